-- The FFI declarations come from the C headers; these specs prove the Lua view
-- of every public struct has the C compiler's size and alignment.

local cartridge = require("cartridge")
local core = require("cartridge.core")
local ffi = cartridge.ffi
local C = cartridge.C

describe("the FFI binding", function()
    it("declares every public struct with the same size and alignment as C", function()
        local n = tonumber(C.cart_abi_struct_count())
        assert.is_true(n > 0)
        local checked = 0
        for i = 0, n - 1 do
            local row = C.cart_abi_struct_at(i)
            local name = ffi.string(row.name)
            local lua_size, lua_align = ffi.sizeof(name), ffi.alignof(name)
            print(("  %-24s C %3d/%d  FFI %3d/%d"):format(name, tonumber(row.size),
                tonumber(row.align), lua_size, lua_align))
            assert.are.equal(tonumber(row.size), lua_size, name .. " size")
            assert.are.equal(tonumber(row.align), lua_align, name .. " alignment")
            checked = checked + 1
        end
        assert.are.equal(n, checked)
    end)

    it("reads its declarations from the headers, not from a copy", function()
        -- every struct the cdef defines is one the C table knows about
        local known = {}
        for i = 0, tonumber(C.cart_abi_struct_count()) - 1 do
            known[ffi.string(C.cart_abi_struct_at(i).name)] = true
        end
        local defined = 0
        for name in core.cdef:gmatch("typedef struct ([%w_]+) {") do
            defined = defined + 1
            assert.is_true(known[name], name .. " is defined in a header but not in abi.c")
        end
        assert.are.equal(tonumber(C.cart_abi_struct_count()), defined)
        assert.truthy(core.cdef:find("cart_gguf_open", 1, true))
        assert.falsy(core.cdef:find("#", 1, true))
    end)

    it("turns engine failures into Lua errors that carry the engine's message", function()
        local ok, err = pcall(cartridge.gguf.open, "/nonexistent/model.gguf")
        assert.is_false(ok)
        assert.truthy(err:find("gguf.open: /nonexistent/model.gguf", 1, true), err)
    end)

    it("reports the engine version and sets the thread count", function()
        assert.truthy(cartridge.version:match("^%d+%.%d+%.%d+"))
        cartridge.set_threads(1)
        assert.are.equal(1, cartridge.threads())
        cartridge.set_threads(0)
        assert.is_true(cartridge.threads() >= 1)
    end)
end)
