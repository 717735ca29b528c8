-- router_cut: streamed llm answers that end without their end
-- (autoconfig_engine_streams_cut_total, docs/metrics.md).
--
-- A streamed answer (text/event-stream, status below 300) is cut when its
-- log phase comes before the answer said it was complete (router_sse
-- ended: "data: [DONE]", a finish_reason, a Responses API end event). Who
-- cut it, from how nginx finished the request:
--   upstream  nginx finished the request itself ($request_completion
--             "OK"): the backend closed the stream early, died, or
--             timed out (proxy_read_timeout); nginx then flushes what it
--             has and closes the client connection without the last
--             chunk;
--   client    the request was terminated ($request_completion empty, or
--             $status 499): the client went away (or a write to it
--             failed) before the end.
-- A stream without any of the end markers (a server that writes neither
-- [DONE] nor finish_reason) counts as cut by "upstream" at every end.
--
-- Runs outside nginx too (busted, spec/cut_spec.lua): reason is pure.
local sse = require("router_sse")
local metrics = require("router_metrics")

local M = {}

M.METRIC = "autoconfig_engine_streams_cut_total"

-- reason: why the answer req (router.lua's request record: mode, parse)
-- was cut, "upstream" or "client", or nil when it was not a stream or
-- reached its end. completion and status are $request_completion and
-- $status.
function M.reason(req, completion, status)
  if req == nil or req.mode ~= "sse" or req.parse == nil or sse.ended(req.parse) then
    return nil
  end
  if completion == "OK" and status ~= "499" then
    return "upstream"
  end
  return "client"
end

-- count counts a cut answer of route r (version v, nil without canary) in
-- the metrics dict d (nil: nothing is counted); the log phase calls it.
function M.count(d, r, req, v)
  if d == nil or req == nil or req.mode ~= "sse" then
    return
  end
  local why = M.reason(req, ngx.var.request_completion, ngx.var.status)
  if why then
    metrics.inc(d, M.METRIC, metrics.labels("route", r.name, "version", v, "reason", why), 1)
  end
end

return M
