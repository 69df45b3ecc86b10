-- The sampler's penalties (engine/sampler.c) against a float64 reference of
-- llama.cpp's penalties sampler: repetition, frequency and presence, over a
-- window that holds the prompt too (llama.cpp's server and CLI accept every
-- prompt token before the first draw).

local cartridge = require("cartridge")
local helper = require("helper")
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

local function json_of(t) return cartridge.json.encode(t) end

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

    it("counts the prompt in the window, which slides from the prompt into the output", function()
        local values = { [3] = 3.0, [5] = 2.9, [7] = 2.8, [9] = 2.0 }
        local prompt, generated = { 3, 3, 5, 9 }, { 5, 7 }
        for n = 1, 7 do
            local p = { frequency_penalty = 0.3, presence_penalty = 0.2, repeat_penalty = 1.1, repeat_last_n = n }
            local history = {}
            for _, t in ipairs(prompt) do history[#history + 1] = t end
            for _, t in ipairs(generated) do history[#history + 1] = t end
            local ref = reference(values, history, p)
            local s = sampler.new(p)
            s:accept_prompt(prompt)
            for _, t in ipairs(generated) do s:accept(t) end
            assert.are.equal(argmax(ref), s:sample(row(values), V), "repeat_last_n " .. n)
            s:free()
        end
        -- the prompt alone decides the first draw: 3 is seen twice there
        local s = sampler.new({ presence_penalty = 0.5 })
        s:accept_prompt(prompt)
        assert.are.equal(7, s:sample(row(values), V))
        s:free()
    end)

    it("makes generate.run (the CLI's decode loop) count the prompt as llama-cli does", function()
        local model = helper.fixture("models/stories260K.gguf")
        if not model then return pending("../shared/models/stories260K.gguf absent") end
        local generate = require("cartridge.generate")
        local m = cartridge.model.load(model)
        local tok = m:tokenizer()
        -- a prompt whose own words the model would repeat next
        local prompt = tok:encode("Once upon a time, there was a little girl named Lily. Once upon a time",
            { add_special = true })
        local n, checked = 16, 0
        for _, p in ipairs({ { presence_penalty = 1 }, { repeat_penalty = 1.5 }, { frequency_penalty = 0.7,
            repeat_last_n = 8 } }) do
            local want = helper.penalized_greedy(m, prompt, p, n, true)
            local output_only = helper.penalized_greedy(m, prompt, p, n, false)
            local r = generate.run({ model = m, tokenizer = tok, prompt_ids = prompt, max_tokens = n, sampling = p })
            assert.are.same(want, r.ids)
            if table.concat(want, ",") ~= table.concat(output_only, ",") then checked = checked + 1 end
            print(("  %s: %q (counting the output only: %q)"):format(json_of(p), tok:decode(r.ids), tok:decode(output_only)))
        end
        -- the prompt changed the answer in at least two of the three, so the test tells the rules apart
        assert.is_true(checked >= 2, "the prompt changed " .. checked .. " of 3 answers")
        m:free()
    end)

    it("refuses a penalty that is not finite", function()
        assert.has_error(function() sampler.new({ frequency_penalty = 0 / 0 }) end)
        assert.has_error(function() sampler.new({ presence_penalty = math.huge }) end)
        assert.has_error(function() sampler.new({ repeat_penalty = 0 }) end)
    end)
end)

describe("sampler.logprobs", function()
    it("gives the untempered log-softmax and the likeliest ids, ties to the lower id, and refuses bad ids", function()
        local ffi = require("ffi")
        local x = ffi.new("float[6]", { 1.5, 3, -2, 3, 0, -math.huge })
        local lp, top = sampler.logprobs(x, 6, 4, 3)
        local sum = 0
        for i = 0, 5 do sum = sum + math.exp(x[i] - 3) end
        local lse = 3 + math.log(sum)
        assert.is_true(math.abs(lp - (0 - lse)) < 1e-6, lp)
        assert.are.same({ 1, 3, 0 }, { top[1].id, top[2].id, top[3].id })
        assert.is_true(math.abs(top[3].logprob - (1.5 - lse)) < 1e-6)
        assert.are.equal(-math.huge, (sampler.logprobs(x, 6, 5, 0)))
        assert.has_error(function() sampler.logprobs(x, 6, 6, 1) end, "sampler.logprobs: cart_token_logprobs: token 6, top 1 of a vocabulary of 6")
        assert.has_error(function() sampler.logprobs(x, 6, 0, -1) end)
        local bad = ffi.new("float[2]", { 0 / 0, 0 / 0 })
        assert.has_error(function() sampler.logprobs(bad, 2, 0, 1) end)
    end)
end)
