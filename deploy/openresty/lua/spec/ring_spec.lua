-- router_ring: the properties the router promises of its consistent-hash
-- ring with bounded loads, checked by simulation (the numbers are printed).

local ring = require("router_ring")
local crc32 = require("router_hash").crc32

local function peer_ids(n)
  local ids = {}
  for i = 1, n do
    ids[i] = string.format("backend|10.%d.%d.%d|8000", math.floor(i / 65536),
      math.floor(i / 256) % 256, i % 256)
  end
  return ids
end

local function key_hashes(count, prefix)
  local hs = {}
  for k = 1, count do
    hs[k] = crc32((prefix or "key-") .. k)
  end
  return hs
end

-- The id string of the peer that owns key hash kh.
local function owner(r, ids, kh)
  return ids[r.p[ring.first(r, kh)]]
end

local function accept()
  return true
end

local function refuse()
  return false
end

describe("router_ring.points_for", function()
  it("is clamp(floor(80000 / n), 8, 512)", function()
    assert.are.equal(512, ring.points_for(1))
    assert.are.equal(512, ring.points_for(8))
    assert.are.equal(160, ring.points_for(500))
    assert.are.equal(133, ring.points_for(600))
    assert.are.equal(80, ring.points_for(1000))
    assert.are.equal(8, ring.points_for(10000))
    assert.are.equal(8, ring.points_for(50000))
  end)
end)

describe("router_ring.bound", function()
  it("is max(ceil(c * (inflight + 1) / n), floor)", function()
    assert.are.equal(10, ring.bound(1.25, 63, 8, 6))
    assert.are.equal(6, ring.bound(1.25, 0, 8, 6))
    assert.are.equal(1, ring.bound(nil, 0, 8))
    assert.are.equal(3, ring.bound(nil, 15, 8, 0))
    assert.are.equal(2, ring.bound(2, 0, 1))
  end)
end)

describe("router_ring.build", function()
  it("(a) gives identical rings for the same ids", function()
    local ids = peer_ids(8)
    local r1, r2 = ring.build(ids), ring.build(peer_ids(8))
    assert.are.equal(8, r1.n)
    assert.are.equal(8 * 512, r1.size)
    assert.are.same(r1.h, r2.h)
    assert.are.same(r1.p, r2.p)
    for i = 2, r1.size do
      assert.is_true(r1.h[i - 1] <= r1.h[i])
    end
  end)

  it("gives owners that depend only on the ids' strings, even on hash ties", function()
    local function coarse(s) -- a hash with many collisions
      return crc32(s) % 64
    end
    local ids = peer_ids(5)
    local reversed = {}
    for i = 1, #ids do
      reversed[#ids + 1 - i] = ids[i]
    end
    local r1, r2 = ring.build(ids, coarse), ring.build(reversed, coarse)
    for _, kh in ipairs(key_hashes(2000)) do
      assert.are.equal(owner(r1, ids, kh), owner(r2, reversed, kh))
    end
  end)

  it("builds an empty ring for no peers", function()
    local r = ring.build({})
    assert.are.equal(0, r.size)
    assert.is_nil(ring.first(r, 1))
    assert.is_nil(ring.walk(r, 1, accept))
  end)
end)

describe("router_ring.first", function()
  it("finds the first point at or after the key and wraps", function()
    local r = ring.build(peer_ids(3))
    local mix = ring.mix
    for _, kh in ipairs(key_hashes(500)) do
      local pos = ring.first(r, kh)
      local x = mix(kh)
      if x > r.h[r.size] then
        assert.are.equal(1, pos)
      else
        assert.is_true(r.h[pos] >= x)
        assert.is_true(pos == 1 or r.h[pos - 1] < x)
      end
    end
  end)
end)

describe("router_ring.walk", function()
  it("(b) removing a peer moves only its keys; adding it back restores them", function()
    local ids = peer_ids(8)
    local full = ring.build(ids)
    local keys = key_hashes(10000)
    for gone = 1, 8 do
      local rest = {}
      for i = 1, 8 do
        if i ~= gone then
          rest[#rest + 1] = ids[i]
        end
      end
      local less = ring.build(rest)
      rest[#rest + 1] = ids[gone] -- back, at another index
      local again = ring.build(rest)
      local moved = 0
      for _, kh in ipairs(keys) do
        local before = owner(full, ids, kh)
        local after = owner(less, rest, kh)
        if before == ids[gone] then
          moved = moved + 1
          assert.are_not.equal(ids[gone], after)
        else
          assert.are.equal(before, after)
        end
        assert.are.equal(before, owner(again, rest, kh))
      end
      local frac = moved / #keys
      print(string.format("(b) remove peer %d of 8: %.4f of 10000 keys moved (1/8 = 0.125)",
        gone, frac))
      assert.is_true(math.abs(frac - 1 / 8) <= 0.02)
    end
  end)

  it("(c) balances 100,000 keys over 8 peers of 512 points", function()
    local ids = peer_ids(8)
    local r = ring.build(ids)
    local count = {}
    for i = 1, 8 do
      count[i] = 0
    end
    local total = 100000
    for k = 1, total do
      local p = r.p[ring.first(r, crc32("key-" .. k))]
      count[p] = count[p] + 1
    end
    local lo, hi = 1, 0
    for i = 1, 8 do
      local share = count[i] / total * 8
      lo, hi = math.min(lo, share), math.max(hi, share)
      assert.is_true(share >= 0.7 and share <= 1.3)
    end
    print(string.format("(c) 8 peers, 100000 keys: shares %.3f .. %.3f of 1/8", lo, hi))
  end)

  it("(d) spreads a hot key within the bound", function()
    local r = ring.build(peer_ids(8))
    local load = {}
    for i = 1, 8 do
      load[i] = 0
    end
    local kh = crc32("chat\0hot system prompt\0hot question")
    local inflight, b = 0, 0
    local function take(peer)
      return load[peer] < b
    end
    for _ = 1, 64 do
      b = ring.bound(1.25, inflight, 8, 6)
      local peer = ring.walk(r, kh, take)
      assert.is_not_nil(peer)
      load[peer] = load[peer] + 1
      inflight = inflight + 1
    end
    local max = 0
    for i = 1, 8 do
      max = math.max(max, load[i])
    end
    print(string.format("(d) 64 requests of one key on 8 peers: loads %s, max %d (limit 11)",
      table.concat(load, " "), max))
    assert.is_true(max <= math.ceil(1.25 * 64 / 8) + 1)
  end)

  -- 16 conversations of 5 turns over 8 peers; each step a random request
  -- in flight completes and its conversation's next turn is placed.
  -- Returns the turns after the first that stayed on the previous turn's
  -- peer, and those turns' count.
  local function conversations(floor_, seed)
    local r = ring.build(peer_ids(8))
    local keys = key_hashes(16, "conversation-")
    local load, peer_of, turn, flight = {}, {}, {}, {}
    for i = 1, 8 do
      load[i] = 0
    end
    local b = 0
    local function take(peer)
      return load[peer] < b
    end
    local function place(c)
      b = ring.bound(1.25, #flight, 8, floor_)
      local peer = assert(ring.walk(r, keys[c], take))
      load[peer] = load[peer] + 1
      flight[#flight + 1] = c
      peer_of[c] = peer
    end
    for c = 1, 16 do
      turn[c] = 1
      place(c)
    end
    math.randomseed(seed)
    local stayed, turns = 0, 0
    while #flight > 0 do
      local i = math.random(#flight)
      local c = flight[i]
      flight[i] = flight[#flight]
      flight[#flight] = nil
      local prev = peer_of[c]
      load[prev] = load[prev] - 1
      if turn[c] < 5 then
        turn[c] = turn[c] + 1
        place(c)
        turns = turns + 1
        if peer_of[c] == prev then
          stayed = stayed + 1
        end
      end
    end
    return stayed, turns
  end

  it("(e) keeps a conversation's turns on one peer", function()
    local r, owned = ring.build(peer_ids(8)), { 0, 0, 0, 0, 0, 0, 0, 0 }
    for _, kh in ipairs(key_hashes(16, "conversation-")) do
      local p = r.p[ring.first(r, kh)]
      owned[p] = owned[p] + 1
    end
    print("(e) conversations owned per peer: " .. table.concat(owned, " "))
    local result = {}
    for _, floor_ in ipairs({ 6, 0 }) do
      local stayed, turns, worst = 0, 0, 1
      for seed = 1, 20 do
        local s, t = conversations(floor_, seed)
        stayed, turns = stayed + s, turns + t
        worst = math.min(worst, s / t)
      end
      result[floor_] = stayed / turns
      print(string.format(
        "(e) 16 conversations x 5 turns, 8 peers, floor %d: %.1f %% of %d later turns stayed (worst run %.1f %%)",
        floor_, 100 * stayed / turns, turns, 100 * worst))
    end
    assert.is_true(result[6] >= 0.95)
    assert.is_true(result[0] <= result[6])
  end)

  it("(f) returns nil when every visited peer refuses", function()
    local r = ring.build(peer_ids(8))
    local seen, ranks = {}, {}
    local function record(peer, rank)
      assert.is_nil(seen[peer])
      seen[peer] = true
      ranks[#ranks + 1] = rank
      return false
    end
    assert.is_nil(ring.walk(r, 12345, record))
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8 }, ranks)
    seen, ranks = {}, {}
    assert.is_nil(ring.walk(r, 12345, record, 3))
    assert.are.same({ 1, 2, 3 }, ranks)
    assert.is_nil(ring.walk(r, 12345, refuse, 0))
  end)

  it("returns the accepted peer and its rank, passing arg through", function()
    local r = ring.build(peer_ids(8))
    local own = r.p[ring.first(r, 777)]
    local peer, rank = ring.walk(r, 777, accept)
    assert.are.equal(own, peer)
    assert.are.equal(1, rank)
    local function third(_, k, want)
      return k == want
    end
    local p3, r3 = ring.walk(r, 777, third, nil, 3)
    assert.are.equal(3, r3)
    assert.are_not.equal(own, p3)
  end)

  it("(g) builds 10,000 peers and walks them quickly (timings printed)", function()
    local ids = peer_ids(10000)
    local t0 = os.clock()
    local r = ring.build(ids)
    local build = os.clock() - t0
    assert.are.equal(80000, r.size)
    local keys = key_hashes(100000)
    t0 = os.clock()
    for k = 1, #keys do
      ring.walk(r, keys[k], accept)
    end
    local one = (os.clock() - t0) / #keys * 1e6
    t0 = os.clock()
    local full = 200
    for k = 1, full do
      ring.walk(r, keys[k], refuse)
    end
    local all = (os.clock() - t0) / full * 1e6
    print(string.format(
      "(g) 10000 peers: build %.1f ms (%d points); walk taking the first peer %.2f us; walk refused by all 10000 peers %.0f us",
      build * 1e3, r.size, one, all))
  end)
end)
