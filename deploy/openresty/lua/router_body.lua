-- router_body: the affinity key of an OpenAI-style LLM request, read from
-- its JSON body. Requests with equal keys belong to one conversation (or
-- share one prompt prefix), so routing them to one peer reuses its prefix
-- cache.
--
-- The kind comes from the URI's ending, else from the body's fields:
--   * "chat" (".../chat/completions", or a "messages" array): the first
--     "system" (or "developer") message and the first "user" message:
--     "chat\0" .. system .. "\0" .. user. Later turns append messages
--     after these, so every turn of a conversation has the key of its
--     first turn. No user message: no key.
--   * "completion" (".../completions", or "prompt"): "completion\0" ..
--     the prompt (a string, or an array's first element when a string).
--   * "response" (".../responses", or "input" / "previous_response_id"):
--     "response\0" .. previous_response_id when there is one, else
--     "response\0" .. the input (a string, or the content of its first
--     item with role "user").
-- A message content that is an array of parts stands as its canonical
-- JSON: object keys sorted, so every nginx worker writes the same text.
-- (cjson.encode writes keys in table order, which follows LuaJIT's string
-- hashes; those are seeded per process, so two workers encode one object
-- differently and would key one conversation two ways.) Each text in a key
-- is cut to its first opts.prompt_bytes bytes (default 512), which bounds
-- the key (a system prompt of 100 KB or an image part would otherwise make
-- a key that size) while keeping it distinct: conversations differ within
-- their first bytes.
--
-- key(text, uri, opts) returns key, kind, previous_response_id (the last
-- only for a Responses request that has one: the engine maps response ids
-- to the key it placed the conversation by). Invalid JSON, a body that is
-- not an object, or a body without the fields its kind needs give nil.
--
-- Bounded cost: decoding JSON costs per value, not per byte (a 650 KB
-- object of 60,000 keys took 45 times a 650 KB string's time), so before
-- any decode one pass over the bytes counts the separators (',' and ':'
-- outside strings; every value but the first of an array or object
-- follows one) and gives up at opts.max_separators (default 20,000): such
-- a body has no key (least load). The pass reads the bytes between strings
-- one by one and skips each string with memchr; it stops at the bound.

local cjson = require("cjson.safe")
local ffi = require("ffi")

local find, sub = string.find, string.sub
local concat, sort = table.concat, table.sort
local pairs, tostring, type = pairs, tostring, type

local M = {}

local DEFAULT_PROMPT_BYTES = 512
local DEFAULT_MAX_SEPARATORS = 20000
M.DEFAULT_MAX_SEPARATORS = DEFAULT_MAX_SEPARATORS

local u8p = ffi.typeof("const uint8_t *")
pcall(ffi.cdef, "void *memchr(const void *s, int c, size_t n);")
local memchr = ffi.C.memchr

-- over(text, max): whether text has more than max separators (',' or ':'
-- outside JSON strings). Outside strings it reads each byte once; a string
-- is skipped with memchr to its closing quote (one preceded by an even
-- number of backslashes). Stops at the bound.
local function over(text, max)
  local p, n = ffi.cast(u8p, text), #text
  local count, i = 0, 0
  while i < n do
    local c = p[i]
    if c == 34 then -- a string: find its closing quote
      local j = i + 1
      while true do
        local q = memchr(p + j, 34, n - j)
        if q == nil then
          return false -- unterminated: cjson refuses it
        end
        j = ffi.cast(u8p, q) - p
        local b = j - 1
        while b > i and p[b] == 92 do
          b = b - 1
        end
        if (j - 1 - b) % 2 == 0 then
          break
        end
        j = j + 1
      end
      i = j
    elseif c == 44 or c == 58 then
      count = count + 1
      if count > max then
        return true
      end
    end
    i = i + 1
  end
  return false
end
M._over = over

-- Whether s ends with suffix.
local function ends_with(s, suffix)
  local start = #s - #suffix + 1
  return start >= 1 and find(s, suffix, start, true) ~= nil
end

-- The kind of request: from the URI when it tells, else from the body.
local function kind_of(obj, uri)
  if type(uri) == "string" then
    if ends_with(uri, "/chat/completions") then
      return "chat"
    elseif ends_with(uri, "/completions") then
      return "completion"
    elseif ends_with(uri, "/responses") then
      return "response"
    end
  end
  if type(obj.messages) == "table" then
    return "chat"
  elseif obj.input ~= nil or obj.previous_response_id ~= nil then
    return "response"
  elseif obj.prompt ~= nil then
    return "completion"
  end
  return nil
end

-- The first max bytes of s.
local function prefix(s, max)
  if #s > max then
    return sub(s, 1, max)
  end
  return s
end

-- Canonical JSON is written into one scratch buffer (the engine runs one
-- request at a time per worker, and key never yields).
local buf, nbuf, nbytes = {}, 0, 0
local MAX_DEPTH = 16

local function put(s)
  nbuf = nbuf + 1
  buf[nbuf] = s
  nbytes = nbytes + #s
end

-- Whether t is a JSON array (keys 1..#t only; an empty table is an
-- object, as cjson writes it).
local function is_array(t)
  local n = #t
  if n == 0 then
    return false
  end
  local count = 0
  for _ in pairs(t) do
    count = count + 1
  end
  return count == n
end

local put_value

local function put_array(t, max, depth)
  put("[")
  for i = 1, #t do
    if nbytes >= max then
      return
    end
    if i > 1 then
      put(",")
    end
    put_value(t[i], max, depth)
  end
  put("]")
end

-- Keys of a decoded JSON object are strings: compared as they are (the
-- order tostring gave before, without a call per comparison).
local function by_text(a, b)
  return a < b
end

local function put_object(t, max, depth)
  local keys = {}
  for k in pairs(t) do
    keys[#keys + 1] = k
  end
  sort(keys, by_text)
  put("{")
  for i = 1, #keys do
    if nbytes >= max then
      return
    end
    local k = keys[i]
    if i > 1 then
      put(",")
    end
    put(cjson.encode(tostring(k)))
    put(":")
    put_value(t[k], max, depth)
  end
  put("}")
end

-- Writes v as JSON with sorted object keys, stopping once max bytes are
-- written (strings are cut to max bytes first).
put_value = function(v, max, depth)
  local t = type(v)
  if t == "string" then
    put(cjson.encode(prefix(v, max)) or '""')
  elseif t == "table" then
    if depth >= MAX_DEPTH then
      put("null")
    elseif is_array(v) then
      put_array(v, max, depth + 1)
    else
      put_object(v, max, depth + 1)
    end
  elseif t == "number" or t == "boolean" then
    put(cjson.encode(v) or "null")
  else
    put("null")
  end
end

-- The canonical JSON of t, cut to max bytes.
local function canonical(t, max)
  nbuf, nbytes = 0, 0
  put_value(t, max, 0)
  local s = concat(buf, "", 1, nbuf)
  for i = 1, nbuf do
    buf[i] = nil
  end
  nbuf = 0
  return prefix(s, max)
end

-- A message content as text: a string as is, an array of parts as its
-- canonical JSON; nil for anything else.
local function content_text(content, max)
  local t = type(content)
  if t == "string" then
    return prefix(content, max)
  elseif t == "table" then
    return canonical(content, max)
  end
  return nil
end

-- The first item of list (an array) with role `role` (or `alt`).
local function first_with_role(list, role, alt)
  for i = 1, #list do
    local m = list[i]
    if type(m) == "table" and (m.role == role or (alt and m.role == alt)) then
      return m
    end
  end
  return nil
end

local function chat_key(obj, max)
  local messages = obj.messages
  if type(messages) ~= "table" then
    return nil
  end
  local user = first_with_role(messages, "user")
  local utext = user and content_text(user.content, max)
  if not utext then
    return nil
  end
  local system = first_with_role(messages, "system", "developer")
  local stext = system and content_text(system.content, max) or ""
  return "chat\0" .. stext .. "\0" .. utext
end

local function completion_key(obj, max)
  local prompt = obj.prompt
  if type(prompt) == "table" then
    prompt = prompt[1]
  end
  if type(prompt) ~= "string" then
    return nil
  end
  return "completion\0" .. prefix(prompt, max)
end

local function response_key(obj, max)
  local prev = obj.previous_response_id
  if type(prev) == "string" and prev ~= "" then
    return "response\0" .. prev, prev
  end
  local input = obj.input
  local text
  if type(input) == "string" then
    text = prefix(input, max)
  elseif type(input) == "table" then
    local user = first_with_role(input, "user")
    text = user and content_text(user.content, max)
  end
  if not text then
    return nil
  end
  return "response\0" .. text
end

-- key(text, uri, opts) -> key, kind, previous_response_id; or nil.
-- text: the request body; uri: the request path (may be nil);
-- opts.prompt_bytes: bytes of each text kept in the key (default 512);
-- opts.max_separators: the most separators a body may have (default
-- 20,000; above it, no key).
function M.key(text, uri, opts)
  if type(text) ~= "string" then
    return nil
  end
  if over(text, opts and opts.max_separators or DEFAULT_MAX_SEPARATORS) then
    return nil
  end
  local obj = cjson.decode(text)
  if type(obj) ~= "table" then
    return nil
  end
  local max = opts and opts.prompt_bytes or DEFAULT_PROMPT_BYTES
  local kind = kind_of(obj, uri)
  local key, prev
  if kind == "chat" then
    key = chat_key(obj, max)
  elseif kind == "completion" then
    key = completion_key(obj, max)
  elseif kind == "response" then
    key, prev = response_key(obj, max)
  end
  if not key then
    return nil
  end
  return key, kind, prev
end

return M
