-- router_pick: which peer serves a try (docs/lua-contract.md, "Placement").
--
-- Tiers are looked at highest priority first; a lower tier serves only
-- when no peer of the higher tiers is in the pick (ejected, unhealthy or
-- already tried by this request). Within a tier:
--   * a request with an affinity key goes to the first peer clockwise
--     from the key's point on the tier's ring (consistent hashing, the
--     same in every worker and after every reload) that is in the pick,
--     under its concurrency limit and under the bounded load
--     max(ceil(c * (in_flight + 1) / n), floor) (router_ring.bound);
--     when none is, it spills to the least loaded peer;
--   * a request without a key goes to the least loaded peer, preferring
--     peers under their limit (ties rotate). A tier of more than FULL
--     (16) peers is sampled: SAMPLE (8) consecutive peers from a random
--     start, the whole tier only when none of them has a free slot, so a
--     pick costs the same on 10 peers and on 10,000.
-- The peer's limit is the tier's max_concurrency, or the adaptive limit
-- (router_slo) when the route adapts it.
local state = require("router_state")
local ring = require("router_ring")
local hash = require("router_hash")

local ident, pkey, tkey = state.ident, state.pkey, state.tkey
local out_of_pick = state.out_of_pick

local M = {}

-- A keyless pick on a tier of more than FULL peers looks at SAMPLE of
-- them (power of d choices, d = 8: close to least load, and each peer
-- looked at costs three dict reads, whose cost grows with the dict).
local FULL, SAMPLE = 16, 8
-- The ring walk looks at this many distinct peers before it gives the
-- key up to the least loaded peer.
local WALK = 64

local crc32 = (ngx and ngx.crc32_long) or hash.crc32

M.keyhash = crc32

-- ring_of: the tier's ring, built on first use (tiers are rebuilt on a
-- table change, so a ring never outlives its peers).
-- Rings by tier object (weak keys: a table swap drops the old tiers'
-- rings with them); kept beside the tier, not in it, since a tier is
-- also what /_status reports.
local RINGS = setmetatable({}, { __mode = "k" })

local function ring_of(t)
  local rg = RINGS[t]
  if rg == nil then
    local ids = {}
    for i, p in ipairs(t.peers) do
      ids[i] = ident(t, p)
    end
    rg = ring.build(ids, crc32)
    RINGS[t] = rg
  end
  return rg
end
M.ring_of = ring_of

-- least_loaded returns tier t's untried peer with the fewest requests in
-- flight, preferring peers under their limit, with whether it is under
-- it; with ignore_out, ejected and unhealthy peers count too.
local function scan(r, t, tried, ignore_out, from, count, limit_of)
  local peers, store = t.peers, r.store
  local n = #peers
  local best, best_free, best_active
  for k = 0, count - 1 do
    local p = peers[(from + k) % n + 1]
    if not tried[ident(t, p)] and (ignore_out or not out_of_pick(r, t, p)) then
      local a = store:get(pkey("a", t, p)) or 0
      local free = a < limit_of(r, t, p)
      if not best or (free and not best_free) or (free == best_free and a < best_active) then
        best, best_free, best_active = p, free, a
      end
    end
  end
  return best, best_free, best_active
end

local function least_loaded(r, t, tried, ignore_out, limit_of)
  local n = #t.peers
  if n <= FULL then
    return scan(r, t, tried, ignore_out, r.rr, n, limit_of)
  end
  local p, free, a = scan(r, t, tried, ignore_out, math.random(0, n - 1), SAMPLE, limit_of)
  if p and free then
    return p, free, a
  end
  return scan(r, t, tried, ignore_out, r.rr, n, limit_of)
end

-- The ring walk's visit: one function and one argument table for every
-- walk (a worker runs one walk at a time and a walk never yields), so a
-- pick allocates no closure.
local W = {}

local function visit(i, _, w)
  local t = w.t
  local p = t.peers[i]
  if w.tried[ident(t, p)] or out_of_pick(w.r, t, p) then
    return false
  end
  local a = w.store:get(pkey("a", t, p)) or 0
  return a < w.bound and a < w.limit_of(w.r, t, p)
end

-- on_ring: the key's peer of tier t under the bounded load, or nil; and
-- whether it is the key's own peer (the first on the ring).
local function on_ring(r, t, tried, key, limit_of)
  local store = r.store
  local inflight = store:get(tkey(t)) or 0
  W.r, W.t, W.tried, W.store, W.limit_of = r, t, tried, store, limit_of
  W.bound = ring.bound(r.aff.c, inflight, #t.peers, r.aff.floor)
  local idx, rank = ring.walk(ring_of(t), key, visit, WALK, W)
  W.r, W.t, W.tried, W.store = nil, nil, nil, nil
  if idx then
    return t.peers[idx], rank == 1
  end
  return nil
end

-- in_tier: the peer of tier t for this try, whether it is under its
-- limit, its requests in flight, and the placement ("home", "spill" or
-- nil for a keyless pick).
local function in_tier(r, t, tried, ignore_out, key, limit_of)
  if key and not ignore_out and #t.peers > 1 then
    local p, home = on_ring(r, t, tried, key, limit_of)
    if p then
      return p, true, 0, home and "home" or "spill"
    end
    local q, free, a = least_loaded(r, t, tried, false, limit_of)
    return q, free, a, q and "spill" or nil
  end
  local p, free, a = least_loaded(r, t, tried, ignore_out, limit_of)
  return p, free, a, (key and p) and "home" or nil
end

-- pick returns tier and peer for the next try from tiers (the route's,
-- or its canary's), whether the peer is under its limit, whether it was
-- found among the peers in the pick (pass 1) and the placement. When
-- every peer is out of the pick, the first tier with an untried peer is
-- used anyway (a request is never failed for ejection alone), except
-- below a FailClose cart tier. A video route picks from its tiers of
-- equal priority as one group (nginx's primary servers are one pool).
-- key is the affinity key's hash (nil: none).
function M.pick(r, tried, tiers, key, limit_of)
  r.rr = r.rr + 1
  local nt = #tiers
  for pass = 1, 2 do
    local i = 1
    while i <= nt do
      local j = i
      if r.video then
        while j < nt and tiers[j + 1].priority == tiers[i].priority do
          j = j + 1
        end
      end
      local bt, bp, bfree, bactive, bplace
      local cart = false
      -- Ties go to the first tier looked at: a group starts its look at a
      -- rotating tier.
      local gs = j - i + 1
      for m = 0, gs - 1 do
        local t = tiers[i + (r.rr + m) % gs]
        local p, free, a, place = in_tier(r, t, tried, pass == 2, key, limit_of)
        if p and (not bp or (free and not bfree) or (free == bfree and a < bactive)) then
          bt, bp, bfree, bactive, bplace = t, p, free, a, place
        end
        cart = cart or t.use == "cart"
      end
      if bp then
        return bt, bp, bfree, pass == 1, bplace
      end
      if r.fail_close and cart then
        break
      end
      i = j + 1
    end
  end
  return nil
end

return M
