-- import_cartridge.lua: a cartridge trained by the reference PyTorch code
-- (HazyResearch/cartridges: cache-step{N}.pt, cache_last.pt) or laid out for
-- Tokasaurus (a folder holding cartridge.pt), as this engine's artifact.
--
--   cartridge run recipes/import_cartridge.lua cache_last.pt --model M --out out/c.safetensors
--   cartridge run recipes/import_cartridge.lua cartridges/my-docs --model M --out out/c.safetensors
--
-- The .pt is read without running any of its code (engine/torchpt.h): a
-- file naming anything but tensors, lists, dicts and nn.ParameterList is
-- refused, naming what it asked for. The rows' geometry must match the
-- model, layer by layer. docs/interop.md says how positions and head
-- layouts carry over.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local torchpt = require("cartridge.torchpt")
local fs = require("cartridge.fs")
local fmt = require("cartridge.fmt")

local opts = options.parse(arg, {
    summary = "Import a cartridge saved by the reference PyTorch trainer or for Tokasaurus (.pt) as a .safetensors artifact.",
    positional = { { "file", required = true, help = "the .pt file, or a Tokasaurus cartridge folder holding cartridge.pt" } },
    flags = {
        { "model", help = "GGUF model the cartridge was trained for (default: " .. defaults.user_model
            .. ", else the embedded demo model)" },
        { "out", help = "the artifact to write (.safetensors; required)" },
        { "rope-shift", type = "int", default = 0,
            help = "turn the keys by this many positions (for a file trained with its queries starting elsewhere "
                .. "than after the rows; 0 for the reference trainer and Tokasaurus)" },
    },
})
if not opts.out then error("import_cartridge: --out C.safetensors is required (see --help)", 0) end
fs.check_output(opts.out)
local file = opts.file
if fs.kind(file) == "dir" then file = file .. "/cartridge.pt" end
if fs.kind(file) ~= "file" then
    error(("import_cartridge: %s is not a file (give the .pt, or a folder holding cartridge.pt)"):format(file), 0)
end

local started = os.clock()
local pt = torchpt.open(file)
local cache = torchpt.read_cache(pt)
local t0 = cache.keys[1]
print(("read %s (archive '%s'%s): %d layers, %d frozen + %d trainable rows, %s, %d KV heads x %d dims in layer 0")
    :format(file, pt.archive, cache.frozen_name and (", " .. cache.frozen_name .. "_keys") or ", no frozen rows",
        cache.n_layer, cache.frozen, cache.trainable, t0.dtype, t0.shape[2], t0.shape[4]))
local m = cartridge.model.load(defaults.pick_model(opts.model))
local c = torchpt.to_cartridge(cache, m, { rope_shift = opts.rope_shift, who = file })
pt:close()
c:save(opts.out, m, { training = { imported_from = file, rope_shift = opts.rope_shift } })
print(("wrote %s: p = %d (%d frozen), %s of f32 rows, for %s%s (%.2f s)"):format(opts.out, c.p, c.frozen,
    fmt.bytes(c:bytes()), tostring(m.file:get("general.name") or m.path),
    m.config.rope_neox and "" or " (key head dims reordered from Hugging Face's RoPE layout to GGUF's)",
    os.clock() - started))
