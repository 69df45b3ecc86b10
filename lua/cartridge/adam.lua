-- cartridge.adam: Adam over a cartridge's trainable rows (engine/adam.h has
-- the update rule: PyTorch's).
--
--   local adam = require("cartridge.adam")
--   local opt = adam.new(c, { lr = 2e-3 })
--   opt:step()                        -- uses c's gradients, then c:zero_grad() yourself
--   opt:save("opt.safetensors")       -- moments and step count
--   opt:load("opt.safetensors")

local core = require("cartridge.core")
local safetensors = require("cartridge.safetensors")
local ffi = core.ffi
local C = core.C

local adam = {}

local Adam = {}
Adam.__index = Adam

-- An optimizer over what `target` trains: a cartridge's rows, or a
-- parameter set's tensors (cartridge.params). params: lr, beta1, beta2, eps,
-- weight_decay, decoupled (true: AdamW's decay of the weights).
function adam.new(target, params)
    params = params or {}
    local p = ffi.new("cart_adam_params")
    C.cart_adam_default_params(p)
    for _, k in ipairs({ "lr", "beta1", "beta2", "eps", "weight_decay" }) do
        if params[k] ~= nil then p[k] = params[k] end
    end
    p.decoupled = params.decoupled and 1 or 0
    return setmetatable({ handle = core.new("cart_adam", C.cart_adam_new, C.cart_adam_free, "adam.new", p,
        target:optimizer_size()), cart = target }, Adam)
end

function Adam:step()
    core.check(self.cart:adam_step(self.handle), "adam:step")
end

function Adam:steps() return tonumber(C.cart_adam_steps(self.handle)) end
function Adam:set_lr(lr) C.cart_adam_set_lr(self.handle, lr) end

function Adam:free()
    core.free(self, C.cart_adam_free)
end

-- Saves the optimizer state: tensors "m" and "v" (F32 [n]) and the step
-- count in the metadata.
function Adam:save(path)
    local n = tonumber(C.cart_adam_size(self.handle))
    safetensors.write(path, {
        { name = "m", dtype = "F32", shape = { n }, data = C.cart_adam_moment(self.handle, 0) },
        { name = "v", dtype = "F32", shape = { n }, data = C.cart_adam_moment(self.handle, 1) },
    }, { ["adam.steps"] = tostring(self:steps()) }, { checksum = true })
end

-- Restores a state saved by Adam:save; refuses one of another size.
function Adam:load(path)
    local f = safetensors.open(path)
    local ok, why = pcall(f.verify, f)
    if not ok then error("adam:load: " .. why, 0) end
    local n = tonumber(C.cart_adam_size(self.handle))
    for which, name in ipairs({ "m", "v" }) do
        local t = f:tensor(name)
        if not t or t.dtype_name ~= "F32" or #t.shape ~= 1 or t.shape[1] ~= n then
            error(("adam:load: %s: tensor '%s' must be F32 [%d] (the optimizer's size)"):format(path, name, n), 0)
        end
        ffi.copy(C.cart_adam_moment(self.handle, which - 1), t.data, t.nbytes)
    end
    core.check(C.cart_adam_set_steps(self.handle, tonumber(f.metadata["adam.steps"] or "0")), "adam:load")
    f:close()
end

return adam
