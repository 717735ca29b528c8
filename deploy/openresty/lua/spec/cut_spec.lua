-- router_cut: a streamed answer is cut when it ends before its end
-- ([DONE], a finish_reason, a Responses API end event); the reason comes
-- from how nginx finished the request.

local sse = require("router_sse")
local cut = require("router_cut")

local function stream(...)
  local req = { mode = "sse", parse = sse.new() }
  for _, chunk in ipairs({ ... }) do
    sse.feed(req.parse, chunk)
  end
  return req
end

local CHUNK = 'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
local LAST = 'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'

describe("router_cut.reason", function()
  it("is nil for a stream that reached its end", function()
    assert.is_nil(cut.reason(stream(CHUNK, LAST, "data: [DONE]\n\n"), "OK", "200"))
    assert.is_nil(cut.reason(stream(CHUNK, "data: [DONE]\n\n"), "OK", "200"))
    -- a finish_reason without [DONE] (the client may close after it)
    assert.is_nil(cut.reason(stream(CHUNK, LAST), "", "200"))
    assert.is_nil(cut.reason(stream('event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1"}}\n\n'), "OK", "200"))
    assert.is_nil(cut.reason(stream('data: {"type":"response.incomplete"}\n\n'), "OK", "200"))
  end)

  it("is nil for an answer that is not a stream", function()
    assert.is_nil(cut.reason(nil, "", "200"))
    assert.is_nil(cut.reason({ mode = "json", parse = sse.new() }, "", "200"))
    assert.is_nil(cut.reason({ mode = "none" }, "", "502"))
    assert.is_nil(cut.reason({}, "", "200"))
  end)

  it("is upstream when nginx finished a stream cut short, client when the request was terminated", function()
    assert.are.equal("upstream", cut.reason(stream(CHUNK, CHUNK), "OK", "200"))
    assert.are.equal("client", cut.reason(stream(CHUNK, CHUNK), "", "200"))
    assert.are.equal("client", cut.reason(stream(CHUNK), "OK", "499"))
    -- cut inside an event: the unfinished tail is no end
    assert.are.equal("upstream", cut.reason(stream(CHUNK, string.sub(LAST, 1, 60)), "OK", "200"))
    assert.are.equal("upstream", cut.reason(stream('data: {"type":"response.output_text.delta","delta":"x"}\n\n'), "OK", "200"))
  end)
end)

describe("router_cut.count", function()
  local incs
  before_each(function()
    incs = {}
    _G.ngx = { var = { request_completion = "OK", status = "200" } }
  end)
  local d = { incr = function() end }
  local metrics = require("router_metrics")
  local inc = metrics.inc
  setup(function()
    metrics.inc = function(_, name, lstr, n) incs[#incs + 1] = { name, lstr, n } end
  end)
  teardown(function() metrics.inc = inc end)

  it("counts a cut stream by route, version and reason", function()
    cut.count(d, { name = "qwen" }, stream(CHUNK), "canary")
    assert.are.same({ { "autoconfig_engine_streams_cut_total", 'route="qwen",version="canary",reason="upstream"', 1 } }, incs)
  end)

  it("counts nothing for an ended stream, a JSON answer or without the metrics dict", function()
    cut.count(d, { name = "qwen" }, stream(CHUNK, LAST), nil)
    cut.count(d, { name = "qwen" }, { mode = "json", parse = sse.new() }, nil)
    cut.count(nil, { name = "qwen" }, stream(CHUNK), nil)
    assert.are.same({}, incs)
  end)
end)
