-- cartridge.defaults: paths and settings recipes agree on.

local core = require("cartridge.core")

local defaults = {}

-- The embedded default model: generated at build time by
-- recipes/make_model.lua (preset "default"), never committed.
defaults.model = core.root .. "/models/default.gguf"

-- The model a real user points at first (REFERENCE-FUCINA §2.2).
defaults.user_model = "models/Qwen3-0.6B-f16.gguf"

local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
end
defaults.exists = exists

-- The model to use when --model is not given: the user's Qwen3 when present,
-- else the embedded default (with a one-line notice on stderr).
function defaults.pick_model(given)
    if given then return given end
    if exists(defaults.user_model) then return defaults.user_model end
    if exists(defaults.model) then
        io.stderr:write(("note: %s not found; using the embedded random-weight demo model %s\n"):format(
            defaults.user_model, defaults.model))
        return defaults.model
    end
    error(("no model: pass --model, put a Qwen3 GGUF at %s, or build the embedded demo model "
        .. "(cmake --build build generates %s)"):format(defaults.user_model, defaults.model), 0)
end

return defaults
