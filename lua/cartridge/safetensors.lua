-- cartridge.safetensors: reading and writing .safetensors files from Lua.
--
--   local f = safetensors.open("cart.safetensors")
--   f.metadata["cartridge.p"]                  -- __metadata__ as a Lua table
--   for _, t in ipairs(f:tensors()) do print(t.name, t.dtype_name, #t.shape) end
--   local k = f:tensor("layers.0.k")           -- { name, dtype, shape, nbytes, data }
--
--   safetensors.write("out.safetensors", {
--       { name = "x", dtype = "F32", shape = { 2, 3 }, data = ptr },   -- data borrowed
--   }, { ["cartridge.p"] = "256" })
--
-- dtype accepts the safetensors spelling ("F32", "BF16", "I64") or the
-- engine's ("f32", "bf16", "i64").

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local safetensors = {}

local File = {}
File.__index = File

function safetensors.open(path)
    local handle = core.new("cart_st_file", C.cart_st_open, C.cart_st_close, "safetensors.open", path)
    local metadata, meta_order = {}, {}
    for i = 0, tonumber(C.cart_st_meta_count(handle)) - 1 do
        local m = C.cart_st_meta_at(handle, i)
        local key = core.str(m.key)
        metadata[key] = core.str(m.value)
        meta_order[#meta_order + 1] = key
    end
    return setmetatable({
        handle = handle,
        path = path,
        header_size = core.int(C.cart_st_header_size(handle)),
        metadata = metadata,
        metadata_keys = meta_order,
    }, File)
end

function File:close()
    core.free(self, C.cart_st_close)
end

local function live(self)
    if self.handle == nil then error("safetensors: " .. self.path .. " is closed", 0) end
    return self.handle
end

local function entry(t)
    local shape, numel = {}, 1
    for i = 0, t.ndim - 1 do
        shape[i + 1] = core.int(t.shape[i])
        numel = numel * tonumber(t.shape[i])
    end
    local st_name = C.cart_st_dtype_name(t.dtype)
    return {
        name = core.str(t.name),
        dtype = t.dtype,
        dtype_name = st_name ~= nil and ffi.string(st_name) or "?",
        shape = shape,
        numel = numel,
        offset = core.int(t.offset),
        nbytes = core.int(t.nbytes),
        data = t.data,
    }
end

-- Every tensor in data order.
function File:tensors()
    local h, out = live(self), {}
    for i = 0, tonumber(C.cart_st_tensor_count(h)) - 1 do
        out[#out + 1] = entry(C.cart_st_tensor_at(h, i))
    end
    return out
end

-- Verifies the checksum the file carries (cart_st_verify_checksum): true
-- when it matches, false when the file has none; raises when it differs.
function File:verify()
    local rc = C.cart_st_verify_checksum(live(self))
    if rc == C.CART_E_NOT_FOUND then return false end
    core.check(rc, "safetensors")
    return true
end

-- One tensor by name, or nil.
function File:tensor(name)
    local t = C.cart_st_find(live(self), name)
    if t == nil then return nil end
    return entry(t)
end

-- Resolves "F32" / "f32" / a cart_dtype number to a cart_dtype id.
local function dtype_id(dtype)
    if type(dtype) == "number" then return dtype end
    local id = C.cart_dtype_from_name(tostring(dtype))
    if id < 0 then error("safetensors: unknown dtype " .. tostring(dtype), 0) end
    return id
end
safetensors.dtype_id = dtype_id

-- Writes `tensors` (a list of { name, dtype, shape, data }) and an optional
-- metadata table (string -> string; keys written in sorted order) atomically
-- to `path`, after removing the temporary files dead processes left beside it.
-- opts.checksum: also store the data's checksum (File:verify checks it).
function safetensors.write(path, tensors, metadata, opts)
    local w = core.new("cart_st_writer", C.cart_st_writer_new, C.cart_st_writer_free, "safetensors.write")
    if opts and opts.checksum then C.cart_st_writer_add_checksum(w) end
    require("cartridge.fs").sweep_temps(path)
    if metadata then
        local keys = {}
        for k in pairs(metadata) do keys[#keys + 1] = k end
        table.sort(keys)
        for _, k in ipairs(keys) do
            core.check(C.cart_st_writer_set_meta(w, k, tostring(metadata[k])),
                "safetensors.write: metadata " .. k)
        end
    end
    for _, t in ipairs(tensors) do
        local n = #t.shape
        local shape = ffi.new("int64_t[?]", math.max(n, 1))
        for i = 1, n do shape[i - 1] = t.shape[i] end
        core.check(C.cart_st_writer_add(w, t.name, dtype_id(t.dtype), n, shape, t.data),
            "safetensors.write: tensor " .. tostring(t.name))
    end
    core.check(C.cart_st_writer_write(w, path), "safetensors.write")
    C.cart_st_writer_free(ffi.gc(w, nil))
end

return safetensors
