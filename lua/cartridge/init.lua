-- cartridge: the engine seen from Lua.
--
--   local cartridge = require("cartridge")
--   local g = cartridge.gguf.open("model.gguf")
--
-- Submodules load on first use: gguf, safetensors, tensor, dtype, model,
-- tokenizer, sampler, chat, generate, json, options, ...
-- cartridge.C is the raw FFI namespace of libcartridge for anything the
-- wrappers do not cover.

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local cartridge = {
    version = ffi.string(C.cart_version()),
    C = C,
    ffi = ffi,
    root = core.root,
    library = core.library,
}

-- The kernels' ISA level (scalar, avx2, avx512, neon): the best this CPU
-- has, or what CART_ISA forces. A CART_ISA this machine cannot run is an
-- error here, before any work, naming the levels it can.
core.check(C.cart_isa_init(), "cartridge")

function cartridge.isa()
    return ffi.string(C.cart_isa_name(C.cart_isa_active()))
end

-- Threads for the engine's kernels and the BLAS (0 = all cores).
function cartridge.set_threads(n)
    core.check(C.cart_set_threads(n or 0), "cartridge.set_threads")
end

function cartridge.threads()
    return C.cart_threads()
end

-- cartridge.<name> loads lua/cartridge/<name>.lua on first use; __fields
-- names them all for the REPL's completion.
return setmetatable(cartridge, {
    __fields = function()
        local names = {}
        local ok, list = pcall(require("cartridge.fs").list, core.root .. "/lua/cartridge")
        for _, f in ipairs(ok and list or {}) do
            local name = f:match("^([%w_]+)%.lua$")
            if name and name ~= "init" then names[#names + 1] = name end
        end
        return names
    end,
    __index = function(t, key)
        if type(key) ~= "string" or not key:match("^[%w_]+$") then return nil end
        if not package.searchpath("cartridge." .. key, package.path) then return nil end
        local m = require("cartridge." .. key)
        rawset(t, key, m)
        return m
    end,
})
