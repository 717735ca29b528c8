-- router_status: a route's own endpoints, GET /_status[?strings=hex]
-- (what the route registered and its peers' live state) and GET
-- /_tps_status (what its SLO admission does now); docs/lua-contract.md,
-- "The reference engine" and "Admission (decode SLO)".
local cjson = require("cjson.safe")
local state = require("router_state")
local tbl = require("router_table")
local canary = require("router_canary")
local slo = require("router_slo")

local hex, hexify, pkey = state.hex, state.hexify, state.pkey
local active, ejected, unhealthy = state.active, state.ejected, state.unhealthy
local K_SERIAL = tbl.K_SERIAL

local M = {}

local function answer_json(v)
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(v))
  return ngx.exit(200)
end

-- tier_state: the live state of the peers of tiers.
function M.tier_state(r, tiers)
  local st = {}
  for ti, t in ipairs(tiers) do
    local peers = {}
    for pi, p in ipairs(t.peers) do
      peers[pi] = {
        host = p.host, port = p.port,
        active = active(r, t, p),
        fails = r.store:get(pkey("f", t, p)) or 0,
        ejected = ejected(r, t, p),
        ejections = r.store:get(pkey("n", t, p)) or 0,
        tries = r.store:get(pkey("t", t, p)) or 0,
        healthy = not unhealthy(r, t, p),
      }
    end
    st[ti] = { use = t.use, peers = peers }
  end
  return st
end
local tier_state = M.tier_state

local function status(r)
  local st = tier_state(r, r.tiers)
  local out = {
    route = r.name, options = r.options, tiers = r.tiers,
    registrations = r.registrations, pid = ngx.worker.pid(),
    shared_dict = r.shared, state = st,
  }
  if r.dynamic then
    out.dynamic, out.version, out.serial = true, r.version, r.store:get(K_SERIAL)
  end
  local c = r.canary
  if c then
    local counts = canary.split_counts(r.store)
    out.canary = {
      weight = c.weight, sticky_header = c.sticky_header, override_header = c.override_header,
      sticky_cookie = c.sticky_cookie, tiers = c.tiers, state = tier_state(r, c.tiers),
      requests = counts.requests, fallthrough = counts.fallthrough, draws = counts.draws,
    }
  end
  if ngx.var.arg_strings == "hex" then
    if out.canary then out.canary = hexify(out.canary) end
    out.route, out.options, out.tiers, out.state = hex(r.name), hexify(r.options), hexify(r.tiers), hexify(st)
    if out.version then out.version = hex(out.version) end
  end
  -- The tiers' rings are the engine's own; they are not part of the
  -- registration.
  return out
end

-- route answers GET /_status of route (r: its registration in this
-- worker, nil when none).
function M.route(route, r)
  if not r then
    return answer_json({ route = route, registered = false })
  end
  return answer_json(status(r))
end

-- tps: GET /_tps_status, what the route's SLO admission does now.
function M.tps(route, r)
  local o = r and r.options or {}
  local s = r and r.slo or slo.config(o)
  local out = {
    route = route, options = o,
    opt_in = s.opt_in,
    adaptive_cc_on = s.adaptive,
    tps_limit_tps = s.tps, ttft_limit_ms = s.ttft,
    adaptive_cc_min = s.min, adaptive_cc_max = s.max,
    affinity = r and r.aff and r.aff.on or false,
  }
  if r then
    local peers = slo.peers_status(r, r.tiers, r.canary and "stable" or nil, {})
    if r.canary then
      slo.peers_status(r, r.canary.tiers, "canary", peers)
    end
    out.peers = peers
  end
  return answer_json(out)
end

return M
