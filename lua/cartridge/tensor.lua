-- cartridge.tensor: f32 tensors (up to 4-D, row-major, strided views).
--
--   local T = require("cartridge.tensor")
--   local a = T.new{2, 3}            -- zeros
--   a:set({0, 1}, 5)  ;  a:get{0, 1} -- 0-based indices, like the C API
--   local b = a:t()                  -- transposed view, shares storage
--   local c = T.matmul(a, b)         -- [2, 2]
--   a:free()                         -- optional; the GC frees it too
--
-- Memory is C memory: the Lua GC does not see its size, so free large tensors
-- explicitly when done.

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local tensor = {}

local Tensor = {}
Tensor.__index = Tensor

local function wrap(ptr)
    return setmetatable({ handle = ptr }, Tensor)
end

local function shape_array(shape)
    local n = #shape
    local arr = ffi.new("int64_t[?]", math.max(n, 4)) -- the C side rejects n > 4
    for i = 1, n do arr[i - 1] = shape[i] end
    return arr, n
end

-- A new zero-filled tensor of the given shape (a Lua list, outermost first).
function tensor.new(shape)
    local arr, n = shape_array(shape)
    return wrap(core.new("cart_tensor", C.cart_tensor_new, C.cart_tensor_free, "tensor.new", n, arr))
end

-- A new tensor holding the numbers of a flat Lua list, with the given shape.
function tensor.from_table(values, shape)
    local t = tensor.new(shape or { #values })
    if t:numel() ~= #values then
        error(("tensor.from_table: %d values for a shape of %d elements"):format(#values, t:numel()), 0)
    end
    local p = t.handle.data
    for i = 1, #values do p[i - 1] = values[i] end
    return t
end

function Tensor:free()
    core.free(self, C.cart_tensor_free)
end

function Tensor:ndim() return self.handle.ndim end
function Tensor:numel() return tonumber(C.cart_tensor_numel(self.handle)) end
function Tensor:is_contiguous() return C.cart_tensor_is_contiguous(self.handle) ~= 0 end
function Tensor:data() return self.handle.data end

function Tensor:shape()
    local s = {}
    for i = 0, self.handle.ndim - 1 do s[i + 1] = tonumber(self.handle.shape[i]) end
    return s
end

function Tensor:stride()
    local s = {}
    for i = 0, self.handle.ndim - 1 do s[i + 1] = tonumber(self.handle.stride[i]) end
    return s
end

local index_buf = ffi.new("int64_t[4]") -- get/set read the first ndim (<= 4) entries
local value_buf = ffi.new("float[1]")

function Tensor:get(index)
    for i = 1, 4 do index_buf[i - 1] = index[i] or 0 end
    core.check(C.cart_tensor_get(value_buf, self.handle, index_buf), "tensor:get")
    return value_buf[0]
end

function Tensor:set(index, value)
    for i = 1, 4 do index_buf[i - 1] = index[i] or 0 end
    core.check(C.cart_tensor_set(self.handle, index_buf, value), "tensor:set")
end

local function view(what, fn, ...)
    return wrap(core.new("cart_tensor", fn, C.cart_tensor_free, what, ...))
end

function Tensor:narrow(dim, start, length)
    return view("tensor:narrow", C.cart_tensor_narrow, self.handle, dim, start, length)
end

function Tensor:select(dim, index)
    return view("tensor:select", C.cart_tensor_select, self.handle, dim, index)
end

function Tensor:transpose(d0, d1)
    return view("tensor:transpose", C.cart_tensor_transpose, self.handle, d0, d1)
end

-- The transpose of a 2-D tensor.
function Tensor:t()
    return self:transpose(0, 1)
end

function Tensor:reshape(shape)
    local arr, n = shape_array(shape)
    return view("tensor:reshape", C.cart_tensor_reshape, self.handle, n, arr)
end

function Tensor:clone()
    return view("tensor:clone", C.cart_tensor_clone, self.handle)
end

function Tensor:copy_(src)
    core.check(C.cart_tensor_copy(self.handle, src.handle), "tensor:copy_")
    return self
end

function Tensor:fill_(value)
    C.cart_tensor_fill(self.handle, value)
    return self
end

-- The elements as a flat Lua list in row-major order.
function Tensor:totable()
    local c = self:is_contiguous() and self or self:clone()
    local out, p = {}, c.handle.data
    for i = 0, c:numel() - 1 do out[i + 1] = p[i] end
    return out
end

-- Largest |self - other|.
function Tensor:max_abs_diff(other)
    local out = ffi.new("double[1]")
    core.check(C.cart_tensor_max_abs_diff(out, self.handle, other.handle), "tensor:max_abs_diff")
    return out[0]
end

Tensor.__tostring = function(self)
    if self.handle == nil then return "tensor(freed)" end
    local s = self:shape()
    local parts = {}
    for i, d in ipairs(s) do parts[i] = tostring(d) end
    return ("tensor[%s]"):format(table.concat(parts, ", "))
end

-- a @ b for 2-D tensors, into a new tensor (or into `out` when given).
function tensor.matmul(a, b, out)
    local m, n = a:shape()[1], b:shape()[2]
    out = out or tensor.new({ m, n })
    core.check(C.cart_tensor_matmul(out.handle, a.handle, b.handle, 1.0, 0.0), "tensor.matmul")
    return out
end

tensor.Tensor = Tensor
return tensor
