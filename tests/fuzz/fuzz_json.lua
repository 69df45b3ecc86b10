-- fuzz_json.lua: libFuzzer target (through lua_harness.c) for the JSON codec
-- every request body and artifact header in Lua goes through,
-- require("cartridge.json").
--
-- Input: the bytes of a JSON text.
--
-- decode must either return a value or raise "json: <what> at byte N" with N
-- within the input (+1 for the end). It must refuse any input that is not
-- UTF-8. What it accepts must survive a round trip: encode(decode(x))
-- succeeds unless a number read as infinity (1e400), decodes back to the
-- same value, and encodes again to the same text (a fixed point).

local util = require("fuzz_util")
local json = require("cartridge.json")
local C = require("cartridge.core").C

local function has_infinity(v, depth)
    if type(v) == "number" then return v == math.huge or v == -math.huge end
    if type(v) ~= "table" or depth > 300 then return false end
    for _, x in pairs(v) do
        if has_infinity(x, depth + 1) then return true end
    end
    return false
end

return function(data)
    local ok, v = pcall(json.decode, data)
    local bad_utf8 = C.cart_utf8_invalid_offset(data, #data) >= 0
    if not ok then
        util.expect_rejection(v, { "json: " }, "json.decode")
        local at = tonumber(tostring(v):match(" at byte (%d+)$"))
        if not at or at < 1 or at > #data + 1 then util.finding("json.decode: no byte position in range: %s", v) end
        return
    end
    if bad_utf8 then util.finding("json.decode accepted %d bytes that are not UTF-8", #data) end
    if has_infinity(v, 0) then return end
    local eok, text = pcall(json.encode, v)
    if not eok then util.finding("json.encode refused a decoded value: %s", tostring(text)) end
    if C.cart_utf8_invalid_offset(text, #text) >= 0 then util.finding("json.encode wrote bytes that are not UTF-8") end
    local dok, again = pcall(json.decode, text)
    if not dok then util.finding("json.decode refused what json.encode wrote: %s", tostring(again)) end
    if not util.same(v, again) then util.finding("a decode/encode/decode round trip changed the value") end
    if json.encode(again) ~= text then util.finding("encoding is not a fixed point after one round trip") end
end
