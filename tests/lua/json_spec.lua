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

-- RFC 8259, case by case: what a strict parser must accept, and refuse.
describe("json.decode against RFC 8259", function()
    local accepted = {
        { "0", 0 }, { "-0", 0 }, { "1.5e3", 1500 }, { "1E+2", 100 }, { "1e-2", 0.01 }, { "-12.25", -12.25 },
        { '"a\\"b\\\\c\\/d"', 'a"b\\c/d' }, { '"\\b\\f\\n\\r\\t"', "\b\f\n\r\t" },
        { '"\\u00e9\\u20ac"', "é€" }, { '"\\ud83d\\ude00"', "😀" }, { '"é€😀"', "é€😀" },
        { '"a\127b"', "a\127b" }, -- DEL needs no escape
        { " \t\r\n[ 1 , 2 ]\n ", { 1, 2 } }, { "[]", {} }, { "{}", {} }, { '{"":1}', { [""] = 1 } },
        { "true", true }, { "false", false }, { '{"a":{"b":[{"c":null}]}}', nil },
        { '{"a":1,"a":2}', { a = 2 } }, -- duplicate keys: the last one wins
        { ("["):rep(200) .. "1" .. ("]"):rep(200), nil }, -- 200 containers open at once, the limit
    }
    local refused = {
        { "", "end of input" }, { " ", "end of input" }, { "01", "bad number" }, { "1.", "bad number" },
        { ".5", "unexpected character '.'" }, { "+1", "unexpected character '+'" }, { "-", "bad number" },
        { "1e", "bad number" }, { "0x10", "trailing" }, { "NaN", "unexpected" }, { "Infinity", "unexpected" },
        { "[1,]", "unexpected character ']'" }, { "[,1]", "unexpected character ','" },
        { '{"a":1,}', "expected a string key" }, { "{a:1}", "expected a string key" },
        { "{'a':1}", "expected a string key" }, { '{"a" 1}', "expected ':'" }, { '{"a":}', "unexpected" },
        { "[1 2]", "expected ',' or ']'" }, { '"abc', "unterminated string" }, { '"a\tb"', "control character" },
        { '"\\x41"', "bad escape" }, { '"\\u12"', "bad \\u escape" },
        { '"\\ud800"', "unpaired surrogate" }, { '"\\udc00"', "unpaired surrogate" },
        { '"\\ud800\\u0041"', "unpaired surrogate" },
        { '"\255"', "invalid UTF-8 (byte 0xff)" }, { '"\192\128"', "invalid UTF-8" }, -- an overlong NUL
        { '"\237\160\128"', "invalid UTF-8" }, -- a surrogate encoded directly
        { "tru", "unexpected" }, { "nul", "unexpected" }, { "[1] [2]", "trailing" }, { "{} x", "trailing" },
        { ("["):rep(201) .. ("]"):rep(201), "nesting deeper than 200 at byte 201" },
        { ('{"a":'):rep(201) .. "1" .. ("}"):rep(201), "nesting deeper than 200" },
    }

    it("accepts every valid form and reads its value", function()
        for _, c in ipairs(accepted) do
            local ok, v = pcall(json.decode, c[1])
            assert.is_true(ok, ("%q was refused: %s"):format(c[1], tostring(v)))
            if c[2] ~= nil then assert.are.same(c[2], v, c[1]) end
        end
        print(("  %d valid documents accepted"):format(#accepted))
    end)

    it("refuses every invalid one with the byte it stopped at", function()
        for _, c in ipairs(refused) do
            local ok, err = pcall(json.decode, c[1])
            assert.is_false(ok, ("%q was accepted"):format(c[1]))
            assert.truthy(err:match("^json: .* at byte %d+$"), err)
            assert.truthy(err:find(c[2], 1, true), ("%q: %s (expected %q)"):format(c[1], err, c[2]))
        end
        print(("  %d invalid documents refused"):format(#refused))
    end)

    it("tells [] from {} and keeps the text of numbers a double cannot hold", function()
        local v = json.decode('{"a":[],"b":{},"c":9007199254740993,"d":1e400,"e":12}')
        assert.are.equal("array", json.kind(v.a))
        assert.are.equal("object", json.kind(v.b))
        assert.are.equal("9007199254740993", json.number_text(v, "c"))
        assert.are.equal("1e400", json.number_text(v, "d"))
        assert.is_nil(json.number_text(v, "e")) -- exact: nothing to keep
        assert.are.equal("null", json.kind(json.decode("[null]")[1]))
    end)
end)

describe("json.encode", function()
    it("writes sorted keys, exact numbers and escaped strings, and refuses what JSON cannot hold", function()
        assert.are.equal('{"a":1,"b":[true,null],"c":"x\\n\\"y\\u0001"}',
            json.encode({ c = 'x\n"y\1', a = 1, b = { true, json.null } }))
        assert.are.equal("[0.1,1e+300,-2.5,9007199254740992]", json.encode({ 0.1, 1e300, -2.5, 2 ^ 53 }))
        assert.are.equal("[]", json.encode(json.array()))
        assert.are.equal("{}", json.encode(json.object()))
        for _, x in ipairs({ 0 / 0, math.huge, -math.huge }) do
            assert.has_error(function() json.encode({ x }) end)
        end
        assert.has_error(function() json.encode({ [true] = 1 }) end, "json.encode: object key true is not a string")
        assert.has_error(function() json.encode(print) end, "json.encode: cannot encode a function")
        for _, x in ipairs({ 0.1, 1 / 3, 1e-300, 123456789.123, -7 }) do
            assert.are.equal(x, json.decode(json.encode(x)))
        end
    end)

    it("with python = true, writes a decoded object's keys in source order with json.dumps's separators", function()
        local text = '{"type":"function","function":{"name":"get","parameters":{"type":"object",'
            .. '"properties":{"b":{"type":"string"},"a":{"type":"integer"}},"required":["b"]}}}'
        -- what Python's json.dumps(json.loads(text), ensure_ascii=False) prints
        assert.are.equal('{"type": "function", "function": {"name": "get", "parameters": {"type": "object", '
            .. '"properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "required": ["b"]}}}',
            json.encode(json.decode(text), { python = true }))
        -- a duplicate key keeps its first place and its last value, as Python's dict does
        assert.are.equal('{"x": 3, "y": 2}', json.encode(json.decode('{"x":1,"y":2,"x":3}'), { python = true }))
        -- tables built in Lua: sorted keys; non-ASCII text as it is
        assert.are.equal('{"a": "é", "z": [1, 2]}', json.encode({ z = { 1, 2 }, a = "é" }, { python = true }))
        -- the default is unchanged: sorted and compact
        assert.are.equal('{"a":{"type":"integer"},"b":{"type":"string"}}',
            json.encode(json.decode('{"b":{"type":"string"},"a":{"type":"integer"}}')))
    end)
end)
