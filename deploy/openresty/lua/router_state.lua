-- router_state: where the engine keeps a route's state, and the keys of
-- each peer's entries in it.
--
-- A route's state lives in ngx.shared[<route>] when the http{} block
-- declares "lua_shared_dict <route> …;" (every route file does), so the
-- workers share it and it survives a reload; without one, a worker-local
-- table with the same small interface holds it (per worker, lost on
-- reload).
--
-- Peer state is keyed by kind and identity (tier use, host, port), never
-- by index, so the state of a peer that stays survives a peers-table
-- change that reorders or changes the peers:
--   a  requests in flight         f  consecutive connection failures
--   e  ejected (with a ttl)       n  ejections
--   t  tries                      u  unhealthy (failed its probe)
--   l  adaptive concurrency limit r  decode-rate EWMA (tokens/s)
--   m  TTFT EWMA (ms)                c  decode capacity EWMA (tokens/s)
-- A tier's requests in flight are counted under "i|<use>" (the bounded
-- load of affinity reads one key, not every peer's).
local M = {}

M.STATE_KINDS = { "a", "f", "e", "n", "t", "u", "l", "r", "m", "c" }

local function local_store()
  local data, expiry = {}, {}
  local s = {}
  function s:get(k)
    local e = expiry[k]
    if e and e <= ngx.now() then
      data[k], expiry[k] = nil, nil
    end
    return data[k]
  end
  function s:set(k, v, ttl)
    data[k] = v
    expiry[k] = (ttl and ttl > 0) and (ngx.now() + ttl) or nil
    return true
  end
  function s:add(k, v, ttl)
    if self:get(k) ~= nil then
      return false, "exists"
    end
    return self:set(k, v, ttl)
  end
  s.safe_set, s.safe_add = s.set, s.add
  function s:delete(k)
    data[k], expiry[k] = nil, nil
    return true
  end
  function s:incr(k, d, init, init_ttl)
    local cur = self:get(k)
    if cur == nil then
      if init == nil then
        return nil, "not found"
      end
      self:set(k, init + d, init_ttl)
      return init + d
    end
    data[k] = cur + d
    return data[k]
  end
  return s
end

-- store_for: ngx.shared[route] and true, else a worker-local store and
-- false.
function M.store_for(route)
  local ok, dict = pcall(function() return ngx.shared[route] end)
  if ok and dict then
    return dict, true
  end
  return local_store(), false
end

-- dict: the shared dict named name, nil when there is none.
function M.dict(name)
  local ok, dict = pcall(function() return ngx.shared[name] end)
  if ok and type(dict) == "table" and dict.get then
    return dict
  end
  return nil
end

function M.num(v, default)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return default end
  return n
end

function M.clamp(n, lo, hi)
  if n < lo then return lo end
  if n > hi then return hi end
  return n
end

function M.hex(s)
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end))
end

-- hexify copies a value: strings (keys too) become hex, numbers and
-- booleans stay, tables recurse; arrays stay arrays.
local function hexify(v)
  local t = type(v)
  if t == "string" then return M.hex(v) end
  if t ~= "table" then return v end
  local out = {}
  local n = #v
  if n > 0 then
    for i = 1, n do out[i] = hexify(v[i]) end
    return out
  end
  for k, x in pairs(v) do
    out[type(k) == "string" and M.hex(k) or k] = hexify(x)
  end
  return out
end
M.hexify = hexify

-- Key strings of a peer, made once per peer object (weak keys: a table
-- swap drops the old objects' entries with them). The pick reads peers on
-- every request; building their keys there each time cost more than the
-- dict reads.
local KEYS = setmetatable({}, { __mode = "k" })

local function keys(t, p)
  local k = KEYS[p]
  if k == nil or k.use ~= t.use then
    k = { use = t.use, id = t.use .. "|" .. p.host .. "|" .. p.port, addr = p.host .. ":" .. p.port }
    KEYS[p] = k
  end
  return k
end

-- ident names a peer by tier use and address: the peer's identity for
-- its state keys, a request's tried set and a table change.
function M.ident(t, p)
  return keys(t, p).id
end

-- addr: "host:port" of a peer (its metrics label).
function M.addr(t, p)
  return keys(t, p).addr
end

-- pkey: the store key of kind for peer p of tier t.
function M.pkey(kind, t, p)
  local k = keys(t, p)
  local s = k[kind]
  if s == nil then
    s = kind .. "|" .. k.id
    k[kind] = s
  end
  return s
end

-- tkey: the store key of tier t's requests in flight.
function M.tkey(t)
  return "i|" .. t.use
end

-- Writes of peer and request state never evict: the route's dict also
-- holds the peers table, its version and serial, which a rarely read key
-- would lose first to an LRU eviction. A write the dict has no room for
-- fails instead (the request is still served) and is counted by
-- M.on_failure (router.lua sets it: a metric).
M.on_failure = function() end

-- Kinds of state that may go when the dict is full: what only informs
-- (tries, ejection counts), what is learnt again (the EWMAs) and the
-- Responses chains ("x|"). Requests in flight, failures, ejections,
-- health and the adaptive limits stay.
local DISPOSABLE = { t = true, n = true, r = true, m = true, c = true, x = true }

-- make_room deletes the disposable state of dict (at most max keys
-- looked at; 0 = all) and returns how many keys it deleted.
function M.make_room(dict, max)
  local n = 0
  for _, k in ipairs(dict:get_keys(max or 0)) do
    local kind = string.match(k, "^(%a)|")
    if kind and DISPOSABLE[kind] then
      dict:delete(k)
      n = n + 1
    end
  end
  return n
end

-- incr adds d to key k of route r's store (creating it at d, with ttl),
-- and returns the new value, or nil when the dict is full.
function M.incr(r, k, d, ttl)
  local store = r.store
  local v, err = store:incr(k, d)
  if v then
    return v
  end
  if err == "not found" then
    local ok, aerr = store:safe_add(k, d, ttl or 0)
    if ok then
      return d
    end
    if aerr == "exists" then
      return store:incr(k, d)
    end
    err = aerr
  end
  M.on_failure(r, k, err)
  return nil
end

-- decr takes one from an existing count (never creates it).
function M.decr(r, k)
  return (r.store:incr(k, -1))
end

-- set writes key k (nil deletes it) without evicting; false when full.
function M.set(r, k, v, ttl)
  if v == nil then
    r.store:delete(k)
    return true
  end
  local ok, err = r.store:safe_set(k, v, ttl or 0)
  if not ok then
    M.on_failure(r, k, err)
  end
  return ok
end

-- add writes key k only when it is absent, without evicting: true when
-- it wrote it.
function M.add(r, k, v, ttl)
  local ok, err = r.store:safe_add(k, v, ttl or 0)
  if not ok and err ~= "exists" then
    M.on_failure(r, k, err)
  end
  return ok
end

local pkey = M.pkey
function M.active(r, t, p) return r.store:get(pkey("a", t, p)) or 0 end
function M.ejected(r, t, p) return r.store:get(pkey("e", t, p)) ~= nil end
function M.unhealthy(r, t, p) return r.store:get(pkey("u", t, p)) ~= nil end
function M.out_of_pick(r, t, p)
  local s = r.store
  return s:get(pkey("e", t, p)) ~= nil or s:get(pkey("u", t, p)) ~= nil
end

-- bracketed: the host as nginx parses an address; an IPv6 host (given
-- bare, as the contract writes it) in brackets.
function M.bracketed(host)
  if string.find(host, ":", 1, true) then
    return "[" .. host .. "]"
  end
  return host
end

return M
