-- Corpus-drafted speculative decoding gives exactly the plain greedy output.

local cartridge = require("cartridge")
local helper = require("helper")
local answering = require("cartridge.answering")
local speculative = require("cartridge.speculative")

local function greedy(m, prompt, n, drafter)
    local kv = m:new_kv(#prompt + n + 16, "f16")
    local ids
    if drafter then
        ids = drafter:decode(m, kv, prompt, n)
    else
        ids = {}
        local logits = m:forward(kv, prompt)
        for _ = 1, n do
            local id = m:argmax(logits)
            if m:tokenizer():is_eog(id) then break end
            ids[#ids + 1] = id
            if #ids == n then break end
            logits = m:forward(kv, { id })
        end
    end
    kv:free()
    return ids
end

describe("speculative decoding", function()
    it("reproduces plain greedy token for token, and accepts drafts from a matching reference", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local m = cartridge.model.load(path)
        local tok = m:tokenizer()
        local prompt = tok:encode("Once upon a time", { add_special = true })
        local plain = greedy(m, prompt, 120)
        -- a reference that holds the model's own continuation: drafts get accepted
        local reference = {}
        for i = 1, #prompt do reference[i] = prompt[i] end
        for i = 1, #plain do reference[#reference + 1] = plain[i] end
        local good = speculative.new(reference)
        assert.are.same(plain, greedy(m, prompt, 120, good))
        local s = good.stats
        print(("  matching reference: %d tokens in %d passes, %d/%d drafts accepted"):format(#plain, s.forwards,
            s.accepted, s.drafted))
        assert.is_true(s.accepted > 60)
        assert.is_true(s.forwards < #plain / 3)
        -- an unrelated reference: drafts get rejected, the output is still the same
        local noise = {}
        for i = 1, 400 do noise[i] = (i * 37) % 500 + 3 end
        local bad = speculative.new(noise)
        assert.are.same(plain, greedy(m, prompt, 120, bad))
        print(("  unrelated reference: %d/%d drafts accepted, %d passes"):format(bad.stats.accepted,
            bad.stats.drafted, bad.stats.forwards))
        m:free()
    end)

    it("serves the same answer behind a cartridge with and without drafting", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local m = cartridge.model.load(path)
        local ids = m:tokenizer():encode("Lily and Tom played in the park with a red ball all day", { add_special = true })
        local c = cartridge.cart.new(m, #ids, 1)
        c:capture(m, ids)
        local plain = answering.answer({ model = m, cartridge = c, question = "Lily", max_a = 60 })
        local drafter = speculative.new(plain.ids)
        local spec = answering.answer({ model = m, cartridge = c, question = "Lily", max_a = 60, speculative = drafter })
        assert.are.same(plain.ids, spec.ids)
        assert.are.equal(plain.text, spec.text)
        m:free()
    end)

    it("needs a draft reference to serve speculatively", function()
        local m = cartridge.model.load(cartridge.defaults.model)
        local tmp = helper.tmpdir()
        local ids = m:tokenizer():encode("some words for the rows", {})
        local c = cartridge.cart.new(m, #ids, 1)
        c:capture(m, ids)
        c:save(tmp .. "/c.safetensors", m)
        local ok, err = pcall(speculative.for_serving, tmp .. "/c.safetensors", nil, m)
        helper.rmdir(tmp)
        assert.is_false(ok)
        assert.truthy(err:find("MissingDraftReference", 1, true), err)
        m:free()
    end)
end)
