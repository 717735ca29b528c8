-- router: the reference routing engine of an autoconfig llm route file
-- (docs/lua-contract.md). Runs on stock openresty (and on Debian's nginx +
-- libnginx-mod-http-lua + lua-cjson, which is what the repository's tests
-- load it with).
--
-- REFERENCE, implemented here:
--   * registered / register_route / access / balance / log, as the contract
--     calls them (registration lazily, once per worker and route);
--   * priority tiers, highest first; a lower tier serves only when every
--     peer of every higher tier is ejected, failed its health probe or was
--     already tried by this request (FailClose: never below a cart tier);
--   * per-peer concurrency limits (tier max_concurrency): a request is
--     admitted only when a peer of its tier has a free slot (else 503 with
--     Retry-After: 1); least connections within a tier, ties round-robin;
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
--     first registration in a worker;
--   * GET /_tps_status (the route's own endpoint, seen after the prefix
--     strip): JSON with the route's options, opt_in = true when
--     tps_limit_tps is set;
--   * GET /_status: JSON of what register_route received (route, options,
--     tiers, registrations in this worker, worker pid) and the live peer
--     state; with ?strings=hex every string (keys too) is hex-encoded, so
--     arbitrary bytes (NUL, invalid UTF-8) survive JSON exactly.
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
-- (keys name the peer by tier use, host and port, never by index). Without
-- it, a worker-local table holds it (per worker; lost on reload). Known
-- limit: a worker that crashes mid-request leaves its active counts in the
-- shared dict (they are released only by the log phase).
--
-- No request header is read for peer choice: peers come only from
-- register_route.
local cjson = require("cjson.safe")

local M = {}
local routes = {}

-- store: ngx.shared[route] when configured, else a worker-local table with
-- the same small interface (get, set and add with ttl, incr with init).
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
  function s:incr(k, d, init)
    local v = (self:get(k) or init or 0) + d
    data[k] = v
    return v
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

-- peer key in the store: tier use and address, so the state stays right
-- across reloads that reorder or change the peers.
local function pkey(kind, t, p)
  return kind .. "|" .. t.use .. "|" .. p.host .. "|" .. p.port
end

-- bracketed: the host as nginx parses an address; an IPv6 host (given
-- bare, as the contract writes it) in brackets.
local function bracketed(host)
  if string.find(host, ":", 1, true) then
    return "[" .. host .. "]"
  end
  return host
end

local probe

function M.registered(route)
  return routes[route] ~= nil
end

function M.register_route(route, options, tiers)
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
    rr = 0,
  }
  routes[route] = r
  if not prev and r.probe_every > 0 then
    local has_probe = false
    for _, t in ipairs(r.tiers) do
      has_probe = has_probe or type(t.probe_path) == "string"
    end
    if has_probe then
      local ok, err = ngx.timer.every(r.probe_every, probe, route)
      if not ok then
        ngx.log(ngx.ERR, "route ", route, ": health probe timer: ", err)
      end
    end
  end
end

local function active(r, t, p) return r.store:get(pkey("a", t, p)) or 0 end
local function ejected(r, t, p) return r.store:get(pkey("e", t, p)) ~= nil end
local function unhealthy(r, t, p) return r.store:get(pkey("u", t, p)) ~= nil end
local function out_of_pick(r, t, p) return ejected(r, t, p) or unhealthy(r, t, p) end

local function has_slot(r, t, p)
  return t.max_concurrency == nil or active(r, t, p) < t.max_concurrency
end

-- best_in_tier returns the index of tier t's untried peer with the fewest
-- active requests, preferring peers under their max_concurrency (ties
-- rotate); with ignore_out, ejected and unhealthy peers count too. nil when
-- the tier has no such peer.
local function best_in_tier(r, ti, t, tried, ignore_out)
  local n = #t.peers
  local best, best_free, best_active
  for k = 0, n - 1 do
    local pi = (r.rr + k) % n + 1
    local p = t.peers[pi]
    if not tried[ti .. ":" .. pi] and (ignore_out or not out_of_pick(r, t, p)) then
      local a = active(r, t, p)
      local free = has_slot(r, t, p)
      if not best or (free and not best_free) or (free == best_free and a < best_active) then
        best, best_free, best_active = pi, free, a
      end
    end
  end
  return best
end

-- pick returns tier and peer index for the next try: the best usable
-- untried peer of the first tier that has one. When every peer is out of
-- the pick, the first tier with an untried peer is used anyway (a request
-- is never failed for ejection alone), except below a FailClose cart tier.
-- Tier and peer come from one look at each peer: the shared state can
-- change between two looks (another worker ejects a peer), and a tier
-- chosen by one look with its peer chosen by another could have none.
local function pick(r, tried)
  r.rr = r.rr + 1
  for pass = 1, 2 do
    for ti, t in ipairs(r.tiers) do
      local pi = best_in_tier(r, ti, t, tried, pass == 2)
      if pi then
        return ti, pi
      end
      if r.fail_close and t.use == "cart" then
        break
      end
    end
  end
  return nil
end

-- connect_failed counts one connection failure of a peer and ejects it
-- after eject_after consecutive ones, unless that would eject more than
-- max_eject_pct of a backend tier's peers (rounded down).
local function connect_failed(r, t, p)
  if r.eject_after <= 0 or ejected(r, t, p) then
    return
  end
  local fails = r.store:incr(pkey("f", t, p), 1, 0)
  if fails < r.eject_after then
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

local function answer_json(v)
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(v))
  return ngx.exit(200)
end

local function status(r)
  local state = {}
  for ti, t in ipairs(r.tiers) do
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
  local out = {
    route = r.name, options = r.options, tiers = r.tiers,
    registrations = r.registrations, pid = ngx.worker.pid(),
    shared_dict = r.shared, state = state,
  }
  if ngx.var.arg_strings == "hex" then
    out.route, out.options, out.tiers, out.state = hex(r.name), hexify(r.options), hexify(r.tiers), hexify(state)
  end
  return out
end

function M.access(route)
  local r = routes[route]
  local uri = ngx.var.uri
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
  if not r then
    ngx.log(ngx.ERR, "route ", route, " is not registered in this worker")
    return ngx.exit(500)
  end
  -- Admission: the tier that serves now (the first with a peer in the
  -- pick) must have a peer with a free slot. One look at each peer decides
  -- both: another worker can eject a peer between two looks, and a tier
  -- found by one look could have no usable peer at the second (a request
  -- refused for an ejection alone: TestNginxReferenceConf's rare 1/150).
  -- When no peer is in the pick the request is admitted, and balance's
  -- second pass chooses (a request is never failed for ejection alone).
  for _, t in ipairs(r.tiers) do
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
      ngx.status = 503
      ngx.header["Retry-After"] = "1"
      ngx.header["Content-Type"] = "text/plain"
      ngx.say("route ", route, ": every peer of the ", t.use, " tier is at its max_concurrency")
      return ngx.exit(503)
    end
    if r.fail_close and t.use == "cart" then
      return
    end
  end
end

-- balance picks the peer of each try. nginx calls it again for the same
-- request only after a try failed without a response (proxy_next_upstream's
-- default "error timeout") and only while set_more_tries allows it.
function M.balance(route)
  local balancer = require("ngx.balancer")
  local r = routes[route]
  local ctx = ngx.ctx
  local tries = ctx.autoconfig_tries
  if not tries then
    tries = {}
    ctx.autoconfig_tries = tries
    if r.retry and r.max_tries > 1 then
      local ok, err = balancer.set_more_tries(r.max_tries - 1)
      if not ok then
        ngx.log(ngx.ERR, "set_more_tries: ", err)
      end
    end
  else
    -- The previous try ended without a response: settle it now, so this
    -- try's pick already sees its failure count and ejection.
    local last = tries[#tries]
    local state = balancer.get_last_failure()
    local t, p = r.tiers[last[1]], r.tiers[last[1]].peers[last[2]]
    r.store:incr(pkey("a", t, p), -1, 1)
    last.settled = true
    if state == "failed" then
      connect_failed(r, t, p)
    end
  end
  local tried = {}
  for _, x in ipairs(tries) do
    tried[x[1] .. ":" .. x[2]] = true
  end
  local ti, pi = pick(r, tried)
  if not ti then
    ngx.log(ngx.ERR, "route ", route, ": no peer left to try")
    return ngx.exit(502)
  end
  tries[#tries + 1] = { ti, pi }
  local t = r.tiers[ti]
  local p = t.peers[pi]
  r.store:incr(pkey("a", t, p), 1, 0)
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
  local tries = ngx.ctx.autoconfig_tries
  if not r or not tries then
    return
  end
  local last = tries[#tries]
  if not last or last.settled then
    return
  end
  local t = r.tiers[last[1]]
  local p = t.peers[last[2]]
  r.store:incr(pkey("a", t, p), -1, 1)
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

-- probe runs in a timer: every peer of every tier with a probe_path.
probe = function(premature, route)
  local r = routes[route]
  if premature or not r or ngx.worker.exiting() then
    return
  end
  for _, t in ipairs(r.tiers) do
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

return M
