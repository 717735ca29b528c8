-- router_sse: token counting, usage and id of streamed and plain answers,
-- whatever the chunking.

local sse = require("router_sse")

local function chunk_event(content)
  return 'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1718000000,'
    .. '"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{'
    .. content .. '},"logprobs":null,"finish_reason":null}]}\n\n'
end

local VLLM_STREAM = table.concat({
  chunk_event('"role":"assistant","content":""'),
  chunk_event('"content":"Hello"'),
  chunk_event('"content":","'),
  chunk_event('"content":" wor"'),
  chunk_event('"content":"ld"'),
  chunk_event('"content":"!"'),
  'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1718000000,'
    .. '"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{},'
    .. '"logprobs":null,"finish_reason":"stop","stop_reason":null}]}\n\n',
  'data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1718000000,'
    .. '"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":17,'
    .. '"total_tokens":22,"completion_tokens":5,"prompt_tokens_details":null}}\n\n',
  "data: [DONE]\n\n",
})

local function check(st, n)
  assert.are.equal(5, n)
  assert.are.equal(5, st.tokens)
  assert.are.equal(17, st.prompt_tokens)
  assert.are.equal(5, st.completion_tokens)
  assert.are.equal("chatcmpl-abc123", st.id)
  assert.is_true(st.done)
  assert.is_nil(st.tail)
end

describe("router_sse.feed", function()
  it("counts a vLLM stream fed whole", function()
    local st = sse.new()
    check(st, sse.feed(st, VLLM_STREAM))
  end)

  it("counts it fed one byte at a time", function()
    local st, n = sse.new(), 0
    for i = 1, #VLLM_STREAM do
      n = n + sse.feed(st, VLLM_STREAM:sub(i, i))
    end
    check(st, n)
  end)

  it("counts it split in two at every position", function()
    local st = sse.new()
    for cut = 0, #VLLM_STREAM do
      sse.reset(st)
      local n = sse.feed(st, VLLM_STREAM:sub(1, cut)) + sse.feed(st, VLLM_STREAM:sub(cut + 1))
      check(st, n)
    end
  end)

  it("counts it split in three at many positions", function()
    local st = sse.new()
    local len = #VLLM_STREAM
    for a = 0, len, 11 do
      for b = a, len, 17 do
        sse.reset(st)
        local n = sse.feed(st, VLLM_STREAM:sub(1, a)) + sse.feed(st, VLLM_STREAM:sub(a + 1, b))
          + sse.feed(st, VLLM_STREAM:sub(b + 1))
        check(st, n)
      end
    end
  end)

  it("takes CRLF separators", function()
    local crlf = VLLM_STREAM:gsub("\n\n", "\r\n\r\n")
    for cut = 0, #crlf, 3 do
      local st = sse.new()
      check(st, sse.feed(st, crlf:sub(1, cut)) + sse.feed(st, crlf:sub(cut + 1)))
    end
  end)

  it("counts a stream without usage and leaves completion_tokens nil", function()
    local text = VLLM_STREAM:gsub("data: [^\n]*\"usage\"[^\n]*\n\n", "")
    local st = sse.new()
    assert.are.equal(5, sse.feed(st, text))
    assert.is_nil(st.completion_tokens)
    assert.is_nil(st.prompt_tokens)
    assert.is_true(st.done)
  end)

  it("does not decode usage:null chunks and counts reasoning deltas", function()
    local text = table.concat({
      'data: {"id":"c1","choices":[{"delta":{"reasoning_content":"Let me"}}],"usage":null}\n\n',
      'data: {"id":"c1","choices":[{"delta":{"reasoning":" think"}}],"usage":null}\n\n',
      'data: {"id":"c1","choices":[{"delta":{"content": "Yes"}}],"usage":null}\n\n',
      'data: {"id":"c1","choices":[{"delta":{"content":null}}],"usage":null}\n\n',
    })
    local st = sse.new()
    assert.are.equal(3, sse.feed(st, text))
    assert.is_nil(st.completion_tokens)
    assert.is_false(st.done)
  end)

  it("counts completions text and ignores what follows [DONE]", function()
    local text = 'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" Paris"}]}\n\n'
      .. 'data: {"id":"cmpl-1","choices":[{"index":0,"text":""}]}\n\n'
      .. 'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n'
      .. 'data: [DONE]\n\n'
    local st = sse.new()
    assert.are.equal(1, sse.feed(st, text))
    assert.are.equal(0, sse.feed(st, 'data: {"choices":[{"text":"late"}]}\n\n'))
    assert.are.equal("cmpl-1", st.id)
    assert.are.equal(4, st.prompt_tokens)
    assert.are.equal(1, st.completion_tokens)
  end)

  it("counts a Responses API stream by its text deltas", function()
    local text = table.concat({
      'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"resp_42","object":"response","status":"in_progress","text":{"format":{"type":"text"}},"usage":null}}\n\n',
      'event: response.output_item.added\ndata: {"type":"response.output_item.added","item":{"id":"msg_1","type":"message","role":"assistant","content":[]}}\n\n',
      'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_1","delta":"Hi"}\n\n',
      'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_1","delta":" there"}\n\n',
      'event: response.output_text.done\ndata: {"type":"response.output_text.done","item_id":"msg_1","text":"Hi there"}\n\n',
      'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_42","output":[{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}],"usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}}\n\n',
    })
    local st = sse.new()
    assert.are.equal(2, sse.feed(st, text))
    assert.are.equal("resp_42", st.id)
    assert.are.equal(9, st.prompt_tokens)
    assert.are.equal(2, st.completion_tokens)
  end)

  it("ends only on a [DONE] data line", function()
    local st = sse.new()
    assert.are.equal(1, sse.feed(st, chunk_event('"content":"data: [DONE]"')))
    assert.is_false(st.done)
    assert.are.equal(0, sse.feed(st, "event: x\r\ndata:[DONE]\r\n\r\n"))
    assert.is_true(st.done)
  end)

  it("survives garbage", function()
    local st = sse.new()
    local junk = {}
    math.randomseed(7)
    for i = 1, 5000 do
      junk[i] = string.char(math.random(0, 255))
    end
    local s = table.concat(junk)
    assert.are.equal(0, sse.feed(st, s))
    assert.are.equal(0, sse.feed(st, "\n\n{not json\n\ndata: {\"usage\":{broken\n\n"))
    assert.are.equal(0, sse.feed(st, nil))
    assert.are.equal(0, sse.feed(st, ""))
    assert.are.equal(0, st.tokens)
  end)

  it("drops a tail over 64 KiB", function()
    local st = sse.new()
    sse.feed(st, "data: " .. string.rep("x", 70000))
    assert.is_nil(st.tail)
    assert.are.equal(1, st.dropped)
    assert.are.equal(1, sse.feed(st, chunk_event('"content":"ok"')))
  end)
end)

describe("router_sse.feed_json / finish_json", function()
  it("reads usage and id of a chat answer fed in pieces", function()
    local answer = '{"id":"chatcmpl-xyz","object":"chat.completion","created":1718000000,'
      .. '"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},'
      .. '"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}'
    local st = sse.new()
    for i = 1, #answer, 10 do
      assert.is_true(sse.feed_json(st, answer:sub(i, i + 9)))
    end
    assert.is_true(sse.finish_json(st))
    assert.are.equal("chatcmpl-xyz", st.id)
    assert.are.equal(12, st.prompt_tokens)
    assert.are.equal(3, st.completion_tokens)
  end)

  it("reads usage and id of a Responses answer", function()
    local answer = '{"id":"resp_67ccd2bed1ec8190","object":"response","status":"completed",'
      .. '"output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}],'
      .. '"previous_response_id":null,"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},'
      .. '"output_tokens":87,"total_tokens":123}}'
    local st = sse.new()
    sse.feed_json(st, answer)
    assert.is_true(sse.finish_json(st))
    assert.are.equal("resp_67ccd2bed1ec8190", st.id)
    assert.are.equal(36, st.prompt_tokens)
    assert.are.equal(87, st.completion_tokens)
  end)

  it("gives up past the limit and on bad JSON", function()
    local st = sse.new()
    assert.is_true(sse.feed_json(st, string.rep(" ", 60), 100))
    assert.is_false(sse.feed_json(st, string.rep(" ", 60), 100))
    assert.is_false(sse.finish_json(st))
    sse.reset(st)
    sse.feed_json(st, "{garbage")
    assert.is_false(sse.finish_json(st))
    sse.reset(st)
    sse.feed_json(st, '{"id":"x","usage":null}')
    assert.is_false(sse.finish_json(st))
    assert.are.equal("x", st.id)
    assert.is_false(sse.finish_json(sse.new()))
  end)
end)
