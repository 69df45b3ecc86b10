-- cartridge: the engine seen from Lua.
--
--   local cartridge = require("cartridge")
--   local g = cartridge.gguf.open("model.gguf")
--
-- Submodules load on first use: gguf, safetensors, tensor, dtype, options.
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

-- Threads for the engine's kernels and the BLAS (0 = all cores).
function cartridge.set_threads(n)
    core.check(C.cart_set_threads(n or 0), "cartridge.set_threads")
end

function cartridge.threads()
    return C.cart_threads()
end

local submodules = {
    gguf = true, safetensors = true, tensor = true, dtype = true, options = true, fmt = true,
}

return setmetatable(cartridge, {
    __index = function(t, key)
        if submodules[key] then
            local m = require("cartridge." .. key)
            rawset(t, key, m)
            return m
        end
        return nil
    end,
})
