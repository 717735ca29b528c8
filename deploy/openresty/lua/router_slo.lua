-- router_slo: decode-SLO admission (adaptive concurrency) of an llm route
-- (docs/lua-contract.md, "Admission").
--
-- A route opts in with tps_limit_tps (the per-stream decode rate it must
-- keep, tokens/s; spec.slo.decodeTokensPerSecond) and/or ttft_limit_ms
-- (spec.slo.ttftMs); adaptive_cc = "false" keeps the static limits only.
-- Each stream's decode rate is measured by the body filter (content
-- events of the SSE stream, router_sse) every SAMPLE_SECONDS and at its
-- end, its time to first token once; each peer keeps an EWMA of both in
-- the route's dict ("r|…", "m|…"), one of its capacity (rate × its
-- streams, "c|…"), and its concurrency limit ("l|…")
-- moves by router_aimd.next_limit between adaptive_cc_min and the tier's
-- max_concurrency (or adaptive_cc_max, default 256, for a tier without
-- one). A request that finds every usable peer at its limit is refused at
-- once (503, Retry-After: 1); streams already admitted are never cut.
local state = require("router_state")
local aimd = require("router_aimd")

local num, clamp, pkey = state.num, state.clamp, state.pkey

local M = {}

M.SAMPLE_SECONDS = 1
local ALPHA = 0.3
local DEFAULT_MAX = 256
local MIN_FRAC = 0.1

-- config: the route's SLO settings from its options.
function M.config(o)
  local tps = num(o.tps_limit_tps, nil)
  if tps and tps <= 0 then tps = nil end
  local ttft = num(o.ttft_limit_ms, nil)
  if ttft and ttft <= 0 then ttft = nil end
  local on = (tps ~= nil or ttft ~= nil) and o.adaptive_cc ~= "false"
  return {
    tps = tps, ttft = ttft,
    opt_in = o.tps_limit_tps ~= nil,
    adaptive = on,
    min = num(o.adaptive_cc_min, nil),
    max = clamp(math.floor(num(o.adaptive_cc_max, DEFAULT_MAX)), 1, 100000),
  }
end

-- bounds: the least and greatest limit of a peer of tier t.
local function bounds(s, t)
  local hi = t.max_concurrency or s.max
  local lo = s.min
  if lo == nil then
    lo = t.max_concurrency and math.max(1, math.floor(t.max_concurrency * MIN_FRAC)) or 1
  end
  lo = clamp(math.floor(lo), 1, hi)
  return lo, hi
end

-- limit_of: the number of requests peer p of tier t may have in flight
-- (math.huge: no limit).
function M.limit_of(r, t, p)
  local s = r.slo
  if not s.adaptive then
    return t.max_concurrency or math.huge
  end
  local l = r.store:get(pkey("l", t, p))
  if l == nil then
    local _, hi = bounds(s, t)
    return hi
  end
  return math.floor(l)
end

-- adapt moves peer p's limit after a new measurement.
local function adapt(r, t, p)
  local s, store = r.slo, r.store
  local lo, hi = bounds(s, t)
  local cur = store:get(pkey("l", t, p)) or hi
  local nl = aimd.next_limit({
    limit = cur,
    inflight = store:get(pkey("a", t, p)) or 0,
    tps = store:get(pkey("r", t, p)), tps_target = s.tps,
    capacity = store:get(pkey("c", t, p)),
    -- Every stream samples once an interval: 1 / limit a sample is about
    -- one a interval.
    step = 1 / (cur > 1 and cur or 1),
    ttft = store:get(pkey("m", t, p)), ttft_target = s.ttft,
    min = lo, max = hi,
  })
  if nl ~= cur then
    state.set(r, pkey("l", t, p), nl)
  end
end

-- decode records a decode-rate sample (tokens/s) of a stream on peer p
-- that shared the peer with n streams (its requests in flight, this one
-- included) while it was measured.
function M.decode(r, t, p, rate, n)
  local store = r.store
  local k = pkey("r", t, p)
  state.set(r, k, aimd.ewma(store:get(k), rate, ALPHA))
  -- The pod's capacity as this sample shows it: the rate times the
  -- streams it shares the pod with (router_aimd).
  if not n or n < 1 then n = 1 end
  local kc = pkey("c", t, p)
  state.set(r, kc, aimd.ewma(store:get(kc), rate * n, ALPHA))
  if r.slo.adaptive then
    adapt(r, t, p)
  end
end

-- ttft records a time-to-first-token sample (ms) of a request on peer p.
function M.ttft(r, t, p, ms)
  local store = r.store
  local k = pkey("m", t, p)
  state.set(r, k, aimd.ewma(store:get(k), ms, ALPHA))
  if r.slo.adaptive and r.slo.ttft then
    adapt(r, t, p)
  end
end

local function round(x, d)
  if x == nil then return nil end
  local m = 10 ^ d
  return math.floor(x * m + 0.5) / m
end

-- peers_status: per peer of tiers, its limit, requests in flight and the
-- EWMAs (GET /_tps_status).
function M.peers_status(r, tiers, version, out)
  local store = r.store
  for _, t in ipairs(tiers) do
    for _, p in ipairs(t.peers) do
      local lim = M.limit_of(r, t, p)
      out[#out + 1] = {
        tier = t.use, host = p.host, port = p.port, version = version,
        limit = lim ~= math.huge and lim or nil,
        in_flight = store:get(pkey("a", t, p)) or 0,
        decode_tps_ewma = round(store:get(pkey("r", t, p)), 2),
        ttft_ms_ewma = round(store:get(pkey("m", t, p)), 1),
      }
    end
  end
  return out
end

return M
