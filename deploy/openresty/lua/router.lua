-- router: the reference routing engine of an autoconfig llm route file
-- (docs/lua-contract.md). Runs on stock openresty (and on Debian's nginx +
-- libnginx-mod-http-lua + lua-cjson, which is what the repository's tests
-- load it with).
--
-- REFERENCE, implemented here:
--   * registered / register_route / access / balance / log, as the contract
--     calls them (registration lazily, once per worker and route);
--   * dynamic peers (docs/lua-contract.md, "Dynamic peers"):
--     register_dynamic_route takes the route's options only; its tiers come
--     from a peers table pushed to the control endpoint (control(), the
--     content handler of the shipped nginx.conf's unix-socket server) or
--     seeded from <peers_dir>/peers_<route>.json (configure(), from
--     init_by_lua). The table lives in the route's shared dict; every
--     request reads its version once (access and balance) and decodes the
--     table only when the version changed;
--   * priority tiers, highest first; a lower tier serves only when every
--     peer of every higher tier is ejected, failed its health probe or was
--     already tried by this request (FailClose: never below a cart tier);
--   * per-peer concurrency limits (tier max_concurrency): a request is
--     admitted only when a peer of its tier has a free slot (else 503 with
--     Retry-After: 1; option admission = "off": never refused, the balancer
--     still prefers a peer with a free slot); least connections within a
--     tier, ties round-robin;
--   * failure-mode options: retry_on = "connect-failure" with max_tries
--     (ngx.balancer.set_more_tries; a try is a connection failure when
--     ngx.balancer.get_last_failure() says "failed", i.e. nginx got no
--     response; any HTTP status, 503 included, is a response and is passed
--     back, never retried), ejection after eject_consecutive_connect_failures
--     (default 3; 0 = never; FailClose routes default to 0) consecutive
--     connection failures for ejection_seconds
--     (default 10), never more than max_ejection_percent (default 50) of a
--     backend tier's peers at once (a one-peer VIP tier is not capped);
--   * active health probes on each tier's probe_path: GET every
--     health_probe_interval_seconds (engine option, default 5; 0 = off;
--     at least 1, at most 3600), 200 =
--     healthy, anything else or no answer = unhealthy (out of the pick
--     until a probe answers 200); ngx.timer.every, started by the route's
--     first registration in a worker (dynamic routes: by the first request
--     that sees a tier with a probe_path);
--   * GET /_tps_status (the route's own endpoint, seen after the prefix
--     strip): JSON with the route's options, opt_in = true when
--     tps_limit_tps is set;
--   * GET /_status: JSON of what register_route received (route, options,
--     tiers, registrations in this worker, worker pid) and the live peer
--     state; with ?strings=hex every string (keys too) is hex-encoded, so
--     arbitrary bytes (NUL, invalid UTF-8) survive JSON exactly. A dynamic
--     route adds dynamic = true, the table's version and serial;
--   * canary routes (docs/lua-contract.md, "Canary"): register_route's
--     fourth argument or a format 2 peers table's canary; each request's
--     version (stable or canary) from the override header, else the CRC-32
--     bucket of the sticky header or cookie, else an exact weighted draw
--     (the response sets the sticky cookie); a version without a live
--     peer falls through to the other (counted); header() sets
--     X-Model-Version; counters in /_status and GET /canary/<route> on the
--     control socket;
--   * option kind = "video" (dynamic video routes): a plain proxy, so no
--     engine endpoint (/_status, /_tps_status go to the backend); tiers of
--     the highest priority form one primary group (nginx's non-backup
--     servers), lower tiers serve only while every primary is out; failures
--     count within ejection_seconds (nginx's max_fails/fail_timeout);
--     active slots are counted only once the route's log phase has run in
--     the worker (a video file may have none).
--
-- PRODUCTION IMAGE ONLY, not implemented here: session (prefix-cache)
-- affinity, adaptive concurrency (limits learned from latency/TTFT against
-- slo_ttft_ms / slo_decode_tps), TPS admission (tps_limit_tps is reported
-- by /_tps_status but not enforced), token accounting. A route's options
-- for those are accepted and ignored.
--
-- State: when the http{} block has "lua_shared_dict <route> …;", peer
-- state (active requests, failure counts, ejections, health) lives in
-- ngx.shared[<route>] and is shared by the workers and across reloads
-- (keys name the peer by tier use, host and port, never by index, so the
-- state of a peer that stays survives a peers-table change). Without
-- it, a worker-local table holds it (per worker; lost on reload). Known
-- limit: a worker that crashes mid-request leaves its active counts in the
-- shared dict (they are released only by the log phase).
--
-- No request header is read for peer choice: peers come only from
-- register_route or the peers table. A canary route's split headers and
-- cookie choose between its two versions only (hashed, never evaluated).
local cjson = require("cjson.safe")

local M = {}
local routes = {}
-- config: set by configure() (init_by_lua, in the master; the workers
-- inherit it).
local config = {}

-- Keys of the peers table in a dynamic route's dict. pkey's keys start
-- with a one-letter kind, so they never collide with these.
local K_TABLE, K_VERSION, K_SERIAL, K_LOCK = "peers|table", "peers|version", "peers|serial", "peers|lock"

-- The greatest serial: lua numbers hold integers exactly up to 2^53.
local MAX_SERIAL = 9007199254740992

-- store: ngx.shared[route] when configured, else a worker-local table with
-- the same small interface (get, set and add with ttl, incr with init and
-- init_ttl, delete).
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
      self:set(k, (init or 0) + d, init_ttl)
      return (init or 0) + d
    end
    data[k] = cur + d
    return data[k]
  end
  return s
end

local function store_for(route)
  local ok, dict = pcall(function() return ngx.shared[route] end)
  if ok and dict then
    return dict, true
  end
  return local_store(), false
end

local function num(v, default)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return default end
  return n
end

local function clamp(n, lo, hi)
  if n < lo then return lo end
  if n > hi then return hi end
  return n
end

local function probe_interval(n)
  if n <= 0 then return 0 end
  return clamp(n, 1, 3600)
end

local function hex(s)
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end))
end

-- hexify copies a value: strings (keys too) become hex, numbers and
-- booleans stay, tables recurse; arrays stay arrays.
local function hexify(v)
  local t = type(v)
  if t == "string" then return hex(v) end
  if t ~= "table" then return v end
  local out = {}
  local n = #v
  if n > 0 then
    for i = 1, n do out[i] = hexify(v[i]) end
    return out
  end
  for k, x in pairs(v) do
    out[type(k) == "string" and hex(k) or k] = hexify(x)
  end
  return out
end

-- Key strings of a peer, made once per peer object (weak keys: a table
-- swap drops the old objects' entries with them). The pick looks at every
-- peer of a tier on every request; building its keys there each time cost
-- more than the dict reads.
local KEYS = setmetatable({}, { __mode = "k" })

local function keys(t, p)
  local k = KEYS[p]
  if k == nil or k.use ~= t.use then
    k = { use = t.use, id = t.use .. "|" .. p.host .. "|" .. p.port }
    KEYS[p] = k
  end
  return k
end

-- ident names a peer by tier use and address: the peer's identity for
-- its state keys, a request's tried set and a table change (two tables
-- that list the same use, host and port list the same peer).
local function ident(t, p)
  return keys(t, p).id
end

-- peer key in the store: kind and identity, so the state stays right
-- across reloads and peers-table changes that reorder or change the peers.
local function pkey(kind, t, p)
  local k = keys(t, p)
  local s = k[kind]
  if s == nil then
    s = kind .. "|" .. k.id
    k[kind] = s
  end
  return s
end

-- The kinds of per-peer state: active requests, consecutive failures,
-- ejected, ejections, tries, unhealthy.
local STATE_KINDS = { "a", "f", "e", "n", "t", "u" }

-- bracketed: the host as nginx parses an address; an IPv6 host (given
-- bare, as the contract writes it) in brackets.
local function bracketed(host)
  if string.find(host, ":", 1, true) then
    return "[" .. host .. "]"
  end
  return host
end

-- is_array: a decoded JSON array (cjson gives an empty object and an
-- empty array the same empty table; both are accepted as empty).
local function is_array(v)
  if type(v) ~= "table" then return false end
  local n = #v
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then return false end
  end
  return true
end

-- check_tiers validates a decoded tiers array; nil when it is sound,
-- else the reason (where names it).
local function check_tiers(tiers, where0)
  if not is_array(tiers) then return where0 .. " is not an array" end
  for i, tr in ipairs(tiers) do
    local where = where0 .. "[" .. (i - 1) .. "]"
    if type(tr) ~= "table" then return where .. " is not an object" end
    if type(tr.use) ~= "string" or tr.use == "" then return where .. ".use is not a string" end
    if type(tr.priority) ~= "number" then return where .. ".priority is not a number" end
    if tr.max_concurrency ~= nil and (type(tr.max_concurrency) ~= "number" or tr.max_concurrency < 0) then
      return where .. ".max_concurrency is not a number >= 0"
    end
    if tr.probe_path ~= nil and type(tr.probe_path) ~= "string" then return where .. ".probe_path is not a string" end
    if not is_array(tr.peers) then return where .. ".peers is not an array" end
    for j, p in ipairs(tr.peers) do
      local pw = where .. ".peers[" .. (j - 1) .. "]"
      if type(p) ~= "table" then return pw .. " is not an object" end
      if type(p.host) ~= "string" or p.host == "" then return pw .. ".host is not a string" end
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
  for _, k in ipairs({ "sticky_header", "override_header", "sticky_cookie" }) do
    if c[k] ~= nil and type(c[k]) ~= "string" then return "canary." .. k .. " is not a string" end
  end
  return check_tiers(c.tiers, "canary.tiers")
end

-- decode_table: the table of JSON text for route, or nil and the reason.
local function decode_table(text, route)
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
local function build(t)
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

-- ---------------------------------------------------------------------
-- Canary split (docs/lua-contract.md, "Canary"): a route with a canary
-- serves each request from one of two versions, "stable" (the route's
-- tiers) or "canary" (the canary's tiers), chosen in this order: the
-- override header (only the values "stable" and "canary"; any other value
-- is ignored); else the session key, the sticky header or else the sticky
-- cookie, hashed into one of BUCKETS buckets (ngx.crc32_long(key) %
-- BUCKETS: the same in every worker and after every reload), canary when
-- the bucket is below weight * BUCKETS / 100 (raising the weight only adds
-- buckets to the canary, lowering it only removes them); else (no key) an
-- exact weighted draw from a counter in the route's dict: the n-th keyless
-- request is canary when floor(n * w / 100) > floor((n - 1) * w / 100).
-- A keyless request's response sets the sticky cookie to
-- "<bucket>.<random hex>" with a bucket of the version drawn, which the
-- cookie's next requests read back as their bucket. A cookie of any other
-- form is a key like the header's (hashed). Header values are never
-- evaluated: only hashed, compared or parsed as digits.
local BUCKETS = 10000

-- Keys of the split's counters in the route's dict.
local K_DRAWS = "canary|draws"
local K_SERVED = { stable = "canary|served|stable", canary = "canary|served|canary" }
local K_FELL = { stable = "canary|fallthrough|stable", canary = "canary|fallthrough|canary" }
local OTHER = { stable = "canary", canary = "stable" }

-- header_var: the nginx variable of a request header (http_<name>, lower
-- case, '-' as '_'); nil for a name that is not a header token.
local function header_var(name, default)
  if type(name) ~= "string" or name == "" then name = default end
  if not string.match(name, "^[%w%-_]+$") then return nil end
  return "http_" .. (string.gsub(string.lower(name), "-", "_"))
end

-- make_canary: the split of a route from a canary description (the
-- register_route canary argument, or a peers table's canary) and its
-- built tiers.
local function make_canary(c, tiers)
  local w = clamp(math.floor(num(c.weight, 0)), 0, 100)
  local cookie = c.sticky_cookie
  if type(cookie) ~= "string" or cookie == "" then cookie = "autoconfig-session" end
  if not string.match(cookie, "^[%w!#$%%&'*+%-.^_`|~]+$") then cookie = "autoconfig-session" end
  return {
    weight = w, band = w * BUCKETS / 100, tiers = tiers,
    sticky_header = c.sticky_header or "x-session-id",
    override_header = c.override_header or "x-model-version",
    sticky_cookie = cookie,
    override_var = header_var(c.override_header, "x-model-version"),
    sticky_var = header_var(c.sticky_header, "x-session-id"),
    cookie_var = "cookie_" .. cookie,
    cookie_attrs = "; Path=/; HttpOnly; SameSite=Lax",
  }
end

local seeded = false

-- cookie_for: a sticky cookie whose bucket is in version v's band.
local function cookie_for(c, v)
  if not seeded then
    seeded = true
    math.randomseed(ngx.worker.pid() * 1000003 + math.floor(ngx.now() * 1000) % 1000003)
  end
  local bucket
  if v == "canary" then
    bucket = math.random(0, c.band - 1)
  else
    bucket = math.random(c.band, BUCKETS - 1)
  end
  return c.sticky_cookie .. "=" .. bucket .. "." .. string.format("%06x%06x", math.random(0, 0xffffff), math.random(0, 0xffffff)) .. c.cookie_attrs
end

-- choose: the version a request asks for, and true when it had no key
-- (its response sets the sticky cookie).
local function choose(r, c)
  local var = ngx.var
  local ov = c.override_var and var[c.override_var]
  if ov == "stable" or ov == "canary" then
    return ov, false
  end
  local bucket
  local key = c.sticky_var and var[c.sticky_var]
  if key ~= nil and key ~= "" then
    bucket = ngx.crc32_long(key) % BUCKETS
  else
    key = var[c.cookie_var]
    if key ~= nil and key ~= "" then
      local b = string.match(key, "^(%d%d?%d?%d?)%.%x+$")
      bucket = b and tonumber(b) or ngx.crc32_long(key) % BUCKETS
    end
  end
  if bucket then
    return bucket < c.band and "canary" or "stable", false
  end
  local w = c.weight
  local n = r.store:incr(K_DRAWS, 1, 0)
  if not n then
    return math.random() * 100 < w and "canary" or "stable", true
  end
  return math.floor(n * w / 100) > math.floor((n - 1) * w / 100) and "canary" or "stable", true
end

local probe

function M.registered(route)
  return routes[route] ~= nil
end

-- configure is called from the shipped nginx.conf's init_by_lua_block:
-- peers_dir is the directory of the peers_<route>.json seed files (the
-- routes ConfigMap's mount).
function M.configure(opts)
  opts = opts or {}
  config.peers_dir = type(opts.peers_dir) == "string" and opts.peers_dir or nil
end

-- start_probe starts the route's probe timer once per worker, when a tier
-- has a probe path and probing is on.
local function start_probe(r)
  if r.probing or r.probe_every <= 0 or not r.has_probe then
    return
  end
  r.probing = true
  local ok, err = ngx.timer.every(r.probe_every, probe, r.name)
  if not ok then
    ngx.log(ngx.ERR, "route ", r.name, ": health probe timer: ", err)
  end
end

local function new_route(route, options, tiers)
  local prev = routes[route]
  local o = options or {}
  local store, shared = store_for(route)
  local r = {
    name = route, options = o, tiers = tiers or {},
    registrations = (prev and prev.registrations or 0) + 1,
    store = store, shared = shared,
    fail_close = o.failure_mode == "FailClose",
    retry = o.retry_on == "connect-failure",
    -- Numeric options are clamped to what keeps the shared nginx sound:
    -- a route's values are free-form text, and one route must not be able
    -- to exhaust the workers (a 1 ms probe timer across many routes ran
    -- out of worker_connections) or break its own requests (a negative
    -- ttl is an error in the dict).
    max_tries = clamp(math.floor(num(o.max_tries, 1)), 1, 16),
    -- FailClose routes do not route around failed peers: no ejection
    -- unless the option asks for it.
    eject_after = math.max(0, math.floor(num(o.eject_consecutive_connect_failures,
      o.failure_mode == "FailClose" and 0 or 3))),
    max_eject_pct = clamp(num(o.max_ejection_percent, 50), 0, 100),
    eject_secs = clamp(num(o.ejection_seconds, 10), 1, 86400),
    -- 0 or less turns probing off; otherwise at least every second.
    probe_every = probe_interval(num(o.health_probe_interval_seconds, 5)),
    admission = o.admission ~= "off",
    video = o.kind == "video",
    probing = prev and prev.probing or false,
    rr = 0,
  }
  routes[route] = r
  return r, prev
end

-- register_route: canary (optional) is the route's second version,
-- { weight, sticky_header, override_header, sticky_cookie, tiers }.
function M.register_route(route, options, tiers, canary)
  local r, prev = new_route(route, options, tiers)
  for _, t in ipairs(r.tiers) do
    r.has_probe = r.has_probe or type(t.probe_path) == "string"
  end
  if type(canary) == "table" then
    r.canary = make_canary(canary, type(canary.tiers) == "table" and canary.tiers or {})
    for _, t in ipairs(r.canary.tiers) do
      r.has_probe = r.has_probe or type(t.probe_path) == "string"
    end
  end
  if not prev then
    start_probe(r)
  end
end

-- register_dynamic_route: a route whose tiers come from its peers table
-- (the route's dict, or the seed file); the same options as register_route.
function M.register_dynamic_route(route, options)
  local r = new_route(route, options, {})
  r.dynamic = true
  r.members, r.npeers = {}, 0
  if not r.shared then
    ngx.log(ngx.ERR, "route ", route, ": no lua_shared_dict named ", route,
      ": the control endpoint cannot reach this route (seed file only, per worker)")
  end
end

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
local function sync(r)
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
  r.canary = ctiers and make_canary(t.canary, ctiers) or nil
  r.version = v
end

local function active(r, t, p) return r.store:get(pkey("a", t, p)) or 0 end
local function ejected(r, t, p) return r.store:get(pkey("e", t, p)) ~= nil end
local function unhealthy(r, t, p) return r.store:get(pkey("u", t, p)) ~= nil end
local function out_of_pick(r, t, p) return ejected(r, t, p) or unhealthy(r, t, p) end

local function has_slot(r, t, p)
  return t.max_concurrency == nil or active(r, t, p) < t.max_concurrency
end

-- tiers_of: the tiers of version v of route r (the route's own tiers
-- unless v is "canary").
local function tiers_of(r, v)
  if v == "canary" and r.canary then
    return r.canary.tiers
  end
  return r.tiers
end

-- live: whether tiers have a peer in the pick (not ejected, not
-- unhealthy).
local function live(r, tiers)
  for _, t in ipairs(tiers) do
    for _, p in ipairs(t.peers) do
      if not out_of_pick(r, t, p) then
        return true
      end
    end
  end
  return false
end

-- split chooses the request's version (choose) and falls through to the
-- other version when the chosen one has no live peer and the other has;
-- it records the version (and the fallthrough, and the cookie to set) in
-- ngx.ctx and returns the version's tiers.
local function split(r, ctx)
  local c = r.canary
  local v, keyless = choose(r, c)
  if keyless then
    ctx.autoconfig_cookie = cookie_for(c, v)
  end
  if not live(r, tiers_of(r, v)) and live(r, tiers_of(r, OTHER[v])) then
    ctx.autoconfig_fell = v
    v = OTHER[v]
  end
  ctx.autoconfig_version = v
  return tiers_of(r, v)
end

-- best_in_tier returns tier t's untried peer with the fewest active
-- requests, preferring peers under their max_concurrency (ties rotate),
-- with whether it has a free slot and its active count; with ignore_out,
-- ejected and unhealthy peers count too. nil when the tier has no such
-- peer. tried holds peer identities.
local function best_in_tier(r, t, tried, ignore_out)
  local n = #t.peers
  local best, best_free, best_active
  for k = 0, n - 1 do
    local pi = (r.rr + k) % n + 1
    local p = t.peers[pi]
    if not tried[ident(t, p)] and (ignore_out or not out_of_pick(r, t, p)) then
      local a = active(r, t, p)
      local free = t.max_concurrency == nil or a < t.max_concurrency
      if not best or (free and not best_free) or (free == best_free and a < best_active) then
        best, best_free, best_active = p, free, a
      end
    end
  end
  return best, best_free, best_active
end

-- pick returns tier and peer (the objects) for the next try from tiers
-- (the route's, or its canary's): the best usable untried peer of the first tier that has one. When every peer is
-- out of the pick, the first tier with an untried peer is used anyway (a
-- request is never failed for ejection alone), except below a FailClose
-- cart tier. Tier and peer come from one look at each peer: the shared
-- state can change between two looks (another worker ejects a peer), and
-- a tier chosen by one look with its peer chosen by another could have
-- none. A video route picks from its tiers of equal priority as one group
-- (nginx's primary servers are one pool).
local function pick(r, tried, tiers)
  r.rr = r.rr + 1
  local nt = #tiers
  for pass = 1, 2 do
    local i = 1
    while i <= nt do
      local j = i
      if r.video then
        while j < nt and tiers[j + 1].priority == tiers[i].priority do
          j = j + 1
        end
      end
      local bt, bp, bfree, bactive
      local cart = false
      -- Ties go to the first tier looked at: a group starts its look at a
      -- rotating tier.
      local gs = j - i + 1
      for m = 0, gs - 1 do
        local t = tiers[i + (r.rr + m) % gs]
        local p, free, a = best_in_tier(r, t, tried, pass == 2)
        if p and (not bp or (free and not bfree) or (free == bfree and a < bactive)) then
          bt, bp, bfree, bactive = t, p, free, a
        end
        cart = cart or t.use == "cart"
      end
      if bp then
        return bt, bp
      end
      if r.fail_close and cart then
        break
      end
      i = j + 1
    end
  end
  return nil
end

-- connect_failed counts one connection failure of a peer and ejects it
-- after eject_after consecutive ones (a video route: that many within
-- ejection_seconds, nginx's max_fails/fail_timeout), unless that would
-- eject more than max_eject_pct of a backend tier's peers (rounded down).
local function connect_failed(r, t, p)
  if r.eject_after <= 0 or ejected(r, t, p) then
    return
  end
  local fails
  if r.video then
    fails = r.store:incr(pkey("f", t, p), 1, 0, r.eject_secs)
  else
    fails = r.store:incr(pkey("f", t, p), 1, 0)
  end
  if not fails or fails < r.eject_after then
    return
  end
  if t.use == "backend" then
    local out = 0
    for _, q in ipairs(t.peers) do
      if ejected(r, t, q) then out = out + 1 end
    end
    if out + 1 > math.floor(#t.peers * r.max_eject_pct / 100) then
      return
    end
  end
  -- add, not set: two workers can both count past eject_after at once;
  -- only the one whose add succeeds ejects (and counts the ejection).
  if not r.store:add(pkey("e", t, p), true, r.eject_secs) then
    return
  end
  r.store:incr(pkey("n", t, p), 1, 0)
  r.store:set(pkey("f", t, p), 0)
  ngx.log(ngx.WARN, "route ", r.name, ": ejected ", t.use, " peer ", p.host, ":", p.port,
    " for ", r.eject_secs, "s after ", fails, " connection failures")
end

-- release gives back the active slot of a try (when its balance counted
-- one). The try holds its tier and peer objects, so a table change since
-- then still releases the right peer; the count of a peer no longer in the
-- table is deleted when it reaches 0.
local function release(r, x)
  if not x.counted then
    return
  end
  local k = pkey("a", x.t, x.p)
  local v = r.store:incr(k, -1, 1)
  if r.dynamic and v ~= nil and v <= 0 and not r.members[x.key] then
    r.store:delete(k)
  end
end

local function answer_json(v)
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(v))
  return ngx.exit(200)
end

local function tier_state(r, tiers)
  local state = {}
  for ti, t in ipairs(tiers) do
    local peers = {}
    for pi, p in ipairs(t.peers) do
      peers[pi] = {
        host = p.host, port = p.port,
        active = active(r, t, p),
        fails = r.store:get(pkey("f", t, p)) or 0,
        ejected = ejected(r, t, p),
        ejections = r.store:get(pkey("n", t, p)) or 0,
        tries = r.store:get(pkey("t", t, p)) or 0,
        healthy = not unhealthy(r, t, p),
      }
    end
    state[ti] = { use = t.use, peers = peers }
  end
  return state
end

-- split_counts: a canary route's counters (the route's dict: every
-- worker's requests).
local function split_counts(store)
  return {
    requests = { stable = store:get(K_SERVED.stable) or 0, canary = store:get(K_SERVED.canary) or 0 },
    fallthrough = { stable = store:get(K_FELL.stable) or 0, canary = store:get(K_FELL.canary) or 0 },
    draws = store:get(K_DRAWS) or 0,
  }
end

local function status(r)
  local state = tier_state(r, r.tiers)
  local out = {
    route = r.name, options = r.options, tiers = r.tiers,
    registrations = r.registrations, pid = ngx.worker.pid(),
    shared_dict = r.shared, state = state,
  }
  if r.dynamic then
    out.dynamic, out.version, out.serial = true, r.version, r.store:get(K_SERIAL)
  end
  local c = r.canary
  if c then
    local counts = split_counts(r.store)
    out.canary = {
      weight = c.weight, sticky_header = c.sticky_header, override_header = c.override_header,
      sticky_cookie = c.sticky_cookie, tiers = c.tiers, state = tier_state(r, c.tiers),
      requests = counts.requests, fallthrough = counts.fallthrough, draws = counts.draws,
    }
  end
  if ngx.var.arg_strings == "hex" then
    if out.canary then out.canary = hexify(out.canary) end
    out.route, out.options, out.tiers, out.state = hex(r.name), hexify(r.options), hexify(r.tiers), hexify(state)
    if out.version then out.version = hex(out.version) end
  end
  return out
end

local function refuse(code, ...)
  ngx.status = code
  if code == 503 then
    ngx.header["Retry-After"] = "1"
  end
  ngx.header["Content-Type"] = "text/plain"
  ngx.say(...)
  return ngx.exit(code)
end

function M.access(route)
  local r = routes[route]
  if r and r.dynamic then
    sync(r)
    start_probe(r)
  end
  local uri = ngx.var.uri
  -- A video route is a plain proxy: its paths are the backend's.
  if not (r and r.video) then
    if uri == "/_tps_status" then
      local o = r and r.options or {}
      return answer_json({
        route = route, opt_in = o.tps_limit_tps ~= nil,
        tps_limit_tps = tonumber(o.tps_limit_tps), options = o,
      })
    end
    if uri == "/_status" then
      if not r then
        return answer_json({ route = route, registered = false })
      end
      return answer_json(status(r))
    end
  end
  if not r then
    ngx.log(ngx.ERR, "route ", route, " is not registered in this worker")
    return ngx.exit(500)
  end
  if r.dynamic then
    if r.version == nil then
      return refuse(503, "route ", route, ": no peers table yet")
    end
    if r.npeers == 0 then
      return refuse(503, "route ", route, ": the peers table version ", r.version, " has no peer")
    end
  end
  local tiers = r.tiers
  if r.canary then
    tiers = split(r, ngx.ctx)
  end
  if not r.admission then
    return
  end
  -- Admission: the tier that serves now (the first with a peer in the
  -- pick) must have a peer with a free slot. One look at each peer decides
  -- both: another worker can eject a peer between two looks, and a tier
  -- found by one look could have no usable peer at the second (a request
  -- refused for an ejection alone: TestNginxReferenceConf's rare 1/150).
  -- When no peer is in the pick the request is admitted, and balance's
  -- second pass chooses (a request is never failed for ejection alone).
  for _, t in ipairs(tiers) do
    local usable = false
    for _, p in ipairs(t.peers) do
      if not out_of_pick(r, t, p) then
        if has_slot(r, t, p) then
          return
        end
        usable = true
      end
    end
    if usable then
      return refuse(503, "route ", route, ": every peer of the ", t.use, " tier is at its max_concurrency")
    end
    if r.fail_close and t.use == "cart" then
      return
    end
  end
end

-- balance picks the peer of each try. nginx calls it again for the same
-- request only after a try failed without a response (proxy_next_upstream's
-- default "error timeout") and only while set_more_tries allows it. A try
-- records its tier and peer objects and the peer's identity, so a peers
-- table swapped in since the last try neither releases another peer's
-- slot nor lets this request try a peer twice.
function M.balance(route)
  local balancer = require("ngx.balancer")
  local r = routes[route]
  if r.dynamic then
    sync(r)
  end
  local ctx = ngx.ctx
  local tries = ctx.autoconfig_tries
  if not tries then
    tries = {}
    ctx.autoconfig_tries = tries
    -- A canary route has one more try: the fallthrough to the other
    -- version after a connection failure.
    local more = (r.retry and r.max_tries or 1) - 1
    if r.canary then
      more = more + 1
    end
    if more > 0 then
      local ok, err = balancer.set_more_tries(more)
      if not ok then
        ngx.log(ngx.ERR, "set_more_tries: ", err)
      end
    end
  else
    -- The previous try ended without a response: settle it now, so this
    -- try's pick already sees its failure count and ejection.
    local last = tries[#tries]
    local state = balancer.get_last_failure()
    release(r, last)
    last.settled = true
    if state == "failed" then
      connect_failed(r, last.t, last.p)
    end
  end
  local tried = {}
  for _, x in ipairs(tries) do
    tried[x.key] = true
  end
  local v = ctx.autoconfig_version
  local t, p
  if v and r.canary then
    -- A retry of a route that does not retry (the canary's extra try)
    -- goes to the other version; a retrying route's retries stay in the
    -- version while it has an untried peer.
    if #tries == 0 or (r.retry and #tries < r.max_tries) then
      t, p = pick(r, tried, tiers_of(r, v))
    end
    if not t and not ctx.autoconfig_fell then
      ctx.autoconfig_fell = v
      v = OTHER[v]
      ctx.autoconfig_version = v
      t, p = pick(r, tried, tiers_of(r, v))
    end
  else
    t, p = pick(r, tried, r.tiers)
  end
  if not t then
    ngx.log(ngx.ERR, "route ", route, ": no peer left to try")
    return ngx.exit(502)
  end
  -- A route without a log phase (a video file may have none) never
  -- releases its final try: its slots are counted only once its log phase
  -- has been seen in this worker.
  local counted = not r.video or r.log_seen == true
  tries[#tries + 1] = { t = t, p = p, key = ident(t, p), counted = counted }
  if counted then
    r.store:incr(pkey("a", t, p), 1, 0)
  end
  r.store:incr(pkey("t", t, p), 1, 0)
  local ok, err = balancer.set_current_peer(bracketed(p.host), p.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

-- log settles the last try: releases its slot, resets the peer's failure
-- count when nginx got a response (any status) or counts a connection
-- failure when it did not ($upstream_status "502"/"504" with no
-- $upstream_connect_time, i.e. "-").
function M.log(route)
  local r = routes[route]
  if r then
    r.log_seen = true
  end
  local ctx = ngx.ctx
  local v = ctx.autoconfig_version
  if r and v then
    r.store:incr(K_SERVED[v], 1, 0)
    local fell = ctx.autoconfig_fell
    if fell then
      r.store:incr(K_FELL[fell], 1, 0)
    end
  end
  local tries = ctx.autoconfig_tries
  if not r or not tries then
    return
  end
  local last = tries[#tries]
  if not last or last.settled then
    return
  end
  local t, p = last.t, last.p
  release(r, last)
  local connect
  for v in string.gmatch(ngx.var.upstream_connect_time or "", "[^,: ]+") do
    connect = v
  end
  if connect == "-" or connect == nil then
    connect_failed(r, t, p)
  else
    r.store:set(pkey("f", t, p), 0)
  end
end

-- header is the header filter of a canary route's file: X-Model-Version
-- names the version that served (after a fallthrough, the other one), and
-- a keyless request's response sets the sticky cookie (beside any cookie
-- the backend sets).
function M.header(route)
  local ctx = ngx.ctx
  local v = ctx.autoconfig_version
  if not v then
    return
  end
  ngx.header["X-Model-Version"] = v
  local ck = ctx.autoconfig_cookie
  if ck then
    local cur = ngx.header["Set-Cookie"]
    if cur == nil then
      ngx.header["Set-Cookie"] = ck
    elseif type(cur) == "table" then
      cur[#cur + 1] = ck
      ngx.header["Set-Cookie"] = cur
    else
      ngx.header["Set-Cookie"] = { cur, ck }
    end
  end
end

-- probe_one: GET probe_path over a cosocket; true on status 200.
local function probe_one(host, port, path)
  local sock = ngx.socket.tcp()
  sock:settimeouts(1000, 1000, 2000)
  local h = bracketed(host)
  local ok = sock:connect(h, port)
  if not ok then
    return false
  end
  local sent = sock:send("GET " .. path .. " HTTP/1.0\r\nHost: " .. h .. "\r\nUser-Agent: autoconfig-router-probe\r\n\r\n")
  local line = sent and sock:receive("*l")
  sock:close()
  return line ~= nil and string.match(line, "^HTTP/%d%.%d 200") ~= nil
end

-- probe runs in a timer: every peer of every tier with a probe_path (a
-- dynamic route's current table).
probe = function(premature, route)
  local r = routes[route]
  if premature or not r or ngx.worker.exiting() then
    return
  end
  if r.dynamic then
    sync(r)
  end
  local all = r.tiers
  if r.canary then
    all = {}
    for _, t in ipairs(r.tiers) do all[#all + 1] = t end
    for _, t in ipairs(r.canary.tiers) do all[#all + 1] = t end
  end
  for _, t in ipairs(all) do
    -- A path that cannot go into a request line as is (space, control or
    -- non-ASCII byte) is not probed.
    if type(t.probe_path) == "string" and string.match(t.probe_path, "^/[%w%p]*$") then
      for _, p in ipairs(t.peers) do
        local ok, healthy = pcall(probe_one, p.host, p.port, t.probe_path)
        if ok and healthy then
          r.store:set(pkey("u", t, p), nil)
        else
          -- Kept a little longer than one interval, so a worker whose timer
          -- stopped does not pin a peer out forever.
          r.store:set(pkey("u", t, p), true, r.probe_every * 3)
        end
      end
    end
  end
end

-- ---------------------------------------------------------------------
-- The control endpoint (docs/lua-contract.md, "Dynamic peers"): the
-- content handler of the shipped nginx.conf's server on
-- unix:<sock-dir>/autoconfig@control.sock.

-- json encodes a control answer: objects with sorted keys, strings by
-- cjson, whole numbers in full (cjson would round a serial above 10^14).
local function json(v)
  local ty = type(v)
  if ty == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do
      parts[i] = cjson.encode(tostring(k)) .. ":" .. json(v[k])
    end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if ty == "number" and v == math.floor(v) and math.abs(v) <= MAX_SERIAL then
    return string.format("%.0f", v)
  end
  if v == nil then
    return "null"
  end
  return cjson.encode(v)
end

local function control_answer(code, v)
  ngx.status = code
  ngx.header["Content-Type"] = "application/json"
  ngx.say(json(v))
  return ngx.exit(ngx.HTTP_OK)
end

local function control_error(code, msg)
  return control_answer(code, { error = msg })
end

-- route_dict: the shared dict named route, nil when there is none.
local function route_dict(route)
  local ok, dict = pcall(function() return ngx.shared[route] end)
  if ok and type(dict) == "table" and dict.get then
    return dict
  end
  return nil
end

local function peer_count(t)
  local n = 0
  for _, tr in ipairs(t.tiers) do
    n = n + #tr.peers
  end
  if type(t.canary) == "table" and is_array(t.canary.tiers) then
    for _, tr in ipairs(t.canary.tiers) do
      n = n + #tr.peers
    end
  end
  return n
end

-- stored: what route's dict holds (route, version, serial, peers), nil
-- when no table.
local function stored(route, dict)
  local version = dict:get(K_VERSION)
  if version == nil then
    return nil
  end
  local out = { route = route, version = version, serial = dict:get(K_SERIAL) or 0 }
  local text = dict:get(K_TABLE)
  local t = text and cjson.decode(text)
  if type(t) == "table" and is_array(t.tiers) then
    out.peers = peer_count(t)
  end
  return out
end

-- lock serializes the pushes of one route across the workers (a ttl
-- frees it should its holder die).
local function lock(dict)
  for _ = 1, 5000 do
    local ok, err = dict:safe_add(K_LOCK, ngx.worker.pid(), 10)
    if ok then
      return true
    end
    if err ~= "exists" then
      return nil, err
    end
    ngx.sleep(0.001)
  end
  return nil, "timeout"
end

-- forget deletes the state of the peers of old that new does not list (a
-- peer removed and added later starts afresh, and the dict does not fill
-- with the state of gone pods). An active count above 0 stays: the
-- request's log phase releases it and deletes it at 0.
local function forget(dict, old_text, members)
  local old = cjson.decode(old_text)
  if type(old) ~= "table" or not is_array(old.tiers) then
    return
  end
  local all = old.tiers
  if type(old.canary) == "table" and is_array(old.canary.tiers) then
    all = {}
    for _, tr in ipairs(old.tiers) do all[#all + 1] = tr end
    for _, tr in ipairs(old.canary.tiers) do all[#all + 1] = tr end
  end
  for _, tr in ipairs(all) do
    if type(tr) == "table" and type(tr.use) == "string" and is_array(tr.peers) then
      for _, p in ipairs(tr.peers) do
        if type(p) == "table" and p.host ~= nil and p.port ~= nil then
          local id = tr.use .. "|" .. tostring(p.host) .. "|" .. tostring(p.port)
          if not members[id] then
            for _, kind in ipairs(STATE_KINDS) do
              local k = kind .. "|" .. id
              if kind ~= "a" or (dict:get(k) or 0) <= 0 then
                dict:delete(k)
              end
            end
          end
        end
      end
    end
  end
end

-- store_table writes a checked table: the text first, then version and
-- serial, so a reader never sees a version without its table. A write the
-- dict has no room for leaves the last good table (a failed safe_set of a
-- key frees its old value: the old text is written back).
local function store_table(dict, text, version, serial, old_text)
  if old_text ~= text then
    local ok, err = dict:safe_set(K_TABLE, text)
    if not ok then
      if old_text ~= nil and not dict:safe_set(K_TABLE, old_text) then
        ngx.log(ngx.ERR, "control: could not write the last good table back")
      end
      return nil, err
    end
  end
  local old_version, old_serial = dict:get(K_VERSION), dict:get(K_SERIAL)
  local ok, err = dict:safe_set(K_VERSION, version)
  if ok then
    ok, err = dict:safe_set(K_SERIAL, serial)
  end
  if not ok then
    if old_text ~= nil and old_text ~= text then dict:safe_set(K_TABLE, old_text) end
    if old_version ~= nil then dict:safe_set(K_VERSION, old_version) else dict:delete(K_VERSION) end
    if old_serial ~= nil then dict:safe_set(K_SERIAL, old_serial) end
    return nil, err
  end
  return true
end

local function read_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body == nil then
    -- Only when the server's client_body_buffer_size is below the body.
    local file = ngx.req.get_body_file()
    if file then
      local f = io.open(file, "rb")
      if f then
        body = f:read("*a")
        f:close()
      end
    end
  end
  return body
end

local function put_peers(route)
  local dict = route_dict(route)
  if not dict then
    return control_error(404, "no lua_shared_dict named " .. route .. " (route not in this configuration yet)")
  end
  local sh = ngx.var.http_x_autoconfig_serial
  local serial = type(sh) == "string" and string.match(sh, "^%d+$") and tonumber(sh)
  if not serial or serial > MAX_SERIAL then
    return control_error(400, "X-Autoconfig-Serial must be a whole number from 0 to 2^53")
  end
  local body = read_body()
  if body == nil or body == "" then
    return control_error(400, "empty body")
  end
  local t, err = decode_table(body, route)
  if not t then
    return control_error(400, err)
  end
  local ok, lerr = lock(dict)
  if not ok then
    if lerr == "no memory" then
      return control_error(507, "dict " .. route .. " is full")
    end
    return control_error(503, "another push holds the lock: " .. tostring(lerr))
  end
  local held = tonumber(dict:get(K_SERIAL))
  if held and serial < held then
    dict:delete(K_LOCK)
    return control_answer(409, { error = "serial " .. sh .. " is lower than the stored serial", serial = held,
      version = dict:get(K_VERSION) })
  end
  local old_text = dict:get(K_TABLE)
  local sok, serr = store_table(dict, body, t.version, serial, old_text)
  if not sok then
    dict:delete(K_LOCK)
    ngx.log(ngx.ERR, "control: route ", route, ": table version ", t.version, " (", #body,
      " bytes) refused: ", serr, "; keeping the last good table")
    return control_answer(507, { error = "dict " .. route .. " has no room for the table (" .. #body ..
      " bytes): " .. tostring(serr) .. "; the last good table stays", version = dict:get(K_VERSION) })
  end
  if old_text ~= nil and old_text ~= body then
    local _, members = build(t)
    forget(dict, old_text, members)
  end
  dict:delete(K_LOCK)
  return control_answer(200, { route = route, version = t.version, serial = serial, peers = peer_count(t) })
end

-- control is the content handler of the control server: PUT and GET
-- /peers/<route>, GET /peers. A proxied request (X-Real-IP, which the
-- dispatch server sets) is refused.
function M.control()
  if ngx.var.http_x_real_ip ~= nil then
    return control_error(403, "the control endpoint answers local callers on its unix socket only")
  end
  local method = ngx.req.get_method()
  local uri = ngx.var.uri
  if uri == "/peers" or uri == "/peers/" then
    if method ~= "GET" then
      return control_error(405, "GET /peers")
    end
    local out = {}
    for name in pairs(ngx.shared) do
      local dict = route_dict(name)
      local version = dict and dict:get(K_VERSION)
      if version ~= nil then
        out[name] = { version = version, serial = dict:get(K_SERIAL) or 0 }
      end
    end
    -- json() writes an empty table as {}.
    return control_answer(200, { routes = out })
  end
  local sroute = string.match(uri, "^/canary/([^/]+)$")
  if sroute then
    -- A canary route's counters (its dict), also for a video route, whose
    -- own paths are the backend's.
    local dict = route_dict(sroute)
    if method ~= "GET" then
      return control_error(405, "GET /canary/<route>")
    end
    if not dict then
      return control_error(404, "no lua_shared_dict named " .. sroute)
    end
    local out = split_counts(dict)
    out.route = sroute
    return control_answer(200, out)
  end
  local route = string.match(uri, "^/peers/([^/]+)$")
  if not route then
    return control_error(404, "no such path: GET /peers, GET or PUT /peers/<route>")
  end
  if method == "PUT" then
    return put_peers(route)
  end
  if method == "GET" then
    local dict = route_dict(route)
    local out = dict and stored(route, dict)
    if not out then
      return control_error(404, "no peers table for route " .. route)
    end
    return control_answer(200, out)
  end
  return control_error(405, "GET or PUT /peers/<route>")
end

return M
