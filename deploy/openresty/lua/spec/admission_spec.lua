-- router_admission: the admission decision from the peers' requests in
-- flight and limits (static max_concurrency, the adaptive limit, ejected
-- peers, admission = "off"), the slots a request takes and gives back
-- (plan, unplan, release, settle: each slot given back once), and the
-- connection failures that eject a peer; router_balance.reachable.
-- The route's store is router_state's worker-local store (no shared dict
-- outside nginx), so the state keys are the engine's own.

local clock = 1000
local logged = {}
_G.ngx = {
  shared = {},
  now = function() return clock end,
  log = function(_, ...) logged[#logged + 1] = table.concat({ ... }) end,
  WARN = "warn",
}

local state = require("router_state")
local slo = require("router_slo")
local admission = require("router_admission")
local balance = require("router_balance")

local function peer(host) return { host = host, port = 8000 } end

-- route: a route as router_registry makes it, with only what the
-- admission and the slots read.
local function route(o, tiers)
  o = o or {}
  local store = state.store_for("spec")
  local r = {
    name = "qwen", options = o, tiers = tiers, store = store, rr = 0, labels = {},
    admission = o.admission ~= "off",
    eject_after = o.eject_after or 3, max_eject_pct = o.max_eject_pct or 50, eject_secs = 10,
    fail_close = o.failure_mode == "FailClose",
    aff = { on = false },
  }
  r.slo = slo.config(o)
  return r
end

local function backend(n, max)
  local t = { use = "backend", priority = 1, max_concurrency = max, peers = {} }
  for i = 1, n do t.peers[i] = peer("10.0.0." .. i) end
  return t
end

local function set_active(r, t, i, n)
  r.store:set(state.pkey("a", t, t.peers[i]), n)
end

local function active(r, t, i)
  return r.store:get(state.pkey("a", t, t.peers[i]))
end

describe("router_admission.decide", function()
  it("refuses when every peer of the serving tier is at its max_concurrency", function()
    local t = backend(2, 2)
    local r = route({}, { t })
    set_active(r, t, 1, 2)
    set_active(r, t, 2, 2)
    local pt, pp, place, why, full = admission.decide(r, r.tiers, nil)
    assert.is_nil(pt)
    assert.is_nil(pp)
    assert.is_nil(place)
    assert.are.equal("max_concurrency", why)
    assert.are.equal(t, full)
  end)

  it("admits to the peer under its limit", function()
    local t = backend(2, 2)
    local r = route({}, { t })
    set_active(r, t, 1, 2)
    set_active(r, t, 2, 1)
    local pt, pp, place, why = admission.decide(r, r.tiers, nil)
    assert.are.equal(t, pt)
    assert.are.equal(t.peers[2], pp)
    assert.is_nil(place)
    assert.is_nil(why)
  end)

  it("admits every request with admission = off", function()
    local t = backend(1, 1)
    local r = route({ admission = "off" }, { t })
    set_active(r, t, 1, 5)
    local pt, pp, _, why = admission.decide(r, r.tiers, nil)
    assert.are.equal(t.peers[1], pp)
    assert.are.equal(t, pt)
    assert.is_nil(why)
  end)

  it("admits without a limit (no max_concurrency, no SLO)", function()
    local t = backend(1, nil)
    local r = route({}, { t })
    set_active(r, t, 1, 10000)
    local pt, _, _, why = admission.decide(r, r.tiers, nil)
    assert.are.equal(t, pt)
    assert.is_nil(why)
  end)

  it("judges the first tier with a peer in the pick: a tier of ejected peers is skipped", function()
    local t1, t2 = backend(1, 4), { use = "backend-svc", priority = 2, max_concurrency = 1, peers = { peer("10.96.0.1") } }
    local r = route({}, { t1, t2 })
    r.store:set(state.pkey("e", t1, t1.peers[1]), true)
    set_active(r, t2, 1, 1)
    local _, _, _, why, full = admission.decide(r, r.tiers, nil)
    assert.are.equal("max_concurrency", why)
    assert.are.equal(t2, full)
  end)

  it("admits when no peer is in the pick (never failed for ejection alone)", function()
    local t = backend(2, 1)
    local r = route({}, { t })
    for i = 1, 2 do
      r.store:set(state.pkey("e", t, t.peers[i]), true)
      set_active(r, t, i, 1)
    end
    local pt, pp, _, why = admission.decide(r, r.tiers, nil)
    assert.are.equal(t, pt)
    assert.is_not_nil(pp)
    assert.is_nil(why)
  end)

  it("refuses at the adaptive limit with reason adaptive_limit", function()
    local t = backend(2, 8)
    local r = route({ tps_limit_tps = "20" }, { t })
    assert.is_true(r.slo.adaptive)
    for i = 1, 2 do
      r.store:set(state.pkey("l", t, t.peers[i]), 3)
      set_active(r, t, i, 3)
    end
    local _, _, _, why = admission.decide(r, r.tiers, nil)
    assert.are.equal("adaptive_limit", why)
    set_active(r, t, 2, 2)
    local _, pp, _, why2 = admission.decide(r, r.tiers, nil)
    assert.is_nil(why2)
    assert.are.equal(t.peers[2], pp)
  end)

  it("answers nil for a route without peers", function()
    local r = route({}, { backend(0, 1) })
    local pt, pp, place, why = admission.decide(r, r.tiers, nil)
    assert.is_nil(pt)
    assert.is_nil(pp)
    assert.is_nil(place)
    assert.is_nil(why)
  end)
end)

describe("router_admission slots", function()
  it("plan takes the peer's and the tier's slot; unplan gives them back once", function()
    local t = backend(1, 4)
    local r = route({}, { t })
    r.version = "v1"
    local ctx = {}
    admission.plan(r, ctx, t, t.peers[1])
    assert.are.equal(1, active(r, t, 1))
    assert.are.equal(1, r.store:get(state.tkey(t)))
    assert.are.same({ t = t, p = t.peers[1], version = "v1", held = true }, ctx.autoconfig_plan)
    admission.unplan(r, ctx)
    admission.unplan(r, ctx)
    assert.are.equal(0, active(r, t, 1))
    assert.are.equal(0, r.store:get(state.tkey(t)))
    assert.is_false(ctx.autoconfig_plan.held)
    admission.unplan(r, {})
    assert.are.equal(0, active(r, t, 1))
  end)

  it("release gives back only a counted try's slot", function()
    local t = backend(1, 4)
    local r = route({}, { t })
    admission.take(r, t, t.peers[1])
    admission.release(r, { t = t, p = t.peers[1], key = state.ident(t, t.peers[1]), counted = false })
    assert.are.equal(1, active(r, t, 1))
    admission.release(r, { t = t, p = t.peers[1], key = state.ident(t, t.peers[1]), counted = true })
    assert.are.equal(0, active(r, t, 1))
    assert.are.equal(0, r.store:get(state.tkey(t)))
  end)

  it("release deletes the count of a dynamic route's peer that left the table", function()
    local t = backend(2, 4)
    local r = route({}, { t })
    r.dynamic = true
    r.members = { [state.ident(t, t.peers[1])] = true }
    for i = 1, 2 do admission.take(r, t, t.peers[i]) end
    for i = 1, 2 do
      admission.release(r, { t = t, p = t.peers[i], key = state.ident(t, t.peers[i]), counted = true })
    end
    assert.are.equal(0, active(r, t, 1))
    assert.is_nil(active(r, t, 2))
  end)

  it("settle releases the slot and resets the failures after a response", function()
    local t = backend(1, 4)
    local r = route({}, { t })
    local p = t.peers[1]
    admission.take(r, t, p)
    r.store:set(state.pkey("f", t, p), 2)
    admission.settle(r, { t = t, p = p, key = state.ident(t, p), counted = true }, "0.001")
    assert.are.equal(0, active(r, t, 1))
    assert.are.equal(0, r.store:get(state.pkey("f", t, p)))
  end)

  it("settle counts a connection failure when the last connect time is '-' or missing", function()
    local t = backend(4, 4)
    local r = route({}, { t })
    local p = t.peers[1]
    local x = { t = t, p = p, key = state.ident(t, p), counted = false }
    admission.settle(r, x, "0.002, -")
    assert.are.equal(1, r.store:get(state.pkey("f", t, p)))
    admission.settle(r, x, nil)
    assert.are.equal(2, r.store:get(state.pkey("f", t, p)))
    assert.is_nil(r.store:get(state.pkey("e", t, p)))
    admission.settle(r, x, "-")
    assert.is_true(state.ejected(r, t, p))
    assert.are.equal(1, r.store:get(state.pkey("n", t, p)))
    assert.are.equal(0, r.store:get(state.pkey("f", t, p)))
    assert.is_truthy(string.find(logged[#logged], "ejected backend peer 10.0.0.1:8000", 1, true))
  end)

  it("failed_try settles the try and counts only a failure without a response", function()
    local t = backend(4, 4)
    local r = route({}, { t })
    local p = t.peers[1]
    admission.take(r, t, p)
    local x = { t = t, p = p, key = state.ident(t, p), counted = true }
    admission.failed_try(r, x, "next")
    assert.is_true(x.settled)
    assert.are.equal(0, active(r, t, 1))
    assert.is_nil(r.store:get(state.pkey("f", t, p)))
    admission.failed_try(r, { t = t, p = p, key = x.key, counted = false }, "failed")
    assert.are.equal(1, r.store:get(state.pkey("f", t, p)))
  end)

  it("never ejects more than max_ejection_percent of a backend tier", function()
    local t = backend(2, 4)
    local r = route({ eject_after = 1 }, { t })
    for i = 1, 2 do
      admission.connect_failed(r, t, t.peers[i])
    end
    assert.is_true(state.ejected(r, t, t.peers[1]))
    assert.is_false(state.ejected(r, t, t.peers[2]))
  end)

  it("never ejects with eject_after 0 (a FailClose route's default)", function()
    local t = backend(2, 4)
    local r = route({ eject_after = 0 }, { t })
    admission.connect_failed(r, t, t.peers[1])
    assert.is_nil(r.store:get(state.pkey("f", t, t.peers[1])))
  end)
end)

describe("router_balance.reachable", function()
  it("counts every tier's peers, a FailClose route's down to its cart tier", function()
    local cart = { use = "cart", peers = { peer("10.0.1.1"), peer("10.0.1.2") } }
    local tiers = { cart, backend(3, nil) }
    assert.are.equal(5, balance.reachable(route({}, tiers), tiers))
    assert.are.equal(2, balance.reachable(route({ failure_mode = "FailClose" }, tiers), tiers))
  end)
end)
