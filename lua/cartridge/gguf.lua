-- cartridge.gguf: reading and writing GGUF files from Lua.
--
--   local g = gguf.open("model.gguf")        -- raises with the engine's message
--   g:get("llama.block_count")               -- 5 (nil when absent)
--   for _, kv in ipairs(g:metadata()) do print(kv.key, kv.type, kv.value) end
--   for _, t in ipairs(g:tensors()) do print(t.name, t.dtype_name, t.shape[1]) end
--   g:close()                                -- or leave it to the GC
--
-- Shapes are given both ways: `shape` row-major (outermost first, as PyTorch
-- and safetensors write them) and `ne` in GGML order (ne[1] = row length).
--
--   local w = gguf.writer()
--   w:set("general.architecture", "llama")              -- Lua types map to GGUF types
--   w:set("llama.block_count", 5, "uint32")             -- or name the type
--   w:add_tensor("x.weight", "f32", {4, 8}, ptr)        -- row-major shape, borrowed data
--   w:write("out.gguf")

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local gguf = {}

-- The value types, by their names in the GGUF spec, as engine/gguf.h numbers them.
local TYPE = {}
for _, name in ipairs({ "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
    "uint64", "int64", "float64" }) do
    TYPE[name] = tonumber(C["CART_GGUF_" .. name:upper()])
end
gguf.TYPE = TYPE
local T_STRING, T_ARRAY, T_BOOL = TYPE.string, TYPE.array, TYPE.bool

local TYPE_NAME = {}
for name, id in pairs(TYPE) do TYPE_NAME[id] = name end
gguf.TYPE_NAME = TYPE_NAME

local ELEM_CTYPE = {
    [TYPE.uint8] = "const uint8_t *", [TYPE.int8] = "const int8_t *", [TYPE.uint16] = "const uint16_t *",
    [TYPE.int16] = "const int16_t *", [TYPE.uint32] = "const uint32_t *", [TYPE.int32] = "const int32_t *",
    [TYPE.float32] = "const float *", [TYPE.bool] = "const uint8_t *", [TYPE.uint64] = "const uint64_t *",
    [TYPE.int64] = "const int64_t *", [TYPE.float64] = "const double *",
}

local SIGNED = { [TYPE.int8] = true, [TYPE.int16] = true, [TYPE.int32] = true, [TYPE.int64] = true }
local FLOAT = { [TYPE.float32] = true, [TYPE.float64] = true }
local WIDE = { [TYPE.uint64] = true, [TYPE.int64] = true }

-- Converts a cart_gguf_value to a Lua value. Arrays become Lua tables (1-based),
-- 64-bit integers numbers when exact, else int64 cdata.
local function to_lua(v)
    local t = v.type
    if t == T_STRING then return core.str(v.as.str) end
    if t == T_BOOL then return v.as.u64 ~= 0 end
    if FLOAT[t] then return v.as.f64 end
    if SIGNED[t] then return core.int(v.as.i64) end
    if t ~= T_ARRAY then return core.int(v.as.u64) end
    local out, n, et = {}, tonumber(v.count), v.elem_type
    if et == T_STRING then
        local strs = ffi.cast("const cart_str *", v.as.array)
        for i = 0, n - 1 do out[i + 1] = core.str(strs[i]) end
    elseif et == T_ARRAY then
        local vals = ffi.cast("const cart_gguf_value *", v.as.array)
        for i = 0, n - 1 do out[i + 1] = to_lua(vals[i]) end
    else
        local p = ffi.cast(ELEM_CTYPE[et], v.as.array)
        for i = 0, n - 1 do
            local x = p[i]
            if et == T_BOOL then x = x ~= 0 elseif WIDE[et] then x = core.int(x) end
            out[i + 1] = x
        end
    end
    return out
end
gguf.to_lua = to_lua

local function type_label(v)
    if v.type == T_ARRAY then
        return ("array[%s x %d]"):format(TYPE_NAME[v.elem_type] or "?", tonumber(v.count))
    end
    return TYPE_NAME[v.type] or "?"
end

local File = {}
File.__index = File

-- Opens and parses a GGUF file; raises "gguf.open: <what is wrong>" on failure.
function gguf.open(path)
    local handle = core.new("cart_gguf", C.cart_gguf_open, C.cart_gguf_close, "gguf.open", path)
    return setmetatable({
        handle = handle,
        path = path,
        version = C.cart_gguf_version(handle),
        alignment = core.int(C.cart_gguf_alignment(handle)),
        data_offset = core.int(C.cart_gguf_data_offset(handle)),
        file_size = core.int(C.cart_gguf_file_size(handle)),
    }, File)
end

-- A File over a cart_gguf * owned by someone else (a model): it is not closed
-- by the GC, and `owner` is kept alive as long as the File is.
function gguf.borrow(handle, owner, path)
    local v = ffi.cast("cart_gguf *", handle)
    return setmetatable({
        handle = v,
        owner = owner,
        borrowed = true,
        path = path or ffi.string(C.cart_gguf_path(v)),
        version = C.cart_gguf_version(v),
        alignment = core.int(C.cart_gguf_alignment(v)),
        data_offset = core.int(C.cart_gguf_data_offset(v)),
        file_size = core.int(C.cart_gguf_file_size(v)),
    }, File)
end

-- Releases the mapping now (tensor data pointers die with it). A borrowed
-- File only forgets its handle.
function File:close()
    if self.borrowed then
        self.handle = nil
        return
    end
    core.free(self, C.cart_gguf_close)
end

local function live(self)
    if self.handle == nil then error("gguf: " .. self.path .. " is closed", 0) end
    return self.handle
end

-- The value of `key` as a Lua value, or nil when absent.
function File:get(key)
    local v = C.cart_gguf_find(live(self), key)
    if v == nil then return nil end
    return to_lua(v)
end

-- The raw cart_gguf_value of `key` (for copying into a writer), or nil.
function File:raw(key)
    local v = C.cart_gguf_find(live(self), key)
    if v == nil then return nil end
    return v
end

-- Every metadata entry in file order: { key, type (label), count, value }.
-- Pass lazy = true to skip converting values (value is then nil).
function File:metadata(lazy)
    local h, out = live(self), {}
    for i = 0, tonumber(C.cart_gguf_kv_count(h)) - 1 do
        local kv = C.cart_gguf_kv_at(h, i)
        local entry = {
            key = core.str(kv.key),
            type = type_label(kv.value),
            count = tonumber(kv.value.count),
            raw = kv.value,
        }
        if not lazy then entry.value = to_lua(kv.value) end -- (false is a value too)
        out[#out + 1] = entry
    end
    return out
end

local function tensor_entry(info)
    local n = info.n_dims
    local ne, shape = {}, {}
    local numel = 1
    for i = 0, n - 1 do
        ne[i + 1] = core.int(info.ne[i])
        shape[n - i] = ne[i + 1]
        numel = numel * tonumber(info.ne[i])
    end
    local dtype = info.dtype
    return {
        name = core.str(info.name),
        dtype = dtype,
        dtype_name = C.cart_dtype_name(dtype) ~= nil and ffi.string(C.cart_dtype_name(dtype))
            or ("type" .. dtype),
        ne = ne,
        shape = shape,
        numel = numel,
        offset = core.int(info.offset),
        nbytes = core.int(info.nbytes),
        data = info.data,
    }
end

-- Every tensor in file order: { name, dtype, dtype_name, shape, ne, numel, offset, nbytes, data }.
function File:tensors()
    local h, out = live(self), {}
    for i = 0, tonumber(C.cart_gguf_tensor_count(h)) - 1 do
        out[#out + 1] = tensor_entry(C.cart_gguf_tensor_at(h, i))
    end
    return out
end

-- One tensor by name, or nil.
function File:tensor(name)
    local info = C.cart_gguf_find_tensor(live(self), name)
    if info == nil then return nil end
    return tensor_entry(info)
end

-- ---------------------------------------------------------------------------
-- Writer

local Writer = {}
Writer.__index = Writer

function gguf.writer()
    return setmetatable({ handle = core.new("cart_gguf_writer", C.cart_gguf_writer_new, C.cart_gguf_writer_free, "gguf.writer"), keep = {} }, Writer)
end

local function guess_type(value)
    local t = type(value)
    if t == "string" then return "string" end
    if t == "boolean" then return "bool" end
    if t == "number" then
        if value == math.floor(value) and value >= -2147483648 and value <= 2147483647 then
            return "int32"
        end
        return "float32"
    end
    if t == "table" then return "array" end
    error("gguf writer: cannot store a " .. t, 0)
end

-- Builds a cart_gguf_value (and the buffers it points to, anchored in `keep`).
local function to_value(value, gtype, elem_type, keep)
    local v = ffi.new("cart_gguf_value")
    keep[#keep + 1] = v
    gtype = gtype or guess_type(value)
    local id = TYPE[gtype]
    if not id then error("gguf writer: unknown value type '" .. tostring(gtype) .. "'", 0) end
    v.type, v.elem_type, v.count = id, -1, 1
    if id == T_STRING then
        local s = tostring(value)
        keep[#keep + 1] = s
        v.as.str.data, v.as.str.len = s, #s
    elseif id == T_BOOL then
        v.as.u64 = value and 1 or 0
    elseif FLOAT[id] then
        v.as.f64 = value
    elseif SIGNED[id] then
        v.as.i64 = value
    elseif id ~= T_ARRAY then
        v.as.u64 = value
    else
        local n = #value
        local et = elem_type or (n > 0 and guess_type(value[1])) or "int32"
        local eid = TYPE[et]
        if not eid then error("gguf writer: unknown element type '" .. tostring(et) .. "'", 0) end
        v.elem_type, v.count = eid, n
        if eid == T_STRING then
            local strs = ffi.new("cart_str[?]", math.max(n, 1))
            for i = 1, n do
                local s = tostring(value[i])
                keep[#keep + 1] = s
                strs[i - 1].data, strs[i - 1].len = s, #s
            end
            keep[#keep + 1] = strs
            v.as.array = strs
        elseif eid == T_ARRAY then
            local vals = ffi.new("cart_gguf_value[?]", math.max(n, 1))
            for i = 1, n do vals[i - 1] = to_value(value[i], "array", nil, keep) end
            keep[#keep + 1] = vals
            v.as.array = vals
        else
            local ctype = ELEM_CTYPE[eid]:gsub("^const ", ""):gsub(" %*$", "")
            local buf = ffi.new(ctype .. "[?]", math.max(n, 1))
            for i = 1, n do
                local x = value[i]
                if eid == T_BOOL then x = x and 1 or 0 end
                buf[i - 1] = x
            end
            keep[#keep + 1] = buf
            v.as.array = buf
        end
    end
    return v
end

-- Sets metadata `key`. gtype names the GGUF type ("uint32", "float32", "string",
-- "array", ...); when omitted it is guessed (integers int32, other numbers
-- float32, tables arrays). For arrays, elem_type names the element type. A
-- cart_gguf_value cdata (from File:raw) is copied as is.
function Writer:set(key, value, gtype, elem_type)
    local v
    if type(value) == "cdata" and ffi.istype("cart_gguf_value", value) then
        v = value
    else
        v = to_value(value, gtype, elem_type, {})
    end
    core.check(C.cart_gguf_writer_set(self.handle, key, v), "gguf writer: " .. key)
end

function Writer:remove(key)
    C.cart_gguf_writer_remove(self.handle, key)
end

-- Declares a tensor. `shape` is row-major (outermost first); data is a pointer
-- (cdata) that must stay alive until write, or nil to stream it later with
-- write_tensor.
function Writer:add_tensor(name, dtype, shape, data)
    local id = type(dtype) == "number" and dtype or C.cart_dtype_from_name(dtype)
    if id < 0 then error("gguf writer: tensor " .. name .. ": unknown dtype " .. tostring(dtype), 0) end
    local n = #shape
    local ne = ffi.new("int64_t[4]", 1, 1, 1, 1)
    for i = 1, n do ne[i - 1] = shape[n - i + 1] end
    if data ~= nil then self.keep[#self.keep + 1] = data end
    core.check(C.cart_gguf_writer_add_tensor(self.handle, name, id, n, ne, data),
        "gguf writer: tensor " .. name)
end

-- Writes the file atomically.
function Writer:write(path)
    core.check(C.cart_gguf_writer_write(self.handle, path), "gguf writer")
    self.keep = {}
end

-- Streaming: begin(path), write_tensor(name, data) in declaration order, finish().
function Writer:begin(path)
    core.check(C.cart_gguf_writer_begin(self.handle, path), "gguf writer")
end

function Writer:write_tensor(name, data)
    core.check(C.cart_gguf_writer_write_tensor(self.handle, name, data), "gguf writer: " .. name)
end

function Writer:finish()
    core.check(C.cart_gguf_writer_finish(self.handle), "gguf writer")
    self.keep = {}
end

function Writer:free()
    core.free(self, C.cart_gguf_writer_free)
end

return gguf
