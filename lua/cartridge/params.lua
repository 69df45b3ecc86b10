-- cartridge.params: a model's weights as trainable tensors (engine/params.h).
--
--   local m = cartridge.model.load("model.gguf", { widen = true })  -- writable f32 weights
--   local p = cartridge.params.new(m)                     -- every tensor
--   local q = cartridge.params.new(m, { "blk.*.attn_q.weight", "*norm*" })  -- chosen ones
--   trainer:set_params(p)                                 -- backward passes add their gradients
--   p:zero_grad(); ... ; p:clip(1.0)                       -- global L2 clipping, returns the norm
--   local opt = cartridge.adam.new(p, { lr = 3e-3, weight_decay = 0.1, decoupled = true })
--   opt:step()                                            -- AdamW; norms are not decayed
--   p:save_state(path, opt, extra)  p:load_state(path, opt) -- weights + moments, atomic
--   p:write_gguf("out.gguf", "f16", "name")               -- the trained model, atomic

local core = require("cartridge.core")
local safetensors = require("cartridge.safetensors")
local ffi = core.ffi
local C = core.C

local params = {}

local Params = {}
Params.__index = Params

function params.new(m, patterns)
    patterns = patterns or {}
    local arr = ffi.new("const char *[?]", math.max(#patterns, 1))
    for i, s in ipairs(patterns) do arr[i - 1] = s end
    local self = setmetatable({ model = m, keep = patterns }, Params)
    self.handle = core.new("cart_params", C.cart_params_new, C.cart_params_free, "params.new", m.handle, arr, #patterns)
    self.names = {}
    for i = 0, self:count() - 1 do self.names[i + 1] = ffi.string(C.cart_params_name(self.handle, i)) end
    return self
end

function Params:free() core.free(self, C.cart_params_free) end
function Params:count() return C.cart_params_count(self.handle) end
function Params:total() return tonumber(C.cart_params_total(self.handle)) end
function Params:zero_grad() C.cart_params_zero_grad(self.handle) end
function Params:grad_norm() return C.cart_params_grad_norm(self.handle) end
function Params:data(i) return C.cart_params_data(self.handle, i), tonumber(C.cart_params_numel(self.handle, i)) end
function Params:grad(i) return C.cart_params_grad(self.handle, i), tonumber(C.cart_params_numel(self.handle, i)) end

-- Scales the gradients so that their global L2 norm is at most max_norm (as
-- torch.nn.utils.clip_grad_norm_: coefficient max / (norm + 1e-6) when
-- below 1). Returns the norm before clipping.
function Params:clip(max_norm)
    local norm = self:grad_norm()
    local coef = max_norm / (norm + 1e-6)
    if coef < 1 then C.cart_params_scale_grad(self.handle, coef) end
    return norm
end

-- A clear error naming the tensor when a value (or a gradient) is not finite.
function Params:check_finite(grads)
    core.check(C.cart_params_check_finite(self.handle, grads and 1 or 0), "params")
end

-- what cartridge.adam asks of what it optimizes
function Params:optimizer_size() return self:total() end
function Params:adam_step(opt) return C.cart_params_adam_step(self.handle, opt) end

-- Writes the model with its current weights as a GGUF ("f32" or "f16"
-- matrices), atomically.
function Params:write_gguf(path, dtype, name)
    local id = (dtype or "f32") == "f16" and C.CART_F16 or C.CART_F32
    if dtype and dtype ~= "f16" and dtype ~= "f32" then
        error("params:write_gguf: matrices are written as f32 or f16, not " .. tostring(dtype), 0)
    end
    core.check(C.cart_model_write_gguf(self.model.handle, path, id, name), "params:write_gguf " .. path)
end

-- The training state in one safetensors file, written atomically: every
-- tensor's values under its GGUF name, the optimizer's moments ("adam.m",
-- "adam.v") and step count, and `meta` (a string map) for the caller.
function Params:save_state(path, opt, meta)
    local tensors = {}
    for i, name in ipairs(self.names) do
        local data, n = self:data(i - 1)
        tensors[#tensors + 1] = { name = name, dtype = "F32", shape = { n }, data = data }
    end
    local meta_all = {}
    for k, v in pairs(meta or {}) do meta_all[k] = tostring(v) end
    if opt then
        local n = tonumber(C.cart_adam_size(opt.handle))
        tensors[#tensors + 1] = { name = "adam.m", dtype = "F32", shape = { n }, data = C.cart_adam_moment(opt.handle, 0) }
        tensors[#tensors + 1] = { name = "adam.v", dtype = "F32", shape = { n }, data = C.cart_adam_moment(opt.handle, 1) }
        meta_all["adam.steps"] = tostring(opt:steps())
    end
    safetensors.write(path, tensors, meta_all, { checksum = true })
end

-- Restores what save_state wrote; refuses a file of other tensors or sizes.
-- Returns its metadata.
function Params:load_state(path, opt)
    local f = safetensors.open(path)
    local ok, why = pcall(f.verify, f)
    if not ok then error("params:load_state: " .. why, 0) end
    local function want(name, n)
        local t = f:tensor(name)
        if not t or t.dtype_name ~= "F32" or #t.shape ~= 1 or t.shape[1] ~= n then
            error(("params:load_state: %s: tensor '%s' must be F32 [%d]: the state is of another model or "
                .. "another choice of tensors"):format(path, name, n), 0)
        end
        return t
    end
    for i, name in ipairs(self.names) do
        local data, n = self:data(i - 1)
        ffi.copy(data, want(name, n).data, n * 4)
    end
    if opt then
        local n = tonumber(C.cart_adam_size(opt.handle))
        ffi.copy(C.cart_adam_moment(opt.handle, 0), want("adam.m", n).data, n * 4)
        ffi.copy(C.cart_adam_moment(opt.handle, 1), want("adam.v", n).data, n * 4)
        core.check(C.cart_adam_set_steps(opt.handle, tonumber(f.metadata["adam.steps"] or "0")), "params:load_state")
    end
    local meta = f.metadata
    f:close()
    return meta
end

return params
