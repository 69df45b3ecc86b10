-- fuzz_json.lua: libFuzzer target (through lua_harness.c) for the JSON codec
-- every request body and artifact header in Lua goes through,
-- require("cartridge.json").
--
-- Input: the bytes of a JSON text. The checks are util.check_json's
-- (fuzz_util.lua), which fuzz_request runs on every request body too.
--
-- decode must either return a value or raise "json: <what> at byte N" with N
-- within the input (+1 for the end). It must refuse any input that is not
-- UTF-8. What it accepts must survive a round trip: encode(decode(x))
-- succeeds unless a number read as infinity (1e400), decodes back to the
-- same value, and encodes again to the same text (a fixed point).

local util = require("fuzz_util")

return function(data) util.check_json(data) end
