-- export_cartridge.lua: this engine's cartridge as a .pt the reference
-- PyTorch code loads (TrainableCache.from_pretrained), or as a Tokasaurus
-- cartridge folder (cartridges/<id>/cartridge.pt and config.yaml).
--
--   cartridge run recipes/export_cartridge.lua out/c.safetensors --model M --format reference --out c.pt
--   cartridge run recipes/export_cartridge.lua out/c.safetensors --model M --format tokasaurus --out cartridges
--
-- The reference format's lists are plain lists of tensors, which
-- torch.load(path, weights_only=True) also reads. docs/interop.md gives
-- both layouts.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local torchpt = require("cartridge.torchpt")
local fs = require("cartridge.fs")
local fmt = require("cartridge.fmt")

local opts = options.parse(arg, {
    summary = "Export a cartridge as the reference trainer's .pt or as a Tokasaurus cartridge folder.",
    positional = { { "cartridge", required = true, help = "the .safetensors artifact" } },
    flags = {
        { "model", help = "GGUF model of the cartridge (default: " .. defaults.user_model
            .. ", else the embedded demo model)" },
        { "format", default = "reference", help = "reference (one .pt file) or tokasaurus (a folder per cartridge)" },
        { "out", help = "reference: the .pt file; tokasaurus: the folder of cartridges (./cartridges there); required" },
        { "id", help = "tokasaurus: the cartridge id (default: the artifact's file name without .safetensors)" },
        { "dtype", default = "bf16", help = "the tensors' dtype: bf16 (the trainer's), f16 or f32 (lossless)" },
        require("cartridge.cart").FOREIGN_FLAG,
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge
if not opts.out then error("export_cartridge: --out is required (see --help)", 0) end
if opts.format ~= "reference" and opts.format ~= "tokasaurus" then
    error(("export_cartridge: --format must be reference or tokasaurus, not '%s'"):format(opts.format), 0)
end
if opts.dtype ~= "bf16" and opts.dtype ~= "f16" and opts.dtype ~= "f32" then
    error(("export_cartridge: --dtype must be bf16, f16 or f32, not '%s'"):format(opts.dtype), 0)
end

local m = cartridge.model.load(defaults.pick_model(opts.model))
local c = cartridge.cart.load(opts.cartridge, m)
local written
if opts.format == "reference" then
    fs.check_output(opts.out)
    written = torchpt.write_reference(c, m, opts.out, { dtype = opts.dtype })
else
    local id = opts.id or (opts.cartridge:match("([^/]+)$"):gsub("%.safetensors$", ""))
    written = torchpt.write_tokasaurus(c, m, opts.out, id, { dtype = opts.dtype }) .. "/cartridge.pt"
end
local _, size = fs.kind(written)
print(("wrote %s: %d layers, %d frozen + %d trainable rows, %s, %s"):format(written, c.n_layer, c.frozen,
    c.p - c.frozen, opts.dtype, fmt.bytes(size or 0)))
if opts.format == "tokasaurus" then
    print(("Tokasaurus serves it with \"cartridges\": [{\"id\": \"%s\", \"source\": \"local\"}] once the folder is in "
        .. "its cartridge_dir; it keeps whole KV pages only, so a p (%d) that is not a multiple of its page size "
        .. "loses its last rows there"):format(opts.id or written:match("([^/]+)/cartridge%.pt$"), c.p))
end
