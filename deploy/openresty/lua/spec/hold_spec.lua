-- router_hold: the hold's options, the peer count, and the wait loop on a
-- simulated clock (ngx.sleep advances it): served at the first peer,
-- refused past hold_max, 503 at the timeout, the waiting count always
-- given back; the demand report of a route dict.

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
    assert.are.same({ waiting = 0, last_request = 1000, held_total = 0 }, hold.demand(r.store))
  end)
end)
