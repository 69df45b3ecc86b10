local cartridge = require("cartridge")
local helper = require("helper")
local st = cartridge.safetensors
local ffi = cartridge.ffi

describe("cartridge.safetensors", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    it("round-trips tensors and metadata, sorting I64 before F32 and names bytewise", function()
        local k = ffi.new("float[6]", 1, 2, 3, 4, 5, 6)
        local ids = ffi.new("int64_t[3]", 7, 8, 9)
        local h = ffi.new("uint16_t[2]", 0x3c00, 0x4000)
        local path = dir .. "/c.safetensors"
        st.write(path, {
            { name = "layers.10.k", dtype = "F32", shape = { 1, 2, 3 }, data = k },
            { name = "layers.0.k", dtype = "F32", shape = { 2, 3 }, data = k },
            { name = "draft_reference", dtype = "I64", shape = { 3 }, data = ids },
            { name = "half", dtype = "F16", shape = { 2 }, data = h },
        }, { ["cartridge.p"] = "3", ["general.architecture"] = "qwen3" })
        local f = st.open(path)
        assert.are.equal("3", f.metadata["cartridge.p"])
        assert.are.equal("qwen3", f.metadata["general.architecture"])
        local names = {}
        for i, t in ipairs(f:tensors()) do names[i] = t.name end
        assert.are.same({ "draft_reference", "layers.0.k", "layers.10.k", "half" }, names)
        local d = f:tensor("draft_reference")
        assert.are.equal("I64", d.dtype_name)
        assert.are.equal(9, tonumber(ffi.cast("const int64_t *", d.data)[2]))
        local t = f:tensor("layers.10.k")
        assert.are.same({ 1, 2, 3 }, t.shape)
        assert.are.equal(24, t.nbytes)
        assert.are.equal(0, (8 + f.header_size) % 8)
        f:close()
    end)

    it("refuses a file whose header lies about a tensor's size", function()
        local header = '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
        local bytes = string.char(#header, 0, 0, 0, 0, 0, 0, 0) .. header .. "\0\0\0\0"
        local path = dir .. "/bad.safetensors"
        helper.write_file(path, bytes)
        local ok, err = pcall(st.open, path)
        assert.is_false(ok)
        assert.truthy(err:find("'x'", 1, true) or err:find("x", 1, true), err)
        print("  error: " .. err)
    end)
end)
