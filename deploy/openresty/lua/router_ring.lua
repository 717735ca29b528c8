-- router_ring: consistent hashing with bounded loads (Mirrokni, Thorup and
-- Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2016) over the
-- peers of one tier.
--
-- Each peer is an identity string (e.g. "backend|10.0.0.1|8000") and owns
-- `points_for(n)` points on a ring of 32-bit positions: point j (0-based) of
-- a peer sits at mix(hash(id .. "#" .. j)), and a key whose hash is k sits at
-- mix(k). A key belongs to the peer of the first point clockwise from the
-- key. Because a point depends only on its peer's string, removing a peer
-- moves only the keys that peer owned, and adding it back returns them.
--
-- mix is MurmurHash3's 32-bit finalizer (fmix32), a bijection on 32-bit
-- integers. CRC-32 is linear: for ids of equal length, the points of
-- "…|10.0.0.2|8000" are those of "…|10.0.0.1|8000" xored with one
-- constant, which leaves arcs of very unequal length (8 peers own 0.68 to
-- 1.35 of their fair share, 200 peers 0.38 to 3.1). After fmix32 the
-- shares are those of random points (8 peers: 0.92 to 1.19). Callers pass
-- CRC-32 values (ngx.crc32_long in nginx, router_hash.crc32 elsewhere,
-- which agree), and the ring mixes points and keys alike.
--
-- Bounded loads: a caller walks the distinct peers clockwise from the key
-- (`walk`) and gives the key to the first peer whose load is under
-- `bound(c, inflight, n)` = ceil(c * (inflight + 1) / n); no peer then holds
-- more than about c times the tier's average, while a key stays on its own
-- peer whenever that peer is not overloaded.
--
-- A ring object is { n = number of peers, size = number of points,
-- h = point positions (mixed hashes, ascending), p = the peer index of each
-- point (1-based, into the ids array given to build) }, plus a scratch
-- array that walk uses to mark the peers it has visited. Walk is not
-- re-entrant on one ring (a visit callback must not walk the same ring);
-- nginx runs one request handler at a time per worker and walk never
-- yields, so that holds.

local bit = require("bit")
local hash_mod = require("router_hash")

local bxor, rshift = bit.bxor, bit.rshift
local floor, ceil = math.floor, math.ceil
local sort = table.sort
local tostring = tostring

local M = {}

local MAX_POINTS = 80000
local MIN_PER_PEER = 8
local MAX_PER_PEER = 512

-- Sorting packs (position, peer index) into one double:
-- position * 2^21 + index - 1, exact while position < 2^32 and
-- index <= 2^21 (2^53 in all).
local PACK = 2097152 -- 2^21
local MAX_PEERS = PACK

-- points_for(n) -> points per peer for a tier of n peers:
-- clamp(floor(80000 / n), 8, 512), so a ring has at most about 80,000 points
-- (512 per peer keep a small tier's shares within about 1/n +- 2 %: removing
-- one of 8 peers moves about 1/8 of the keys, not 1/8 +- 3 %).
function M.points_for(n)
  if not n or n < 1 then
    return MAX_PER_PEER
  end
  local k = floor(MAX_POINTS / n)
  if k > MAX_PER_PEER then
    return MAX_PER_PEER
  end
  if k < MIN_PER_PEER then
    return MIN_PER_PEER
  end
  return k
end

local TWO16, TWO32 = 65536, 4294967296

-- a * b mod 2^32 for a, b in [0, 2^32), exact in doubles.
local function mul32(a, b)
  local alo, blo = a % TWO16, b % TWO16
  local mid = (((a - alo) / TWO16) * blo + alo * ((b - blo) / TWO16)) % TWO16
  return (mid * TWO16 + alo * blo) % TWO32
end

-- xorshift step h ^ (h >> s), as a non-negative integer.
local function xorshift(h, s)
  h = bxor(h, rshift(h, s))
  if h < 0 then
    return h + TWO32
  end
  return h
end

-- mix(h) -> MurmurHash3's fmix32 of h (an integer in [0, 2^32)), the ring
-- position of a hash.
local function mix(h)
  h = mul32(xorshift(h, 16), 0x85EBCA6B)
  h = mul32(xorshift(h, 13), 0xC2B2AE35)
  return xorshift(h, 16)
end
M.mix = mix

-- Fills keys[] with position * 2^21 + (i - 1) for every point of every peer.
local function packed_points(ids, hash, per_peer)
  local keys, k = {}, 0
  for i = 1, #ids do
    local prefix = ids[i] .. "#"
    local base = i - 1
    for j = 0, per_peer - 1 do
      k = k + 1
      keys[k] = mix(hash(prefix .. tostring(j))) * PACK + base
    end
  end
  return keys, k
end

-- Orders the points of equal position by their peer's id string (then
-- index), so which peer owns a position depends only on the ids' strings.
local function order_ties(ring, ids)
  local h, p, size = ring.h, ring.p, ring.size
  local i = 1
  while i < size do
    local j = i
    while j < size and h[j + 1] == h[i] do
      j = j + 1
    end
    if j > i then
      local run = {}
      for k = i, j do
        run[#run + 1] = p[k]
      end
      sort(run, function(a, b)
        local sa, sb = ids[a], ids[b]
        if sa ~= sb then
          return sa < sb
        end
        return a < b
      end)
      for k = i, j do
        p[k] = run[k - i + 1]
      end
    end
    i = j + 1
  end
end

-- build(ids, hash) -> ring for the array of peer identity strings ids.
-- hash: function(string) -> integer in [0, 2^32); router_hash.crc32 when nil.
function M.build(ids, hash)
  hash = hash or hash_mod.crc32
  local n = #ids
  assert(n <= MAX_PEERS, "router_ring: too many peers")
  local keys, size = packed_points(ids, hash, M.points_for(n))
  sort(keys)
  local h, p = {}, {}
  for k = 1, size do
    local v = keys[k]
    local idx = v % PACK
    h[k] = (v - idx) / PACK
    p[k] = idx + 1
  end
  local seen = {}
  for i = 1, n do
    seen[i] = 0
  end
  local ring = { n = n, size = size, h = h, p = p, seen = seen, gen = 0 }
  order_ties(ring, ids)
  return ring
end

-- first(ring, keyhash) -> the 1-based index of the first point at or after
-- the key's position mix(keyhash) (ring.h[i] >= mix(keyhash)), wrapping to
-- 1 past the last point; nil on an empty ring.
function M.first(ring, keyhash)
  local size = ring.size
  if size == 0 then
    return nil
  end
  keyhash = mix(keyhash)
  local h = ring.h
  if keyhash > h[size] then
    return 1
  end
  local lo, hi = 1, size
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if h[mid] < keyhash then
      lo = mid + 1
    else
      hi = mid
    end
  end
  return lo
end

-- Starts a new walk: returns a generation number no entry of ring.seen
-- holds yet.
local function next_generation(ring)
  local gen = ring.gen + 1
  if gen >= 2 ^ 52 then
    local seen = ring.seen
    for i = 1, ring.n do
      seen[i] = 0
    end
    gen = 1
  end
  ring.gen = gen
  return gen
end

-- walk(ring, keyhash, visit, max_distinct, arg) -> peer_index, rank | nil
-- Visits the distinct peers clockwise from first(ring, keyhash), calling
-- visit(peer_index, rank, arg) (rank 1 = the key's own peer, 2 = the next
-- distinct peer, ...). Returns the peer index and rank for which visit
-- returned true; nil once every peer, or max_distinct peers when given, was
-- visited without one. arg is passed through, so a caller can use one
-- visit function for every request instead of a closure per request.
function M.walk(ring, keyhash, visit, max_distinct, arg)
  local pos = M.first(ring, keyhash)
  if not pos then
    return nil
  end
  local n, size, p, seen = ring.n, ring.size, ring.p, ring.seen
  local limit = n
  if max_distinct and max_distinct < n then
    limit = max_distinct
  end
  if limit < 1 then
    return nil
  end
  local gen = next_generation(ring)
  local rank = 0
  for _ = 1, size do
    local peer = p[pos]
    if seen[peer] ~= gen then
      seen[peer] = gen
      rank = rank + 1
      if visit(peer, rank, arg) then
        return peer, rank
      end
      if rank >= limit then
        return nil
      end
    end
    pos = pos + 1
    if pos > size then
      pos = 1
    end
  end
  return nil
end

-- bound(c, inflight, n, floor) -> max(ceil(c * (inflight + 1) / n), floor):
-- a peer's capacity for the new key. A peer takes the key while its load
-- (requests it holds now) is below the bound, so with the key it holds at
-- most the bound.
-- inflight: the tier's requests in flight, not counting the new one;
-- n: the tier's peers; c: 1.25 when nil; floor: 0 when nil.
function M.bound(c, inflight, n, floor_)
  c = c or 1.25
  if not n or n < 1 then
    n = 1
  end
  local b = ceil(c * (inflight + 1) / n)
  if floor_ and b < floor_ then
    return floor_
  end
  return b
end

return M
