-- router_balance: the balancer phase, the tries of a request: how many
-- nginx may make, the peer of each (the first as access planned it), and
-- the settling of a try that ended without a response (router_admission
-- holds the slots).
local state = require("router_state")
local canary = require("router_canary")
local pick_mod = require("router_pick")
local slo = require("router_slo")
local admission = require("router_admission")

local ident, pkey, bracketed = state.ident, state.pkey, state.bracketed
local pick, limit_of = pick_mod.pick, slo.limit_of
local tiers_of, OTHER = canary.tiers_of, canary.OTHER

local M = {}

-- reachable: the peers a request may try in tiers (a FailClose route
-- never goes below its cart tier).
local function reachable(r, tiers)
  local n = 0
  for _, t in ipairs(tiers) do
    n = n + #t.peers
    if r.fail_close and t.use == "cart" then
      break
    end
  end
  return n
end
M.reachable = reachable

-- balance picks the peer of each try of route r's request (ctx, its
-- ngx.ctx). nginx calls it again for the same request only after a try
-- failed without a response (proxy_next_upstream's default "error
-- timeout") and only while set_more_tries allows it. A try records its
-- tier and peer objects and the peer's identity, so a peers table swapped
-- in since the last try neither releases another peer's slot nor lets
-- this request try a peer twice.
function M.balance(r, ctx)
  local balancer = require("ngx.balancer")
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
    -- Never more tries than peers to try: nginx answers 502 itself once
    -- the tries are used up; a balancer call with no peer left could only
    -- fail the request with a 500.
    local n = reachable(r, r.tiers)
    if r.canary then
      n = n + reachable(r, r.canary.tiers)
    end
    if more > n - 1 then
      more = n - 1
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
    local st = balancer.get_last_failure()
    admission.failed_try(r, last, st)
  end
  local tried = {}
  for _, x in ipairs(tries) do
    tried[x.key] = true
  end
  local req = ctx.autoconfig_req
  local kh = req and req.key and pick_mod.keyhash(req.key) or nil
  local v = ctx.autoconfig_version
  local t, p
  local plan = ctx.autoconfig_plan
  local held = false
  if #tries == 0 and plan and plan.held and plan.version == r.version then
    t, p, held = plan.t, plan.p, true
    plan.held = false
  elseif v and r.canary then
    -- A retry of a route that does not retry (the canary's extra try)
    -- goes to the other version; a retrying route's retries stay in the
    -- version while it has an untried peer.
    if #tries == 0 or (r.retry and #tries < r.max_tries) then
      t, p = pick(r, tried, tiers_of(r, v), kh, limit_of)
    end
    if not t and not ctx.autoconfig_fell then
      ctx.autoconfig_fell = v
      v = OTHER[v]
      ctx.autoconfig_version = v
      t, p = pick(r, tried, tiers_of(r, v), kh, limit_of)
    end
  else
    t, p = pick(r, tried, r.tiers, kh, limit_of)
  end
  if #tries == 0 and not held then
    admission.unplan(r, ctx)
  end
  if not t then
    ngx.log(ngx.ERR, "route ", r.name, ": no peer left to try")
    return ngx.exit(502)
  end
  -- A route without a log phase (a video file may have none) never
  -- releases its final try: its slots are counted only once its log phase
  -- has been seen in this worker.
  local counted = not r.video or r.log_seen == true
  tries[#tries + 1] = { t = t, p = p, key = ident(t, p), counted = counted }
  if counted and not held then
    admission.take(r, t, p)
  end
  state.incr(r, pkey("t", t, p), 1)
  local ok, err = balancer.set_current_peer(bracketed(p.host), p.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

return M
