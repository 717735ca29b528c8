-- Stand-in for the openresty image's routing engine, for tests only. It
-- implements the contract of docs/lua-contract.md and shows what a route
-- file registered: GET /<route>/_registered (after the prefix strip, the
-- path "/_registered") answers JSON of every argument register_route
-- received. Strings are hex-encoded, because JSON cannot carry arbitrary
-- bytes (NUL, invalid UTF-8) exactly.
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
  routes[name] = { name = name, options = options, tiers = tiers, calls = calls + 1 }
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
end

-- balance sends every request to the first peer of the highest tier.
function M.balance(name)
  local balancer = require("ngx.balancer")
  local p = routes[name].tiers[1].peers[1]
  local ok, err = balancer.set_current_peer(p.host, p.port)
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
    return ngx.exit(500)
  end
end

function M.log(name)
end

return M
