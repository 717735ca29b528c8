-- router_aimd: the adaptive concurrency limit of one peer (an LLM serving
-- pod), by additive increase and multiplicative decrease towards the
-- concurrency that holds the route's latency targets.
--
-- Targets (either or both):
--   * tps_target: the decode rate each stream should get, tokens/s;
--   * ttft_target: the time to first token, ms.
-- A pod decodes its streams in one batch, so each stream's rate is about
-- the pod's capacity divided by the streams it runs: rate ~ C / inflight.
-- The concurrency that holds the target is then C / target
-- = inflight * rate / target. So a missed target moves the limit straight
-- to what the measurement says the pod carries, base * rate / target
-- (base = the streams that produced the measurement: the peer's requests
-- in flight, which may exceed a limit just cut), never below half the base
-- in one step, so one noisy measurement cannot collapse the limit. TTFT
-- grows with the queue and the prefill work of the running streams, and
-- the same ratio, ttft_target / ttft, scales the limit when it is missed.
-- When every target is met with headroom (rate >= target * (1 + headroom),
-- ttft <= target / (1 + headroom)) and the limit is what holds traffic back
-- (inflight >= floor(limit) - 1), the limit grows by one per step, probing
-- for capacity that appeared. Between the two (met, but without headroom,
-- or the limit not binding) the limit stays.
--
-- o.step (default 1) is the additive increase of one step; an engine
-- that feeds a sample per stream and interval passes 1 / limit, so the
-- limit grows by about one per interval, whatever the number of streams
-- (the additive increase of TCP's congestion window: one per round trip).
--
-- With o.capacity (an EWMA of rate * streams at each measurement, the
-- pod's decode capacity in tokens/s), a missed decode target moves the
-- limit to capacity / target instead (still never below half the limit
-- in one step): that estimate does not depend on how many streams ran
-- when the rate was measured, so a rate EWMA that still remembers a busier
-- moment cannot ratchet the limit down while the streams drain.
--
-- The limit is a float; the engine admits a request while
-- inflight < floor(limit). Measurements are EWMAs (`ewma`), fed by the
-- engine from each finished request's decode rate and TTFT.

local floor = math.floor

local M = {}

local DEFAULT_ALPHA = 0.3
local DEFAULT_HEADROOM = 0.1
local MAX_CUT = 0.5 -- a step never takes the limit below half its base

-- ewma(old, sample, alpha) -> old + alpha * (sample - old); sample when
-- old is nil. alpha defaults to 0.3.
function M.ewma(old, sample, alpha)
  if old == nil then
    return sample
  end
  alpha = alpha or DEFAULT_ALPHA
  return old + alpha * (sample - old)
end

-- The factor the decode target asks for (< 1 when missed), or nil when it
-- is not missed; and whether it is met with headroom.
local function tps_verdict(tps, target, headroom)
  if not target then
    return nil, true
  end
  if not tps then
    return nil, false
  end
  if tps < target then
    return tps / target, false
  end
  return nil, tps >= target * (1 + headroom)
end

-- The same for the TTFT target (a time: lower is better).
local function ttft_verdict(ttft, target, headroom)
  if not target then
    return nil, true
  end
  if not ttft then
    return nil, false
  end
  if ttft > target then
    return target / ttft, false
  end
  return nil, ttft <= target / (1 + headroom)
end

local function clamp(x, lo, hi)
  if x < lo then
    return lo
  end
  if x > hi then
    return hi
  end
  return x
end

-- The limit after a missed target, for the smaller factor f.
local function decrease(limit, inflight, f)
  if f < MAX_CUT then
    f = MAX_CUT
  end
  -- The measurement was taken at the peer's concurrency now, so that is
  -- what it scales (also above the limit: streams admitted before a cut
  -- still run, and the rate they see is the rate of that concurrency).
  local base = inflight > 1 and inflight or 1
  local v = base * f
  if v < limit then
    return v
  end
  return limit
end

-- next_limit(o) -> the new limit (a float in [o.min, o.max]).
-- o = { limit, inflight, tps, tps_target, ttft, ttft_target, min, max,
--       headroom }: limit = the current limit; inflight = the peer's
-- requests in flight; tps = EWMA decode rate per stream, tokens/s (nil:
-- not measured yet); ttft = EWMA time to first token, ms (nil: not
-- measured); tps_target / ttft_target = nil for no target; min default 1;
-- max required; headroom default 0.1. With no target the limit only gets
-- clamped.
function M.next_limit(o)
  local limit = o.limit
  local lo, hi = o.min or 1, assert(o.max, "router_aimd: max required")
  local headroom = o.headroom or DEFAULT_HEADROOM
  local inflight = o.inflight or 0
  local f1, ok1 = tps_verdict(o.tps, o.tps_target, headroom)
  local f2, ok2 = ttft_verdict(o.ttft, o.ttft_target, headroom)
  local f = f1
  if f2 and (not f or f2 < f) then
    f = f2
  end
  if f then
    local v
    if f1 and o.capacity and o.capacity > 0 then
      -- The decode target is missed: go to what the pod carries.
      local sustainable = o.capacity / o.tps_target
      local cut = limit * MAX_CUT
      v = sustainable > cut and sustainable or cut
      if f2 then
        local w = decrease(limit, inflight, f2)
        if w < v then v = w end
      end
      if v > limit then v = limit end
    else
      v = decrease(limit, inflight, f)
    end
    return clamp(v, lo, hi)
  end
  local targeted = o.tps_target or o.ttft_target
  if targeted and ok1 and ok2 and inflight >= floor(limit) - 1 then
    return clamp(limit + (o.step or 1), lo, hi)
  end
  return clamp(limit, lo, hi)
end

return M
