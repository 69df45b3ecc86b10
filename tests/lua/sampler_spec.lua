-- The sampler's penalties (engine/sampler.c) against a float64 reference of
-- llama.cpp's penalties sampler: repetition, frequency and presence.

local cartridge = require("cartridge")
local sampler = require("cartridge.sampler")
local ffi = require("ffi")

local V = 16

local function row(values)
    local l = ffi.new("float[?]", V)
    for i = 0, V - 1 do l[i] = values[i] or -4 end
    return l
end

-- llama.cpp: for each distinct id in the window, counted c times:
-- l = l <= 0 and l * rp or l / rp; l = l - c * freq - presence
local function reference(values, history, p)
    local out, count = {}, {}
    local window = {}
    local n = p.repeat_last_n or 64
    for i = math.max(1, #history - n + 1), #history do window[#window + 1] = history[i] end
    for _, t in ipairs(window) do count[t] = (count[t] or 0) + 1 end
    for i = 0, V - 1 do
        local l = values[i] or -4
        local c = count[i]
        if c then
            local rp = p.repeat_penalty or 1
            l = l <= 0 and l * rp or l / rp
            l = l - c * (p.frequency_penalty or 0) - (p.presence_penalty or 0)
        end
        out[i] = l
    end
    return out
end

local function pick(values, history, p)
    local s = sampler.new(p)
    for _, t in ipairs(history) do s:accept(t) end
    local id = s:sample(row(values), V)
    s:free()
    return id
end

local function argmax(t)
    local best = 0
    for i = 1, V - 1 do if t[i] > t[best] then best = i end end
    return best
end

describe("the sampler's penalties", function()
    local cases = {
        { "frequency 0.2 pushes a thrice-seen token below its rival", { [5] = 3.0, [7] = 2.5 }, { 5, 5, 5 },
            { frequency_penalty = 0.2 }, 7 },
        { "frequency 0.1 does not", { [5] = 3.0, [7] = 2.5 }, { 5, 5, 5 }, { frequency_penalty = 0.1 }, 5 },
        { "presence 0.6 counts the token once", { [5] = 3.0, [7] = 2.5 }, { 5, 5, 5 }, { presence_penalty = 0.6 }, 7 },
        { "presence 0.4 does not reach", { [5] = 3.0, [7] = 2.5 }, { 5, 5, 5 }, { presence_penalty = 0.4 }, 5 },
        { "a negative presence penalty favours a seen token", { [5] = 2.0, [7] = 2.5 }, { 5 },
            { presence_penalty = -1 }, 5 },
        { "repetition 1.3 divides a positive logit", { [5] = 3.0, [7] = 2.5 }, { 5 }, { repeat_penalty = 1.3 }, 7 },
        { "repetition 1.3 multiplies a negative one", { [5] = -1.0, [7] = -1.2 }, { 5 }, { repeat_penalty = 1.3 }, 7 },
        { "the window holds only the last repeat_last_n tokens", { [5] = 3.0, [7] = 2.5 }, { 5, 9, 9 },
            { presence_penalty = 5, repeat_last_n = 2 }, 5 },
        { "all three together", { [5] = 3.0, [7] = 2.9, [9] = 2.0 }, { 5, 7, 7, 9 },
            { repeat_penalty = 1.1, frequency_penalty = 0.3, presence_penalty = 0.2 }, 5 },
    }
    for _, case in ipairs(cases) do
        it("greedy: " .. case[1], function()
            local ref = reference(case[2], case[3], case[4])
            assert.are.equal(case[5], argmax(ref), "the reference itself")
            assert.are.equal(case[5], pick(case[2], case[3], case[4]))
        end)
    end

    it("draws from the softmax of the penalized logits", function()
        local values = { [1] = 1.0, [2] = 0.8, [3] = 0.5, [4] = 0.2 }
        local history = { 1, 1, 2, 4 }
        local p = { temperature = 1, frequency_penalty = 0.3, presence_penalty = 0.2, repeat_penalty = 1.2, seed = 7 }
        local ref = reference(values, history, p)
        local z = 0
        for i = 0, V - 1 do z = z + math.exp(ref[i]) end
        local s = sampler.new(p)
        for _, t in ipairs(history) do s:accept(t) end
        local l, n, seen = row(values), 40000, {}
        for _ = 1, n do
            local id = s:sample(l, V)
            seen[id] = (seen[id] or 0) + 1
        end
        s:free()
        local worst = 0
        for i = 0, V - 1 do
            local want = math.exp(ref[i]) / z
            worst = math.max(worst, math.abs((seen[i] or 0) / n - want))
        end
        -- a binomial frequency over 40000 draws has a standard deviation below 0.0025
        print(("  max |empirical - reference probability| %.4f (tolerance 0.01)"):format(worst))
        assert.is_true(worst < 0.01)
    end)

    it("refuses a penalty that is not finite", function()
        assert.has_error(function() sampler.new({ frequency_penalty = 0 / 0 }) end)
        assert.has_error(function() sampler.new({ presence_penalty = math.huge }) end)
        assert.has_error(function() sampler.new({ repeat_penalty = 0 }) end)
    end)
end)
