-- The engine's distillation loss and its gradient into the cartridge rows,
-- against the independent float64 reference (tests/reference/forward.lua):
-- the reference loss from its own forward behind the same prefix rows, its
-- gradient by central differences in double precision.

local cartridge = require("cartridge")
local helper = require("helper")
local ffi = cartridge.ffi

local ref = helper.reference()

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

-- The distillation loss of the reference model behind prefix rows.
local function ref_loss(rm, tokens, prefix, targets)
    local logits = rm:forward(tokens, { prefix = prefix, logits = "all" }).logits
    local V = rm.n_vocab
    local total = 0
    for _, e in ipairs(targets) do
        local row = logits[e[1]] -- the row before the predicted token (1-based = 0-based position)
        local lse = ref.logsumexp(row, V)
        total = total - math.exp(e[3]) * (row[e[2]] - lse)
    end
    return total / #targets
end

local function check(preset, label)
    local path = tmp .. "/" .. preset .. ".gguf"
    require("cartridge.randmodel").write({ out = path, preset = preset, dtype = "f32", seed = 9, quiet = true })
    local m = cartridge.model.load(path)
    local rm = ref.load(path)
    local p, frozen = 6, 1
    local c = cartridge.cart.new(m, p, frozen)
    c:init_random(3, 0.5)
    local tokens = { 256, 72, 101, 108, 108, 111, 44, 32, 119 }
    local targets = {}
    for pos = 1, #tokens - 1 do
        targets[#targets + 1] = { pos, tokens[pos + 1], -0.3 }
        targets[#targets + 1] = { pos, (tokens[pos + 1] + 11) % m.n_vocab, -1.7 }
    end
    -- the engine
    local tr = cartridge.trainer.new(m)
    c:zero_grad()
    local loss = tr:distill(c, { tokens }, targets, { backward = true })
    -- the reference behind the same rows (as doubles)
    local kvd = rm:kv_dim()
    local prefix = { n = p, k = {}, v = {} }
    for l = 1, m.config.n_layer do
        for which, side in ipairs({ "k", "v" }) do
            local rows = c:rows(l - 1, which - 1)
            local d = ffi.new("double[?]", p * kvd)
            for i = 0, p * kvd - 1 do d[i] = rows[i] end
            prefix[side][l] = d
        end
    end
    local want = ref_loss(rm, tokens, prefix, targets)
    print(("  %s: loss engine %.9f, reference %.9f, relative difference %.2g (tolerance 1e-5)"):format(label, loss,
        want, math.abs(loss - want) / want))
    assert.is_true(math.abs(loss - want) / want < 1e-5)
    -- gradients: central differences of the reference, every layer, K and V
    local h, worst, largest, checked = 1e-4, 0, 0, 0
    local sink_matters = false
    for l = 1, m.config.n_layer do
        for which, side in ipairs({ "k", "v" }) do
            local g = c:grad(l - 1, which - 1)
            local d = prefix[side][l]
            for _, i in ipairs({ 0, 3, kvd + 1, 2 * kvd + 5, 4 * kvd + 7, (p - 1) * kvd + kvd - 1 }) do
                local keep = d[i]
                d[i] = keep + h
                local up = ref_loss(rm, tokens, prefix, targets)
                d[i] = keep - h
                local down = ref_loss(rm, tokens, prefix, targets)
                d[i] = keep
                local fd = (up - down) / (2 * h)
                if i < frozen * kvd then
                    assert.are.equal(0, g[i]) -- the sink is frozen: no gradient...
                    if math.abs(fd) > 1e-9 then sink_matters = true end -- ...though it matters
                else
                    worst = math.max(worst, math.abs(g[i] - fd) / math.max(math.abs(fd), 1e-3))
                    largest = math.max(largest, math.abs(fd))
                    checked = checked + 1
                end
            end
        end
    end
    print(("  %s: %d row coordinates, |grad| up to %.3g, max relative difference %.2g (tolerance 1e-3)"):format(
        label, checked, largest, worst))
    assert.is_true(sink_matters)
    assert.is_true(worst < 1e-3)
    m:free()
end

describe("the distillation gradient", function()
    it("matches the float64 reference on a qwen3 model", function() check("qwen3-tiny", "qwen3") end)
    it("matches the float64 reference on a llama model", function() check("llama-tiny", "llama") end)
end)
