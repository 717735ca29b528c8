-- router_gauges: a scrape's per-peer gauges come from the route's peers
-- (its own registration, the registry another worker wrote, or the stored
-- peers table) and their four state keys; a dict's keys are never listed,
-- so what else the dict holds (chain keys) costs the scrape nothing.

_G.ngx = { shared = {}, now = function() return 1000 end }

local cjson = require("cjson.safe")
local gauges = require("router_gauges")
local routes = require("router_probe").routes

local function fake_dict()
  local d = { data = {} }
  function d:get(k) return self.data[k] end
  function d:safe_set(k, v) self.data[k] = v; return true end
  function d:get_keys() error("a scrape must not list a dict's keys") end
  return d
end

local TIERS = {
  { use = "backend", priority = 2, peers = { { host = "10.0.0.1", port = 8000 }, { host = "fd00::a", port = 8000 } } },
  { use = "backend-svc", priority = 1, peers = { { host = "10.96.0.10", port = 80 } } },
}

local function by_series(out)
  local m = {}
  for _, g in ipairs(out) do m[g.name .. "{" .. g.labels .. "}"] = g.value end
  return m
end

local function fill_state(d)
  d.data["a|backend|10.0.0.1|8000"] = 3
  d.data["l|backend|10.0.0.1|8000"] = 7.6
  d.data["r|backend|10.0.0.1|8000"] = 41.5
  d.data["m|backend|10.0.0.1|8000"] = 250
  d.data["a|backend|fd00::a|8000"] = 0
  d.data["a|backend-svc|10.96.0.10|80"] = 1
  d.data["a|backend|10.0.0.99|8000"] = 5 -- a peer no longer listed
  for i = 1, 1000 do d.data["x|resp_" .. i] = "chat\0s\0u" .. i end
end

local WANT = {
  ['autoconfig_engine_peer_in_flight{route="qwen",peer="10.0.0.1:8000"}'] = 3,
  ['autoconfig_engine_peer_concurrency_limit{route="qwen",peer="10.0.0.1:8000"}'] = 7,
  ['autoconfig_engine_peer_decode_tokens_per_second{route="qwen",peer="10.0.0.1:8000"}'] = 41.5,
  ['autoconfig_engine_peer_ttft_seconds{route="qwen",peer="10.0.0.1:8000"}'] = 0.25,
  ['autoconfig_engine_peer_in_flight{route="qwen",peer="fd00::a:8000"}'] = 0,
  ['autoconfig_engine_peer_in_flight{route="qwen",peer="10.96.0.10:80"}'] = 1,
}

describe("router_gauges.collect", function()
  before_each(function()
    for k in pairs(routes) do routes[k] = nil end
  end)

  it("reads a static route's peers from this worker's registration, else from the registry", function()
    local d = fake_dict()
    ngx.shared = { qwen = d, ["autoconfig@metrics"] = fake_dict() }
    fill_state(d)
    local r = { name = "qwen", tiers = TIERS, store = d, shared = true }
    gauges.remember(r)
    assert.are.equal("backend|10.0.0.1|8000\nbackend|fd00::a|8000\nbackend-svc|10.96.0.10|80", d.data["g|peers"])
    routes.qwen = r
    assert.are.same(WANT, by_series(gauges.collect()))
    routes.qwen = nil -- a worker that has not registered the route
    assert.are.same(WANT, by_series(gauges.collect()))
  end)

  it("reads a dynamic route's peers from its stored table, the canary's too", function()
    local d = fake_dict()
    ngx.shared = { qwen = d }
    fill_state(d)
    d.data["a|canary|10.0.5.1|8000"] = 2
    d.data["peers|version"] = "v1"
    d.data["peers|table"] = cjson.encode({ format = 2, route = "qwen", version = "v1", tiers = TIERS,
      canary = { weight = 10, tiers = { { use = "canary", priority = 2, peers = { { host = "10.0.5.1", port = 8000 } } } } } })
    routes.qwen = { name = "qwen", dynamic = true }
    local want = {}
    for k, v in pairs(WANT) do want[k] = v end
    want['autoconfig_engine_peer_in_flight{route="qwen",peer="10.0.5.1:8000"}'] = 2
    assert.are.same(want, by_series(gauges.collect()))
    -- A new version is read again.
    d.data["peers|version"] = "v2"
    d.data["peers|table"] = cjson.encode({ format = 1, route = "qwen", version = "v2",
      tiers = { { use = "backend", priority = 2, peers = { { host = "10.0.0.1", port = 8000 } } } } })
    local got = by_series(gauges.collect())
    assert.are.equal(3, got['autoconfig_engine_peer_in_flight{route="qwen",peer="10.0.0.1:8000"}'])
    assert.is_nil(got['autoconfig_engine_peer_in_flight{route="qwen",peer="fd00::a:8000"}'])
  end)

  it("exports nothing for a dict without peers", function()
    ngx.shared = { other = fake_dict() }
    assert.are.same({}, gauges.collect())
  end)
end)
