-- router_aimd: the adaptive limit finds the concurrency that holds the
-- targets on a simulated pod whose per-stream rate is capacity / streams.

local aimd = require("router_aimd")

-- Runs `steps` steps of a pod of `capacity` tokens/s under `demand`
-- concurrent streams; returns the final limit and rate EWMA and the rates
-- seen at each step.
local function simulate(capacity, limit, tps, steps, demand, o)
  local rates = {}
  for s = 1, steps do
    local inflight = math.max(1, math.min(math.floor(limit), demand))
    tps = aimd.ewma(tps, capacity / inflight, 0.3)
    rates[s] = tps
    limit = aimd.next_limit({
      limit = limit, inflight = inflight, tps = tps, tps_target = 30,
      min = o and o.min or 1, max = o and o.max or 128,
    })
  end
  return limit, tps, rates
end

describe("router_aimd.ewma", function()
  it("starts at the sample and moves alpha of the way", function()
    assert.are.equal(10, aimd.ewma(nil, 10))
    assert.are.equal(13, aimd.ewma(10, 20))
    assert.are.equal(15, aimd.ewma(10, 20, 0.5))
  end)
end)

describe("router_aimd.next_limit", function()
  it("settles a 300 tokens/s pod with target 30 at 10 streams", function()
    local limit, tps, rates = simulate(300, 64, nil, 50, 40)
    local good = 0
    for s = 1, #rates do
      if rates[s] >= 27 then
        good = good + 1
      end
    end
    print(string.format("aimd: capacity 300, target 30, start 64: limit %.2f, rate %.1f tokens/s, rate >= 27 in %d of 50 steps",
      limit, tps, good))
    assert.is_true(math.abs(math.floor(limit) - 10) <= 1)
    assert.is_true(good >= 40)

    local grown, tps2 = simulate(600, limit, tps, 40, 40)
    print(string.format("aimd: capacity 300 -> 600: limit %.2f, rate %.1f tokens/s", grown, tps2))
    assert.is_true(math.abs(math.floor(grown) - 20) <= 1)
  end)

  it("never cuts more than half in one step", function()
    local l = aimd.next_limit({ limit = 40, inflight = 40, tps = 1, tps_target = 30, max = 64 })
    assert.are.equal(20, l)
  end)

  it("cuts from the in-flight count when the limit does not bind", function()
    local l = aimd.next_limit({ limit = 40, inflight = 10, tps = 24, tps_target = 30, max = 64 })
    assert.are.equal(8, l)
  end)

  it("grows only while the limit binds and the target has headroom", function()
    local base = { limit = 10, inflight = 9, tps = 40, tps_target = 30, max = 64 }
    assert.are.equal(11, aimd.next_limit(base))
    base.inflight = 5
    assert.are.equal(10, aimd.next_limit(base))
    base.inflight, base.tps = 10, 32 -- met, within the 10 % headroom
    assert.are.equal(10, aimd.next_limit(base))
  end)

  it("respects min and max", function()
    local low = simulate(10, 8, nil, 30, 40, { min = 4, max = 128 })
    assert.are.equal(4, low)
    local high = simulate(100000, 8, nil, 30, 40, { min = 1, max = 12 })
    assert.are.equal(12, high)
    assert.are.equal(7, aimd.next_limit({ limit = 9, inflight = 9, max = 7 }))
  end)

  it("follows a TTFT-only target", function()
    -- the time to first token grows with the streams: 50 ms per stream
    local limit, ttft = 64, nil
    for _ = 1, 60 do
      local inflight = math.max(1, math.min(math.floor(limit), 40))
      ttft = aimd.ewma(ttft, 50 * inflight, 0.3)
      limit = aimd.next_limit({ limit = limit, inflight = inflight, ttft = ttft,
        ttft_target = 500, max = 128 })
    end
    print(string.format("aimd: TTFT 50 ms per stream, target 500 ms: limit %.2f, ttft %.0f ms", limit, ttft))
    assert.is_true(math.abs(math.floor(limit) - 10) <= 1)
  end)

  it("takes the smaller factor when both targets are missed", function()
    local l = aimd.next_limit({ limit = 10, inflight = 10, tps = 24, tps_target = 30,
      ttft = 1000, ttft_target = 600, max = 64 })
    assert.are.equal(6, l)
  end)

  it("waits for a measurement before growing", function()
    local l = aimd.next_limit({ limit = 10, inflight = 10, tps_target = 30, max = 64 })
    assert.are.equal(10, l)
  end)
end)

describe("router_aimd.next_limit with a capacity estimate", function()
  it("does not ratchet the limit down while the streams drain", function()
    -- The rate EWMA still remembers a busy moment (27 < 30) while only one
    -- stream runs; the capacity estimate (300 tokens/s) says 10 streams.
    local l = aimd.next_limit({ limit = 10, inflight = 1, tps = 27, tps_target = 30,
      capacity = 300, max = 64 })
    assert.are.equal(10, l)
  end)
  it("cuts to capacity / target, at most by half", function()
    assert.are.equal(10, aimd.next_limit({ limit = 16, inflight = 16, tps = 18.75, tps_target = 30,
      capacity = 300, max = 64 }))
    assert.are.equal(20, aimd.next_limit({ limit = 40, inflight = 40, tps = 7.5, tps_target = 30,
      capacity = 300, max = 64 }))
  end)
end)
