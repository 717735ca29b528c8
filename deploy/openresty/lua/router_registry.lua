-- router_registry: the routes registered in this worker (router_probe's
-- routes table): register_route, register_dynamic_route, configure, the
-- options as the engine uses them (clamped), a dynamic route's refresh
-- and the start of its probe timer (docs/lua-contract.md,
-- "register_route" and "Dynamic peers").
local state = require("router_state")
local tbl = require("router_table")
local canary = require("router_canary")
local affinity = require("router_affinity")
local slo = require("router_slo")
local probe_mod = require("router_probe")
local hold = require("router_hold")
local gauges = require("router_gauges")

local num, clamp = state.num, state.clamp
local sync, config = tbl.sync, tbl.config

local M = {}
local routes = probe_mod.routes
M.routes = routes

local function probe_interval(n)
  if n <= 0 then return 0 end
  return clamp(n, 1, 3600)
end

function M.registered(route)
  return routes[route] ~= nil
end

-- configure is called from the shipped nginx.conf's init_by_lua_block:
-- peers_dir is the directory of the peers_<route>.json seed files (the
-- routes ConfigMap's mount); worker_connections and hold_engine_max bound
-- the engine's held requests (router_hold.configure).
function M.configure(opts)
  opts = opts or {}
  config.peers_dir = type(opts.peers_dir) == "string" and opts.peers_dir or nil
  hold.configure(opts)
end

-- start_probe starts the route's probe timer once per worker, when a tier
-- has a probe path and probing is on.
function M.start_probe(r)
  if r.probing or r.probe_every <= 0 or not r.has_probe then
    return
  end
  r.probing = true
  local ok, err = ngx.timer.every(r.probe_every, probe_mod.run, r.name)
  if not ok then
    ngx.log(ngx.ERR, "route ", r.name, ": health probe timer: ", err)
  end
end
local start_probe = M.start_probe

local function new_route(route, options, tiers)
  local prev = routes[route]
  local o = options or {}
  local store, shared = state.store_for(route)
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
    labels = {},
  }
  r.slo = slo.config(o)
  r.hold = hold.config(o)
  if r.video then
    r.slo.adaptive = false
  end
  routes[route] = r
  return r, prev
end

-- set_affinity: the route's affinity settings (its canary's split names
-- the session header and cookie).
local function set_affinity(r)
  r.aff = affinity.config(r.options, r.canary)
  if r.video then
    r.aff.on = false
  end
end

-- register_route: canary (optional) is the route's second version,
-- { weight, sticky_header, override_header, sticky_cookie, tiers }.
function M.register_route(route, options, tiers, c)
  local r, prev = new_route(route, options, tiers)
  for _, t in ipairs(r.tiers) do
    r.has_probe = r.has_probe or type(t.probe_path) == "string"
  end
  if type(c) == "table" then
    r.canary = canary.make(c, type(c.tiers) == "table" and c.tiers or {})
    for _, t in ipairs(r.canary.tiers) do
      r.has_probe = r.has_probe or type(t.probe_path) == "string"
    end
  end
  set_affinity(r)
  gauges.remember(r)
  if r.hold.timeout > 0 then
    hold.registered(r)
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
  set_affinity(r)
  if r.hold.timeout > 0 then
    hold.registered(r)
  end
  if not r.shared then
    ngx.log(ngx.ERR, "route ", route, ": no lua_shared_dict named ", route,
      ": the control endpoint cannot reach this route (seed file only, per worker)")
  end
end

-- refresh: a dynamic route's current table (and the affinity settings of
-- its canary, which the table carries).
function M.refresh(r)
  local v = r.version
  sync(r)
  if r.version ~= v then
    set_affinity(r)
  end
end

return M
