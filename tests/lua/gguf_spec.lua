local cartridge = require("cartridge")
local helper = require("helper")
local gguf = cartridge.gguf
local ffi = cartridge.ffi

describe("cartridge.gguf", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    it("round-trips metadata of every kind and tensor data through a file", function()
        local w = gguf.writer()
        w:set("general.architecture", "llama")
        w:set("test.u8", 200, "uint8")
        w:set("test.i8", -100, "int8")
        w:set("test.u16", 65535, "uint16")
        w:set("test.i16", -32768, "int16")
        w:set("test.u32", 4000000000, "uint32")
        w:set("test.i32", -2000000000, "int32")
        w:set("test.u64", 2 ^ 53, "uint64")
        w:set("test.i64", -(2 ^ 53), "int64")
        w:set("test.f32", 0.5, "float32")
        w:set("test.f64", 0.1, "float64")
        w:set("test.bool", true)
        w:set("test.false", false)
        w:set("test.strings", { "a", "", "ünïcode" }, "array", "string")
        w:set("test.floats", { 1.5, -2.25 }, "array", "float32")
        w:set("test.nested", { { 1, 2 }, { 3 } }, "array", "array")
        local data = ffi.new("float[8]", 1, 2, 3, 4, 5, 6, 7, 8)
        w:add_tensor("x.weight", "f32", { 2, 4 }, data)
        local path = dir .. "/t.gguf"
        w:write(path)

        local g = gguf.open(path)
        assert.are.equal(3, g.version)
        assert.are.equal("llama", g:get("general.architecture"))
        assert.are.equal(200, g:get("test.u8"))
        assert.are.equal(-100, g:get("test.i8"))
        assert.are.equal(65535, g:get("test.u16"))
        assert.are.equal(-32768, g:get("test.i16"))
        assert.are.equal(4000000000, g:get("test.u32"))
        assert.are.equal(-2000000000, g:get("test.i32"))
        assert.are.equal(2 ^ 53, g:get("test.u64"))
        assert.are.equal(-(2 ^ 53), g:get("test.i64"))
        assert.are.equal(0.5, g:get("test.f32"))
        assert.are.equal(0.1, g:get("test.f64"))
        assert.are.equal(true, g:get("test.bool"))
        assert.are.equal(false, g:get("test.false"))
        local listed = {}
        for _, kv in ipairs(g:metadata()) do listed[kv.key] = kv.value end
        assert.are.equal(false, listed["test.false"])
        assert.are.same({ "a", "", "ünïcode" }, g:get("test.strings"))
        assert.are.same({ 1.5, -2.25 }, g:get("test.floats"))
        assert.are.same({ { 1, 2 }, { 3 } }, g:get("test.nested"))
        assert.is_nil(g:get("test.absent"))
        local t = g:tensor("x.weight")
        assert.are.same({ 2, 4 }, t.shape)
        assert.are.same({ 4, 2 }, t.ne)
        assert.are.equal(32, t.nbytes)
        assert.are.equal(0, t.offset % g.alignment)
        local p = ffi.cast("const float *", t.data)
        for i = 0, 7 do assert.are.equal(i + 1, p[i]) end
        g:close()
    end)

    it("copies raw metadata values from a reader into a writer", function()
        local src = helper.fixture("models/stories260K.gguf")
        if not src then return pending("../shared/models/stories260K.gguf absent") end
        local g = gguf.open(src)
        local w = gguf.writer()
        for _, kv in ipairs(g:metadata(true)) do w:set(kv.key, kv.raw) end
        local path = dir .. "/copy.gguf"
        w:write(path)
        local c = gguf.open(path)
        local a, b = g:metadata(), c:metadata()
        assert.are.equal(#a, #b)
        for i = 1, #a do
            assert.are.equal(a[i].key, b[i].key)
            assert.are.same(a[i].value, b[i].value)
        end
        c:close()
        g:close()
    end)

    it("reads stories260K: llama, 5 layers, 64 wide, 8 heads, 4 KV heads, 512 tokens", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local g = gguf.open(path)
        assert.are.equal("llama", g:get("general.architecture"))
        assert.are.equal(5, g:get("llama.block_count"))
        assert.are.equal(64, g:get("llama.embedding_length"))
        assert.are.equal(8, g:get("llama.attention.head_count"))
        assert.are.equal(4, g:get("llama.attention.head_count_kv"))
        assert.are.equal(512, #g:get("tokenizer.ggml.tokens"))
        local params = 0
        for _, t in ipairs(g:tensors()) do params = params + t.numel end
        assert.are.equal(292800, params)
        g:close()
    end)

    it("fails on a truncated file with a message naming the file", function()
        local src = helper.fixture("models/stories260K.gguf")
        if not src then return pending("../shared/models/stories260K.gguf absent") end
        local bytes = helper.read_file(src)
        local path = dir .. "/cut.gguf"
        helper.write_file(path, bytes:sub(1, 1000))
        local ok, err = pcall(gguf.open, path)
        assert.is_false(ok)
        assert.truthy(err:find(path, 1, true), err)
    end)
end)
