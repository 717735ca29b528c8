-- router_sse: counts the tokens of an OpenAI-style LLM answer as it passes
-- through, and reads its usage and id.
--
-- Streamed answers (text/event-stream): `feed` takes the body chunk by
-- chunk, cut at any byte. Events end at a blank line ("\n\n" or
-- "\r\n\r\n"); the unfinished last event waits in state.tail for the next
-- chunk (at most 64 KiB; a longer tail is dropped and counted in
-- state.dropped). Each event that carries text counts as one token:
--   * chat/completions: a non-empty "content", "reasoning_content" or
--     "reasoning" string (a delta); completions: a non-empty "text";
--   * Responses API (events whose "type" is "response.…"): only the
--     "response.*text.delta" events (output text and reasoning text); the
--     other events repeat text already counted ("….done",
--     "response.completed").
-- Events are matched with plain string.find (JSON keys as compact servers
-- write them: '"content":', no blank before the colon; blanks after it are
-- skipped) and never decoded, except an event holding a "usage" object,
-- which is decoded (cjson.safe) for prompt_tokens / completion_tokens
-- (chat, completions) or input_tokens / output_tokens (Responses API,
-- inside "response"). The first "id" string of the stream (a chat chunk's
-- "chatcmpl-…", a Responses "resp_…") goes to state.id. A "data: [DONE]"
-- line ends the stream: later chunks are ignored. An answer that says it
-- is complete sets state.finished: a non-empty "finish_reason" string (a
-- chat or completions choice's last chunk) or a Responses API event
-- "response.completed", "response.incomplete" or "response.failed"; a
-- stream with neither and no [DONE] was cut (M.ended).
--
-- Non-streamed answers (application/json): `feed_json` keeps the chunks
-- (up to a byte limit), `finish_json` decodes them once for usage and the
-- top-level "id".
--
-- Finding a needle is remembered per chunk (state.at / state.to hold the
-- next match of each), so each needle is searched once over a chunk
-- whatever the number of events in it; nothing is allocated per event
-- except the decoded usage event. A state is reused with `reset`.

local cjson = require("cjson.safe")

local find, byte, sub, gsub = string.find, string.byte, string.sub, string.gsub
local concat = table.concat
local type = type

local M = {}

local MAX_TAIL = 65536
local DEFAULT_JSON_LIMIT = 1048576
local BIG = math.huge
local LF, CR, SPACE, QUOTE, BRACE = 10, 13, 32, 34, 123

-- The needles (plain strings, so string.find stays compiled), by index
-- into state.at / state.to. A key's needle ends on its colon.
local CONTENT, REASONING, TEXT, TYPE, USAGE, DONE, ID, FINISH = 1, 2, 3, 4, 5, 6, 7, 8
local NEEDLES = {
  [CONTENT] = 'content":', -- "content" and "reasoning_content"
  [REASONING] = '"reasoning":',
  [TEXT] = '"text":',
  [TYPE] = '"type":',
  [USAGE] = '"usage":',
  [DONE] = "[DONE]",
  [ID] = '"id":',
  [FINISH] = '"finish_reason":',
}
local NNEEDLES = #NEEDLES

-- new() -> a parser state.
function M.new()
  local state = { at = {}, to = {}, parts = {} }
  M.reset(state)
  return state
end

-- reset(state) -> state, emptied for a new answer (its tables are kept).
function M.reset(state)
  state.tail = nil
  state.done = false
  state.finished = false
  state.tokens = 0
  state.dropped = 0
  state.prompt_tokens = nil
  state.completion_tokens = nil
  state.id = nil
  local parts = state.parts
  for i = 1, state.nparts or 0 do
    parts[i] = nil
  end
  state.nparts = 0
  state.json_bytes = 0
  state.json_over = false
  return state
end

-- The next match of needle k at or after `from`: start, end (BIG, BIG
-- when there is none).
local function seek(data, k, from)
  local s, e = find(data, NEEDLES[k], from, true)
  if s then
    return s, e
  end
  return BIG, BIG
end

-- The start and end of needle k's first match in [pos, stop), or nil.
local function match_in(state, data, k, pos, stop)
  local at, to = state.at, state.to
  if at[k] < pos then
    at[k], to[k] = seek(data, k, pos)
  end
  if at[k] < stop then
    return at[k], to[k]
  end
  return nil
end

-- The position and byte of the first non-blank byte after position e.
local function value_at(data, e)
  local v = e + 1
  local b = byte(data, v)
  while b == SPACE do
    v = v + 1
    b = byte(data, v)
  end
  return v, b
end

-- Whether key needle k has a non-empty string value in [pos, stop).
local function has_text(state, data, k, pos, stop)
  local s, e = match_in(state, data, k, pos, stop)
  while s do
    local v, b = value_at(data, e)
    if b == QUOTE and byte(data, v + 1) ~= QUOTE then
      return true
    end
    s, e = match_in(state, data, k, e + 1, stop)
  end
  return false
end

-- Whether key needle k has an object value in [pos, stop).
local function has_object(state, data, k, pos, stop)
  local s, e = match_in(state, data, k, pos, stop)
  while s do
    local _, b = value_at(data, e)
    if b == BRACE then
      return true
    end
    s, e = match_in(state, data, k, e + 1, stop)
  end
  return false
end

-- The string value of the first "id" key in [pos, stop), or nil.
local function id_in(state, data, pos, stop)
  local _, e = match_in(state, data, ID, pos, stop)
  if not e then
    return nil
  end
  local v, b = value_at(data, e)
  if b ~= QUOTE then
    return nil
  end
  local close = find(data, '"', v + 1, true)
  if not close or close >= stop then
    return nil
  end
  return sub(data, v + 1, close - 1)
end

-- Whether the event in [pos, stop) has the line "data: [DONE]" (or
-- "data:[DONE]").
local function is_done(state, data, pos, stop)
  local s, e = match_in(state, data, DONE, pos, stop)
  while s do
    local d = byte(data, s - 1) == SPACE and s - 6 or s - 5
    local after = byte(data, e + 1)
    if d >= pos and find(data, "data:", d, true) == d
      and (d == pos or byte(data, d - 1) == LF)
      and (e + 1 == stop or after == CR or after == LF) then
      return true
    end
    s, e = match_in(state, data, DONE, e + 1, stop)
  end
  return false
end

-- The Responses API events that end an answer.
local RESPONSE_ENDS = { ["response.completed"] = true, ["response.incomplete"] = true, ["response.failed"] = true }

-- For a Responses API event in [pos, stop) (a "type" whose value starts
-- with "response."): whether that type ends in "text.delta" (and
-- state.finished when the type ends the answer). nil for other events.
local function responses_delta(state, data, pos, stop)
  local s, e = match_in(state, data, TYPE, pos, stop)
  while s do
    local v, b = value_at(data, e)
    if b == QUOTE and find(data, "response.", v + 1, true) == v + 1 then
      local close = find(data, '"', v + 10, true)
      if close ~= nil and close - v <= 24 and RESPONSE_ENDS[sub(data, v + 1, close - 1)] then
        state.finished = true
      end
      return close ~= nil and find(data, 'text.delta"', close - 10, true) == close - 10
    end
    s, e = match_in(state, data, TYPE, e + 1, stop)
  end
  return nil
end

-- Whether the event in [pos, stop) carries one token of text.
local function is_token(state, data, pos, stop)
  local delta = responses_delta(state, data, pos, stop)
  if delta ~= nil then
    return delta
  end
  return has_text(state, data, CONTENT, pos, stop)
    or has_text(state, data, REASONING, pos, stop)
    or has_text(state, data, TEXT, pos, stop)
end

-- Copies prompt and completion token counts from a usage object.
local function take_usage(state, u)
  if type(u) ~= "table" then
    return false
  end
  local p = u.prompt_tokens or u.input_tokens
  local c = u.completion_tokens or u.output_tokens
  if type(p) == "number" then
    state.prompt_tokens = p
  end
  if type(c) == "number" then
    state.completion_tokens = c
  end
  return type(p) == "number" or type(c) == "number"
end

-- Decodes the data of the event in [pos, stop) and takes its usage.
local function read_usage(state, data, pos, stop)
  local _, e = find(data, "data:", pos, true)
  if not e or e >= stop then
    return
  end
  local payload = sub(data, e + 1, stop - 1)
  if find(payload, "\n", 1, true) then
    payload = gsub(payload, "\r?\ndata: ?", "\n")
  end
  local obj = cjson.decode(payload)
  if type(obj) ~= "table" then
    return
  end
  if not take_usage(state, obj.usage) and type(obj.response) == "table" then
    take_usage(state, obj.response.usage)
  end
end

-- Handles the complete event in [pos, stop): returns its token count (0
-- or 1); sets state.done on [DONE].
local function on_event(state, data, pos, stop)
  if is_done(state, data, pos, stop) then
    state.done = true
    return 0
  end
  if not state.id then
    state.id = id_in(state, data, pos, stop)
  end
  if has_object(state, data, USAGE, pos, stop) then
    read_usage(state, data, pos, stop)
  end
  if not state.finished and has_text(state, data, FINISH, pos, stop) then
    state.finished = true
  end
  if is_token(state, data, pos, stop) then
    return 1
  end
  return 0
end

-- The next blank line at or after `from` ("\n\n" or "\n\r\n", which
-- ends "\r\n\r\n"): its start and end, or nil.
local function separator(data, from)
  local s = find(data, "\n", from, true)
  while s do
    local b = byte(data, s + 1)
    if b == LF then
      return s, s + 1
    end
    if b == CR and byte(data, s + 2) == LF then
      return s, s + 2
    end
    s = find(data, "\n", s + 1, true)
  end
  return nil
end

-- Keeps data from pos on as the unfinished event, unless over 64 KiB.
local function keep_tail(state, data, pos)
  local len = #data
  if pos > len then
    state.tail = nil
  elseif len - pos + 1 > MAX_TAIL then
    state.tail = nil
    state.dropped = state.dropped + 1
  elseif pos == 1 then
    state.tail = data
  else
    state.tail = sub(data, pos)
  end
end

-- feed(state, chunk) -> the number of tokens in the events this chunk
-- completed (also added to state.tokens).
function M.feed(state, chunk)
  if state.done or type(chunk) ~= "string" or chunk == "" then
    return 0
  end
  local data, from = state.tail, 1
  if data then
    -- the tail holds no whole separator: search only where one may end
    from = #data > 1 and #data - 1 or 1
    data = data .. chunk
  else
    data = chunk
  end
  local at = state.at
  for k = 1, NNEEDLES do
    at[k] = 0
  end
  local n, pos = 0, 1
  while true do
    local s, e = separator(data, from)
    if not s then
      break
    end
    n = n + on_event(state, data, pos, s)
    pos = e + 1
    from = pos
    if state.done then
      state.tail = nil
      state.tokens = state.tokens + n
      return n
    end
  end
  keep_tail(state, data, pos)
  state.tokens = state.tokens + n
  return n
end

-- ended(state) -> whether the streamed answer fed so far reached its end
-- ([DONE], or state.finished); false for a stream cut before it.
function M.ended(state)
  return state.done or state.finished
end

-- feed_json(state, chunk, limit) -> true while the answer is kept, false
-- once it passed limit bytes (default 1 MiB; finish_json then finds
-- nothing).
function M.feed_json(state, chunk, limit)
  if state.json_over then
    return false
  end
  if type(chunk) ~= "string" or chunk == "" then
    return true
  end
  local bytes = state.json_bytes + #chunk
  if bytes > (limit or DEFAULT_JSON_LIMIT) then
    state.json_over = true
    return false
  end
  state.json_bytes = bytes
  local k = state.nparts + 1
  state.parts[k] = chunk
  state.nparts = k
  return true
end

-- finish_json(state) -> true when the kept answer decoded and held usage;
-- fills state.prompt_tokens, state.completion_tokens and state.id (the
-- top-level "id" string).
function M.finish_json(state)
  local parts, k = state.parts, state.nparts
  if state.json_over or k == 0 then
    return false
  end
  local text = concat(parts, "", 1, k)
  for i = 1, k do
    parts[i] = nil
  end
  state.nparts = 0
  local obj = cjson.decode(text)
  if type(obj) ~= "table" then
    return false
  end
  if type(obj.id) == "string" then
    state.id = obj.id
  end
  return take_usage(state, obj.usage)
end

return M
