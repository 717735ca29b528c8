-- busted spec of router_metrics.lua, outside nginx:
--   cd deploy/openresty/lua && luajit /usr/bin/busted --lpath='./?.lua' spec/metrics_spec.lua

local M = require("router_metrics")

-- A fake ngx.shared.DICT: get, set, incr(key, n, init) (the new value, or
-- nil and an error), get_keys(max) (0 = every key).
local function fake_dict()
  local data, order = {}, {}
  local d = {}
  function d:get(k) return data[k] end
  function d:set(k, v)
    if data[k] == nil then order[#order + 1] = k end
    data[k] = v
    return true
  end
  function d:incr(k, n, init)
    local v = data[k]
    if v == nil then
      if init == nil then return nil, "not found" end
      order[#order + 1] = k
      v = init
    elseif type(v) ~= "number" then
      return nil, "not a number"
    end
    data[k] = v + n
    return data[k], nil, false
  end
  function d:get_keys(max)
    max = max or 1024
    local out = {}
    for _, k in ipairs(order) do
      if data[k] ~= nil then
        if max ~= 0 and #out >= max then break end
        out[#out + 1] = k
      end
    end
    return out
  end
  d._data = data
  return d
end

local function lines_of(text)
  local out = {}
  for l in text:gmatch("([^\n]*)\n") do out[#out + 1] = l end
  return out
end

-- Parses a label set {a="x",b="y"} starting at text position pos (at '{');
-- returns the table of labels, a canonical key and the position after '}',
-- or nil and an error.
local function parse_labels(s, pos)
  local labels, names = {}, {}
  pos = pos + 1
  if s:sub(pos, pos) == "}" then return labels, "", pos + 1 end
  while true do
    local name, e = s:match('^([a-zA-Z_][a-zA-Z0-9_]*)="()', pos)
    if not name then return nil, "bad label name at " .. pos end
    if labels[name] then return nil, "duplicate label " .. name end
    pos = e
    local val = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" or c == "\n" then return nil, "unterminated value" end
      if c == '"' then pos = pos + 1 break end
      if c == "\\" then
        local d = s:sub(pos + 1, pos + 1)
        if d == "\\" then val[#val + 1] = "\\"
        elseif d == '"' then val[#val + 1] = '"'
        elseif d == "n" then val[#val + 1] = "\n"
        else return nil, "bad escape \\" .. d end
        pos = pos + 2
      else
        val[#val + 1] = c
        pos = pos + 1
      end
    end
    labels[name] = table.concat(val)
    names[#names + 1] = name
    local c = s:sub(pos, pos)
    if c == "}" then
      table.sort(names)
      local canon = {}
      for _, n in ipairs(names) do canon[#canon + 1] = n .. "=" .. string.format("%q", labels[n]) end
      return labels, table.concat(canon, ","), pos + 1
    end
    if c ~= "," then return nil, "expected , or } at " .. pos end
    pos = pos + 1
  end
end

-- check(text): validates text as Prometheus text exposition 0.0.4 and
-- returns { [family] = { type =, series = { { name, labels, value } } } }.
-- Every series line is name, optional label set, one space, a value;
-- HELP and TYPE come once per family, before its series; no series twice;
-- a histogram's buckets are cumulative and end in +Inf = _count.
local function check(text)
  assert(text == "" or text:sub(-1) == "\n", "exposition must end with a newline")
  local fams, seen, current = {}, {}, nil
  for i, line in ipairs(lines_of(text)) do
    local where = "line " .. i .. ": " .. line
    if line:sub(1, 1) == "#" then
      local kind, name, rest = line:match("^# (%u+) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$")
      assert(kind == "HELP" or kind == "TYPE", "bad comment, " .. where)
      if kind == "HELP" then
        assert(not fams[name], "HELP after the family started, " .. where)
        assert(not rest:find("\n"), where)
        fams[name] = { help = rest, series = {} }
        current = name
      else
        assert(current == name and fams[name] and not fams[name].type, "TYPE without its HELP or twice, " .. where)
        assert(rest == "counter" or rest == "gauge" or rest == "histogram", "bad type, " .. where)
        fams[name].type = rest
      end
    else
      local name = line:match("^[a-zA-Z_:][a-zA-Z0-9_:]*")
      assert(name, "bad metric name, " .. where)
      local pos = #name + 1
      local labels, canon = {}, ""
      if line:sub(pos, pos) == "{" then
        local l, c, p = parse_labels(line, pos)
        assert(l, tostring(c) .. ", " .. where)
        labels, canon, pos = l, c, p
      end
      assert(line:sub(pos, pos) == " ", "no single space before the value, " .. where)
      local value = line:sub(pos + 1)
      assert(value:match("^[-+0-9.eE]+$") or value == "+Inf" or value == "-Inf" or value == "NaN", "bad value, " .. where)
      local num = value == "+Inf" and math.huge or value == "-Inf" and -math.huge or value == "NaN" and 0 / 0 or tonumber(value)
      assert(num ~= nil, "unparsable value, " .. where)
      local f = current and fams[current]
      assert(f and f.type, "series before its HELP/TYPE, " .. where)
      local base = name
      if f.type == "histogram" then
        base = name:match("^(.*)_bucket$") or name:match("^(.*)_sum$") or name:match("^(.*)_count$")
        assert(name:match("_bucket$") == nil or labels.le, "bucket without le, " .. where)
      end
      assert(base == current, "series of another family than " .. current .. ", " .. where)
      local id = name .. "{" .. canon .. "}"
      assert(not seen[id], "duplicate series, " .. where)
      seen[id] = true
      f.series[#f.series + 1] = { name = name, labels = labels, value = num, text = value }
    end
  end
  -- histograms: per label set (le aside), buckets nondecreasing, +Inf last = _count
  for fname, f in pairs(fams) do
    assert(f.type, fname .. " has no TYPE")
    if f.type == "histogram" then
      local groups = {}
      for _, s in ipairs(f.series) do
        local rest = {}
        for k, v in pairs(s.labels) do if k ~= "le" then rest[#rest + 1] = k .. "=" .. v end end
        table.sort(rest)
        local g = table.concat(rest, ",")
        groups[g] = groups[g] or { buckets = {} }
        if s.name == fname .. "_bucket" then
          table.insert(groups[g].buckets, s)
        elseif s.name == fname .. "_count" then
          groups[g].count = s.value
        else
          groups[g].sum = s.value
        end
      end
      for g, h in pairs(groups) do
        assert(h.count and h.sum, fname .. "{" .. g .. "} lacks _sum or _count")
        local last, prev_le = -1, -math.huge
        for _, b in ipairs(h.buckets) do
          local le = b.labels.le == "+Inf" and math.huge or tonumber(b.labels.le)
          assert(le and le > prev_le, fname .. " buckets out of order")
          assert(b.value >= last, fname .. " buckets not cumulative")
          last, prev_le = b.value, le
        end
        assert(prev_le == math.huge, fname .. " has no +Inf bucket")
        assert(last == h.count, fname .. " +Inf bucket ~= _count")
      end
    end
  end
  return fams
end

local function value_of(fams, family, name, want)
  local f = fams[family]
  if not f then return nil end
  for _, s in ipairs(f.series) do
    if s.name == name then
      local match = true
      for k, v in pairs(want) do if s.labels[k] ~= v then match = false end end
      for k in pairs(s.labels) do if want[k] == nil then match = false end end
      if match then return s.value, s.text end
    end
  end
  return nil
end

describe("router_metrics", function()
  before_each(function() M._flush_cache() end)

  describe("families", function()
    it("declares every family once, in one naming style", function()
      local want = {
        autoconfig_engine_requests_total = "counter",
        autoconfig_engine_admission_refusals_total = "counter",
        autoconfig_engine_affinity_placements_total = "counter",
        autoconfig_engine_prompt_tokens_total = "counter",
        autoconfig_engine_completion_tokens_total = "counter",
        autoconfig_engine_ejections_total = "counter",
        autoconfig_engine_canary_fallthrough_total = "counter",
        autoconfig_engine_state_write_failures_total = "counter",
        autoconfig_engine_held_requests_total = "counter",
        autoconfig_engine_streams_cut_total = "counter",
        autoconfig_engine_ttft_seconds = "histogram",
        autoconfig_engine_decode_tokens_per_second = "histogram",
        autoconfig_engine_hold_seconds = "histogram",
        autoconfig_engine_waiting_requests = "gauge",
        autoconfig_engine_open_requests = "gauge",
        autoconfig_engine_peer_in_flight = "gauge",
        autoconfig_engine_peer_concurrency_limit = "gauge",
        autoconfig_engine_peer_decode_tokens_per_second = "gauge",
        autoconfig_engine_peer_ttft_seconds = "gauge",
      }
      local seen = {}
      for _, f in ipairs(M.families) do
        assert.is_nil(seen[f.name], f.name)
        seen[f.name] = true
        assert.equals(want[f.name], f.type, f.name)
        assert.truthy(f.name:match("^autoconfig_engine_[a-z_]+$"), f.name)
        assert.equals(f.type == "counter", f.name:match("_total$") ~= nil, f.name)
        assert.truthy(type(f.help) == "string" and #f.help > 0, f.name)
        if f.type == "histogram" then
          for i = 2, #f.buckets do assert.truthy(f.buckets[i] > f.buckets[i - 1], f.name) end
        else
          assert.is_nil(f.buckets, f.name)
        end
      end
      for name in pairs(want) do assert.truthy(seen[name], name) end
      local ttft, dtps
      for _, f in ipairs(M.families) do
        if f.name == "autoconfig_engine_ttft_seconds" then ttft = f.buckets end
        if f.name == "autoconfig_engine_decode_tokens_per_second" then dtps = f.buckets end
      end
      assert.same({ 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 }, ttft)
      assert.same({ 1, 2.5, 5, 10, 15, 20, 25, 30, 40, 50, 75, 100, 200, 500 }, dtps)
    end)
  end)

  describe("labels", function()
    it("joins key/value pairs in order", function()
      assert.equals('route="r",version="v",peer="10.0.0.1:8000"',
        M.labels("route", "r", "version", "v", "peer", "10.0.0.1:8000"))
    end)
    it("omits nil and empty values", function()
      assert.equals('route="r",class="2xx"', M.labels("route", "r", "version", nil, "peer", "", "class", "2xx"))
      assert.equals('', M.labels("version", nil))
      assert.equals('', M.labels())
    end)
    it("escapes backslash, double quote and newline", function()
      assert.equals('route="a\\\\b\\"c\\nd"', M.labels("route", 'a\\b"c\nd'))
      -- the escaped string parses back to the original value
      local l = parse_labels("{" .. M.labels("route", 'x"\\\n"y', "peer", "p") .. "}", 1)
      assert.equals('x"\\\n"y', l.route)
      assert.equals("p", l.peer)
    end)
    it("writes numbers with tostring", function()
      assert.equals('port="8000"', M.labels("port", 8000))
    end)
  end)

  describe("counters", function()
    it("add up, one series per label string", function()
      local d = fake_dict()
      local a = M.labels("route", "qwen", "peer", "10.0.0.1:8000", "class", "2xx")
      local b = M.labels("route", "qwen", "peer", "10.0.0.2:8000", "class", "5xx")
      for _ = 1, 5 do M.inc(d, "autoconfig_engine_requests_total", a) end
      M.inc(d, "autoconfig_engine_requests_total", b, 3)
      M.inc(d, "autoconfig_engine_requests_total", b)
      M.inc(d, "autoconfig_engine_prompt_tokens_total", M.labels("route", "qwen"), 1200)
      M.inc(d, "autoconfig_engine_prompt_tokens_total", M.labels("route", "qwen"), 34)
      local fams = check(M.render(d))
      assert.equals(5, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total",
        { route = "qwen", peer = "10.0.0.1:8000", class = "2xx" }))
      assert.equals(4, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total",
        { route = "qwen", peer = "10.0.0.2:8000", class = "5xx" }))
      assert.equals(1234, value_of(fams, "autoconfig_engine_prompt_tokens_total", "autoconfig_engine_prompt_tokens_total",
        { route = "qwen" }))
      assert.equals("counter", fams.autoconfig_engine_requests_total.type)
    end)
    it("is a no-op without a dict, and refuses a name that is not a declared counter", function()
      assert.is_nil(M.inc(nil, "autoconfig_engine_requests_total", ""))
      assert.is_nil(M.observe(nil, "autoconfig_engine_ttft_seconds", "", 1))
      local d = fake_dict()
      assert.is_nil(M.inc(d, "autoconfig_engine_made_up_total", ""))
      assert.is_nil(M.inc(d, "autoconfig_engine_ttft_seconds", ""))
      assert.is_nil(M.inc(d, "autoconfig_engine_requests_total", "", "x"))
      assert.same({}, d:get_keys(0))
    end)
    it("renders a series without labels bare", function()
      local d = fake_dict()
      M.inc(d, "autoconfig_engine_ejections_total", "")
      assert.equals("# HELP autoconfig_engine_ejections_total " .. M.families[6].help .. "\n"
        .. "# TYPE autoconfig_engine_ejections_total counter\n"
        .. "autoconfig_engine_ejections_total 1\n", M.render(d))
    end)
    it("renders a count above 2^31 (and 2^53) exactly", function()
      local d = fake_dict()
      local l = M.labels("route", "r")
      M.inc(d, "autoconfig_engine_completion_tokens_total", l, 2 ^ 31)
      M.inc(d, "autoconfig_engine_completion_tokens_total", l, 5)
      local text = M.render(d)
      check(text)
      assert.truthy(text:find('\nautoconfig_engine_completion_tokens_total{route="r"} 2147483653\n', 1, true), text)
      local d2 = fake_dict()
      M.inc(d2, "autoconfig_engine_completion_tokens_total", l, 2 ^ 53 + 2)
      assert.truthy(M.render(d2):find(' 9007199254740994\n', 1, true))
    end)
  end)

  describe("histograms", function()
    it("renders cumulative buckets, sum and count exactly for a known sample", function()
      local d = fake_dict()
      local l = M.labels("route", "qwen", "version", "canary")
      -- 0.01 and 0.025 → le 0.025 (le is inclusive); 0.3 → 0.5; 1 → 1;
      -- 7 → 10; 100 → +Inf
      local sample = { 0.01, 0.025, 0.3, 1, 7, 100 }
      for _, v in ipairs(sample) do M.observe(d, "autoconfig_engine_ttft_seconds", l, v) end
      local text = M.render(d)
      local fams = check(text)
      local f = "autoconfig_engine_ttft_seconds"
      local want = {
        ["0.025"] = 2, ["0.05"] = 2, ["0.1"] = 2, ["0.25"] = 2, ["0.5"] = 3, ["1"] = 4,
        ["2.5"] = 4, ["5"] = 4, ["10"] = 5, ["30"] = 5, ["60"] = 5, ["+Inf"] = 6,
      }
      local nb = 0
      for le, n in pairs(want) do
        nb = nb + 1
        assert.equals(n, value_of(fams, f, f .. "_bucket", { route = "qwen", version = "canary", le = le }), "le " .. le)
      end
      assert.equals(12, nb)
      assert.equals(6, value_of(fams, f, f .. "_count", { route = "qwen", version = "canary" }))
      local sum, sumtext = value_of(fams, f, f .. "_sum", { route = "qwen", version = "canary" })
      local exact = 0
      for _, v in ipairs(sample) do exact = exact + v end
      assert.equals(exact, sum)
      assert.equals(exact, tonumber(sumtext))
      -- the bucket lines are in le order, in the family's own block
      assert.truthy(text:find('autoconfig_engine_ttft_seconds_bucket{route="qwen",version="canary",le="0.025"} 2\n'
        .. 'autoconfig_engine_ttft_seconds_bucket{route="qwen",version="canary",le="0.05"} 2\n', 1, true), text)
      assert.truthy(text:find('autoconfig_engine_ttft_seconds_bucket{route="qwen",version="canary",le="+Inf"} 6\n'
        .. 'autoconfig_engine_ttft_seconds_sum{route="qwen",version="canary"} ' .. sumtext .. '\n'
        .. 'autoconfig_engine_ttft_seconds_count{route="qwen",version="canary"} 6\n', 1, true), text)
      assert.equals(1, select(2, text:gsub("# TYPE autoconfig_engine_ttft_seconds histogram", "")))
    end)
    it("keeps integral sums integral and ignores non-finite values", function()
      local d = fake_dict()
      for _, v in ipairs({ 12, 30, 450, 1000 }) do M.observe(d, "autoconfig_engine_decode_tokens_per_second", "", v) end
      assert.is_nil(M.observe(d, "autoconfig_engine_decode_tokens_per_second", "", 0 / 0))
      assert.is_nil(M.observe(d, "autoconfig_engine_decode_tokens_per_second", "", math.huge))
      assert.is_nil(M.observe(d, "autoconfig_engine_decode_tokens_per_second", "", "3"))
      assert.is_nil(M.observe(d, "autoconfig_engine_requests_total", "", 3))
      local text = M.render(d)
      local fams = check(text)
      local f = "autoconfig_engine_decode_tokens_per_second"
      assert.truthy(text:find("\n" .. f .. "_sum 1492\n", 1, true), text)
      assert.equals(4, value_of(fams, f, f .. "_count", {}))
      assert.equals(1, value_of(fams, f, f .. "_bucket", { le = "15" }))
      assert.equals(3, value_of(fams, f, f .. "_bucket", { le = "500" }))
      assert.equals(4, value_of(fams, f, f .. "_bucket", { le = "+Inf" }))
    end)
    it("stores non-cumulative bucket counts", function()
      local d = fake_dict()
      M.observe(d, "autoconfig_engine_ttft_seconds", "", 0.2)
      M.observe(d, "autoconfig_engine_ttft_seconds", "", 0.2)
      M.observe(d, "autoconfig_engine_ttft_seconds", "", 45)
      local numbers = {}
      for _, k in ipairs(d:get_keys(0)) do numbers[#numbers + 1] = d:get(k) end
      table.sort(numbers)
      assert.same({ 1, 2, 45.4 }, numbers) -- two buckets and the sum
    end)
    it("keeps its key cache bounded", function()
      local d = fake_dict()
      for i = 1, 10050 do M.inc(d, "autoconfig_engine_requests_total", M.labels("route", "r" .. i)) end
      for i = 1, 10050 do M.inc(d, "autoconfig_engine_requests_total", M.labels("route", "r" .. i)) end
      local fams = check(M.render(d))
      assert.equals(10050, #fams.autoconfig_engine_requests_total.series)
      assert.equals(2, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total", { route = "r77" }))
    end)
  end)

  describe("render", function()
    local function populated()
      local d = fake_dict()
      local routes = { "qwen", "llama", 'we"ird\\route\nname' }
      for _, r in ipairs(routes) do
        for _, v in ipairs({ "stable", "canary" }) do
          for _, p in ipairs({ "10.0.0.1:8000", "10.0.0.2:8000", "" }) do
            for _, c in ipairs({ "2xx", "5xx" }) do
              M.inc(d, "autoconfig_engine_requests_total", M.labels("route", r, "version", v, "peer", p, "class", c), 2)
            end
          end
          M.inc(d, "autoconfig_engine_admission_refusals_total", M.labels("route", r, "version", v, "reason", "max_concurrency"))
          M.inc(d, "autoconfig_engine_affinity_placements_total", M.labels("route", r, "version", v, "result", "home"), 7)
          M.inc(d, "autoconfig_engine_affinity_placements_total", M.labels("route", r, "version", v, "result", "spill"))
          M.inc(d, "autoconfig_engine_canary_fallthrough_total", M.labels("route", r, "version", v))
          M.inc(d, "autoconfig_engine_prompt_tokens_total", M.labels("route", r, "version", v), 10)
          M.inc(d, "autoconfig_engine_completion_tokens_total", M.labels("route", r, "version", v), 20)
          for _, x in ipairs({ 0.07, 0.6, 3 }) do M.observe(d, "autoconfig_engine_ttft_seconds", M.labels("route", r, "version", v), x) end
          for _, x in ipairs({ 18.5, 33.25, 700 }) do M.observe(d, "autoconfig_engine_decode_tokens_per_second", M.labels("route", r, "version", v), x) end
        end
        M.inc(d, "autoconfig_engine_ejections_total", M.labels("route", r, "peer", "10.0.0.2:8000"))
        M.inc(d, "autoconfig_engine_state_write_failures_total", M.labels("route", r))
        M.inc(d, "autoconfig_engine_held_requests_total", M.labels("route", r, "result", "served"), 3)
        M.observe(d, "autoconfig_engine_hold_seconds", M.labels("route", r), 4.5)
        M.inc(d, "autoconfig_engine_streams_cut_total", M.labels("route", r, "reason", "upstream"))
      end
      return d
    end
    local gauges = {
      { name = "autoconfig_engine_peer_in_flight", labels = 'route="qwen",peer="10.0.0.1:8000"', value = 3 },
      { name = "autoconfig_engine_peer_in_flight", labels = 'route="qwen",peer="10.0.0.2:8000"', value = 0 },
      { name = "autoconfig_engine_peer_concurrency_limit", labels = 'route="qwen",peer="10.0.0.1:8000"', value = 16 },
      { name = "autoconfig_engine_peer_decode_tokens_per_second", labels = 'route="qwen",peer="10.0.0.1:8000"', value = 41.37 },
      { name = "autoconfig_engine_peer_ttft_seconds", labels = 'route="qwen",peer="10.0.0.1:8000"', value = 0.1 },
      { name = "autoconfig_engine_waiting_requests", labels = 'route="qwen"', value = 2 },
      { name = "autoconfig_engine_open_requests", labels = 'route="qwen"', value = 3 },
    }

    it("is valid exposition with every family, HELP/TYPE once before its series", function()
      local text = M.render(populated(), gauges)
      local fams = check(text)
      for _, f in ipairs(M.families) do
        assert.truthy(fams[f.name], f.name)
        assert.equals(f.type, fams[f.name].type)
        local _, types = ("\n" .. text):gsub("\n# TYPE " .. f.name .. " ", "")
        local _, helps = ("\n" .. text):gsub("\n# HELP " .. f.name .. " ", "")
        assert.equals(1, types, f.name)
        assert.equals(1, helps, f.name)
      end
      local n = 0
      for _ in pairs(fams) do n = n + 1 end
      assert.equals(#M.families, n)
      -- the escaped route survives the round trip
      assert.equals(2, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total",
        { route = 'we"ird\\route\nname', version = "canary", peer = "10.0.0.1:8000", class = "5xx" }))
      -- a peer of "" drops the label: the engine's own answers
      assert.equals(2, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total",
        { route = "qwen", version = "stable", class = "2xx" }))
    end)

    it("renders the same text for the same data, series sorted", function()
      local d = populated()
      local a = M.render(d, gauges)
      assert.equals(a, M.render(d, gauges))
      local prev
      for l in a:gmatch("autoconfig_engine_requests_total{([^\n]*)} %d+\n") do
        if prev then assert.truthy(prev < l, prev .. " !< " .. l) end
        prev = l
      end
    end)

    it("renders the gauges in their families", function()
      local fams = check(M.render(fake_dict(), gauges))
      assert.equals(3, value_of(fams, "autoconfig_engine_peer_in_flight", "autoconfig_engine_peer_in_flight",
        { route = "qwen", peer = "10.0.0.1:8000" }))
      assert.equals(0, value_of(fams, "autoconfig_engine_peer_in_flight", "autoconfig_engine_peer_in_flight",
        { route = "qwen", peer = "10.0.0.2:8000" }))
      assert.equals(16, value_of(fams, "autoconfig_engine_peer_concurrency_limit", "autoconfig_engine_peer_concurrency_limit",
        { route = "qwen", peer = "10.0.0.1:8000" }))
      local v, text = value_of(fams, "autoconfig_engine_peer_decode_tokens_per_second", "autoconfig_engine_peer_decode_tokens_per_second",
        { route = "qwen", peer = "10.0.0.1:8000" })
      assert.equals(41.37, v)
      assert.equals("41.37", text)
      assert.equals("0.1", select(2, value_of(fams, "autoconfig_engine_peer_ttft_seconds", "autoconfig_engine_peer_ttft_seconds",
        { route = "qwen", peer = "10.0.0.1:8000" })))
      assert.equals("gauge", fams.autoconfig_engine_peer_in_flight.type)
      -- gauges render without a dict too
      check(M.render(nil, gauges))
    end)

    it("omits families without series and never renders an undeclared one", function()
      assert.equals("", M.render(fake_dict(), {}))
      assert.equals("", M.render(fake_dict()))
      local d = fake_dict()
      M.inc(d, "autoconfig_engine_ejections_total", M.labels("route", "r", "peer", "p:1"))
      local text = M.render(d, {
        { name = "autoconfig_engine_not_a_gauge", labels = "", value = 1 },
        { name = "autoconfig_engine_requests_total", labels = "", value = 1 }, -- a counter, not a gauge
        { name = "autoconfig_engine_peer_in_flight", labels = "bad labels", value = 1 },
        { name = "autoconfig_engine_peer_in_flight", labels = "", value = "1" },
      })
      local fams = check(text)
      assert.truthy(fams.autoconfig_engine_ejections_total)
      local n = 0
      for _ in pairs(fams) do n = n + 1 end
      assert.equals(1, n, text)
    end)

    it("ignores dict keys it did not write", function()
      local d = fake_dict()
      M.inc(d, "autoconfig_engine_ejections_total", M.labels("route", "r", "peer", "p:1"))
      M.observe(d, "autoconfig_engine_ttft_seconds", M.labels("route", "r"), 0.3)
      d:set("something_else", 5)
      d:set("autoconfig_engine_unknown_total{}", 5)
      d:set("autoconfig_engine_peer_in_flight{}", 9) -- gauges are not read from the dict
      d:set('autoconfig_engine_ejections_total{route="r"}x', 5) -- no such counter suffix
      d:set('autoconfig_engine_ejections_total{route="r",peer="q"}', "text") -- not a number
      d:set('autoconfig_engine_ejections_total{route=unquoted}', 5) -- not a label string
      d:set('autoconfig_engine_ejections_total{route="a"} 1\nevil 2', 5)
      d:set('autoconfig_engine_ttft_seconds{route="r"}b99', 5) -- no such bucket
      d:set('autoconfig_engine_ttft_seconds{route="r"}b01', 5)
      d:set('autoconfig_engine_ttft_seconds{route="r"}c', 5)
      d:set('autoconfig_engine_ttft_seconds{route="r"}', 5)
      local text = M.render(d)
      local fams = check(text)
      assert.equals(1, #fams.autoconfig_engine_ejections_total.series, text)
      assert.equals(1, value_of(fams, "autoconfig_engine_ejections_total", "autoconfig_engine_ejections_total", { route = "r", peer = "p:1" }))
      assert.equals(14, #fams.autoconfig_engine_ttft_seconds.series, text) -- 12 buckets, sum, count
      assert.equals(1, value_of(fams, "autoconfig_engine_ttft_seconds", "autoconfig_engine_ttft_seconds_count", { route = "r" }))
      assert.equals(1, value_of(fams, "autoconfig_engine_ttft_seconds", "autoconfig_engine_ttft_seconds_bucket", { route = "r", le = "0.5" }))
      assert.is_nil(fams.autoconfig_engine_peer_in_flight)
      assert.is_nil(text:find("evil", 1, true))
      assert.is_nil(text:find("something_else", 1, true))
    end)

    it("formats numbers exactly and briefly", function()
      local f = M.format_number
      assert.equals("0", f(0))
      assert.equals("2147483653", f(2 ^ 31 + 5))
      assert.equals("100000000000000000000", f(1e20))
      assert.equals("0.025", f(0.025))
      assert.equals("2.5", f(2.5))
      assert.equals("0.30000000000000004", f(0.1 + 0.2))
      assert.equals(0.1 + 0.2, tonumber(f(0.1 + 0.2)))
      assert.equals("+Inf", f(math.huge))
      assert.equals("-Inf", f(-math.huge))
      assert.equals("NaN", f(0 / 0))
    end)
  end)

  describe("handler", function()
    local saved
    local function fake_ngx()
      local n = { status = nil, header = {}, body = {}, logged = {}, ERR = 4 }
      function n.print(s) n.body[#n.body + 1] = s end
      function n.say(s) n.body[#n.body + 1] = s .. "\n" end
      function n.exit(code) n.exited = code end
      function n.log(_, ...) n.logged[#n.logged + 1] = table.concat({ ... }) end
      return n
    end
    before_each(function() saved = _G.ngx end)
    after_each(function() _G.ngx = saved end)

    it("answers 200 with the exposition and its content type", function()
      local n = fake_ngx()
      _G.ngx = n
      local d = fake_dict()
      M.inc(d, "autoconfig_engine_requests_total", M.labels("route", "r", "class", "2xx"))
      M.handler(d, function()
        return { { name = "autoconfig_engine_peer_in_flight", labels = M.labels("route", "r", "peer", "p:1"), value = 2 } }
      end)
      assert.equals(200, n.status)
      assert.equals(200, n.exited)
      assert.equals("text/plain; version=0.0.4; charset=utf-8", n.header["Content-Type"])
      local body = table.concat(n.body)
      local fams = check(body)
      assert.equals(1, value_of(fams, "autoconfig_engine_requests_total", "autoconfig_engine_requests_total", { route = "r", class = "2xx" }))
      assert.equals(2, value_of(fams, "autoconfig_engine_peer_in_flight", "autoconfig_engine_peer_in_flight", { route = "r", peer = "p:1" }))
    end)

    it("renders the counters when the gauges function fails", function()
      local n = fake_ngx()
      _G.ngx = n
      local d = fake_dict()
      M.inc(d, "autoconfig_engine_ejections_total", "")
      M.handler(d, function() error("boom") end)
      assert.equals(200, n.status)
      assert.truthy(table.concat(n.body):find("autoconfig_engine_ejections_total 1\n", 1, true))
      assert.equals(1, #n.logged)
    end)

    it("answers 503 without the dict", function()
      local n = fake_ngx()
      _G.ngx = n
      M.handler(nil, function() return {} end)
      assert.equals(503, n.status)
      assert.equals(503, n.exited)
      local body = table.concat(n.body)
      assert.truthy(body:find("lua_shared_dict autoconfig@metrics", 1, true), body)
      assert.equals(1, select(2, body:gsub("\n", "")))
    end)
  end)
end)
