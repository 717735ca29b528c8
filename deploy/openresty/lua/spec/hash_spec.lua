-- router_hash: crc32 agrees with zlib.crc32 (values computed with Python's
-- zlib), i.e. with nginx's ngx.crc32_long and Go's crc32.ChecksumIEEE.

local hash = require("router_hash")

describe("router_hash.crc32", function()
  it("gives the CRC-32 check value of 123456789", function()
    assert.are.equal(0xCBF43926, hash.crc32("123456789"))
    assert.are.equal(3421780262, hash.crc32("123456789"))
  end)

  it("gives 0 for the empty string", function()
    assert.are.equal(0, hash.crc32(""))
  end)

  it("agrees with zlib on other inputs", function()
    local all = {}
    for i = 0, 255 do
      all[#all + 1] = string.char(i)
    end
    local cases = {
      { "a", 3904355907 },
      { "hello world", 222957957 },
      { "The quick brown fox jumps over the lazy dog", 1095738169 },
      { "backend|10.0.0.1|8000#0", 158258483 },
      { "\0", 3523407757 },
      { string.rep("\255", 100), 64128641 },
      { table.concat(all), 688229491 },
      { "chat\0You are helpful.\0hi", 1527609910 },
    }
    for _, c in ipairs(cases) do
      assert.are.equal(c[2], hash.crc32(c[1]))
    end
  end)

  it("returns a non-negative integer below 2^32", function()
    for i = 1, 2000 do
      local v = hash.crc32("key-" .. i)
      assert.is_true(v >= 0 and v < 2 ^ 32 and v == math.floor(v))
    end
  end)
end)
