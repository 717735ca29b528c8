-- Stand-in for the openresty image's routing engine, for tests only. It
-- implements the contract of docs/lua-contract.md and shows what a route
-- file registered: GET /<route>/_registered (after the prefix strip, the
-- path "/_registered") answers JSON of every argument register_route
-- received. Strings are hex-encoded, because JSON cannot carry arbitrary
-- bytes (NUL, invalid UTF-8) exactly.
--
-- Balancing implements the tier and failure-mode contract for real, so the
-- data-plane tests exercise it: tiers in the order given (a lower tier only
-- when every peer above is ejected or already tried by this request),
-- least active requests within a tier (ties round-robin), and, when the
-- options ask for them, retries on connection failures (retry_on,
-- max_tries) and ejection after consecutive connection failures
-- (eject_consecutive_connect_failures, max_ejection_percent on backend
-- tiers, ejection_seconds). A try counts as a connection failure when
-- nginx never connected ($upstream_connect_time "-"); any response,
-- 503 included, resets the count. GET /<route>/_peers answers the peer
-- state as JSON. No request header is read for peer choice.
local cjson = require("cjson.safe")

local M = {}
local routes = {}

local function hex(s)
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end))
end

-- hexify copies a value: strings (keys too) become hex, numbers and
-- booleans stay, tables recurse. Arrays stay arrays.
local function hexify(v)
  local t = type(v)
  if t == "string" then return hex(v) end
  if t ~= "table" then return v end
  local out = {}
  local n = #v
  if n > 0 then
    for i = 1, n do out[i] = hexify(v[i]) end
    return out
  end
  for k, x in pairs(v) do
    out[type(k) == "string" and hex(k) or k] = hexify(x)
  end
  return out
end

function M.registered(name)
  return routes[name] ~= nil
end

function M.register_route(name, options, tiers)
  local r = routes[name]
  local calls = r and r.calls or 0
  local o = options or {}
  local state = {}
  for ti, t in ipairs(tiers) do
    state[ti] = {}
    for pi = 1, #t.peers do
      state[ti][pi] = { fails = 0, ejected_until = 0, ejections = 0, active = 0, tries = 0 }
    end
  end
  routes[name] = {
    name = name, options = options, tiers = tiers, calls = calls + 1,
    fail_close = o.failure_mode == "FailClose",
    retry = o.retry_on == "connect-failure",
    max_tries = math.max(1, tonumber(o.max_tries) or 1),
    eject_after = tonumber(o.eject_consecutive_connect_failures),
    max_eject_pct = tonumber(o.max_ejection_percent) or 100,
    eject_secs = tonumber(o.ejection_seconds) or 10,
    state = state, rr = 0,
  }
end

local function ejected(ps, now)
  return ps.ejected_until > now
end

-- pick returns the tier and peer index for the next try: the first tier
-- (highest priority) with a peer this request has not tried and that is not
-- ejected; if there is none, ejection is ignored (never leave a request
-- with no peer because of ejection). FailClose never descends below a cart
-- tier.
local function pick(r, tried)
  local now = ngx.now()
  for pass = 1, 2 do
    for ti, t in ipairs(r.tiers) do
      local n = #t.peers
      local best, bestActive
      for k = 0, n - 1 do
        local pi = (r.rr + k) % n + 1
        local ps = r.state[ti][pi]
        if not tried[ti .. ":" .. pi] and (pass == 2 or not ejected(ps, now)) then
          if not best or ps.active < bestActive then
            best, bestActive = pi, ps.active
          end
        end
      end
      if best then
        r.rr = r.rr + 1
        return ti, best
      end
      if r.fail_close and t.use == "cart" then
        break
      end
    end
  end
end

-- connect_failed counts one connection failure of a peer and ejects it
-- after eject_after consecutive ones, unless that would eject more than
-- max_eject_pct of a backend tier's peers (rounded down). A single VIP
-- (cart, backend-svc) is not capped: its ejection means "tier down".
local function connect_failed(r, ti, pi)
  if not r.eject_after then
    return
  end
  local ps = r.state[ti][pi]
  local now = ngx.now()
  if ejected(ps, now) then
    return
  end
  ps.fails = ps.fails + 1
  if ps.fails < r.eject_after then
    return
  end
  local t = r.tiers[ti]
  if t.use == "backend" then
    local out = 0
    for _, q in ipairs(r.state[ti]) do
      if ejected(q, now) then out = out + 1 end
    end
    if out + 1 > math.floor(#t.peers * r.max_eject_pct / 100) then
      return
    end
  end
  ps.ejected_until = now + r.eject_secs
  ps.ejections = ps.ejections + 1
  ps.fails = 0
end

function M.access(name)
  local r = routes[name]
  if ngx.var.uri == "/_registered" then
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode({
      name = hex(r.name),
      options = hexify(r.options),
      tiers = hexify(r.tiers),
      calls = r.calls,
      pid = ngx.worker.pid(),
    }))
    return ngx.exit(200)
  end
  if ngx.var.uri == "/_peers" then
    local now = ngx.now()
    local out = {}
    for ti, t in ipairs(r.tiers) do
      local peers = {}
      for pi, p in ipairs(t.peers) do
        local ps = r.state[ti][pi]
        peers[pi] = { host = p.host, port = p.port, fails = ps.fails, ejected = ejected(ps, now),
                      ejections = ps.ejections, tries = ps.tries }
      end
      out[ti] = { use = t.use, peers = peers }
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode(out))
    return ngx.exit(200)
  end
end

-- balance picks the peer of each try. The first call of a request sets
-- the number of extra tries; a later call is a retry nginx makes only after
-- a connection error or timeout (proxy_next_upstream's default "error
-- timeout"), never after a response.
function M.balance(name)
  local balancer = require("ngx.balancer")
  local r = routes[name]
  local ctx = ngx.ctx
  local tries = ctx.autoconfig_tries
  if not tries then
    tries = {}
    ctx.autoconfig_tries = tries
    if r.retry and r.max_tries > 1 then
      local ok, err = balancer.set_more_tries(r.max_tries - 1)
      if not ok then
        ngx.log(ngx.ERR, "set_more_tries: ", err)
      end
    end
  end
  local tried = {}
  for _, t in ipairs(tries) do
    tried[t[1] .. ":" .. t[2]] = true
  end
  local ti, pi = pick(r, tried)
  if not ti then
    ngx.log(ngx.ERR, "route ", name, ": no peer left to try")
    return ngx.exit(502)
  end
  tries[#tries + 1] = { ti, pi }
  local ps = r.state[ti][pi]
  ps.active = ps.active + 1
  ps.tries = ps.tries + 1
  local p = r.tiers[ti].peers[pi]
  local ok, err = balancer.set_current_peer(p.host, p.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

-- log settles every try of the request: releases its active count and
-- counts a connection failure ($upstream_connect_time "-": never
-- connected) or a success (connected; whatever the status) for its peer.
function M.log(name)
  local r = routes[name]
  local tries = ngx.ctx.autoconfig_tries
  if not r or not tries then
    return
  end
  local times = {}
  for v in string.gmatch(ngx.var.upstream_connect_time or "", "[^,: ]+") do
    times[#times + 1] = v
  end
  for i, t in ipairs(tries) do
    local ps = r.state[t[1]][t[2]]
    ps.active = ps.active - 1
    local c = times[i]
    if c == "-" then
      connect_failed(r, t[1], t[2])
    elseif c then
      ps.fails = 0
    end
  end
end

return M
