-- router_metrics: the routing engine's Prometheus metrics (docs/metrics.md,
-- "engine (nginx data plane)").
--
-- Counters and histograms live in one lua shared dict (the shipped
-- nginx.conf declares "lua_shared_dict autoconfig@metrics 16m;"), which
-- every worker process writes into with atomic incr, so the counts are
-- exact across workers and survive a reload. The engine passes the dict
-- object in (ngx.shared["autoconfig@metrics"]; nil when it is not declared:
-- every write is then a no-op). Gauges are not stored: the engine supplies
-- them at scrape time (render's gauges argument, handler's gauges_fn).
--
-- When the dict is full, incr's forcible insert evicts the least recently
-- used keys: a series that has not moved for the longest time disappears
-- (Prometheus sees a counter reset if it comes back).
--
-- Dict layout (private to this module; render ignores any other key):
--   counter     <name>{<lstr>}
--   histogram   <name>{<lstr>}b<i>   non-cumulative count of bucket i (1 ..
--                                    #buckets, #buckets+1 = +Inf)
--               <name>{<lstr>}s      sum of the observed values
-- A histogram's _count is the sum of its buckets at render time, so it
-- always equals its le="+Inf" bucket.
--
-- Runs outside nginx too (busted, spec/metrics_spec.lua): nothing here
-- touches ngx but handler(), which reads the global when it runs.

local byte, find, format, sub, gsub = string.byte, string.find, string.format, string.sub, string.gsub
local concat, sort = table.concat, table.sort
local floor, huge = math.floor, math.huge
local select, tostring, tonumber, type, pcall = select, tostring, tonumber, type, pcall

local M = {}

M.DICT = "autoconfig@metrics"
M.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

local ttft_buckets = { 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 }
local tps_buckets = { 1, 2.5, 5, 10, 15, 20, 25, 30, 40, 50, 75, 100, 200, 500 }
local hold_buckets = { 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600 }

-- Every family the engine exposes, in exposition order.
M.families = {
  -- counters
  { name = "autoconfig_engine_requests_total", type = "counter",
    help = "Requests answered, by route, version (canary routes only), peer (host:port; empty when the engine answered itself) and status class (2xx, 3xx, 4xx, 5xx)." },
  { name = "autoconfig_engine_admission_refusals_total", type = "counter",
    help = "Requests refused by admission (503), by route, version and reason (max_concurrency, adaptive_limit, no_peers, hold_timeout, hold_full, hold_engine_full, dispatch_busy)." },
  { name = "autoconfig_engine_affinity_placements_total", type = "counter",
    help = "Peer placements, by route, version and result (home: the key's own ring peer; spill: moved to another peer by load or health; keyless: no key, least load)." },
  { name = "autoconfig_engine_prompt_tokens_total", type = "counter",
    help = "Prompt tokens reported by the backends' responses, by route and version." },
  { name = "autoconfig_engine_completion_tokens_total", type = "counter",
    help = "Completion tokens reported by the backends' responses, by route and version." },
  { name = "autoconfig_engine_ejections_total", type = "counter",
    help = "Peer ejections after consecutive connection failures, by route and peer." },
  { name = "autoconfig_engine_canary_fallthrough_total", type = "counter",
    help = "Requests whose version had no live peer and fell through to the other version, by route and the version left." },
  { name = "autoconfig_engine_state_write_failures_total", type = "counter",
    help = "Writes of peer or request state the route's dict had no room for (the request is still served; the dict never evicts the peers table for state), by route." },
  { name = "autoconfig_engine_held_requests_total", type = "counter",
    help = "Requests held because the route had no peer (scale to zero), by route and result (served: a peer arrived; timeout: answered 503 after hold_timeout; refused: hold_max requests were held already, answered 503 at once)." },
  { name = "autoconfig_engine_streams_cut_total", type = "counter",
    help = "Streamed answers (text/event-stream) that ended before their end ([DONE], a finish_reason, a Responses API end event), by route, version and reason (upstream: the backend closed, died or timed out mid-stream; client: the client went away)." },
  -- histograms
  { name = "autoconfig_engine_ttft_seconds", type = "histogram", buckets = ttft_buckets,
    help = "Time to first token (the first content event of a streamed answer) in seconds, by route and version." },
  { name = "autoconfig_engine_decode_tokens_per_second", type = "histogram", buckets = tps_buckets,
    help = "Decode rate of a response in completion tokens per second after the first token, by route and version." },
  { name = "autoconfig_engine_hold_seconds", type = "histogram", buckets = hold_buckets,
    help = "Time a held request waited for a peer (served or timed out) in seconds, by route." },
  -- gauges (supplied by the engine at scrape time)
  { name = "autoconfig_engine_waiting_requests", type = "gauge",
    help = "Requests held now because the route has no peer (scale to zero), by route; 0 on every route that holds. A KEDA Prometheus trigger may scale on it." },
  { name = "autoconfig_engine_open_requests", type = "gauge",
    help = "Requests open now on a route that holds (scale to zero): held, waiting for their first byte or streaming, by route; 0 on every route that holds." },
  { name = "autoconfig_engine_peer_in_flight", type = "gauge",
    help = "Requests in flight to the peer, by route and peer." },
  { name = "autoconfig_engine_peer_concurrency_limit", type = "gauge",
    help = "Concurrency limit in force for the peer (adaptive or static), by route and peer." },
  { name = "autoconfig_engine_peer_decode_tokens_per_second", type = "gauge",
    help = "EWMA of the peer's decode rate in tokens per second, by route and peer." },
  { name = "autoconfig_engine_peer_ttft_seconds", type = "gauge",
    help = "EWMA of the peer's time to first token in seconds, by route and peer." },
}

-- Numbers in the exposition: integral values without exponent or
-- decimals (exact past 2^31 and 2^53), others in the shortest %g form
-- that reads back as the same double.
local function num(v)
  if v ~= v then return "NaN" end
  if v == huge then return "+Inf" end
  if v == -huge then return "-Inf" end
  if v == floor(v) then return format("%.0f", v) end
  for p = 15, 16 do
    local s = format("%." .. p .. "g", v)
    if tonumber(s) == v then return s end
  end
  return format("%.17g", v)
end
M.format_number = num

local by_name = {}
for _, f in ipairs(M.families) do
  by_name[f.name] = f
  if f.type == "histogram" then
    local le = {}
    for i, b in ipairs(f.buckets) do le[i] = num(b) end
    le[#f.buckets + 1] = "+Inf"
    f.le = le
    -- key suffixes after "<name>{<lstr>}", precomputed per family
    local suffix = {}
    for i = 1, #le do suffix[i] = "b" .. i end
    f.suffix = suffix
  end
end

-- label values, escaped per the text exposition format
local escapes = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }

-- labels("route", r, "version", v, "peer", p) → route="r",version="v",peer="p".
-- A nil or "" value omits its label. Numbers are written with tostring.
function M.labels(...)
  local n = select("#", ...)
  local parts, np = {}, 0
  for i = 1, n - 1, 2 do
    local k, v = select(i, ...)
    if v ~= nil and v ~= "" then
      v = tostring(v)
      if find(v, '[\\"\n]') then v = gsub(v, '[\\"\n]', escapes) end
      np = np + 1
      parts[np] = k .. '="' .. v .. '"'
    end
  end
  return concat(parts, ",")
end

-- Dict keys per (name, lstr), so a hot path builds no strings: a counter's
-- key, or a histogram's array of bucket keys with the sum key at [0].
-- Bounded: flushed whole when it passes 10,000 entries.
local CACHE_MAX = 10000
local cache, cached = {}, 0

local function flush_cache()
  cache, cached = {}, 0
end
M._flush_cache = flush_cache

local function counter_key(name, lstr)
  local c = cache[name]
  if c then
    local k = c[lstr]
    if k then return k end
  else
    c = {}
    cache[name] = c
  end
  if cached >= CACHE_MAX then
    flush_cache()
    c = {}
    cache[name] = c
  end
  local k = name .. "{" .. lstr .. "}"
  c[lstr] = k
  cached = cached + 1
  return k
end

local function histogram_keys(f, lstr)
  local name = f.name
  local c = cache[name]
  if c then
    local ks = c[lstr]
    if ks then return ks end
  else
    c = {}
    cache[name] = c
  end
  if cached >= CACHE_MAX then
    flush_cache()
    c = {}
    cache[name] = c
  end
  local base = name .. "{" .. lstr .. "}"
  local ks = { [0] = base .. "s" }
  local suffix = f.suffix
  for i = 1, #suffix do ks[i] = base .. suffix[i] end
  c[lstr] = ks
  cached = cached + 1
  return ks
end

-- inc(dict, name, lstr, n): add n (default 1) to a counter series. A nil
-- dict, or a name that is not a declared counter, is a no-op. Returns the
-- dict's incr results (new value, err, forcible).
function M.inc(dict, name, lstr, n)
  if not dict then return nil end
  local f = by_name[name]
  if not f or f.type ~= "counter" then return nil, "not a counter: " .. tostring(name) end
  if n == nil then
    n = 1
  elseif type(n) ~= "number" or n ~= n then
    return nil, "not a number"
  end
  return dict:incr(counter_key(name, lstr or ""), n, 0)
end

-- observe(dict, name, lstr, value): one histogram observation (the first
-- bucket whose le >= value, and the sum). NaN, infinities and non-numbers
-- are ignored (they would poison _sum for good).
function M.observe(dict, name, lstr, value)
  if not dict then return nil end
  local f = by_name[name]
  if not f or f.type ~= "histogram" then return nil, "not a histogram: " .. tostring(name) end
  if type(value) ~= "number" or value ~= value or value == huge or value == -huge then
    return nil, "not a finite number"
  end
  local ks = histogram_keys(f, lstr or "")
  local buckets = f.buckets
  local i = #buckets + 1
  for j = 1, #buckets do
    if value <= buckets[j] then i = j break end
  end
  dict:incr(ks[i], 1, 0)
  return dict:incr(ks[0], value, 0)
end

-- A label string as labels() writes it: name="value" pairs joined by
-- commas, values escaped. Anything else in the dict was not written by
-- this module (or by the engine through it) and is not rendered.
local function valid_lstr(s)
  if s == "" then return true end
  local pos, len = 1, #s
  while true do
    local _, e = find(s, '^[a-zA-Z_][a-zA-Z0-9_]*="', pos)
    if not e then return false end
    pos = e + 1
    while true do
      local _, e2 = find(s, '^[^"\\\n]*', pos)
      pos = e2 + 1
      local c = byte(s, pos)
      if c == 34 then -- closing quote
        pos = pos + 1
        break
      elseif c == 92 then -- backslash: \\ \" \n only
        local d = byte(s, pos + 1)
        if d ~= 92 and d ~= 34 and d ~= 110 then return false end
        pos = pos + 2
      else -- end of string or a raw newline
        return false
      end
    end
    if pos > len then return true end
    if byte(s, pos) ~= 44 then return false end
    pos = pos + 1
  end
end

local function help_text(s)
  return (gsub(s, "[\\\n]", { ["\\"] = "\\\\", ["\n"] = "\\n" }))
end

local function series(name, lstr, extra)
  if extra then
    if lstr == "" then return name .. "{" .. extra .. "}" end
    return name .. "{" .. lstr .. "," .. extra .. "}"
  end
  if lstr == "" then return name end
  return name .. "{" .. lstr .. "}"
end

local function sorted_keys(t)
  local ks, n = {}, 0
  for k in pairs(t) do
    n = n + 1
    ks[n] = k
  end
  sort(ks)
  return ks
end

-- render(dict, gauges): the exposition text (format 0.0.4) of every family
-- with series, in M.families order, series sorted by label string. gauges
-- is an array of { name = <gauge family>, labels = <lstr>, value = <number> }
-- (a later entry for the same series replaces an earlier one). A nil dict
-- renders the gauges only.
function M.render(dict, gauges)
  local data = {} -- name → lstr → value (counter, gauge) or { [0] = sum, b1 .. bn+1 }
  local okl = {} -- lstr → validity, memoized for this render
  local function lstr_ok(l)
    local v = okl[l]
    if v == nil then
      v = valid_lstr(l)
      okl[l] = v
    end
    return v
  end

  if dict then
    local keys = dict:get_keys(0) or {}
    for _, key in ipairs(keys) do
      local name, lstr, suffix = key:match("^([^{]+){(.*)}([^}]*)$")
      local f = name and by_name[name]
      if f and f.type ~= "gauge" and lstr_ok(lstr) then
        local v = dict:get(key)
        if type(v) == "number" then
          local d = data[name]
          if not d then
            d = {}
            data[name] = d
          end
          if f.type == "counter" then
            if suffix == "" then d[lstr] = v end
          else
            local idx
            if suffix == "s" then
              idx = 0
            elseif byte(suffix, 1) == 98 then -- "b<i>"
              idx = tonumber(sub(suffix, 2))
              if not idx or idx < 1 or idx > #f.le or suffix ~= f.suffix[idx] then idx = nil end
            end
            if idx then
              local h = d[lstr]
              if not h then
                h = {}
                d[lstr] = h
              end
              h[idx] = v
            end
          end
        end
      end
    end
  end

  for _, g in ipairs(gauges or {}) do
    local f = by_name[g.name]
    local l = g.labels or ""
    if f and f.type == "gauge" and type(l) == "string" and type(g.value) == "number" and lstr_ok(l) then
      local d = data[g.name]
      if not d then
        d = {}
        data[g.name] = d
      end
      d[l] = g.value
    end
  end

  local out, n = {}, 0
  local function put(s)
    n = n + 1
    out[n] = s
  end
  for _, f in ipairs(M.families) do
    local d = data[f.name]
    if d and next(d) then
      local name = f.name
      put("# HELP " .. name .. " " .. help_text(f.help))
      put("# TYPE " .. name .. " " .. f.type)
      for _, lstr in ipairs(sorted_keys(d)) do
        local v = d[lstr]
        if f.type == "histogram" then
          local cum = 0
          for i, le in ipairs(f.le) do
            cum = cum + (v[i] or 0)
            put(series(name .. "_bucket", lstr, 'le="' .. le .. '"') .. " " .. num(cum))
          end
          put(series(name .. "_sum", lstr) .. " " .. num(v[0] or 0))
          put(series(name .. "_count", lstr) .. " " .. num(cum))
        else
          put(series(name, lstr) .. " " .. num(v))
        end
      end
    end
  end
  if n == 0 then return "" end
  return concat(out, "\n") .. "\n"
end

-- handler(dict, gauges_fn): the content handler of the shipped nginx.conf's
-- "location = /metrics" (port 9145). Only inside nginx.
function M.handler(dict, gauges_fn)
  local ngx = ngx
  if not dict then
    ngx.status = 503
    ngx.header["Content-Type"] = "text/plain; charset=utf-8"
    ngx.say("no engine metrics: lua_shared_dict " .. M.DICT .. " is not declared in nginx.conf's http{} block")
    return ngx.exit(503)
  end
  local gauges = {}
  if gauges_fn then
    local ok, res = pcall(gauges_fn)
    if ok then
      gauges = res or {}
    else
      ngx.log(ngx.ERR, "router_metrics: the gauges function failed, rendering without gauges: ", res)
    end
  end
  local body = M.render(dict, gauges)
  ngx.status = 200
  ngx.header["Content-Type"] = M.CONTENT_TYPE
  ngx.print(body)
  return ngx.exit(200)
end

return M
