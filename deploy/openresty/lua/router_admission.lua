-- router_admission: a request's slots and its admission
-- (docs/lua-contract.md, "Admission (decode SLO)" and "Failure modes").
--
-- A slot is one request in flight on a peer: its "a|<peer>" count and its
-- tier's "i|<use>" count in the route's store (router_state). The slot of
-- the first try is taken in the access phase, with the pick that admits
-- the request (plan; the balancer uses it, or unplan gives it back); a
-- retry's slot in the balancer (take); a try's slot is given back
-- (release) when the balancer sees it failed or in the log phase
-- (settle), which also counts a connection failure and ejects a peer
-- after enough of them (connect_failed).
--
-- The admission: the tier that serves now (the first with a peer in the
-- pick) must have a peer under its limit (router_slo.limit_of), else the
-- request is refused at once, 503 with Retry-After: 1.
--
-- decide, release, unplan and settle run outside nginx too (busted,
-- spec/admission_spec.lua).
local state = require("router_state")
local pick_mod = require("router_pick")
local slo = require("router_slo")
local metrics = require("router_metrics")
local count = require("router_count")

local ident, pkey, tkey, addr, ejected = state.ident, state.pkey, state.tkey, state.addr, state.ejected
local pick, limit_of = pick_mod.pick, slo.limit_of

local M = {}

-- connect_failed counts one connection failure of a peer and ejects it
-- after eject_after consecutive ones (a video route: that many within
-- ejection_seconds, nginx's max_fails/fail_timeout), unless that would
-- eject more than max_eject_pct of a backend tier's peers (rounded down).
function M.connect_failed(r, t, p)
  if r.eject_after <= 0 or ejected(r, t, p) then
    return
  end
  local fails
  if r.video then
    fails = state.incr(r, pkey("f", t, p), 1, r.eject_secs)
  else
    fails = state.incr(r, pkey("f", t, p), 1)
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
  if not state.add(r, pkey("e", t, p), true, r.eject_secs) then
    return
  end
  state.incr(r, pkey("n", t, p), 1)
  state.set(r, pkey("f", t, p), 0)
  local d = count.dict()
  if d then
    metrics.inc(d, "autoconfig_engine_ejections_total", metrics.labels("route", r.name, "peer", addr(t, p)), 1)
  end
  ngx.log(ngx.WARN, "route ", r.name, ": ejected ", t.use, " peer ", p.host, ":", p.port,
    " for ", r.eject_secs, "s after ", fails, " connection failures")
end
local connect_failed = M.connect_failed

-- take takes a slot of peer p of tier t.
function M.take(r, t, p)
  state.incr(r, pkey("a", t, p), 1)
  state.incr(r, tkey(t), 1)
end
local take = M.take

-- release gives back the active slot of a try (when its balance counted
-- one). The try holds its tier and peer objects, so a table change since
-- then still releases the right peer; the count of a peer no longer in the
-- table is deleted when it reaches 0.
function M.release(r, x)
  if not x.counted then
    return
  end
  local k = pkey("a", x.t, x.p)
  local v = state.decr(r, k)
  state.decr(r, tkey(x.t))
  if r.dynamic and v ~= nil and v <= 0 and not r.members[x.key] then
    r.store:delete(k)
  end
end
local release = M.release

-- plan takes the slot of the first try's peer in the access phase and
-- records it in ctx for the balancer.
function M.plan(r, ctx, t, p)
  -- The planned peer's slot is taken now, not in the balancer: the
  -- next request's pick (in any worker) already counts it, so a burst
  -- cannot overshoot a limit or the bounded load between the two phases.
  take(r, t, p)
  ctx.autoconfig_plan = { t = t, p = p, version = r.version, held = true }
end

-- unplan gives back the slot access took for a plan the balancer did not
-- use (the table changed in between, or no try was made).
function M.unplan(r, ctx)
  local plan = ctx.autoconfig_plan
  if plan and plan.held then
    plan.held = false
    release(r, { t = plan.t, p = plan.p, key = ident(plan.t, plan.p), counted = true })
  end
end

-- failed_try settles a try that ended without a response (the balancer
-- is called again): its slot is given back, and a connection failure
-- (st, ngx.balancer.get_last_failure()'s "failed") is counted.
function M.failed_try(r, x, st)
  release(r, x)
  x.settled = true
  if st == "failed" then
    connect_failed(r, x.t, x.p)
  end
end

-- settle settles the last try x in the log phase: releases its slot,
-- resets the peer's failure count when nginx got a response (any status)
-- or counts a connection failure when it did not ($upstream_connect_time,
-- connect: its last value "-", or none).
function M.settle(r, x, connect_time)
  local t, p = x.t, x.p
  release(r, x)
  local connect
  for v in string.gmatch(connect_time or "", "[^,: ]+") do
    connect = v
  end
  if connect == "-" or connect == nil then
    connect_failed(r, t, p)
  else
    state.set(r, pkey("f", t, p), 0)
  end
end

-- decide is the first try's pick and the admission of a request over
-- tiers (kh: its affinity key's hash, or nil): the tier that serves now
-- (the first with a peer in the pick) must have a peer under its limit.
-- One look at each peer decides both (another worker can eject a peer
-- between two looks). When no peer is in the pick the request is
-- admitted, and the pick's second pass chooses (a request is never
-- failed for ejection alone). It returns the tier, peer and placement
-- (t nil: no peer at all), or, refused, the reason and the serving tier:
-- nil, nil, nil, why, tier.
function M.decide(r, tiers, kh)
  local t, p, free, inpick, place = pick(r, {}, tiers, kh, limit_of)
  if t and inpick and not free and r.admission then
    return nil, nil, nil, r.slo.adaptive and "adaptive_limit" or "max_concurrency", t
  end
  return t, p, place
end

-- refuse answers the request itself (no peer is tried); a 503 carries
-- Retry-After: 1 and counts as an admission refusal for reason.
function M.refuse(r, code, reason, ...)
  ngx.status = code
  if code == 503 then
    ngx.header["Retry-After"] = "1"
  end
  ngx.header["Content-Type"] = "text/plain"
  if r and reason then
    local d = count.dict()
    if d then
      local v = ngx.ctx.autoconfig_version
      metrics.inc(d, "autoconfig_engine_admission_refusals_total",
        metrics.labels("route", r.name, "version", v, "reason", reason), 1)
    end
  end
  ngx.say(...)
  return ngx.exit(code)
end

-- admit decides an llm request (req, the request record) of route r over
-- tiers: refused (503), or its first try planned.
function M.admit(r, ctx, req, tiers, kh)
  local t, p, place, why, full = M.decide(r, tiers, kh)
  if why then
    return M.refuse(r, 503, why, "route ", r.name, ": every peer of the ", full.use,
      " tier is at its ", r.slo.adaptive and "adaptive concurrency limit" or "max_concurrency")
  end
  if t then
    M.plan(r, ctx, t, p)
    req.place = place or "keyless"
  end
end

return M
