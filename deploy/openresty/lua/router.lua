-- router: the reference routing engine of autoconfig's route files
-- (docs/lua-contract.md). Runs on stock openresty and on Debian's nginx +
-- libnginx-mod-http-lua + lua-cjson (what the repository's tests load it
-- with). This module is the contract's entry points; each concept lives
-- in a module of its own, all in this directory (flat, so a ConfigMap
-- can carry them):
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
--   router_slo       decode-SLO admission: adaptive per-peer limits
--                    (router_aimd)
--   router_sse       tokens and usage of a streamed or JSON answer
--   router_metrics   Prometheus counters and histograms (GET /metrics on
--                    the shipped nginx.conf's port 9145)
--   router_count     what the phases count in the metrics dict
--   router_status    the route's own endpoints: /_status, /_tps_status
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
local slo = require("router_slo")
local sse = require("router_sse")
local metrics = require("router_metrics")
local control_mod = require("router_control")
local hold = require("router_hold")
local cut = require("router_cut")
local gauges = require("router_gauges")
local registry = require("router_registry")
local status_mod = require("router_status")
local count = require("router_count")

local ident, pkey, tkey, addr = state.ident, state.pkey, state.tkey, state.addr
local active, ejected, out_of_pick = state.active, state.ejected, state.out_of_pick
local bracketed = state.bracketed
local K_SERVED, K_FELL, OTHER = canary.K_SERVED, canary.K_FELL, canary.OTHER
local pick, limit_of = pick_mod.pick, slo.limit_of

local M = {}
local routes = registry.routes
local reachable
local metrics_dict, lv, count_request, count_hold = count.dict, count.lv, count.request, count.hold
local refresh, start_probe = registry.refresh, registry.start_probe

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

-- ---------------------------------------------------------------------
-- Failures and slots.

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
  local d = metrics_dict()
  if d then
    metrics.inc(d, "autoconfig_engine_ejections_total", metrics.labels("route", r.name, "peer", addr(t, p)), 1)
  end
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
  local v = state.decr(r, k)
  state.decr(r, tkey(x.t))
  if r.dynamic and v ~= nil and v <= 0 and not r.members[x.key] then
    r.store:delete(k)
  end
end

-- refuse answers the request itself (no peer is tried); a 503 carries
-- Retry-After: 1 and counts as an admission refusal for reason.
local function refuse(r, code, reason, ...)
  ngx.status = code
  if code == 503 then
    ngx.header["Retry-After"] = "1"
  end
  ngx.header["Content-Type"] = "text/plain"
  if r and reason then
    local d = metrics_dict()
    if d then
      local v = ngx.ctx.autoconfig_version
      metrics.inc(d, "autoconfig_engine_admission_refusals_total",
        metrics.labels("route", r.name, "version", v, "reason", reason), 1)
    end
  end
  ngx.say(...)
  return ngx.exit(code)
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

-- split chooses the request's version (canary.choose) and falls through
-- to the other version when the chosen one has no live peer and the
-- other has; it records the version (and the fallthrough, and the cookie
-- to set) in ngx.ctx and returns the version's tiers.
local function split(r, ctx)
  local c = r.canary
  local v, keyless = canary.choose(r, c)
  if keyless then
    ctx.autoconfig_cookie = canary.cookie_for(c, v)
  end
  if not live(r, tiers_of(r, v)) and live(r, tiers_of(r, OTHER[v])) then
    ctx.autoconfig_fell = v
    v = OTHER[v]
  end
  ctx.autoconfig_version = v
  return tiers_of(r, v)
end

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
      local result, waited = hold.wait(r, function()
        if r.dynamic then refresh(r) else hold.sync_static(r) end
      end)
      count_hold(r, result, waited)
      if result == "timeout" then
        return refuse(r, 503, "hold_timeout", "route ", route, ": no peer arrived within hold_timeout (",
          r.hold.timeout, " s) while the model is woken; retry")
      elseif result == "refused" then
        return refuse(r, 503, "hold_full", "route ", route, ": ", r.hold.max,
          " requests are held already (hold_max); retry")
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
    tiers = split(r, ctx)
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
  -- The first try's pick is the admission: the tier that serves now (the
  -- first with a peer in the pick) must have a peer under its limit. One
  -- look at each peer decides both (another worker can eject a peer
  -- between two looks). When no peer is in the pick the request is
  -- admitted, and the pick's second pass chooses (a request is never
  -- failed for ejection alone).
  local t, p, free, inpick, place = pick(r, {}, tiers, kh, limit_of)
  if t and inpick and not free and r.admission then
    local why = r.slo.adaptive and "adaptive_limit" or "max_concurrency"
    return refuse(r, 503, why, "route ", route, ": every peer of the ", t.use,
      " tier is at its ", r.slo.adaptive and "adaptive concurrency limit" or "max_concurrency")
  end
  if t then
    -- The planned peer's slot is taken now, not in the balancer: the
    -- next request's pick (in any worker) already counts it, so a burst
    -- cannot overshoot a limit or the bounded load between the two phases.
    state.incr(r, pkey("a", t, p), 1)
    state.incr(r, tkey(t), 1)
    ctx.autoconfig_plan = { t = t, p = p, version = r.version, held = true }
    req.place = place or "keyless"
  end
end

-- unplan gives back the slot access took for a plan the balancer did not
-- use (the table changed in between, or no try was made).
local function unplan(r, ctx)
  local plan = ctx.autoconfig_plan
  if plan and plan.held then
    plan.held = false
    release(r, { t = plan.t, p = plan.p, key = ident(plan.t, plan.p), counted = true })
  end
end

-- reachable: the peers a request may try in tiers (a FailClose route
-- never goes below its cart tier).
reachable = function(r, tiers)
  local n = 0
  for _, t in ipairs(tiers) do
    n = n + #t.peers
    if r.fail_close and t.use == "cart" then
      break
    end
  end
  return n
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
    refresh(r)
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
    release(r, last)
    last.settled = true
    if st == "failed" then
      connect_failed(r, last.t, last.p)
    end
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
    unplan(r, ctx)
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
  if counted and not held then
    state.incr(r, pkey("a", t, p), 1)
    state.incr(r, tkey(t), 1)
  end
  state.incr(r, pkey("t", t, p), 1)
  local ok, err = balancer.set_current_peer(bracketed(p.host), p.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

-- ---------------------------------------------------------------------
-- Measuring an llm answer (the body filter) and settling it (log).

local remember

local function elapsed_ms(req, now)
  return (now - req.start) * 1000
end

-- first_token records the request's time to first token.
local function first_token(req, now, t, p)
  req.first, req.mark, req.mark_tokens = now, now, req.tokens
  req.mark_n = active(req.r, t, p)
  req.next_sample = now + slo.SAMPLE_SECONDS
  local ms = elapsed_ms(req, now)
  req.ttft_ms = ms
  slo.ttft(req.r, t, p, ms)
end

-- sample feeds the decode rate of the stream's last interval to the
-- peer's adaptive limit.
local function sample(req, now, t, p)
  local dt = now - req.mark
  -- The streams the rate was shared by: the peer's requests in flight at
  -- both ends of the interval, averaged.
  local n = active(req.r, t, p)
  if dt > 0 then
    slo.decode(req.r, t, p, (req.tokens - req.mark_tokens) / dt, (n + req.mark_n) / 2)
  end
  req.mark, req.mark_tokens, req.mark_n = now, req.tokens, n
  req.next_sample = now + slo.SAMPLE_SECONDS
end

-- remember maps an answer's id (a Responses API "resp_…") to the key
-- its request was placed by, as soon as the id passes: before the client
-- has the answer, so its next turn (previous_response_id) finds it.
remember = function(req)
  local id = req.parse.id
  if id and req.key and not req.remembered then
    req.remembered = true
    affinity.remember(req.r, id, req.key)
  end
end

-- body is the http-level body filter of the shipped nginx.conf: for llm
-- requests it counts the answer's tokens as they pass (SSE content
-- events, or the usage of a JSON answer) and times the first one.
function M.body()
  local ctx = ngx.ctx
  local req = ctx.autoconfig_req
  if not req then
    return
  end
  local tries = ctx.autoconfig_tries
  local last = tries and tries[#tries]
  if not last then
    return
  end
  local chunk, eof = ngx.arg[1], ngx.arg[2]
  local mode = req.mode
  if mode == nil then
    local ct = ngx.header["Content-Type"] or ""
    if type(ct) == "table" then ct = ct[1] or "" end
    if ngx.status >= 300 then
      mode = "none"
    elseif string.find(ct, "text/event-stream", 1, true) then
      mode = "sse"
    elseif string.find(ct, "json", 1, true) then
      mode = "json"
    else
      mode = "none"
    end
    req.mode, req.tokens = mode, 0
    if mode ~= "none" then
      req.parse = sse.new()
    end
  end
  if mode == "none" then
    return
  end
  if mode == "sse" then
    local now = ngx.now()
    if chunk and chunk ~= "" then
      local n = sse.feed(req.parse, chunk)
      if not req.remembered and req.parse.id then
        remember(req)
      end
      if n > 0 then
        req.tokens = req.tokens + n
        req.last = now
        if not req.first then
          first_token(req, now, last.t, last.p)
        elseif now >= req.next_sample then
          sample(req, now, last.t, last.p)
        end
      end
    end
    return
  end
  -- A JSON answer arrives whole after the generation: it has usage, no
  -- first-token time.
  if chunk and chunk ~= "" then
    if not req.seen_json then
      -- An OpenAI answer object starts with its id: take it from the
      -- first bytes, before the client has the whole answer (the end of
      -- the body filter can run after the client read the last byte).
      req.seen_json = true
      local id = string.match(string.sub(chunk, 1, 512), '^%s*{%s*"id"%s*:%s*"([^"\\]+)"')
      if id then
        req.parse.id = id
        remember(req)
      end
    end
    sse.feed_json(req.parse, chunk)
  end
  if eof then
    sse.finish_json(req.parse)
    remember(req)
  end
end

-- settle_answer records what the body filter measured: tokens, the TTFT
-- and decode-rate histograms, the stream's last decode sample, and a
-- Responses API answer's id (the next turn's previous_response_id).
local function settle_answer(r, req, t, p, v)
  local st = req.parse
  if not st then
    return
  end
  local d = metrics_dict()
  local rv = lv(r, v).rv
  local completion = st.completion_tokens or (req.mode == "sse" and req.tokens) or nil
  if d then
    if st.prompt_tokens then
      metrics.inc(d, "autoconfig_engine_prompt_tokens_total", rv, st.prompt_tokens)
    end
    if completion and completion > 0 then
      metrics.inc(d, "autoconfig_engine_completion_tokens_total", rv, completion)
    end
    if req.ttft_ms then
      metrics.observe(d, "autoconfig_engine_ttft_seconds", rv, req.ttft_ms / 1000)
    end
  end
  if req.mode == "sse" and req.first and req.last and req.last > req.first and req.tokens > 1 then
    local rate = (req.tokens - 1) / (req.last - req.first)
    if d then
      metrics.observe(d, "autoconfig_engine_decode_tokens_per_second", rv, rate)
    end
    -- The stream's last interval feeds the limit only when it is long
    -- enough to measure (a short tail of a few tokens is noise); a stream
    -- too short for an interval sample gives its whole decode rate.
    if req.mark == req.first then
      if req.tokens >= 4 then
        slo.decode(r, t, p, rate, (active(r, t, p) + req.mark_n) / 2)
      end
    elseif req.last - req.mark >= slo.SAMPLE_SECONDS / 2 and req.tokens > req.mark_tokens then
      sample(req, req.last, t, p)
    end
  end
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
    state.incr(r, K_SERVED[v], 1)
    local fell = ctx.autoconfig_fell
    if fell then
      state.incr(r, K_FELL[fell], 1)
      local d = metrics_dict()
      if d then
        metrics.inc(d, "autoconfig_engine_canary_fallthrough_total", lv(r, fell).rv, 1)
      end
    end
  end
  local tries = ctx.autoconfig_tries
  if not r then
    return
  end
  unplan(r, ctx)
  local last = tries and tries[#tries]
  count_request(r, v, last and addr(last.t, last.p) or "", ngx.status)
  local req = ctx.autoconfig_req
  if req and last then
    local d = metrics_dict()
    if d and req.place then
      local c = lv(r, v)
      local ps = c[req.place]
      if ps == nil then
        ps = metrics.labels("route", r.name, "version", v, "result", req.place)
        c[req.place] = ps
      end
      metrics.inc(d, "autoconfig_engine_affinity_placements_total", ps, 1)
    end
    settle_answer(r, req, last.t, last.p, v)
    cut.count(metrics_dict(), r, req, v)
  end
  if not last or last.settled then
    return
  end
  local t, p = last.t, last.p
  release(r, last)
  local connect
  for x in string.gmatch(ngx.var.upstream_connect_time or "", "[^,: ]+") do
    connect = x
  end
  if connect == "-" or connect == nil then
    connect_failed(r, t, p)
  else
    state.set(r, pkey("f", t, p), 0)
  end
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
  return metrics.handler(metrics_dict(), gauges.collect)
end

-- control is the content handler of the control server (router_control).
function M.control()
  return control_mod.handle()
end

return M
