-- router: the reference routing engine of autoconfig's route files
-- (docs/lua-contract.md). Runs on stock openresty and on Debian's nginx +
-- libnginx-mod-http-lua + lua-cjson (what the repository's tests load it
-- with). This module is the contract's entry points and nothing else:
-- each phase delegates to the modules of its concepts, all in this
-- directory (flat, so a ConfigMap can carry them):
--
--   router_registry  the routes of this worker: registration, options,
--                    a dynamic route's refresh, the probe timer
--   router_state     the route's store (its shared dict) and peer keys
--   router_table     the peers table: check, build, seed, per-request sync
--   router_canary    the split between a canary route's two versions
--   router_affinity  the affinity key of an llm request (header, cookie,
--                    body: router_body)
--   router_pick      placement: tiers, the affinity ring with bounded
--                    loads (router_ring, router_hash), least load
--   router_admission a request's slots (plan, take, release, settle),
--                    connection failures and ejection, the admission
--   router_balance   the balancer phase: the tries of a request
--   router_slo       decode-SLO admission: adaptive per-peer limits
--                    (router_aimd)
--   router_measure   measuring an answer (body filter) and settling it
--   router_sse       tokens and usage of a streamed or JSON answer
--   router_status    the route's own endpoints: /_status, /_tps_status
--   router_count     what the phases count (router_metrics stores it;
--                    GET /metrics on the shipped nginx.conf's port 9145)
--   router_gauges    the scrape's gauges, read from the route dicts
--   router_probe     active health probes
--   router_control   the control endpoint (peers pushes, demand)
--   router_hold      scale to zero: holding requests, the open count
--   router_cut       streamed answers cut before their end
--
-- What the engine does, by phase:
--   access   registration is lazy (once per worker and route); the
--            route's own endpoints (/_status, /_tps_status); the canary
--            version; the affinity key; the pick of the first try, which
--            is also the admission (every usable peer at its limit →
--            503 with Retry-After: 1);
--   balance  the first try's peer as access chose it (unless the table
--            changed since), retries on connection failures to untried
--            peers (FailOpen), ejection;
--   body     (the shipped nginx.conf's http-level body_filter_by_lua)
--            first token time, decode rate, usage;
--   log      releases the try, feeds the adaptive limit, counts metrics.
-- Video routes (option kind = "video") are plain proxies: no engine
-- endpoint, no body read, no token accounting.
--
-- No request header names a peer: peers come only from register_route or
-- the peers table. Header, cookie and body values are hashed (affinity,
-- canary bucket) or compared, never evaluated.
local state = require("router_state")
local canary = require("router_canary")
local pick_mod = require("router_pick")
local affinity = require("router_affinity")
local metrics = require("router_metrics")
local control_mod = require("router_control")
local hold = require("router_hold")
local cut = require("router_cut")
local gauges = require("router_gauges")
local registry = require("router_registry")
local admission = require("router_admission")
local balance_mod = require("router_balance")
local measure = require("router_measure")
local status_mod = require("router_status")
local count = require("router_count")

local addr = state.addr
local refresh, start_probe = registry.refresh, registry.start_probe
local refuse, count_hold = admission.refuse, count.hold

local M = {}
local routes = registry.routes

-- A state write the route's dict had no room for (router_state): counted
-- and logged (router_count).
state.on_failure = count.state_failure

-- Registration (router_registry): the route file calls registered and
-- register_route or register_dynamic_route in its access phase, the
-- shipped nginx.conf calls configure in init_by_lua_block.
M.registered = registry.registered
M.configure = registry.configure
M.register_route = registry.register_route
M.register_dynamic_route = registry.register_dynamic_route

-- access runs for every request of the route (the route file's access
-- phase, after registration).
function M.access(route)
  local r = routes[route]
  if r and r.dynamic then
    refresh(r)
    start_probe(r)
  end
  local uri = ngx.var.uri
  -- A video route is a plain proxy: its paths are the backend's.
  if not (r and r.video) then
    if uri == "/_tps_status" then
      return status_mod.tps(route, r)
    end
    if uri == "/_status" then
      return status_mod.route(route, r)
    end
  end
  if not r then
    ngx.log(ngx.ERR, "route ", route, " is not registered in this worker")
    return ngx.exit(500)
  end
  if r.hold.timeout > 0 then
    hold.arrive(r, ngx.ctx)
    if not hold.has_peer(r) then
      local result, waited, reason = hold.wait(r, function()
        if r.dynamic then refresh(r) else hold.sync_static(r) end
      end)
      count_hold(r, result, waited)
      if reason then
        return refuse(r, 503, reason, hold.why(r, reason))
      end
      start_probe(r)
    end
  end
  if r.dynamic then
    if r.version == nil then
      return refuse(r, 503, "no_peers", "route ", route, ": no peers table yet")
    end
    if r.npeers == 0 then
      return refuse(r, 503, "no_peers", "route ", route, ": the peers table version ", r.version, " has no peer")
    end
  end
  local ctx = ngx.ctx
  local tiers = r.tiers
  if r.canary then
    tiers = canary.split(r, ctx)
  end
  if r.video then
    return
  end
  -- An llm request: the body filter and the log phase measure it.
  local req = { r = r, start = ngx.req.start_time() }
  ctx.autoconfig_req = req
  local kh
  if r.aff.on then
    local key = affinity.key(r)
    if key then
      req.key = key
      kh = pick_mod.keyhash(key)
    end
  end
  -- The first try's pick is the admission (router_admission): refused,
  -- or the planned peer's slot is taken now.
  return admission.admit(r, ctx, req, tiers, kh)
end

-- balance picks the peer of each try (router_balance).
function M.balance(route)
  local r = routes[route]
  if r.dynamic then
    refresh(r)
  end
  return balance_mod.balance(r, ngx.ctx)
end

-- body is the http-level body filter of the shipped nginx.conf: it
-- measures an llm answer as it passes (router_measure).
function M.body()
  return measure.body()
end

-- log settles the last try: releases its slot, resets the peer's failure
-- count when nginx got a response (any status) or counts a connection
-- failure when it did not ($upstream_status "502"/"504" with no
-- $upstream_connect_time, i.e. "-"); it counts the request's metrics.
function M.log(route)
  local r = routes[route]
  if r then
    r.log_seen = true
  end
  local ctx = ngx.ctx
  hold.leave(ctx)
  local v = ctx.autoconfig_version
  if r and v then
    count.version(r, v, ctx.autoconfig_fell)
  end
  local tries = ctx.autoconfig_tries
  if not r then
    return
  end
  admission.unplan(r, ctx)
  local last = tries and tries[#tries]
  count.request(r, v, last and addr(last.t, last.p) or "", ngx.status)
  local req = ctx.autoconfig_req
  if req and last then
    count.placement(r, v, req.place)
    measure.settle(r, req, last.t, last.p, v)
    cut.count(count.dict(), r, req, v)
  end
  if not last or last.settled then
    return
  end
  admission.settle(r, last, ngx.var.upstream_connect_time)
end

-- header is the header filter of a canary route's file: X-Model-Version
-- names the version that served (after a fallthrough, the other one), and
-- a keyless request's response sets the sticky cookie (beside any cookie
-- the backend sets).
function M.header(route) -- luacheck: ignore 212 (the contract's signature: the route file passes its route)
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

-- ---------------------------------------------------------------------
-- GET /metrics (the shipped nginx.conf's port 9145).

-- The gauges read the route dicts' peer state (router_gauges).
function M.metrics()
  return metrics.handler(count.dict(), gauges.collect)
end

-- control is the content handler of the control server (router_control).
function M.control()
  return control_mod.handle()
end

return M
