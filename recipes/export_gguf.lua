-- export_gguf.lua: transcode a GGUF's weight matrices to f16, bf16 or f32.
--
--   cartridge run recipes/export_gguf.lua --from-gguf Qwen3-0.6B-BF16.gguf \
--       --out models/Qwen3-0.6B-f16.gguf --dtype f16
--
-- Matrices are the tensors with two or more dims whose name ends in ".weight"
-- and does not contain "norm" (token_embd and output included); norms and
-- other 1-D tensors keep their type. All metadata is copied and
-- general.file_type is set. Quantized sources are refused: converting one
-- quantization to another loses precision twice. The output is written
-- atomically, tensor by tensor.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local fmt = require("cartridge.fmt")
local ffi = cartridge.ffi
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Transcode a GGUF's weight matrices to f16, bf16 or f32.",
    flags = {
        { "from-gguf", help = "input .gguf (required)" },
        { "out", help = "output .gguf (required; must differ from the input)" },
        { "dtype", default = "f16", choices = { "f16", "bf16", "f32" }, help = "dtype of the matrices" },
    },
})
if not opts.from_gguf or not opts.out then
    error("export_gguf: --from-gguf and --out are both required (see --help)", 0)
end

if require("cartridge.fs").same_file(opts.from_gguf, opts.out) then
    error("export_gguf: --out is the input file; write to another path", 0)
end

local src = cartridge.gguf.open(opts.from_gguf)
local target = cartridge.dtype.id(opts.dtype)
local FILE_TYPE = { f32 = 0, f16 = 1, bf16 = 32 }

local function is_matrix(t)
    return #t.shape >= 2 and t.name:match("%.weight$") and not t.name:find("norm", 1, true)
end

local tensors = src:tensors()
for _, t in ipairs(tensors) do
    if is_matrix(t) and cartridge.dtype.info(t.dtype).is_quantized then
        error(("export_gguf: %s is %s-quantized; transcoding a quantized model would lose precision "
            .. "twice. Start from the f16, bf16 or f32 GGUF of the model instead."):format(t.name, t.dtype_name), 0)
    end
end

local w = cartridge.gguf.writer()
for _, kv in ipairs(src:metadata(true)) do w:set(kv.key, kv.raw) end
w:set("general.file_type", FILE_TYPE[opts.dtype], "uint32")
local changed, bytes_in, bytes_out = 0, 0, 0
for _, t in ipairs(tensors) do
    local dtype = is_matrix(t) and target or t.dtype
    w:add_tensor(t.name, dtype, t.shape, nil)
end
w:begin(opts.out)
local started = C.cart_now_seconds()
local bar = require("cartridge.progress").new(#tensors, "export_gguf")
for i, t in ipairs(tensors) do
    bytes_in = bytes_in + t.nbytes
    if is_matrix(t) and t.dtype ~= target then
        local f32 = cartridge.dtype.to_f32(t.dtype, t.data, t.numel)
        local out, size = cartridge.dtype.from_f32(target, f32, t.numel)
        w:write_tensor(t.name, out)
        bytes_out = bytes_out + size
        changed = changed + 1
    else
        w:write_tensor(t.name, t.data)
        bytes_out = bytes_out + t.nbytes
    end
    bar:update(i)
end
w:finish()
bar:finish()
print(("export_gguf: %s -> %s: %d matrices to %s, %s -> %s, %.1f s"):format(opts.from_gguf, opts.out,
    changed, opts.dtype, fmt.bytes(bytes_in), fmt.bytes(bytes_out), C.cart_now_seconds() - started))
src:close()
