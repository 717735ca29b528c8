-- router_control: the engine's control endpoint (docs/lua-contract.md,
-- "The control endpoint"): the content handler of the shipped
-- nginx.conf's server on unix:<sock-dir>/autoconfig@control.sock.
local cjson = require("cjson.safe")
local state = require("router_state")
local tbl = require("router_table")
local canary = require("router_canary")
local hold = require("router_hold")

local K_TABLE, K_VERSION, K_SERIAL, K_LOCK = tbl.K_TABLE, tbl.K_VERSION, tbl.K_SERIAL, tbl.K_LOCK
local STATE_KINDS = state.STATE_KINDS
local is_array, decode_table, build = tbl.is_array, tbl.decode_table, tbl.build
local split_counts = canary.split_counts

-- The greatest serial: lua numbers hold integers exactly up to 2^53.
local MAX_SERIAL = 9007199254740992
local MAX_SERIAL_DIGITS = "9007199254740992"

local M = {}

-- ---------------------------------------------------------------------
-- The control endpoint (docs/lua-contract.md, "Dynamic peers"): the
-- content handler of the shipped nginx.conf's server on
-- unix:<sock-dir>/autoconfig@control.sock.

-- json encodes a control answer: objects with sorted keys, strings by
-- cjson, whole numbers in full (cjson would round a serial above 10^14).
local function json(v)
  local ty = type(v)
  if ty == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do
      parts[i] = cjson.encode(tostring(k)) .. ":" .. json(v[k])
    end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  if ty == "number" and v == math.floor(v) and math.abs(v) <= MAX_SERIAL then
    return string.format("%.0f", v)
  end
  if v == nil then
    return "null"
  end
  return cjson.encode(v)
end

local function control_answer(code, v)
  ngx.status = code
  ngx.header["Content-Type"] = "application/json"
  ngx.say(json(v))
  return ngx.exit(ngx.HTTP_OK)
end

local function control_error(code, msg)
  return control_answer(code, { error = msg })
end

local route_dict = state.dict

local function peer_count(t)
  local n = 0
  for _, tr in ipairs(t.tiers) do
    n = n + #tr.peers
  end
  if type(t.canary) == "table" and is_array(t.canary.tiers) then
    for _, tr in ipairs(t.canary.tiers) do
      n = n + #tr.peers
    end
  end
  return n
end

-- stored: what route's dict holds (route, version, serial, peers), nil
-- when no table.
local function stored(route, dict)
  local version = dict:get(K_VERSION)
  if version == nil then
    return nil
  end
  local out = { route = route, version = version, serial = dict:get(K_SERIAL) or 0 }
  local text = dict:get(K_TABLE)
  local t = text and cjson.decode(text)
  if type(t) == "table" and is_array(t.tiers) then
    out.peers = peer_count(t)
  end
  return out
end

-- lock serializes the pushes of one route across the workers (a ttl
-- frees it should its holder die).
local function lock(dict)
  for _ = 1, 5000 do
    local ok, err = dict:safe_add(K_LOCK, ngx.worker.pid(), 10)
    if ok then
      return true
    end
    if err ~= "exists" then
      return nil, err
    end
    ngx.sleep(0.001)
  end
  return nil, "timeout"
end

-- forget deletes the state of the peers of old that new does not list (a
-- peer removed and added later starts afresh, and the dict does not fill
-- with the state of gone pods). An active count above 0 stays: the
-- request's log phase releases it and deletes it at 0.
local function forget(dict, old_text, members)
  local old = cjson.decode(old_text)
  if type(old) ~= "table" or not is_array(old.tiers) then
    return
  end
  local all = old.tiers
  if type(old.canary) == "table" and is_array(old.canary.tiers) then
    all = {}
    for _, tr in ipairs(old.tiers) do all[#all + 1] = tr end
    for _, tr in ipairs(old.canary.tiers) do all[#all + 1] = tr end
  end
  for _, tr in ipairs(all) do
    if type(tr) == "table" and type(tr.use) == "string" and is_array(tr.peers) then
      for _, p in ipairs(tr.peers) do
        if type(p) == "table" and p.host ~= nil and p.port ~= nil then
          local id = tr.use .. "|" .. tostring(p.host) .. "|" .. tostring(p.port)
          if not members[id] then
            for _, kind in ipairs(STATE_KINDS) do
              local k = kind .. "|" .. id
              if kind ~= "a" or (dict:get(k) or 0) <= 0 then
                dict:delete(k)
              end
            end
          end
        end
      end
    end
  end
end

-- store_table writes a checked table: the text first, then version and
-- serial, so a reader never sees a version without its table. A write the
-- dict has no room for leaves the last good table (a failed safe_set of a
-- key frees its old value: the old text is written back).
local function store_table(dict, text, version, serial, old_text)
  if old_text ~= text then
    local ok, err = dict:safe_set(K_TABLE, text)
    if not ok then
      if old_text ~= nil and not dict:safe_set(K_TABLE, old_text) then
        ngx.log(ngx.ERR, "control: could not write the last good table back")
      end
      return nil, err
    end
  end
  local old_version, old_serial = dict:get(K_VERSION), dict:get(K_SERIAL)
  local ok, err = dict:safe_set(K_VERSION, version)
  if ok then
    ok, err = dict:safe_set(K_SERIAL, serial)
  end
  if not ok then
    if old_text ~= nil and old_text ~= text then dict:safe_set(K_TABLE, old_text) end
    if old_version ~= nil then dict:safe_set(K_VERSION, old_version) else dict:delete(K_VERSION) end
    if old_serial ~= nil then dict:safe_set(K_SERIAL, old_serial) end
    return nil, err
  end
  return true
end

local function read_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body == nil then
    -- Only when the server's client_body_buffer_size is below the body.
    local file = ngx.req.get_body_file()
    if file then
      local f = io.open(file, "rb")
      if f then
        body = f:read("*a")
        f:close()
      end
    end
  end
  return body
end

local function put_peers(route)
  local dict = route_dict(route)
  if not dict then
    return control_error(404, "no lua_shared_dict named " .. route .. " (route not in this configuration yet)")
  end
  local sh = ngx.var.http_x_autoconfig_serial
  -- Judged on its digits: tonumber rounds above 2^53 (9007199254740993
  -- reads as 2^53), so a check after it would pass a serial no later push
  -- could follow.
  local digits = type(sh) == "string" and string.match(sh, "^0*(%d+)$")
  if digits and #digits > 1 and string.sub(digits, 1, 1) == "0" then digits = nil end
  local serial
  if digits and (#digits < #MAX_SERIAL_DIGITS or (#digits == #MAX_SERIAL_DIGITS and digits <= MAX_SERIAL_DIGITS)) then
    serial = tonumber(digits)
  end
  if not serial then
    return control_error(400, "X-Autoconfig-Serial must be a whole number from 0 to 2^53")
  end
  local body = read_body()
  if body == nil or body == "" then
    return control_error(400, "empty body")
  end
  local t, err = decode_table(body, route)
  if not t then
    return control_error(400, err)
  end
  -- The ordering guard answers before anything needs room in the dict
  -- (and again under the lock, against a push in between).
  local held = tonumber(dict:get(K_SERIAL))
  if held and serial < held then
    return control_answer(409, { error = "serial " .. sh .. " is lower than the stored serial", serial = held,
      version = dict:get(K_VERSION) })
  end
  local ok, lerr = lock(dict)
  if not ok and lerr == "no memory" then
    -- Peer state filled the dict: the table comes first.
    state.make_room(dict)
    ok, lerr = lock(dict)
  end
  if not ok then
    if lerr == "no memory" then
      return control_error(507, "dict " .. route .. " is full")
    end
    return control_error(503, "another push holds the lock: " .. tostring(lerr))
  end
  held = tonumber(dict:get(K_SERIAL))
  if held and serial < held then
    dict:delete(K_LOCK)
    return control_answer(409, { error = "serial " .. sh .. " is lower than the stored serial", serial = held,
      version = dict:get(K_VERSION) })
  end
  local old_text = dict:get(K_TABLE)
  local sok, serr = store_table(dict, body, t.version, serial, old_text)
  if not sok and serr == "no memory" and state.make_room(dict) > 0 then
    sok, serr = store_table(dict, body, t.version, serial, old_text)
  end
  if not sok then
    dict:delete(K_LOCK)
    ngx.log(ngx.ERR, "control: route ", route, ": table version ", t.version, " (", #body,
      " bytes) refused: ", serr, "; keeping the last good table")
    return control_answer(507, { error = "dict " .. route .. " has no room for the table (" .. #body ..
      " bytes): " .. tostring(serr) .. "; the last good table stays", version = dict:get(K_VERSION) })
  end
  if old_text ~= nil and old_text ~= body then
    local _, members = build(t)
    forget(dict, old_text, members)
  end
  dict:delete(K_LOCK)
  return control_answer(200, { route = route, version = t.version, serial = serial, peers = peer_count(t) })
end

-- control is the content handler of the control server: PUT and GET
-- /peers/<route>, GET /peers, GET /demand. A proxied request (X-Real-IP, which the
-- dispatch server sets) is refused.
function M.handle()
  if ngx.var.http_x_real_ip ~= nil then
    return control_error(403, "the control endpoint answers local callers on its unix socket only")
  end
  local method = ngx.req.get_method()
  local uri = ngx.var.uri
  if uri == "/peers" or uri == "/peers/" then
    if method ~= "GET" then
      return control_error(405, "GET /peers")
    end
    local out = {}
    for name in pairs(ngx.shared) do
      local dict = route_dict(name)
      local version = dict and dict:get(K_VERSION)
      if version ~= nil then
        out[name] = { version = version, serial = dict:get(K_SERIAL) or 0 }
      end
    end
    -- json() writes an empty table as {}.
    return control_answer(200, { routes = out })
  end
  if uri == "/demand" then
    -- The scale-to-zero routes' demand (router_hold), for the reload
    -- sidecar's served report.
    if method ~= "GET" then
      return control_error(405, "GET /demand")
    end
    local out = {}
    for name in pairs(ngx.shared) do
      local dict = route_dict(name)
      local d = dict and hold.demand(dict)
      if d then
        out[name] = d
      end
    end
    return control_answer(200, { routes = out, engine = hold.engine_report() })
  end
  local sroute = string.match(uri, "^/canary/([^/]+)$")
  if sroute then
    -- A canary route's counters (its dict), also for a video route, whose
    -- own paths are the backend's.
    local dict = route_dict(sroute)
    if method ~= "GET" then
      return control_error(405, "GET /canary/<route>")
    end
    if not dict then
      return control_error(404, "no lua_shared_dict named " .. sroute)
    end
    local out = split_counts(dict)
    out.route = sroute
    return control_answer(200, out)
  end
  local route = string.match(uri, "^/peers/([^/]+)$")
  if not route then
    return control_error(404, "no such path: GET /peers, GET or PUT /peers/<route>")
  end
  if method == "PUT" then
    return put_peers(route)
  end
  if method == "GET" then
    local dict = route_dict(route)
    local out = dict and stored(route, dict)
    if not out then
      return control_error(404, "no peers table for route " .. route)
    end
    return control_answer(200, out)
  end
  return control_error(405, "GET or PUT /peers/<route>")
end

return M
