-- router_table: the peers table of a dynamic route (docs/lua-contract.md,
-- "Dynamic peers"): its check, the engine's tiers built from it, the seed
-- file read when the route's dict holds no table, and the per-request
-- sync that swaps a worker's tiers when the stored version changed.
local cjson = require("cjson.safe")
local state = require("router_state")
local canary = require("router_canary")

local ident = state.ident

local M = {}

-- Keys of the peers table in a dynamic route's dict. Peer state keys
-- start with a one-letter kind and "|", so they never collide with these.
M.K_TABLE, M.K_VERSION, M.K_SERIAL, M.K_LOCK = "peers|table", "peers|version", "peers|serial", "peers|lock"
local K_TABLE, K_VERSION, K_SERIAL = M.K_TABLE, M.K_VERSION, M.K_SERIAL

-- config: set by configure() (init_by_lua, in the master; the workers
-- inherit it).
M.config = {}
local config = M.config

-- is_array: a decoded JSON array (cjson gives an empty object and an
-- empty array the same empty table; both are accepted as empty).
function M.is_array(v)
  if type(v) ~= "table" then return false end
  local n = #v
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then return false end
  end
  return true
end

-- check_tiers validates a decoded tiers array; nil when it is sound,
-- else the reason (where names it).
-- Hosts: the engine dials a peer with ngx.balancer.set_current_peer,
-- which takes an IP literal only (no name, no port, no space, no IPv6
-- zone or brackets): a table naming any other host would be accepted and
-- then fail every request sent to that peer, so it is refused.

-- is_ipv4: a dotted quad of decimal octets 0-255 without leading zeros.
local function is_ipv4(h)
  local a, b, c, d = string.match(h, "^(%d%d?%d?)%.(%d%d?%d?)%.(%d%d?%d?)%.(%d%d?%d?)$")
  if not a then
    return false
  end
  for _, o in ipairs({ a, b, c, d }) do
    if (#o > 1 and string.sub(o, 1, 1) == "0") or tonumber(o) > 255 then
      return false
    end
  end
  return true
end

-- v6_groups: the 16-bit groups of a part of an IPv6 address between
-- "::" (a dotted quad may end the address: two groups), nil when it is
-- not one.
local function v6_groups(part, may_end_v4)
  if part == "" then
    return 0
  end
  local n, from = 0, 1
  while true do
    local colon = string.find(part, ":", from, true)
    local g = string.sub(part, from, colon and colon - 1 or #part)
    if not colon and may_end_v4 and string.find(g, ".", 1, true) then
      if not is_ipv4(g) then return nil end
      n = n + 2
    elseif string.match(g, "^%x%x?%x?%x?$") then
      n = n + 1
    else
      return nil
    end
    if not colon then
      return n
    end
    from = colon + 1
  end
end

-- is_ipv6: an IPv6 address as the contract writes it (bare: no brackets,
-- no zone).
local function is_ipv6(h)
  if #h < 2 or #h > 45 or not string.find(h, ":", 1, true) or not string.match(h, "^[%x:%.]+$") then
    return false
  end
  local dbl = string.find(h, "::", 1, true)
  if not dbl then
    return v6_groups(h, true) == 8
  end
  if string.find(h, "::", dbl + 1, true) then
    return false
  end
  local head = v6_groups(string.sub(h, 1, dbl - 1), false)
  local tail = v6_groups(string.sub(h, dbl + 2), true)
  return head ~= nil and tail ~= nil and head + tail <= 7
end

-- is_ip: a host the balancer can dial.
function M.is_ip(h)
  return type(h) == "string" and (is_ipv4(h) or is_ipv6(h))
end

-- Header names as the engine reads them (nginx's $http_<name>), and
-- cookie names as RFC 6265 tokens: a pushed split must be one the engine
-- applies as written, never silently replaced by a default.
local function is_header_name(v)
  return type(v) == "string" and #v >= 1 and #v <= 64 and string.match(v, "^[%w%-]+$") ~= nil
end

local function is_cookie_name(v)
  return type(v) == "string" and #v >= 1 and #v <= 64 and string.match(v, "^[%w!#$%%&'*+%-.^_`|~]+$") ~= nil
end

local function check_tiers(tiers, where0)
  if not M.is_array(tiers) then return where0 .. " is not an array" end
  for i, tr in ipairs(tiers) do
    local where = where0 .. "[" .. (i - 1) .. "]"
    if type(tr) ~= "table" then return where .. " is not an object" end
    if type(tr.use) ~= "string" or tr.use == "" then return where .. ".use is not a string" end
    if type(tr.priority) ~= "number" then return where .. ".priority is not a number" end
    if tr.max_concurrency ~= nil and (type(tr.max_concurrency) ~= "number" or tr.max_concurrency < 0) then
      return where .. ".max_concurrency is not a number >= 0"
    end
    if tr.probe_path ~= nil and type(tr.probe_path) ~= "string" then return where .. ".probe_path is not a string" end
    if not M.is_array(tr.peers) then return where .. ".peers is not an array" end
    for j, p in ipairs(tr.peers) do
      local pw = where .. ".peers[" .. (j - 1) .. "]"
      if type(p) ~= "table" then return pw .. " is not an object" end
      if type(p.host) ~= "string" or p.host == "" then return pw .. ".host is not a string" end
      if not M.is_ip(p.host) then
        return pw .. ".host " .. cjson.encode(p.host)
          .. " is not an IP address (IPv4 dotted quad, or IPv6 without brackets or zone): the balancer dials IP literals only"
      end
      local port = p.port
      if type(port) ~= "number" or port ~= math.floor(port) or port < 1 or port > 65535 then
        return pw .. ".port is not a port (1-65535)"
      end
    end
  end
  return nil
end

-- check_table validates a decoded peers table (format 1, or format 2: a
-- canary) for route; nil when it is sound, else the reason.
local function check_table(t, route)
  if type(t) ~= "table" then return "not a JSON object" end
  if t.format ~= 1 and t.format ~= 2 then
    return "unknown format " .. cjson.encode(t.format or cjson.null) .. " (this engine reads formats 1 and 2)"
  end
  if type(t.route) ~= "string" or t.route == "" then return "no route" end
  if t.route ~= route then return "a table of route " .. cjson.encode(t.route) .. " for route " .. cjson.encode(route) end
  if type(t.version) ~= "string" or t.version == "" then return "no version" end
  local err = check_tiers(t.tiers, "tiers")
  if err then return err end
  local c = t.canary
  if t.format == 1 then
    if c ~= nil then return "format 1 has no canary (a table with one is format 2)" end
    return nil
  end
  if type(c) ~= "table" then return "format 2 without a canary object" end
  local w = c.weight
  if type(w) ~= "number" or w ~= math.floor(w) or w < 0 or w > 100 then return "canary.weight is not a whole number from 0 to 100" end
  for _, k in ipairs({ "sticky_header", "override_header" }) do
    if c[k] ~= nil and not is_header_name(c[k]) then
      return "canary." .. k .. " is not a header name (1 to 64 letters, digits and '-')"
    end
  end
  if c.sticky_cookie ~= nil and not is_cookie_name(c.sticky_cookie) then
    return "canary.sticky_cookie is not a cookie name (1 to 64 characters of an RFC 6265 token)"
  end
  return check_tiers(c.tiers, "canary.tiers")
end

-- decode_table: the table of JSON text for route, or nil and the reason.
function M.decode_table(text, route)
  local t, err = cjson.decode(text)
  if t == nil then
    return nil, "malformed JSON: " .. tostring(err)
  end
  err = check_table(t, route)
  if err then
    return nil, err
  end
  return t
end

-- build_tiers makes the engine's tiers of a checked tiers array: the same
-- shape register_route receives (max_concurrency 0 and an empty
-- probe_path are absent; the decoded peer objects are used as they are);
-- it adds their identities to members and returns the tiers, their peer
-- count and whether a tier has a probe path.
local function build_tiers(in_tiers, members)
  local tiers, n, has_probe = {}, 0, false
  for i, tr in ipairs(in_tiers) do
    local x = { use = tr.use, priority = tr.priority, peers = tr.peers }
    if tr.max_concurrency and tr.max_concurrency > 0 then
      x.max_concurrency = tr.max_concurrency
    end
    if tr.probe_path and tr.probe_path ~= "" then
      x.probe_path = tr.probe_path
      has_probe = true
    end
    for _, q in ipairs(x.peers) do
      members[ident(x, q)] = true
    end
    n = n + #x.peers
    tiers[i] = x
  end
  return tiers, n, has_probe
end

-- build makes the engine's tiers of a checked table, the identities of
-- its peers (the canary's too), their count, whether a tier has a probe
-- path, and the canary's tiers (nil without a canary).
function M.build(t)
  local members = {}
  local tiers, n, has_probe = build_tiers(t.tiers, members)
  local ctiers
  if type(t.canary) == "table" then
    local cn, cp
    ctiers, cn, cp = build_tiers(t.canary.tiers, members)
    n, has_probe = n + cn, has_probe or cp
  end
  return tiers, members, n, has_probe, ctiers
end

local decode_table, build = M.decode_table, M.build

-- seed stores the route's seed file, <peers_dir>/peers_<route>.json, when
-- the dict holds no table: with add, so it never overwrites a push, and
-- serial 0. Returns the stored version (a push's, when one came first),
-- nil when there is none. A missing or bad file is looked at again after
-- a second, not on every request.
local function seed(r)
  if not config.peers_dir then
    return nil
  end
  local now = ngx.now()
  if r.seed_retry and now < r.seed_retry then
    return nil
  end
  r.seed_retry = now + 1
  local path = config.peers_dir .. "/peers_" .. r.name .. ".json"
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local text = f:read("*a")
  f:close()
  local t, err = decode_table(text or "", r.name)
  if not t then
    ngx.log(ngx.ERR, "route ", r.name, ": seed ", path, ": ", err)
    return nil
  end
  local dict = r.store
  local ok, aerr = dict:safe_add(K_TABLE, text)
  if not ok and aerr ~= "exists" then
    ngx.log(ngx.ERR, "route ", r.name, ": seed ", path, ": ", aerr)
    return nil
  end
  -- The dict holds a table now, ours or a push's that came between: its
  -- version is that text's, so version and table always agree.
  local stored = dict:get(K_TABLE)
  local version = t.version
  if stored ~= nil and stored ~= text then
    local st = cjson.decode(stored)
    version = type(st) == "table" and st.version or nil
  end
  if type(version) ~= "string" then
    return nil
  end
  dict:safe_add(K_VERSION, version)
  dict:safe_add(K_SERIAL, 0)
  ngx.log(ngx.INFO, "route ", r.name, ": seeded peers table version ", version, " from ", path)
  return dict:get(K_VERSION)
end

-- sync makes the worker's tiers those of the table in the dict: one read
-- of the version; the table is decoded only when the version differs from
-- the one this worker holds. The version is read before the table, and a
-- push writes the table before the version, so the table is never older
-- than the version (a newer one is decoded again on the next request).
function M.sync(r)
  local dict = r.store
  local v = dict:get(K_VERSION)
  if v == nil then
    v = seed(r)
    if v == nil then
      return
    end
  end
  if v == r.version then
    return
  end
  -- Only checked tables are stored (a push's, a seed's): decoded, not
  -- checked again (the check costs a quarter of the decode).
  local text = dict:get(K_TABLE)
  local ok, tiers, members, npeers, has_probe, ctiers
  local t
  if text == nil then
    tiers = "version " .. tostring(v) .. " stored without a table"
  else
    local err
    t, err = cjson.decode(text)
    if type(t) ~= "table" or t.route ~= r.name then
      tiers = "not a table of this route: " .. tostring(err)
    else
      ok, tiers, members, npeers, has_probe, ctiers = pcall(build, t)
    end
  end
  if not ok then
    -- Keep the tiers held; do not decode again until the version changes.
    ngx.log(ngx.ERR, "route ", r.name, ": peers table version ", tostring(v), ": ", tostring(tiers),
      "; keeping version ", tostring(r.version))
    r.version = v
    return
  end
  r.tiers, r.members, r.npeers, r.has_probe = tiers, members, npeers, has_probe
  r.canary = ctiers and canary.make(t.canary, ctiers) or nil
  r.version = v
end

return M
