-- cartridge.json: decoding edge cases found by tests/fuzz (fuzz_request).

local json = require("cartridge.json")

describe("json.decode", function()
    it("reads numbers whose exponent has too many digits for LuaJIT as 0 or infinity", function()
        -- LuaJIT's tonumber gives nil for these; decode used to return nil
        -- (top level), leave a hole (arrays) or drop the key (objects)
        assert.are.equal(math.huge, json.decode("2e99999999999"))
        local a = json.decode("[1e-99999999999,-0e99999999999,-2e99999999999,0e99999999999,7]")
        assert.are.equal(5, #a)
        assert.are.same({ 0, 0, -math.huge, 0, 7 }, a)
        assert.are.equal(-math.huge, 1 / a[2]) -- -0 keeps its sign
        local o = json.decode('{"max_tokens":2e99999999999}')
        assert.are.equal(math.huge, o.max_tokens)
        assert.are.equal("2e99999999999", json.number_text(o, "max_tokens"))
    end)

    it("round-trips what it decodes when the numbers are finite", function()
        for _, text in ipairs({ '{"a":[1,2.5,-0,1e-400,null,true],"b":{"":"\\u0000\\u007f"}}', "[[[]]]", '"\\ud83d\\ude00"' }) do
            local v = json.decode(text)
            local again = json.decode(json.encode(v))
            assert.are.same(v, again)
            assert.are.equal(json.encode(v), json.encode(again))
        end
    end)
end)
