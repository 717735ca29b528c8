-- router_body: the affinity key of a request, equal for the turns of one
-- conversation and distinct across conversations.

local body = require("router_body")
local cjson = require("cjson.safe")

local SYSTEM = "You are a helpful assistant."

local function chat(messages, extra)
  local t = { model = "m", stream = true, messages = messages }
  for k, v in pairs(extra or {}) do
    t[k] = v
  end
  return cjson.encode(t)
end

local TURN1 = {
  { role = "system", content = SYSTEM },
  { role = "user", content = "What is the capital of France?" },
}
local TURN2 = {
  { role = "system", content = SYSTEM },
  { role = "user", content = "What is the capital of France?" },
  { role = "assistant", content = "Paris." },
  { role = "user", content = "And of Italy?" },
}

describe("router_body.key: chat", function()
  local uri = "/v1/chat/completions"

  it("gives both turns of a conversation the same key", function()
    local k1, kind1 = body.key(chat(TURN1), uri)
    local k2, kind2 = body.key(chat(TURN2, { temperature = 0.2 }), uri)
    assert.are.equal("chat", kind1)
    assert.are.equal("chat", kind2)
    assert.are.equal(k1, k2)
    assert.are.equal("chat\0" .. SYSTEM .. "\0What is the capital of France?", k1)
  end)

  it("tells conversations apart by system prompt or first user message", function()
    local k = body.key(chat(TURN1), uri)
    local other_system = body.key(chat({
      { role = "system", content = "You are a pirate." },
      { role = "user", content = "What is the capital of France?" },
    }), uri)
    local other_user = body.key(chat({
      { role = "system", content = SYSTEM },
      { role = "user", content = "What is the capital of Spain?" },
    }), uri)
    assert.are_not.equal(k, other_system)
    assert.are_not.equal(k, other_user)
    assert.are_not.equal(other_system, other_user)
  end)

  it("takes content given as an array of parts", function()
    local parts = { { type = "text", text = "Describe this image." },
      { type = "image_url", image_url = { url = "https://example.com/a.png" } } }
    local k1 = body.key(chat({ { role = "user", content = parts } }), uri)
    local k2 = body.key(chat({ { role = "user", content = parts },
      { role = "assistant", content = "A cat." }, { role = "user", content = "Its colour?" } }), uri)
    assert.are.equal(k1, k2)
    assert.are.equal('chat\0\0[{"text":"Describe this image.","type":"text"},'
      .. '{"image_url":{"url":"https:\\/\\/example.com\\/a.png"},"type":"image_url"}]', k1)
    local system_parts = body.key(chat({ { role = "system", content = { { type = "text", text = SYSTEM } } },
      { role = "user", content = "hi" } }), uri)
    assert.is_truthy(system_parts:find(SYSTEM, 1, true))
  end)

  it("writes parts the same way in every process (sorted keys)", function()
    -- LuaJIT seeds its string hashes per process, so the order of a
    -- table's keys (and cjson.encode's output) differs between nginx
    -- workers; the key must not.
    local text = '{"messages":[{"role":"user","content":[{"type":"text","text":"hi",'
      .. '"cache_control":{"type":"ephemeral"}},{"type":"image_url","image_url":{"url":"u","detail":"low"}}]}]}'
    local script = "package.path='./?.lua;'..package.path; io.write((require('router_body').key(io.read('*a'))))"
    local want = body.key(text, uri)
    local tmp = os.tmpname()
    local f = assert(io.open(tmp, "w"))
    f:write(text)
    f:close()
    for _ = 1, 8 do
      local p = assert(io.popen('luajit -e "' .. script .. '" < ' .. tmp))
      local got = p:read("*a")
      p:close()
      assert.are.equal(want, got)
    end
    os.remove(tmp)
  end)

  it("cuts a large part (an inline image) to prompt_bytes", function()
    local image = "data:image/png;base64," .. string.rep("A", 100000)
    local k = body.key(chat({ { role = "user", content = { { type = "image_url",
      image_url = { url = image } } } } }), uri)
    assert.are.equal(#"chat\0\0" + 512, #k)
  end)

  it("takes a developer message as the system prompt", function()
    local k = body.key(chat({ { role = "developer", content = "Be brief." },
      { role = "user", content = "hi" } }), uri)
    assert.are.equal("chat\0Be brief.\0hi", k)
  end)

  it("cuts each text to prompt_bytes", function()
    local long = string.rep("s", 5000)
    local k = body.key(chat({ { role = "system", content = long }, { role = "user", content = "hi" } }), uri)
    assert.are.equal("chat\0" .. string.rep("s", 512) .. "\0hi", k)
    local k8 = body.key(chat({ { role = "system", content = long }, { role = "user", content = "hello" } }),
      uri, { prompt_bytes = 4 })
    assert.are.equal("chat\0ssss\0hell", k8)
  end)

  it("finds a chat body by its messages when the URI does not tell", function()
    local k, kind = body.key(chat(TURN1), "/proxy/llm")
    assert.are.equal("chat", kind)
    assert.are.equal(body.key(chat(TURN1), uri), k)
    assert.are.equal(k, body.key(chat(TURN1)))
  end)

  it("gives nil without a user message or without messages", function()
    assert.is_nil(body.key(chat({ { role = "system", content = SYSTEM } }), uri))
    assert.is_nil(body.key(chat({}), uri))
    assert.is_nil(body.key('{"model":"m"}', uri))
    assert.is_nil(body.key('{"messages":"hello"}', uri))
    assert.is_nil(body.key('{"messages":[1,"x",{"role":"user","content":null}]}', uri))
  end)
end)

describe("router_body.key: completions", function()
  it("keys on the prompt's first prompt_bytes bytes", function()
    local long = string.rep("p", 600)
    local k, kind = body.key(cjson.encode({ model = "m", prompt = long .. "tail 1" }), "/v1/completions")
    local k2 = body.key(cjson.encode({ model = "m", prompt = long .. "tail 2" }), "/v1/completions")
    assert.are.equal("completion", kind)
    assert.are.equal("completion\0" .. string.rep("p", 512), k)
    assert.are.equal(k, k2)
    assert.are.equal("completion\0Once", body.key('{"prompt":"Once upon a time"}', nil, { prompt_bytes = 4 }))
  end)

  it("takes an array prompt's first element when it is a string", function()
    assert.are.equal("completion\0a", body.key('{"prompt":["a","b"]}', "/v1/completions"))
    assert.is_nil(body.key('{"prompt":[[1,2,3]]}', "/v1/completions"))
    assert.is_nil(body.key('{"prompt":42}', "/v1/completions"))
  end)
end)

describe("router_body.key: responses", function()
  local uri = "/v1/responses"

  it("keys on previous_response_id and returns it", function()
    local k, kind, prev = body.key('{"model":"m","previous_response_id":"resp_abc","input":"more"}', uri)
    assert.are.equal("response\0resp_abc", k)
    assert.are.equal("response", kind)
    assert.are.equal("resp_abc", prev)
  end)

  it("keys on a string input", function()
    local k, kind, prev = body.key('{"model":"m","input":"Tell me a joke"}', uri)
    assert.are.equal("response\0Tell me a joke", k)
    assert.are.equal("response", kind)
    assert.is_nil(prev)
  end)

  it("keys on the first user item of an input array", function()
    local input = {
      { role = "developer", content = "Be brief." },
      { type = "message", role = "user", content = { { type = "input_text", text = "Hi" } } },
      { role = "user", content = "second" },
    }
    local k = body.key(cjson.encode({ model = "m", input = input }), uri)
    assert.are.equal('response\0[{"text":"Hi","type":"input_text"}]', k)
    local k2 = body.key(cjson.encode({ input = { { role = "user", content = "plain" } } }), "/x")
    assert.are.equal("response\0plain", k2)
  end)

  it("gives nil for an input without a user item", function()
    assert.is_nil(body.key('{"input":[{"role":"assistant","content":"x"}]}', uri))
    assert.is_nil(body.key('{"input":7}', uri))
  end)
end)

describe("router_body.key: bad bodies", function()
  it("gives nil without error", function()
    for _, text in ipairs({ "", "{", "not json", "[1,2]", "42", '"str"', "null", "true", "{}" }) do
      assert.is_nil(body.key(text, "/v1/chat/completions"))
      assert.is_nil(body.key(text, "/v1/responses"))
      assert.is_nil(body.key(text, nil))
    end
    assert.is_nil(body.key(nil, "/v1/chat/completions"))
    assert.is_nil(body.key({}, "/v1/chat/completions"))
  end)
end)

describe("router_body.key: bounded cost", function()
  local uri = "/v1/chat/completions"

  -- A chat body with an extra top-level object of n small members.
  local function wide(n)
    local parts = {}
    for i = 1, n do parts[i] = string.format('"k%06d":1', i) end
    return '{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}],"metadata":{'
      .. table.concat(parts, ",") .. "}}"
  end

  local function ms_per_key(text, opts)
    local n = 10
    body.key(text, uri, opts)
    collectgarbage()
    local t0 = os.clock()
    for _ = 1, n do body.key(text, uri, opts) end
    return (os.clock() - t0) * 1000 / n
  end

  it("gives no key for a body with more separators than the bound, before decoding it", function()
    local text = wide(60000) -- 60,000 keys: 120,002 separators
    assert.is_nil(body.key(text, uri))
    assert.is_nil(body.key(wide(20000), uri)) -- 40,002 > 20,000
    -- Under the bound the same shape keys as ever.
    assert.are.equal("chat\0S\0U", body.key(wide(9000), uri))
    assert.are.equal("chat\0S\0U", body.key(text, uri, { max_separators = 200000 }))
    -- The bound is exact: separators, not bytes.
    local at = wide(9998)
    local _, commas = string.gsub(at, ",", "")
    local _, colons = string.gsub(at, ":", "")
    assert.are.equal("chat\0S\0U", body.key(at, uri, { max_separators = commas + colons }))
    assert.is_nil(body.key(at, uri, { max_separators = commas + colons - 1 }))
  end)

  it("counts no separator inside strings (escaped quotes included)", function()
    local prose = string.rep('a, b: "c", ', 50000) -- 150,000 ',' and ':' in a string
    local text = cjson.encode({ messages = { { role = "user", content = prose } } })
    assert.are.equal("chat\0\0" .. string.sub(prose, 1, 512), body.key(text, uri))
    assert.is_false(body._over(text, 10))
    assert.is_true(body._over('{"a":1,"b":2}', 2))
    assert.is_false(body._over('{"a\\":1,":2}', 1)) -- one ':' outside the string
  end)

  it("prints the key's CPU time for a 650 KB body of 60,000 keys and a string body of that size", function()
    local text = wide(60000)
    local str = cjson.encode({ messages = { { role = "user", content = string.rep("a", #text) } } })
    local parts = {}
    for i = 1, 60000 do parts[i] = string.format('{"k%06d":1}', i) end
    local part = '{"messages":[{"role":"user","content":[' .. table.concat(parts, ",") .. "]}]}"
    print(string.format("body key: %d-byte string body %.3f ms; %d-byte body of 60,000 keys %.3f ms (decoded: %.3f ms); "
      .. "%d-byte content of 60,000 parts %.3f ms (decoded: %.3f ms)",
      #str, ms_per_key(str), #text, ms_per_key(text), ms_per_key(text, { max_separators = 1e9 }),
      #part, ms_per_key(part), ms_per_key(part, { max_separators = 1e9 })))
  end)
end)
