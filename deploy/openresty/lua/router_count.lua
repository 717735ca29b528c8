-- router_count: what the phases count of a route in the engine's
-- metrics dict (autoconfig@metrics; docs/metrics.md, engine): requests,
-- canary versions and fallthroughs, placements, held requests, state
-- writes the route's dict had no room for. Labels are made once per
-- route, version and peer (r.labels). router_metrics stores and exposes
-- them.
local state = require("router_state")
local canary = require("router_canary")
local metrics = require("router_metrics")

local K_SERVED, K_FELL = canary.K_SERVED, canary.K_FELL

local M = {}

local METRICS_DICT = "autoconfig@metrics"
local mdict_checked, mdict = false, nil

-- dict: the shared dict of the engine's metrics, nil when the image's
-- nginx.conf declares none (then nothing is counted).
function M.dict()
  if not mdict_checked then
    mdict_checked = true
    mdict = state.dict(METRICS_DICT)
  end
  return mdict
end
local metrics_dict = M.dict

-- lv: the labels of route r's version v (nil: no canary), with the
-- cache of its peers' labels.
local function lv(r, v)
  local c = r.labels[v or ""]
  if c == nil then
    c = { rv = metrics.labels("route", r.name, "version", v), peers = {} }
    r.labels[v or ""] = c
  end
  return c
end
M.lv = lv

local CLASSES = { "1xx", "2xx", "3xx", "4xx", "5xx" }

local function lpeer(r, v, peer, status)
  local c = lv(r, v)
  local cls = CLASSES[math.floor(status / 100)] or "5xx"
  local pc = c.peers[peer]
  if pc == nil then
    pc = {}
    c.peers[peer] = pc
  end
  local s = pc[cls]
  if s == nil then
    s = metrics.labels("route", r.name, "version", v, "peer", peer, "class", cls)
    pc[cls] = s
  end
  return s
end

-- request counts a request of route r (version v) answered by peer
-- ("host:port", "" when none) with status.
function M.request(r, v, peer, status)
  local d = metrics_dict()
  if d then
    metrics.inc(d, "autoconfig_engine_requests_total", lpeer(r, v, peer or "", status), 1)
  end
end

-- version counts the version v that served a canary route's request, and
-- the fallthrough from version fell (nil: none).
function M.version(r, v, fell)
  state.incr(r, K_SERVED[v], 1)
  if fell then
    state.incr(r, K_FELL[fell], 1)
    local d = metrics_dict()
    if d then
      metrics.inc(d, "autoconfig_engine_canary_fallthrough_total", lv(r, fell).rv, 1)
    end
  end
end

-- placement counts the affinity placement of a request ("home",
-- "spill", "keyless"; nil: none).
function M.placement(r, v, place)
  local d = metrics_dict()
  if d and place then
    local c = lv(r, v)
    local ps = c[place]
    if ps == nil then
      ps = metrics.labels("route", r.name, "version", v, "result", place)
      c[place] = ps
    end
    metrics.inc(d, "autoconfig_engine_affinity_placements_total", ps, 1)
  end
end

-- hold counts a held request's outcome (served, timeout, refused)
-- and how long it waited.
function M.hold(r, result, waited)
  local d = metrics_dict()
  if not d then
    return
  end
  metrics.inc(d, "autoconfig_engine_held_requests_total", metrics.labels("route", r.name, "result", result), 1)
  if result ~= "refused" then
    metrics.observe(d, "autoconfig_engine_hold_seconds", metrics.labels("route", r.name), waited)
  end
end

-- state_failure is router_state's on_failure: a state write the route's
-- dict had no room for, counted, and logged once per route and worker.
local full_logged = {}
function M.state_failure(r, key, err)
  local d = metrics_dict()
  if d then
    metrics.inc(d, "autoconfig_engine_state_write_failures_total", lv(r, nil).rv, 1)
  end
  if not full_logged[r.name] then
    full_logged[r.name] = true
    ngx.log(ngx.WARN, "route ", r.name, ": its lua_shared_dict has no room for peer state (", tostring(key), ": ",
      tostring(err), "); requests are served, the state is not kept (raise shared_dict_size)")
  end
  -- Make room once in a while (not in the request: a timer), deleting
  -- the state that only informs or is learnt again.
  local now = ngx.now()
  if err == "no memory" and r.shared and (r.room_at or 0) <= now then
    r.room_at = now + 5
    ngx.timer.at(0, function(premature, dict, name)
      if not premature then
        local n = state.make_room(dict)
        ngx.log(ngx.INFO, "route ", name, ": dict full, deleted ", n, " keys of disposable state")
      end
    end, r.store, r.name)
  end
end

return M
