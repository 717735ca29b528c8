-- router_canary: the split of a route with a canary between its two
-- versions (docs/lua-contract.md, "Canary").
local state = require("router_state")
local clamp, num = state.clamp, state.num

local M = {}

-- ---------------------------------------------------------------------
-- Canary split (docs/lua-contract.md, "Canary"): a route with a canary
-- serves each request from one of two versions, "stable" (the route's
-- tiers) or "canary" (the canary's tiers), chosen in this order: the
-- override header (only the values "stable" and "canary"; any other value
-- is ignored); else the session key, the sticky header or else the sticky
-- cookie, hashed into one of BUCKETS buckets (ngx.crc32_long(key) %
-- BUCKETS: the same in every worker and after every reload), canary when
-- the bucket is below weight * BUCKETS / 100 (raising the weight only adds
-- buckets to the canary, lowering it only removes them); else (no key) an
-- exact weighted draw from a counter in the route's dict: the n-th keyless
-- request is canary when floor(n * w / 100) > floor((n - 1) * w / 100).
-- A keyless request's response sets the sticky cookie to
-- "<bucket>.<random hex>" with a bucket of the version drawn, which the
-- cookie's next requests read back as their bucket. A cookie of any other
-- form is a key like the header's (hashed). Header values are never
-- evaluated: only hashed, compared or parsed as digits.
local BUCKETS = 10000

-- Keys of the split's counters in the route's dict.
M.K_DRAWS = "canary|draws"
M.K_SERVED = { stable = "canary|served|stable", canary = "canary|served|canary" }
M.K_FELL = { stable = "canary|fallthrough|stable", canary = "canary|fallthrough|canary" }
M.OTHER = { stable = "canary", canary = "stable" }

-- header_var: the nginx variable of a request header (http_<name>, lower
-- case, '-' as '_'); nil for a name that is not a header token.
local function header_var(name, default)
  if type(name) ~= "string" or name == "" then name = default end
  if not string.match(name, "^[%w%-_]+$") then return nil end
  return "http_" .. (string.gsub(string.lower(name), "-", "_"))
end

-- make_canary: the split of a route from a canary description (the
-- register_route canary argument, or a peers table's canary) and its
-- built tiers.
function M.make(c, tiers)
  local w = clamp(math.floor(num(c.weight, 0)), 0, 100)
  local cookie = c.sticky_cookie
  if type(cookie) ~= "string" or cookie == "" then cookie = "autoconfig-session" end
  if not string.match(cookie, "^[%w!#$%%&'*+%-.^_`|~]+$") then cookie = "autoconfig-session" end
  return {
    weight = w, band = w * BUCKETS / 100, tiers = tiers,
    sticky_header = c.sticky_header or "x-session-id",
    override_header = c.override_header or "x-model-version",
    sticky_cookie = cookie,
    override_var = header_var(c.override_header, "x-model-version"),
    sticky_var = header_var(c.sticky_header, "x-session-id"),
    cookie_var = "cookie_" .. cookie,
    cookie_attrs = "; Path=/; HttpOnly; SameSite=Lax",
  }
end

local seeded = false

-- cookie_for: a sticky cookie whose bucket is in version v's band.
function M.cookie_for(c, v)
  if not seeded then
    seeded = true
    math.randomseed(ngx.worker.pid() * 1000003 + math.floor(ngx.now() * 1000) % 1000003)
  end
  local bucket
  if v == "canary" then
    bucket = math.random(0, c.band - 1)
  else
    bucket = math.random(c.band, BUCKETS - 1)
  end
  return c.sticky_cookie .. "=" .. bucket .. "."
    .. string.format("%06x%06x", math.random(0, 0xffffff), math.random(0, 0xffffff)) .. c.cookie_attrs
end

-- choose: the version a request asks for, and true when it had no key
-- (its response sets the sticky cookie).
function M.choose(r, c)
  local var = ngx.var
  local ov = c.override_var and var[c.override_var]
  if ov == "stable" or ov == "canary" then
    return ov, false
  end
  local bucket
  local key = c.sticky_var and var[c.sticky_var]
  if key ~= nil and key ~= "" then
    bucket = ngx.crc32_long(key) % BUCKETS
  else
    key = var[c.cookie_var]
    if key ~= nil and key ~= "" then
      local b = string.match(key, "^(%d%d?%d?%d?)%.%x+$")
      bucket = b and tonumber(b) or ngx.crc32_long(key) % BUCKETS
    end
  end
  if bucket then
    return bucket < c.band and "canary" or "stable", false
  end
  local w = c.weight
  local n = state.incr(r, M.K_DRAWS, 1)
  if not n then
    return math.random() * 100 < w and "canary" or "stable", true
  end
  return math.floor(n * w / 100) > math.floor((n - 1) * w / 100) and "canary" or "stable", true
end


-- split_counts: a canary route's counters (the route's dict: every
-- worker's requests).
function M.split_counts(store)
  return {
    requests = { stable = store:get(M.K_SERVED.stable) or 0, canary = store:get(M.K_SERVED.canary) or 0 },
    fallthrough = { stable = store:get(M.K_FELL.stable) or 0, canary = store:get(M.K_FELL.canary) or 0 },
    draws = store:get(M.K_DRAWS) or 0,
  }
end

-- tiers_of: the tiers of version v of route r (the route's own tiers
-- unless v is "canary").
function M.tiers_of(r, v)
  if v == "canary" and r.canary then
    return r.canary.tiers
  end
  return r.tiers
end
local tiers_of = M.tiers_of

-- live: whether tiers have a peer in the pick (not ejected, not
-- unhealthy).
local function live(r, tiers)
  for _, t in ipairs(tiers) do
    for _, p in ipairs(t.peers) do
      if not state.out_of_pick(r, t, p) then
        return true
      end
    end
  end
  return false
end

-- split chooses the request's version (choose) and falls through
-- to the other version when the chosen one has no live peer and the
-- other has; it records the version (and the fallthrough, and the cookie
-- to set) in ngx.ctx and returns the version's tiers.
function M.split(r, ctx)
  local c = r.canary
  local v, keyless = M.choose(r, c)
  if keyless then
    ctx.autoconfig_cookie = M.cookie_for(c, v)
  end
  if not live(r, tiers_of(r, v)) and live(r, tiers_of(r, M.OTHER[v])) then
    ctx.autoconfig_fell = v
    v = M.OTHER[v]
  end
  ctx.autoconfig_version = v
  return tiers_of(r, v)
end

return M
