-- router_probe: active health probes of a route's tiers with a
-- probe_path (GET, 200 = healthy), run from an ngx.timer.every per worker.
local state = require("router_state")
local tbl = require("router_table")
local bracketed, pkey = state.bracketed, state.pkey

local M = {}

-- routes: the engine's registered routes of this worker (set by router).
M.routes = {}

-- probe_one: GET probe_path over a cosocket; true on status 200.
local function probe_one(host, port, path)
  local sock = ngx.socket.tcp()
  sock:settimeouts(1000, 1000, 2000)
  local h = bracketed(host)
  local ok = sock:connect(h, port)
  if not ok then
    return false
  end
  local sent = sock:send("GET " .. path .. " HTTP/1.0\r\nHost: " .. h .. "\r\nUser-Agent: autoconfig-router-probe\r\n\r\n")
  local line = sent and sock:receive("*l")
  sock:close()
  return line ~= nil and string.match(line, "^HTTP/%d%.%d 200") ~= nil
end

-- probe runs in a timer: every peer of every tier with a probe_path (a
-- dynamic route's current table).
function M.run(premature, route)
  local r = M.routes[route]
  if premature or not r or ngx.worker.exiting() then
    return
  end
  if r.dynamic then
    tbl.sync(r)
  end
  local all = r.tiers
  if r.canary then
    all = {}
    for _, t in ipairs(r.tiers) do all[#all + 1] = t end
    for _, t in ipairs(r.canary.tiers) do all[#all + 1] = t end
  end
  for _, t in ipairs(all) do
    -- A path that cannot go into a request line as is (space, control or
    -- non-ASCII byte) is not probed.
    if type(t.probe_path) == "string" and string.match(t.probe_path, "^/[%w%p]*$") then
      for _, p in ipairs(t.peers) do
        local ok, healthy = pcall(probe_one, p.host, p.port, t.probe_path)
        if ok and healthy then
          state.set(r, pkey("u", t, p), nil)
        else
          -- Kept a little longer than one interval, so a worker whose timer
          -- stopped does not pin a peer out forever.
          state.set(r, pkey("u", t, p), true, r.probe_every * 3)
        end
      end
    end
  end
end

return M
