-- router_hold: holding requests at zero (docs/lua-contract.md, "Holding
-- requests at zero"). A route registered with the option hold_timeout (a
-- scale-to-zero route, spec.scaleToZero) that has no peer holds each
-- request instead of failing it: the request sleeps in steps of STEP
-- seconds (ngx.sleep: the worker serves others meanwhile, no busy loop),
-- looking each step for a peer — a pushed peers table (dynamic peers) or,
-- after a reload, the tiers the new route file registered — and goes on
-- to the first one; after hold_timeout it is answered 503 with
-- Retry-After. At most hold_max requests wait per route in one engine (all
-- workers: a counter in the route's dict), and at most engine_max in the
-- whole engine, all routes together (a counter in the shared dict
-- autoconfig@hold, see "The engine's bound" below); the excess is refused
-- at once.
--
-- The route's dict also keeps what the controller needs to wake and idle
-- the model (GET /demand on the control endpoint): the requests waiting,
-- the requests open now, the times of the route's last request and of the
-- last request's end, and the requests held so far.
--
-- A request is open from its access phase (arrive) to its log phase
-- (leave): held, waiting for its first byte, or streaming. The count is
-- kept with non-evicting writes (router_state), and the request carries a
-- mark in ngx.ctx naming the route it was counted on, so leave gives it
-- back exactly once, also after the route was registered again (without
-- the hold) in between. Every way out of the access phase (ngx.exit,
-- an error) still runs the request's log phase with the same ngx.ctx:
-- the route files (compiler/llm.go, video.go) have no error_page,
-- try_files or ngx.exec, the only internal redirect that drops ngx.ctx,
-- and their rewrite … break runs before the access phase. An engine
-- whose configuration adds one must give the count back there too.
-- A worker that dies with requests open (a crash, not a reload: an
-- exiting worker runs their log phases) leaves them counted until nginx
-- restarts.
--
-- A static route's tiers are per worker, from its route file: a request
-- held in a worker of the old configuration after a reload would never
-- see the new file's. So a static hold route publishes its tiers in its
-- dict when a worker of the current configuration registers it, and a
-- held request in an exiting (old) worker asks the route's own socket for
-- /_status once a second — a new worker answers it and registers the
-- route — and takes the published tiers.
--
-- A client that goes away is not noticed while its request is held (the
-- shipped nginx.conf does not set lua_check_client_abort): the request
-- ends at the first peer or at hold_timeout, and the counter is given
-- back then, on every way out.
--
-- The engine's bound. A held request ties up connections of the engine's
-- workers, and when its peer arrives it opens one more at once: the
-- client's to the dispatch server, the dispatch's to the route's socket,
-- the route server's side of it, and the route server's to the peer —
-- CONNS (4) in all. The engine has W × C connections (W worker
-- processes, ngx.worker.count(); C = worker_connections, the init option
-- of the shipped nginx.conf, capped by the worker's open-file limit,
-- each connection being a descriptor). Held requests may take half of
-- them; the other half is kept for what is not held: other routes'
-- requests, a burst's requests on their way to being held or refused (3
-- connections each meanwhile), and the uneven spread of connections
-- over the workers (measured about 60/40 with 2 workers):
--
--   engine_max = floor(W × C / (2 × CONNS)) = floor(W × C / 8)
--
-- (the shipped nginx.conf, C = 16384: 4,096 held requests with 2
-- workers). The init option hold_engine_max sets engine_max instead.
-- Without the dict autoconfig@hold (an older nginx.conf) each worker
-- counts its own held requests against floor(C / 8).
local cjson = require("cjson.safe")
local state = require("router_state")
local metrics = require("router_metrics")

local M = {}

M.ENGINE_DICT = "autoconfig@hold"
M.K_ENGINE_WAITING = "hold|engine_waiting" -- requests held now, all routes
M.CONNS = 4
M.DEFAULT_WORKER_CONNECTIONS = 512 -- nginx's own default

M.K_ON = "hold|on"           -- the route holds (set at registration)
M.K_WAITING = "hold|waiting" -- requests held now
M.K_LAST = "hold|last"       -- ngx.now() of the last request
M.K_TOTAL = "hold|total"     -- requests held so far
M.K_OPEN = "hold|open"       -- requests open now (access to log phase)
M.K_LAST_END = "hold|last_end" -- ngx.now() of the last request's end
M.K_TIERS = "hold|tiers"     -- a static route's tiers (JSON)
M.K_TIERS_VERSION = "hold|tiers_version"
M.STEP = 0.05
M.DEFAULT_MAX = 256
M.MAX_TIMEOUT = 3600

local K_ON, K_WAITING, K_LAST, K_TOTAL = M.K_ON, M.K_WAITING, M.K_LAST, M.K_TOTAL
local K_TIERS, K_TIERS_VERSION = M.K_TIERS, M.K_TIERS_VERSION
local K_OPEN, K_LAST_END = M.K_OPEN, M.K_LAST_END

-- config: the hold of a route's options; timeout 0 = the route does not
-- hold.
function M.config(o)
  local timeout = state.clamp(math.floor(state.num(o.hold_timeout, 0)), 0, M.MAX_TIMEOUT)
  local max = state.clamp(math.floor(state.num(o.hold_max, M.DEFAULT_MAX)), 1, 100000)
  return { timeout = timeout, max = max }
end

-- The engine's options (configure, from init_by_lua: the master, so every
-- worker forks with them) and, per worker, the engine's counter and bound.
local engine_opts = {}
local engine

local function positive(v)
  local n = state.num(v, nil)
  if n == nil or n < 1 then
    return nil
  end
  return math.floor(n)
end

-- configure takes the engine options worker_connections (the events{}
-- value of nginx.conf) and hold_engine_max (overrides the derived bound).
function M.configure(opts)
  engine_opts = {
    worker_connections = positive(opts.worker_connections),
    max = positive(opts.hold_engine_max),
  }
  engine = nil
end

local ffi_ok, ffi = pcall(require, "ffi")
if ffi_ok then
  ffi_ok = pcall(ffi.cdef, "struct autoconfig_rlimit { unsigned long cur, max; };"
    .. "int getrlimit(int resource, struct autoconfig_rlimit *rlim);"
    .. "int access(const char *path, int mode);"
    .. "struct autoconfig_timespec { long sec, nsec; };"
    .. "int clock_gettime(int clk, struct autoconfig_timespec *tp);")
end

-- clock: seconds on CLOCK_MONOTONIC (1 on Linux), which never steps, for
-- the hold's deadline. ngx.now() is the wall clock, cached between events
-- and truncated to the millisecond: on a loaded machine a hold measured by
-- it was answered 14 ms before hold_timeout (by the client's own clock).
-- ngx.now() without ffi.
local mono_ts = ffi_ok and ffi.new("struct autoconfig_timespec")
function M.clock()
  if mono_ts and ffi.C.clock_gettime(1, mono_ts) == 0 then
    return tonumber(mono_ts.sec) + tonumber(mono_ts.nsec) / 1e9
  end
  ngx.update_time()
  return ngx.now()
end

-- nofile: the worker's open-file limit (RLIMIT_NOFILE, 7 on Linux), nil
-- when it cannot be read.
local function nofile()
  if not ffi_ok then
    return nil
  end
  local rl = ffi.new("struct autoconfig_rlimit")
  if ffi.C.getrlimit(7, rl) ~= 0 then
    return nil
  end
  return tonumber(rl.cur)
end

-- engine_bound: engine_max for W workers of C connections each.
function M.engine_bound(workers, conns)
  return math.max(1, math.floor(workers * conns / (2 * M.CONNS)))
end

-- engine: this worker's view of the engine's hold: the counter's store
-- (as a route object for router_state's helpers) and the bound.
function M.engine()
  if engine then
    return engine
  end
  local store, shared = state.store_for(M.ENGINE_DICT)
  local workers = shared and ngx.worker.count() or 1
  local conns = engine_opts.worker_connections or M.DEFAULT_WORKER_CONNECTIONS
  conns = math.min(conns, nofile() or conns)
  engine = {
    r = { name = M.ENGINE_DICT, store = store },
    workers = workers, connections = conns,
    max = engine_opts.max or M.engine_bound(workers, conns),
  }
  return engine
end

-- engine_report: the engine's hold for GET /demand: requests held now (all
-- routes), the bound, and what it was derived from.
function M.engine_report()
  local e = M.engine()
  return {
    waiting = math.max(e.r.store:get(M.K_ENGINE_WAITING) or 0, 0),
    max = e.max, workers = e.workers, worker_connections = e.connections,
  }
end

-- peers: the peers of tiers.
function M.count(tiers)
  local n = 0
  for _, t in ipairs(tiers or {}) do
    n = n + #(t.peers or {})
  end
  return n
end

-- has_peer: route r has a peer to send to (its own tiers or its canary's).
function M.has_peer(r)
  if r.dynamic then
    return (r.npeers or 0) > 0
  end
  return M.count(r.tiers) > 0 or (r.canary ~= nil and M.count(r.canary.tiers) > 0)
end

-- registered marks the route as holding; a static route (not dynamic)
-- publishes its tiers, unless this worker is of an old configuration.
function M.registered(r)
  state.set(r, K_ON, r.hold.timeout)
  if r.dynamic or ngx.worker.exiting() then
    return
  end
  local text = cjson.encode(r.tiers) or "[]"
  local version = ngx.crc32_long(text)
  if r.store:get(K_TIERS_VERSION) ~= version then
    -- table before version: a reader never sees a version without its
    -- tiers.
    state.set(r, K_TIERS, text)
    state.set(r, K_TIERS_VERSION, version)
  end
  r.hold_version = version
end

-- sync_static takes a static route's published tiers when they changed.
function M.sync_static(r)
  local v = r.store:get(K_TIERS_VERSION)
  if v == nil or v == r.hold_version then
    return
  end
  local tiers = cjson.decode(r.store:get(K_TIERS) or "")
  r.hold_version = v
  if type(tiers) == "table" then
    r.tiers = tiers
  end
end

-- touch records a request of the route (held or not).
function M.touch(r)
  state.set(r, K_LAST, ngx.now())
end

-- arrive: a request of hold route r begins (its access phase): its time,
-- and it is open until its log phase calls leave with the same ctx
-- (ngx.ctx). A request is counted once; a full dict counts nothing (and
-- leave then gives nothing back).
function M.arrive(r, ctx)
  M.touch(r)
  if ctx.autoconfig_open == nil then
    ctx.autoconfig_open = false
    if state.incr(r, K_OPEN, 1) then
      ctx.autoconfig_open = r
    end
  end
end

-- leave: the log phase of a request arrive counted: it is open no more,
-- and its end is the route's last end (unless another worker recorded a
-- later one meanwhile).
function M.leave(ctx)
  local r = ctx.autoconfig_open
  if not r then
    return
  end
  ctx.autoconfig_open = false
  state.decr(r, K_OPEN)
  ngx.update_time()
  local now = ngx.now()
  if (r.store:get(K_LAST_END) or 0) < now then
    state.set(r, K_LAST_END, now)
  end
end

-- poke asks the route's own socket (addr, e.g. "unix:/…/qwen.sock") for
-- /<route>/_status as an in-pod caller: a worker of the current
-- configuration answers and registers the route.
local function poke(addr, route)
  local sock = ngx.socket.tcp()
  sock:settimeout(1000)
  local ok = sock:connect(addr)
  if not ok then
    return
  end
  sock:send("GET /" .. route .. "/_status HTTP/1.0\r\nHost: localhost\r\nX-Real-IP: 127.0.0.1\r\n\r\n")
  sock:receive("*a")
  sock:close()
end

-- wait holds the request until sync (called each step) gives route r a
-- peer or the hold times out. It returns "served" (a peer is there),
-- "timeout" or "refused" (hold_max requests of the route, or engine_max
-- of the engine, wait already), the seconds waited, and the refusal's
-- reason (nil when served): "hold_timeout", "hold_full" or
-- "hold_engine_full".
function M.wait(r, sync)
  local n = state.incr(r, K_WAITING, 1)
  if n == nil or n > r.hold.max then
    if n ~= nil then
      state.decr(r, K_WAITING)
    end
    return "refused", 0, "hold_full"
  end
  local e = M.engine()
  local en = state.incr(e.r, M.K_ENGINE_WAITING, 1)
  if en == nil or en > e.max then
    if en ~= nil then
      state.decr(e.r, M.K_ENGINE_WAITING)
    end
    state.decr(r, K_WAITING)
    return "refused", 0, "hold_engine_full"
  end
  state.incr(r, K_TOTAL, 1)
  local clock = M.clock
  local start = clock()
  -- A clock of millisecond resolution that truncates (ngx.now(), the
  -- fallback) says the request came up to 1 ms before it did, so the
  -- deadline is 1 ms later and the 503 never comes before hold_timeout
  -- has passed.
  local deadline = start + r.hold.timeout + 0.001
  local addr = ngx.var.server_addr
  local next_poke = 0
  local ok, res = pcall(function()
    while true do
      sync()
      if M.has_peer(r) then
        return "served"
      end
      local now = clock()
      if now >= deadline then
        return "timeout"
      end
      if not r.dynamic and ngx.worker.exiting() and now >= next_poke and addr and addr:sub(1, 5) == "unix:" then
        next_poke = now + 1
        poke(addr, r.name)
      end
      ngx.sleep(math.min(M.STEP, deadline - now))
    end
  end)
  state.decr(r, K_WAITING)
  state.decr(e.r, M.K_ENGINE_WAITING)
  ngx.update_time()
  if not ok then
    error(res)
  end
  return res, clock() - start, res == "timeout" and "hold_timeout" or nil
end

-- why: the text of a refusal of route r for reason (wait's third result).
function M.why(r, reason)
  if reason == "hold_timeout" then
    return "route " .. r.name .. ": no peer arrived within hold_timeout (" .. r.hold.timeout
      .. " s) while the model is woken; retry"
  elseif reason == "hold_full" then
    return "route " .. r.name .. ": " .. r.hold.max .. " requests are held already (hold_max); retry"
  end
  return "route " .. r.name .. ": the engine holds " .. M.engine().max
    .. " requests already, all routes together (its connections' bound); retry"
end

-- exists: whether path names a file of any kind (a socket too).
local function exists(path)
  if ffi_ok then
    return ffi.C.access(path, 0) == 0
  end
  local f, err = io.open(path)
  if f then
    f:close()
    return true
  end
  return not tostring(err):find("No such file", 1, true)
end

-- dispatch_failed answers the dispatch server's own 502 (the shipped
-- nginx.conf's error_page): the dispatch could not connect to the
-- route's socket, or its server went away mid-request. While the socket
-- exists (a burst filled its listen queue: connect() failed with EAGAIN)
-- it is 503 with Retry-After, counted as the route's admission refusal
-- "dispatch_busy"; an unknown route (no socket) stays 502.
function M.dispatch_failed()
  local path = (ngx.var.upstream_addr or ""):match("unix:([^,%s]+)$")
  if not (path and exists(path)) then
    return ngx.exit(502)
  end
  local d = state.dict("autoconfig@metrics")
  if d then
    metrics.inc(d, "autoconfig_engine_admission_refusals_total",
      metrics.labels("route", ngx.var.route, "reason", "dispatch_busy"), 1)
  end
  ngx.status = 503
  ngx.header["Retry-After"] = "1"
  ngx.header["Content-Type"] = "text/plain"
  ngx.say("route ", ngx.var.route or "", ": the engine took no connection (busy); retry")
  return ngx.exit(503)
end

-- demand: the demand report of the route dict named name (GET /demand),
-- nil when the route does not hold.
function M.demand(dict)
  if dict:get(K_ON) == nil then
    return nil
  end
  return {
    waiting = math.max(dict:get(K_WAITING) or 0, 0),
    open = math.max(dict:get(K_OPEN) or 0, 0),
    last_request = dict:get(K_LAST) or 0,
    last_end = dict:get(K_LAST_END) or 0,
    held_total = dict:get(K_TOTAL) or 0,
  }
end

-- gauges appends the hold gauges of the route dict named name (dict) to
-- out (router.lua's scrape-time gauges): nothing when it does not hold.
function M.gauges(out, name, dict)
  local dm = dict and M.demand(dict)
  if not dm then
    return
  end
  local labels = metrics.labels("route", name)
  out[#out + 1] = { name = "autoconfig_engine_waiting_requests", value = dm.waiting, labels = labels }
  out[#out + 1] = { name = "autoconfig_engine_open_requests", value = dm.open, labels = labels }
end

return M
