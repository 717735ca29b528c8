-- router_hash: the standard CRC-32 (IEEE 802.3, reflected polynomial
-- 0xEDB88320, initial value and final xor 0xFFFFFFFF) of a string, the same
-- value as zlib's crc32, Go's hash/crc32.ChecksumIEEE and nginx's
-- ngx.crc32_long. The engine uses ngx.crc32_long inside nginx and this
-- module outside it (unit specs, tools); both give the same numbers.
--
-- Pure Lua on LuaJIT's `bit` library: a 256-entry table is built once when
-- the module loads; crc32 then costs one table lookup and a few bit
-- operations per byte and allocates nothing.

local bit = require("bit")

local band, bxor, bnot, rshift = bit.band, bit.bxor, bit.bnot, bit.rshift
local byte = string.byte

local M = {}

-- TABLE[b] is the CRC register update for the byte value b (0..255).
-- `bit` works on signed 32-bit integers, so entries may be negative; only
-- their bit patterns matter.
local TABLE = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) == 1 then
      c = bxor(rshift(c, 1), 0xEDB88320)
    else
      c = rshift(c, 1)
    end
  end
  TABLE[i] = c
end

local TWO32 = 4294967296

-- crc32(s) -> the CRC-32 of the bytes of s, an integer in [0, 2^32).
function M.crc32(s)
  local c = -1 -- 0xFFFFFFFF as a signed 32-bit value
  for i = 1, #s do
    c = bxor(rshift(c, 8), TABLE[band(bxor(c, byte(s, i)), 0xFF)])
  end
  c = bnot(c)
  if c < 0 then
    c = c + TWO32
  end
  return c
end

return M
