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
--   router_admission a request's slots (plan, take, release, settle),
--                    connection failures and ejection, the admission
--   router_balance   the balancer phase: the tries of a request
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
local admission = require("router_admission")
local balance_mod = require("router_balance")

local addr, active = state.addr, state.active
local K_SERVED, K_FELL = canary.K_SERVED, canary.K_FELL

local M = {}
local routes = registry.routes
local metrics_dict, lv, count_request, count_hold = count.dict, count.lv, count.request, count.hold
local refuse = admission.refuse
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
  admission.unplan(r, ctx)
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
  return metrics.handler(metrics_dict(), gauges.collect)
end

-- control is the content handler of the control server (router_control).
function M.control()
  return control_mod.handle()
end

return M
