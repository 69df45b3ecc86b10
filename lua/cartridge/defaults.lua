-- cartridge.defaults: paths and settings recipes agree on.

local core = require("cartridge.core")

local defaults = {}

-- The embedded default model: generated at build time by
-- recipes/make_model.lua (preset "default"), never committed.
defaults.model = core.root .. "/models/default.gguf"

-- The model a real user points at first: Qwen3-0.6B at f16.
defaults.user_model = "models/Qwen3-0.6B-f16.gguf"

local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
end
defaults.exists = exists

-- The model a benchmark measures: `given` (its --model) when set, else the
-- random-weight model of a randmodel preset's shape and dtype (default the
-- Qwen3-0.6B shape at f16), written once to models/bench-PRESET-DTYPE.gguf
-- with seed 7 and kept for later runs. `who` names the recipe in the line
-- that says so.
function defaults.bench_model(given, who, preset, dtype)
    if given then return given end
    preset, dtype = preset or "qwen3-0.6b", dtype or "f16"
    local path = ("%s/models/bench-%s-%s.gguf"):format(core.root, preset, dtype)
    if not exists(path) then
        io.stderr:write(("%s: generating %s (once)\n"):format(who, path))
        require("cartridge.randmodel").write({ out = path, preset = preset, dtype = dtype, seed = 7 })
    end
    return path
end

-- Where a bare model name (no "/" and no ".gguf", e.g. "stories260K") is
-- looked for, in order.
function defaults.model_dirs()
    return { "models", core.root .. "/models", core.root .. "/../shared/models" }
end

-- A --model value as a path: a path is taken as given; a bare name becomes
-- the first DIR/NAME.gguf that exists, else an error listing where it looked.
function defaults.resolve_model(given)
    if given:find("/", 1, true) or given:match("%.gguf$") or exists(given) then return given end
    local tried = {}
    for _, dir in ipairs(defaults.model_dirs()) do
        local path = dir .. "/" .. given .. ".gguf"
        if exists(path) then return path end
        tried[#tried + 1] = path
    end
    error(("no model named '%s': looked for %s; pass a path to a .gguf file"):format(given,
        table.concat(tried, ", ")), 0)
end

-- The model to use: --model resolved when given; else the user's Qwen3 when
-- present, else the embedded default (with a one-line notice on stderr).
function defaults.pick_model(given)
    if given then return defaults.resolve_model(given) end
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
