-- router_gauges: the gauges of a scrape (docs/metrics.md, engine), read
-- from the route dicts' peer state, whichever worker answers.
--
-- A scrape reads exactly the keys of its series: for each route dict, the
-- hold gauges and, for each of the route's peers, its four state keys
-- (a| in flight, l| limit, r| decode EWMA, m| TTFT EWMA, each
-- "<kind>|<use>|<host>|<port>"). It never lists a dict's keys: a route's
-- dict also holds what clients make (one Responses chain key per answer,
-- kept an hour), so the cost of a walk grew with the traffic, while this
-- one grows with routes × peers only.
--
-- The route's peers are, in this order:
--   * a dynamic route (its dict holds "peers|version"): the stored peers
--     table's tiers and canary tiers (decoded once per version and worker);
--   * a static route registered in this worker: its tiers and canary tiers;
--   * else the registry "g|peers" in the route's dict, written by
--     remember() when a worker registers the route (one "use|host|port" a
--     line; safe_set, so it never evicts; a full dict leaves the last one).
-- Gauges of peers in none of these (a peer a reload took away) are not
-- exported: the gauges come from the live peers.
local cjson = require("cjson.safe")
local state = require("router_state")
local tbl = require("router_table")
local hold = require("router_hold")
local metrics = require("router_metrics")
local routes = require("router_probe").routes

local concat, floor, gmatch, match = table.concat, math.floor, string.gmatch, string.match

local M = {}

M.K_PEERS = "g|peers"
local K_PEERS, K_TABLE, K_VERSION = M.K_PEERS, tbl.K_TABLE, tbl.K_VERSION
local METRICS_DICT = metrics.DICT

local KINDS = {
  { "a", "autoconfig_engine_peer_in_flight" },
  { "l", "autoconfig_engine_peer_concurrency_limit" },
  { "r", "autoconfig_engine_peer_decode_tokens_per_second" },
  { "m", "autoconfig_engine_peer_ttft_seconds" },
}

-- The identities "use|host|port" of the peers of tiers, appended to ids.
local function add_ids(ids, tiers)
  for _, t in ipairs(type(tiers) == "table" and tiers or {}) do
    for _, p in ipairs(type(t.peers) == "table" and t.peers or {}) do
      ids[#ids + 1] = tostring(t.use) .. "|" .. tostring(p.host) .. "|" .. tostring(p.port)
    end
  end
  return ids
end

local function route_ids(r)
  local ids = add_ids({}, r.tiers)
  return add_ids(ids, r.canary and r.canary.tiers)
end

-- remember stores route r's peers in its dict's registry (a static route,
-- at its registration in a worker): the scrape of a worker that has not
-- registered the route reads them there.
function M.remember(r)
  if not r.shared then
    return
  end
  local text = concat(route_ids(r), "\n")
  if r.store:get(K_PEERS) ~= text then
    r.store:safe_set(K_PEERS, text)
  end
end

-- Per worker: route → { src = <what the list was made of>, peers = {
-- { keys = { a|…, l|…, r|…, m|… }, labels = … } } }.
local cache = {}

local function peer_list(name, src, ids)
  local c = cache[name]
  if c and c.src == src then
    return c.peers
  end
  local peers = {}
  for _, id in ipairs(ids) do
    local host, port = match(id, "^[^|]*|(.*)|(%d+)$")
    if host then
      local keys = {}
      for i, k in ipairs(KINDS) do
        keys[i] = k[1] .. "|" .. id
      end
      peers[#peers + 1] = { keys = keys, labels = metrics.labels("route", name, "peer", host .. ":" .. port) }
    end
  end
  cache[name] = { src = src, peers = peers }
  return peers
end

-- The peers of the route whose dict is named name.
local function peers_of(name, dict)
  local v = dict:get(K_VERSION)
  if v ~= nil then
    local c = cache[name]
    if c and c.src == v then
      return c.peers
    end
    local t = cjson.decode(dict:get(K_TABLE) or "")
    local ids = {}
    if type(t) == "table" then
      add_ids(ids, t.tiers)
      add_ids(ids, type(t.canary) == "table" and t.canary.tiers)
    end
    return peer_list(name, v, ids)
  end
  local r = routes[name]
  if r and not r.dynamic then
    -- The route's tiers are the same table until the next registration.
    return peer_list(name, r.tiers, route_ids(r))
  end
  local text = dict:get(K_PEERS)
  if type(text) ~= "string" then
    return {}
  end
  local ids = {}
  for id in gmatch(text, "[^\n]+") do
    ids[#ids + 1] = id
  end
  return peer_list(name, text, ids)
end

-- collect: the gauges of every route dict, for router_metrics.render.
function M.collect()
  local out = {}
  for name in pairs(ngx.shared) do
    if name ~= METRICS_DICT then
      local dict = state.dict(name)
      if dict then
        hold.gauges(out, name, dict)
        for _, p in ipairs(peers_of(name, dict)) do
          local keys = p.keys
          for i = 1, #KINDS do
            local val = dict:get(keys[i])
            if type(val) == "number" then
              if i == 4 then val = val / 1000 end
              if i == 2 then val = floor(val) end
              out[#out + 1] = { name = KINDS[i][2], value = val, labels = p.labels }
            end
          end
        end
      end
    end
  end
  return out
end

return M
