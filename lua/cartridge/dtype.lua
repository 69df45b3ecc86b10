-- cartridge.dtype: element types by name, their block geometry, conversions.
--
--   dtype.id("q4_K")          -- 12
--   dtype.name(12)            -- "q4_K"
--   dtype.info("q4_K")        -- { name, block_size = 256, type_size = 144, is_quantized, can_dequantize }
--   dtype.nbytes("q4_K", 512) -- 288
--   dtype.to_f32("f16", ptr, n) -- a new float[n] cdata

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local dtype = {}

-- The cart_dtype id of a name or id; raises on an unknown one.
function dtype.id(d)
    if type(d) == "number" then
        if C.cart_dtype_name(d) == nil then error("dtype: unknown dtype id " .. d, 0) end
        return d
    end
    local id = C.cart_dtype_from_name(tostring(d))
    if id < 0 then error("dtype: unknown dtype '" .. tostring(d) .. "'", 0) end
    return id
end

function dtype.name(d)
    local p = C.cart_dtype_name(dtype.id(d))
    return ffi.string(p)
end

function dtype.info(d)
    local info = ffi.new("cart_dtype_info")
    core.check(C.cart_dtype_get_info(info, dtype.id(d)), "dtype.info")
    return {
        name = ffi.string(info.name),
        block_size = info.block_size,
        type_size = info.type_size,
        is_quantized = info.is_quantized ~= 0,
        can_dequantize = info.can_dequantize ~= 0,
    }
end

function dtype.nbytes(d, n)
    local out = ffi.new("uint64_t[1]")
    core.check(C.cart_dtype_nbytes(out, dtype.id(d), n), "dtype.nbytes")
    return core.int(out[0])
end

-- n elements of type d at src (a pointer) as a new float[n] array.
function dtype.to_f32(d, src, n)
    local dst = ffi.new("float[?]", math.max(n, 1))
    core.check(C.cart_to_f32(dst, dtype.id(d), src, n), "dtype.to_f32")
    return dst
end

-- n floats at src converted to type d, as a new uint8_t[] buffer and its size.
function dtype.from_f32(d, src, n)
    local size = dtype.nbytes(d, n)
    local dst = ffi.new("uint8_t[?]", math.max(size, 1))
    core.check(C.cart_from_f32(dst, dtype.id(d), src, n), "dtype.from_f32")
    return dst, size
end

return dtype
