-- gguf_reader.lua: a minimal, slow, pure-Lua GGUF v2/v3 reader for the
-- reference forward pass. It shares no code with the engine's GGUF parser on
-- purpose: the tests compare the two, so a bug here must not be a bug there.
--
-- It reads the whole file into one Lua string and decodes it with LuaJIT's
-- FFI (used only to reinterpret bytes as integers and floats). Every offset
-- and size read from the file is bounds-checked. Only F32 and F16 tensors can
-- be read; other types raise an error naming the tensor.

local ffi = require("ffi")

local M = {}

-- ggml tensor type ids (ggml.h, enum ggml_type).
M.GGML_F32 = 0
M.GGML_F16 = 1

-- GGUF metadata value types (gguf.h, enum gguf_type).
local T_U8, T_I8, T_U16, T_I16, T_U32, T_I32 = 0, 1, 2, 3, 4, 5
local T_F32, T_BOOL, T_STRING, T_ARRAY = 6, 7, 8, 9
local T_U64, T_I64, T_F64 = 10, 11, 12

local scalar_size = {
    [T_U8] = 1, [T_I8] = 1, [T_U16] = 2, [T_I16] = 2, [T_U32] = 4, [T_I32] = 4,
    [T_F32] = 4, [T_BOOL] = 1, [T_U64] = 8, [T_I64] = 8, [T_F64] = 8,
}

local u8p = ffi.typeof("const uint8_t *")

-- Unaligned reads go through a small union: copy the bytes in, read the
-- field out. (x86 tolerates unaligned casts, but this keeps it portable.)
ffi.cdef([[
typedef union {
    uint8_t b[8];
    uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64;
} ref_gguf_scalar;
]])
local scratch = ffi.new("ref_gguf_scalar")

local TWO53 = 2 ^ 53

-- Converts one IEEE half-precision bit pattern (0..65535) to a Lua number.
-- Written out by hand (sign, 5-bit exponent, 10-bit mantissa) rather than
-- borrowed from any engine or library code.
local function f16_to_f64(h)
    local sign = (h >= 0x8000) and -1 or 1
    local e = math.floor(h / 0x400) % 0x20
    local m = h % 0x400
    if e == 0 then
        return sign * m * 2 ^ -24 -- zero or subnormal: m * 2^-14 * 2^-10
    elseif e == 31 then
        if m == 0 then return sign * math.huge end
        return 0 / 0
    end
    return sign * (1 + m / 1024) * 2 ^ (e - 15)
end
M.f16_to_f64 = f16_to_f64

-- All 65536 half values, so converting a big F16 tensor is a table lookup.
local f16_table = ffi.new("double[65536]")
for h = 0, 65535 do f16_table[h] = f16_to_f64(h) end
M.f16_table = f16_table

-- Rounds a Lua number to the nearest IEEE half value (ties to even), as the
-- F16C instruction (and ggml's f32 -> f16 conversion) does. Returns the
-- rounded value as a Lua number, not the bit pattern. Overflow gives ±inf.
local frexp, floor = math.frexp, math.floor
local function round_f16(x)
    if x ~= x or x == 0 then return x end
    local ax = x < 0 and -x or x
    if ax >= 65520 then return x < 0 and -math.huge or math.huge end
    local _, e = frexp(ax) -- ax = m * 2^e, 0.5 <= m < 1
    -- A normal half has 11 significant bits: ulp = 2^(e-11). Below 2^-14 the
    -- spacing is fixed at the subnormal ulp 2^-24.
    local ulp_exp = e - 11
    if ulp_exp < -24 then ulp_exp = -24 end
    local ulp = 2 ^ ulp_exp
    local q = ax / ulp -- exact: division by a power of two
    local r = floor(q + 0.5)
    if r - q == 0.5 and r % 2 == 1 then r = r - 1 end -- tie: to even
    local y = r * ulp
    return x < 0 and -y or y
end
M.round_f16 = round_f16

-- Rounds a Lua number to the nearest float32 (ties to even).
local f32_box = ffi.new("float[1]")
local function round_f32(x)
    f32_box[0] = x
    return f32_box[0]
end
M.round_f32 = round_f32

local Reader = {}
Reader.__index = Reader

local function fail(self, fmt, ...)
    error(("gguf_reader: %s: " .. fmt):format(self.path, ...), 0)
end

-- Raises unless n bytes are available at the cursor.
local function need(self, n, what)
    if n < 0 or self.pos + n > self.size then
        fail(self, "truncated file reading %s at byte %d (need %d, have %d)",
            what, self.pos, n, self.size - self.pos)
    end
end

local function read_scalar(self, ty, what)
    local n = scalar_size[ty]
    if not n then fail(self, "unknown metadata type %d for %s", ty, what) end
    need(self, n, what)
    ffi.copy(scratch.b, self.base + self.pos, n)
    self.pos = self.pos + n
    if ty == T_U8 then return scratch.b[0]
    elseif ty == T_I8 then return scratch.b[0] >= 128 and scratch.b[0] - 256 or scratch.b[0]
    elseif ty == T_U16 then return scratch.u16
    elseif ty == T_I16 then return scratch.i16
    elseif ty == T_U32 then return scratch.u32
    elseif ty == T_I32 then return scratch.i32
    elseif ty == T_F32 then return scratch.f32
    elseif ty == T_F64 then return scratch.f64
    elseif ty == T_BOOL then
        local b = scratch.b[0]
        if b > 1 then fail(self, "bool %s is %d, expected 0 or 1", what, b) end
        return b == 1
    elseif ty == T_U64 then
        local v = scratch.u64
        if v > TWO53 then fail(self, "uint64 %s too large for a Lua number", what) end
        return tonumber(v)
    else -- T_I64
        local v = scratch.i64
        if v > TWO53 or v < -TWO53 then
            fail(self, "int64 %s too large for a Lua number", what)
        end
        return tonumber(v)
    end
end

local function read_u32(self, what) return read_scalar(self, T_U32, what) end
local function read_u64(self, what) return read_scalar(self, T_U64, what) end

local function read_string(self, what)
    local n = read_u64(self, what .. " (string length)")
    need(self, n, what)
    local s = self.data:sub(self.pos + 1, self.pos + n)
    self.pos = self.pos + n
    return s
end

local function read_value(self, ty, what, depth)
    if ty == T_STRING then return read_string(self, what) end
    if ty == T_ARRAY then
        if depth > 8 then fail(self, "arrays nested too deep in %s", what) end
        local ety = read_u32(self, what .. " (array type)")
        local n = read_u64(self, what .. " (array length)")
        -- Every element takes at least one byte: reject absurd counts early.
        need(self, n, what .. " (array elements)")
        local out = {}
        for i = 1, n do out[i] = read_value(self, ety, what, depth + 1) end
        return out
    end
    return read_scalar(self, ty, what)
end

-- Opens and parses a GGUF file.
-- Returns a reader with fields: path, version, alignment, metadata (key ->
-- Lua value; arrays are Lua tables, 1-based), tensors (name -> info with
-- name, ne = {ne0, ne1, ...} (ne0 is the contiguous dimension), type,
-- n_elements, offset (absolute byte offset in the file), nbytes), and
-- tensor_names (file order). Raises "gguf_reader: <path>: ..." on any error.
-- The whole file stays in memory until reader:close().
function M.open(path)
    local f, err = io.open(path, "rb")
    if not f then error("gguf_reader: cannot open " .. tostring(err), 0) end
    local data = f:read("*a")
    f:close()
    local self = setmetatable({
        path = path, data = data, size = #data, pos = 0,
        base = ffi.cast(u8p, data),
    }, Reader)

    need(self, 4, "magic")
    if data:sub(1, 4) ~= "GGUF" then
        fail(self, "bad magic %q, expected \"GGUF\"", data:sub(1, 4))
    end
    self.pos = 4
    self.version = read_u32(self, "version")
    if self.version ~= 2 and self.version ~= 3 then
        fail(self, "version %d, expected 2 or 3", self.version)
    end
    local n_tensors = read_u64(self, "tensor count")
    local n_kv = read_u64(self, "metadata count")

    self.metadata, self.metadata_types = {}, {}
    for _ = 1, n_kv do
        local key = read_string(self, "metadata key")
        local ty = read_u32(self, "type of " .. key)
        self.metadata[key] = read_value(self, ty, key, 0)
        self.metadata_types[key] = ty
    end

    self.alignment = self.metadata["general.alignment"] or 32
    if type(self.alignment) ~= "number" or self.alignment < 1
        or self.alignment % 1 ~= 0 then
        fail(self, "general.alignment is %s, expected a positive integer",
            tostring(self.alignment))
    end

    self.tensors, self.tensor_names = {}, {}
    local infos = {}
    for i = 1, n_tensors do
        local name = read_string(self, "tensor name")
        local n_dims = read_u32(self, "n_dims of " .. name)
        if n_dims < 1 or n_dims > 4 then
            fail(self, "tensor %s has %d dims, expected 1..4", name, n_dims)
        end
        local ne, count = {}, 1
        for d = 1, n_dims do
            ne[d] = read_u64(self, "dims of " .. name)
            count = count * ne[d]
        end
        local ty = read_u32(self, "type of " .. name)
        local rel = read_u64(self, "offset of " .. name)
        if self.tensors[name] then fail(self, "duplicate tensor %s", name) end
        local info = { name = name, ne = ne, type = ty, n_elements = count, rel = rel }
        self.tensors[name] = info
        infos[i] = info
        self.tensor_names[i] = name
    end

    local a = self.alignment
    local data_start = math.ceil(self.pos / a) * a
    for _, info in ipairs(infos) do
        if info.rel % a ~= 0 then
            fail(self, "tensor %s offset %d not aligned to %d", info.name, info.rel, a)
        end
        info.offset = data_start + info.rel
        local esize = (info.type == M.GGML_F32 and 4) or (info.type == M.GGML_F16 and 2)
        if esize then
            info.nbytes = info.n_elements * esize
            if info.offset + info.nbytes > self.size then
                fail(self, "tensor %s data [%d, %d) runs past the end of the file (%d bytes)",
                    info.name, info.offset, info.offset + info.nbytes, self.size)
            end
        end
    end
    return self
end

-- Returns the metadata value for key, or default when absent.
function Reader:get(key, default)
    local v = self.metadata[key]
    if v == nil then return default end
    return v
end

-- Returns the tensor info for name, or nil.
function Reader:info(name)
    return self.tensors[name]
end

-- Reads tensor `name` (F32 or F16) into a new `double[n_elements]` in file
-- order (ne0 fastest). Returns the array and the info table. Raises if the
-- tensor is absent or of another type. The array is owned by the caller
-- (ordinary FFI GC memory) and outlives the reader.
function Reader:tensor(name)
    local info = self.tensors[name]
    if not info then fail(self, "no tensor named %s", name) end
    if not self.data then fail(self, "reader is closed") end
    local n = info.n_elements
    local out = ffi.new("double[?]", n)
    local p = self.base + info.offset
    if info.type == M.GGML_F32 then
        local src = ffi.new("float[?]", n)
        ffi.copy(src, p, n * 4)
        for i = 0, n - 1 do out[i] = src[i] end
    elseif info.type == M.GGML_F16 then
        local src = ffi.new("uint16_t[?]", n)
        ffi.copy(src, p, n * 2)
        for i = 0, n - 1 do out[i] = f16_table[src[i]] end
    else
        fail(self, "tensor %s has ggml type %d; only F32 (0) and F16 (1) are supported",
            name, info.type)
    end
    return out, info
end

-- Drops the file bytes. Tensor arrays already read stay valid.
function Reader:close()
    self.data, self.base = nil, nil
end

return M
