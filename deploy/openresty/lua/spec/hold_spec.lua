-- router_hold: the hold's options, the peer count, and the wait loop on a
-- simulated clock (ngx.sleep advances it): served at the first peer,
-- refused past hold_max, 503 at the timeout, the waiting count always
-- given back; the open count (arrive in the access phase, leave in the
-- log phase, exactly once) and the demand report of a route dict.

local clock, exiting = 1000, false
_G.ngx = {
  now = function() return clock end,
  update_time = function() end,
  sleep = function(s) clock = clock + s end,
  worker = { exiting = function() return exiting end },
  var = { server_addr = "127.0.0.1" },
  crc32_long = function(s) return #s end,
  shared = {},
}

local hold = require("router_hold")
-- The wait's clock is the simulated one (in nginx: CLOCK_MONOTONIC).
local monotonic = hold.clock
hold.clock = function() return ngx.now() end

-- fake_dict is the part of an ngx.shared dict the hold uses.
local function fake_dict()
  local d = { data = {} }
  function d:get(k) return self.data[k] end
  function d:incr(k, n)
    if self.data[k] == nil then return nil, "not found" end
    self.data[k] = self.data[k] + n
    return self.data[k]
  end
  function d:safe_add(k, v)
    if self.data[k] ~= nil then return false, "exists" end
    self.data[k] = v
    return true
  end
  function d:safe_set(k, v) self.data[k] = v; return true end
  function d:delete(k) self.data[k] = nil end
  return d
end

local function route(o, dynamic)
  local r = { name = "qwen", store = fake_dict(), dynamic = dynamic, tiers = {}, npeers = 0 }
  r.hold = hold.config(o)
  return r
end

describe("router_hold.config", function()
  it("is off without hold_timeout, bounded with it", function()
    assert.are.same({ timeout = 0, max = 256 }, hold.config({}))
    assert.are.same({ timeout = 300, max = 256 }, hold.config({ hold_timeout = "300" }))
    assert.are.same({ timeout = 3600, max = 1 }, hold.config({ hold_timeout = "99999", hold_max = "0" }))
    assert.are.same({ timeout = 0, max = 256 }, hold.config({ hold_timeout = "soon" }))
  end)
end)

describe("router_hold.has_peer", function()
  it("counts a static route's tiers and its canary's, a dynamic route's table", function()
    local r = route({ hold_timeout = "5" })
    assert.is_false(hold.has_peer(r))
    r.tiers = { { use = "backend", peers = {} } }
    assert.is_false(hold.has_peer(r))
    r.canary = { tiers = { { use = "canary", peers = { { host = "10.0.0.1", port = 80 } } } } }
    assert.is_true(hold.has_peer(r))
    local d = route({ hold_timeout = "5" }, true)
    d.tiers = { { peers = { { host = "10.0.0.1", port = 80 } } } }
    assert.is_false(hold.has_peer(d)) -- the table's count, not stale tiers
    d.npeers = 1
    assert.is_true(hold.has_peer(d))
  end)
end)

describe("router_hold.wait", function()
  before_each(function() clock, exiting = 1000, false end)

  it("holds until a peer arrives, then gives the count back", function()
    local r = route({ hold_timeout = "10" }, true)
    local looks = 0
    local result, waited = hold.wait(r, function()
      looks = looks + 1
      assert.are.equal(1, r.store:get(hold.K_WAITING))
      if looks == 20 then r.npeers = 1 end
    end)
    assert.are.equal("served", result)
    assert.are.equal(20, looks)
    assert.is_true(waited > 0.9 and waited < 1.0) -- 19 steps of 50 ms
    assert.are.equal(0, r.store:get(hold.K_WAITING))
    assert.are.equal(1, r.store:get(hold.K_TOTAL))
  end)

  it("times out at hold_timeout, not before, in steps of at most STEP", function()
    local r = route({ hold_timeout = "3" }, true)
    local last = clock
    local result, waited = hold.wait(r, function()
      assert.is_true(clock - last <= hold.STEP + 1e-9)
      last = clock
    end)
    assert.are.equal("timeout", result)
    assert.is_true(waited >= 3 and waited <= 3.001 + 1e-6)
    assert.are.equal(0, r.store:get(hold.K_WAITING))
  end)

  it("waits on CLOCK_MONOTONIC, not the wall clock ngx.now() caches", function()
    local a = monotonic()
    local b = monotonic()
    assert.is_true(b >= a)
    assert.are_not.equal(ngx.now(), a) -- the stub's wall clock says 1000
    assert.is_true(a > 0)
  end)

  it("never times out before hold_timeout on nginx's millisecond clock", function()
    -- ngx.now() truncates to the millisecond: the request arrives at
    -- 1000.0007 but the clock says 1000.000.
    local real = 1000.0007
    local now, sleep = ngx.now, ngx.sleep
    ngx.now = function() return math.floor(real * 1000) / 1000 end
    ngx.sleep = function(s) real = real + s end
    local r = route({ hold_timeout = "3" }, true)
    local start = real
    local result = hold.wait(r, function() end)
    ngx.now, ngx.sleep = now, sleep
    assert.are.equal("timeout", result)
    assert.is_true(real - start >= 3, "answered after " .. (real - start) .. " s, before hold_timeout")
  end)

  it("refuses past hold_max at once", function()
    local r = route({ hold_timeout = "3", hold_max = "2" }, true)
    r.store.data[hold.K_WAITING] = 2
    local result, waited = hold.wait(r, function() error("no look") end)
    assert.are.equal("refused", result)
    assert.are.equal(0, waited)
    assert.are.equal(2, r.store:get(hold.K_WAITING))
  end)

  it("gives the count back when the look fails", function()
    local r = route({ hold_timeout = "3" }, true)
    assert.has_error(function() hold.wait(r, function() error("boom") end) end)
    assert.are.equal(0, r.store:get(hold.K_WAITING))
    assert.are.equal(0, hold.engine().r.store:get(hold.K_ENGINE_WAITING))
  end)
end)

describe("router_hold engine bound", function()
  before_each(function() clock, exiting = 1000, false end)
  after_each(function() hold.configure({}) end)

  it("is the workers' connections / 8 (4 per held request, half kept)", function()
    assert.are.equal(4096, hold.engine_bound(2, 16384))
    assert.are.equal(1024, hold.engine_bound(2, 4096))
    assert.are.equal(768, hold.engine_bound(3, 2048))
    assert.are.equal(1, hold.engine_bound(1, 1))
  end)

  it("derives from worker_connections (nginx's 512 without it), one worker without the dict", function()
    hold.configure({})
    assert.are.equal(64, hold.engine().max) -- 512 / 8
    hold.configure({ worker_connections = "800" })
    local e = hold.engine()
    assert.are.same({ 1, 800, 100 }, { e.workers, e.connections, e.max })
    hold.configure({ worker_connections = 800, hold_engine_max = "7" })
    assert.are.equal(7, hold.engine().max)
    hold.configure({ worker_connections = "lots", hold_engine_max = -1 })
    assert.are.equal(64, hold.engine().max)
  end)

  it("refuses past the engine's bound at once, all routes together, and gives both counts back", function()
    hold.configure({ hold_engine_max = 2 })
    local a = route({ hold_timeout = "3", hold_max = "10" }, true)
    local b = route({ hold_timeout = "3", hold_max = "10" }, true)
    local estore = hold.engine().r.store
    estore:set(hold.K_ENGINE_WAITING, 2) -- two held elsewhere
    local result, waited, reason = hold.wait(b, function() error("no look") end)
    local _
    assert.are.same({ "refused", 0, "hold_engine_full" }, { result, waited, reason })
    assert.are.equal(0, b.store:get(hold.K_WAITING))
    assert.are.equal(2, estore:get(hold.K_ENGINE_WAITING))
    assert.matches("the engine holds 2 requests already", hold.why(b, reason))
    estore:set(hold.K_ENGINE_WAITING, 1)
    local looks = 0
    result, _, reason = hold.wait(a, function()
      looks = looks + 1
      assert.are.equal(2, estore:get(hold.K_ENGINE_WAITING))
      if looks == 3 then a.npeers = 1 end
    end)
    assert.are.same({ "served", nil }, { result, reason })
    assert.are.equal(1, estore:get(hold.K_ENGINE_WAITING))
    result, _, reason = hold.wait(route({ hold_timeout = "1" }, true), function() end)
    assert.are.same({ "timeout", "hold_timeout" }, { result, reason })
    assert.are.equal(1, estore:get(hold.K_ENGINE_WAITING))
    local r = route({ hold_timeout = "3", hold_max = "2" }, true)
    r.store.data[hold.K_WAITING] = 2
    result, _, reason = hold.wait(r, function() end)
    assert.are.same({ "refused", "hold_full" }, { result, reason })
    assert.are.equal(1, estore:get(hold.K_ENGINE_WAITING)) -- the route's bound first
  end)

  it("reports the engine's hold", function()
    hold.configure({ worker_connections = 800 })
    hold.engine().r.store:set(hold.K_ENGINE_WAITING, 3)
    assert.are.same({ waiting = 3, max = 100, workers = 1, worker_connections = 800 }, hold.engine_report())
  end)
end)

describe("router_hold static tiers", function()
  it("a worker of the current configuration publishes, an old one takes them", function()
    local new = route({ hold_timeout = "5" })
    new.tiers = { { use = "backend", priority = 2, peers = { { host = "10.0.0.1", port = 8000 } } } }
    local old = route({ hold_timeout = "5" })
    old.store = new.store -- one route dict
    exiting = true
    hold.registered(old) -- an exiting worker never publishes
    assert.is_nil(new.store:get(hold.K_TIERS_VERSION))
    exiting = false
    hold.registered(new)
    assert.is_false(hold.has_peer(old))
    hold.sync_static(old)
    assert.is_true(hold.has_peer(old))
    assert.are.equal("10.0.0.1", old.tiers[1].peers[1].host)
  end)
end)

describe("router_hold.demand", function()
  it("reports a holding route's waiting, last request and total; nil for others", function()
    local r = route({ hold_timeout = "5" }, true)
    assert.is_nil(hold.demand(r.store))
    hold.registered(r)
    hold.touch(r)
    assert.are.same({ waiting = 0, open = 0, last_request = 1000, last_end = 0, held_total = 0 }, hold.demand(r.store))
  end)
end)

describe("router_hold open count", function()
  it("counts a request from arrive to leave, once, and records its end", function()
    local r = route({ hold_timeout = "5" }, true)
    hold.registered(r)
    clock = 2000
    local a, b = {}, {}
    hold.arrive(r, a)
    hold.arrive(r, a) -- the same request again: counted once
    hold.arrive(r, b)
    local d = hold.demand(r.store)
    assert.are.equal(2, d.open)
    assert.are.equal(2000, d.last_request)
    assert.are.equal(0, d.last_end)
    clock = 2007.5
    hold.leave(a)
    hold.leave(a) -- a second log phase gives nothing back
    d = hold.demand(r.store)
    assert.are.equal(1, d.open)
    assert.are.equal(2007.5, d.last_end)
    clock = 2009
    hold.leave(b)
    d = hold.demand(r.store)
    assert.are.equal(0, d.open)
    assert.are.equal(2009, d.last_end)
    assert.are.equal(2000, d.last_request)
  end)

  it("gives nothing back for a request it did not count", function()
    local r = route({ hold_timeout = "5" }, true)
    hold.registered(r)
    hold.arrive(r, {})
    hold.leave({}) -- a request that never arrived on a hold route
    assert.are.equal(1, hold.demand(r.store).open)
  end)

  it("counts nothing when the dict is full, and gives nothing back", function()
    local r = route({ hold_timeout = "5" }, true)
    hold.registered(r)
    r.store.safe_add = function() return false, "no memory" end
    local ctx = {}
    hold.arrive(r, ctx)
    assert.are.equal(0, hold.demand(r.store).open)
    hold.leave(ctx)
    assert.are.equal(0, hold.demand(r.store).open)
    assert.is_nil(r.store:get(hold.K_LAST_END))
  end)

  it("gives the count back on the route it was taken on, after a re-registration", function()
    local r = route({ hold_timeout = "5" }, true)
    hold.registered(r)
    local ctx = {}
    hold.arrive(r, ctx)
    -- the route registered again without the hold (a new route object
    -- whose hold is off): the mark names the route the count was taken on
    r.hold = hold.config({})
    hold.leave(ctx)
    assert.are.equal(0, hold.demand(r.store).open)
  end)

  it("never moves the last end back", function()
    local r = route({ hold_timeout = "5" }, true)
    hold.registered(r)
    local a, b = {}, {}
    hold.arrive(r, a)
    hold.arrive(r, b)
    clock = 3000
    hold.leave(a)
    clock = 2999 -- another worker's older end, logged later
    hold.leave(b)
    assert.are.equal(3000, hold.demand(r.store).last_end)
  end)

  it("exports the waiting and open gauges of a holding route only", function()
    local r = route({ hold_timeout = "5" }, true)
    local out = {}
    hold.gauges(out, "qwen", r.store)
    assert.are.equal(0, #out)
    hold.registered(r)
    hold.arrive(r, {})
    hold.gauges(out, "qwen", r.store)
    hold.gauges(out, "none", nil)
    assert.are.equal(2, #out)
    assert.are.equal("autoconfig_engine_waiting_requests", out[1].name)
    assert.are.equal(0, out[1].value)
    assert.are.equal("autoconfig_engine_open_requests", out[2].name)
    assert.are.equal(1, out[2].value)
    assert.are.equal('route="qwen"', out[2].labels)
  end)
end)
