-- router_measure: measuring an llm answer as it passes (the body filter:
-- first token, decode samples, tokens, a Responses answer's id) and
-- settling it in the log phase (the token and timing metrics, the last
-- decode sample); docs/lua-contract.md, "Measuring answers and token
-- accounting". The request record (ngx.ctx.autoconfig_req) is made by the
-- access phase: { r = route, start = ngx.req.start_time(), key = … }.
local state = require("router_state")
local affinity = require("router_affinity")
local slo = require("router_slo")
local sse = require("router_sse")
local metrics = require("router_metrics")
local count = require("router_count")

local active = state.active

local M = {}

local function elapsed_ms(req, now)
  return (now - req.start) * 1000
end

-- first_token records the request's time to first token.
local function first_token(req, now, t, p)
  req.first, req.mark, req.mark_tokens = now, now, req.tokens
  req.mark_n = active(req.r, t, p)
  req.next_sample = now + slo.SAMPLE_SECONDS
  local ms = elapsed_ms(req, now)
  req.ttft_ms = ms
  slo.ttft(req.r, t, p, ms)
end

-- sample feeds the decode rate of the stream's last interval to the
-- peer's adaptive limit.
local function sample(req, now, t, p)
  local dt = now - req.mark
  -- The streams the rate was shared by: the peer's requests in flight at
  -- both ends of the interval, averaged.
  local n = active(req.r, t, p)
  if dt > 0 then
    slo.decode(req.r, t, p, (req.tokens - req.mark_tokens) / dt, (n + req.mark_n) / 2)
  end
  req.mark, req.mark_tokens, req.mark_n = now, req.tokens, n
  req.next_sample = now + slo.SAMPLE_SECONDS
end

-- remember maps an answer's id (a Responses API "resp_…") to the key
-- its request was placed by, as soon as the id passes: before the client
-- has the answer, so its next turn (previous_response_id) finds it.
local function remember(req)
  local id = req.parse.id
  if id and req.key and not req.remembered then
    req.remembered = true
    affinity.remember(req.r, id, req.key)
  end
end

-- body is the http-level body filter of the shipped nginx.conf: for llm
-- requests it counts the answer's tokens as they pass (SSE content
-- events, or the usage of a JSON answer) and times the first one.
function M.body()
  local ctx = ngx.ctx
  local req = ctx.autoconfig_req
  if not req then
    return
  end
  local tries = ctx.autoconfig_tries
  local last = tries and tries[#tries]
  if not last then
    return
  end
  local chunk, eof = ngx.arg[1], ngx.arg[2]
  local mode = req.mode
  if mode == nil then
    local ct = ngx.header["Content-Type"] or ""
    if type(ct) == "table" then ct = ct[1] or "" end
    if ngx.status >= 300 then
      mode = "none"
    elseif string.find(ct, "text/event-stream", 1, true) then
      mode = "sse"
    elseif string.find(ct, "json", 1, true) then
      mode = "json"
    else
      mode = "none"
    end
    req.mode, req.tokens = mode, 0
    if mode ~= "none" then
      req.parse = sse.new()
    end
  end
  if mode == "none" then
    return
  end
  if mode == "sse" then
    local now = ngx.now()
    if chunk and chunk ~= "" then
      local n = sse.feed(req.parse, chunk)
      if not req.remembered and req.parse.id then
        remember(req)
      end
      if n > 0 then
        req.tokens = req.tokens + n
        req.last = now
        if not req.first then
          first_token(req, now, last.t, last.p)
        elseif now >= req.next_sample then
          sample(req, now, last.t, last.p)
        end
      end
    end
    return
  end
  -- A JSON answer arrives whole after the generation: it has usage, no
  -- first-token time.
  if chunk and chunk ~= "" then
    if not req.seen_json then
      -- An OpenAI answer object starts with its id: take it from the
      -- first bytes, before the client has the whole answer (the end of
      -- the body filter can run after the client read the last byte).
      req.seen_json = true
      local id = string.match(string.sub(chunk, 1, 512), '^%s*{%s*"id"%s*:%s*"([^"\\]+)"')
      if id then
        req.parse.id = id
        remember(req)
      end
    end
    sse.feed_json(req.parse, chunk)
  end
  if eof then
    sse.finish_json(req.parse)
    remember(req)
  end
end

-- settle records what the body filter measured: tokens, the TTFT
-- and decode-rate histograms, the stream's last decode sample, and a
-- Responses API answer's id (the next turn's previous_response_id).
function M.settle(r, req, t, p, v)
  local st = req.parse
  if not st then
    return
  end
  local d = count.dict()
  local rv = count.lv(r, v).rv
  local completion = st.completion_tokens or (req.mode == "sse" and req.tokens) or nil
  if d then
    if st.prompt_tokens then
      metrics.inc(d, "autoconfig_engine_prompt_tokens_total", rv, st.prompt_tokens)
    end
    if completion and completion > 0 then
      metrics.inc(d, "autoconfig_engine_completion_tokens_total", rv, completion)
    end
    if req.ttft_ms then
      metrics.observe(d, "autoconfig_engine_ttft_seconds", rv, req.ttft_ms / 1000)
    end
  end
  if req.mode == "sse" and req.first and req.last and req.last > req.first and req.tokens > 1 then
    local rate = (req.tokens - 1) / (req.last - req.first)
    if d then
      metrics.observe(d, "autoconfig_engine_decode_tokens_per_second", rv, rate)
    end
    -- The stream's last interval feeds the limit only when it is long
    -- enough to measure (a short tail of a few tokens is noise); a stream
    -- too short for an interval sample gives its whole decode rate.
    if req.mark == req.first then
      if req.tokens >= 4 then
        slo.decode(r, t, p, rate, (active(r, t, p) + req.mark_n) / 2)
      end
    elseif req.last - req.mark >= slo.SAMPLE_SECONDS / 2 and req.tokens > req.mark_tokens then
      sample(req, req.last, t, p)
    end
  end
end

return M
