-- The reading task and weight training end to end: make_facts.lua,
-- pretrain.lua (tiny preset: a few steps), report.lua --qa.

local cartridge = require("cartridge")
local helper = require("helper")
local facts = require("cartridge.facts")
local json = require("cartridge.json")

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

local function run(...)
    if not helper.exists(helper.bin) then return nil end
    return helper.cartridge("run", ...)
end

describe("the reading task", function()
    it("draws the same document for a seed, with every fact's sentence in it and unambiguous people", function()
        local a, b, c = facts.document(1001, 40), facts.document(1001, 40), facts.document(1002, 40)
        assert.are.equal(a.text, b.text)
        assert.are_not.equal(a.text, c.text)
        assert.are.equal(40, #a.facts)
        assert.are.equal(40, #a.people)
        local named = {}
        for _, p in ipairs(a.people) do
            assert.is_true(facts.is_name[p], p)
            assert.is_nil(named[p], "a person has one fact")
            named[p] = true
        end
        local other = {}
        for _, p in ipairs(c.people) do other[#other + 1] = p end
        assert.are_not.same(a.people, other, "another seed draws other people in another order")
        local seen = {}
        for _, f in ipairs(a.facts) do
            assert.truthy(a.text:find(f.sentence, 1, true), f.sentence)
            assert.truthy(f.question:find(f.person, 1, true), f.question)
            assert.truthy(f.sentence:find(f.answer, 1, true), f.sentence)
            assert.is_nil(seen[f.person], "one fact per person")
            seen[f.person] = true
            local _, mentions = a.text:gsub("%f[%w]" .. f.person .. "%f[%W]", "")
            assert.are.equal(1, mentions, f.person .. " is in one sentence")
        end
        local chance = facts.chance(a)
        print(("  40 facts, %d bytes; guessing scores %.1f%%"):format(#a.text, 100 * chance))
        assert.is_true(chance > 0 and chance < 0.1)
    end)

    it("splits a document into its facts' sentences as self-study's focus seed does, and teaches bot A on them", function()
        local selfstudy = require("cartridge.selfstudy")
        local d = facts.document(1001, 40)
        local sentences = selfstudy.sentences(d.text, true)
        local of = {}
        for _, f in ipairs(d.facts) do of[f.sentence] = f end
        assert.are.equal(40, #sentences)
        for _, sentence in ipairs(sentences) do assert.truthy(of[sentence], sentence) end
        -- bot A's focus conversations: the instruction quotes one of the
        -- excerpt's sentences, the reply is that fact's question
        local T = require("cartridge.chat").templates.chatml
        local g = facts.rng(7)
        for _ = 1, 20 do
            local pieces = facts.conversation(g, d, T, { bot_a = 1, focus = 1 })
            assert.are.equal(3, #pieces)
            local quoted = pieces[2].text:match('this sentence of the information above answers: "(.-)" ')
            local f = assert(of[quoted], pieces[2].text)
            assert.truthy(pieces[1].text:find(f.sentence, 1, true), "the sentence is in the excerpt")
            assert.are.equal(f.question .. T.close, pieces[3].text)
            assert.is_true(pieces[3].supervised)
        end
    end)

    it("draws a document's facts from as many relations as asked, and refuses a bad count", function()
        for _, k in ipairs({ 1, 3, 8 }) do
            local d = facts.document(1005, 20, { relations = k })
            local rels, n = {}, 0
            for _, f in ipairs(d.facts) do
                if not rels[f.relation] then rels[f.relation], n = true, n + 1 end
            end
            assert.are.equal(k, n)
        end
        assert.are.equal(facts.document(1001, 40).text, facts.document(1001, 40, { relations = 8 }).text)
        for _, bad in ipairs({ 0, 9, 2.5, "3" }) do
            local ok, err = pcall(facts.document, 1001, 4, { relations = bad })
            assert.is_false(ok)
            assert.truthy(tostring(err):find("relations must be an integer in 1..8", 1, true), err)
        end
    end)

    it("counts a reply whose first line holds the answer as a whole word and no other value of its relation",
        function()
        assert.is_true(facts.correct("  Kristail.\nmore", "kristail"))
        assert.is_true(facts.correct("It is 5154", "5154"))
        assert.is_false(facts.correct("no\nKristail", "Kristail"))
        assert.is_false(facts.correct("", "x"))
        -- whole words only: a two-letter pet name inside another word is not it
        assert.is_false(facts.correct("Her lamp is called Lamor.", "La"))
        assert.is_true(facts.correct("Her cat is called La.", "La"))
        assert.is_false(facts.correct("She is 515", "51"))
        -- naming every value of the relation is not an answer
        assert.is_false(facts.correct("Kristail or Braneam", "Kristail", { "Braneam", "Osto" }))
        assert.is_true(facts.correct("Kristail, not far from Braneamkris", "Kristail", { "Braneam" }))
        assert.is_true(facts.correct("In Kristail.", "Kristail", { "kristail" })) -- the same value listed
        -- others come from the document: each fact's relation's other values
        local d = facts.document(1003, 12, { relations = 2 })
        local others = facts.others(d)
        for i, f in ipairs(d.facts) do
            for _, o in ipairs(others[i]) do assert.are_not.equal(f.answer:lower(), o:lower()) end
            local n = 0
            for _, g in ipairs(d.facts) do if g.relation == f.relation and g.answer ~= f.answer then n = n + 1 end end
            assert.is_true(#others[i] <= n and (n == 0 or #others[i] > 0))
        end
    end)

    it("make_facts.lua writes the document and its questions, the same bytes for a seed", function()
        local rc, out, err = run("recipes/make_facts.lua", "--seed", "1003", "--facts", "12", "--out", tmp .. "/f")
        if rc == nil then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("12 facts about 12 people", 1, true), out)
        local doc = helper.read_file(tmp .. "/f/doc.md")
        assert.are.equal(facts.document(1003, 12).text, doc)
        local d = facts.document(1003, 12)
        local others, lines = facts.others(d), {}
        for line in helper.read_file(tmp .. "/f/qa.jsonl"):gmatch("[^\n]+") do lines[#lines + 1] = json.decode(line) end
        -- phrasings 1, 2, 3 of every fact, in the document's fact order, then the reverse questions
        for j = 1, 3 do
            for i, f in ipairs(d.facts) do
                local e = lines[(j - 1) * 12 + i]
                assert.are.equal(tostring(j), e.phrasing)
                assert.are.equal(f.questions[j], e.question)
                assert.truthy(e.question:find(f.person, 1, true), e.question)
                assert.are.equal(f.answer, e.answer)
                assert.truthy(doc:find(e.answer, 1, true), e.answer)
                assert.are.same(others[i], e.others)
                assert.are.equal(f.relation, e.relation)
            end
        end
        assert.are.equal(d.facts[1].question, lines[1].question) -- bot A's form is phrasing 1
        local reverse = 0
        for k = 37, #lines do
            local e = lines[k]
            assert.are.equal("reverse", e.phrasing)
            -- the answer is the person; the question names a value that only that person has
            local f
            for _, g in ipairs(d.facts) do if g.person == e.answer then f = g end end
            assert.truthy(f, e.answer)
            assert.truthy(e.question:find(f.answer, 1, true), e.question)
            for _, g in ipairs(d.facts) do
                if g ~= f and g.relation == f.relation then assert.are_not.equal(g.answer:lower(), f.answer:lower()) end
            end
            assert.are.equal(11, #e.others)
            reverse = reverse + 1
        end
        assert.is_true(reverse >= 1)
        print(("  qa.jsonl: 3 x 12 phrasings and %d reverse questions"):format(reverse))
        rc, _, err = run("recipes/make_facts.lua", "--facts", "0", "--out", tmp .. "/g")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--facts must be in 1..160", 1, true), err)
    end)
end)

describe("pretrain.lua", function()
    it("trains a tiny model, writes a GGUF that loads, and is deterministic across a resume", function()
        local a, b = tmp .. "/a.gguf", tmp .. "/b.gguf"
        local rc, out, err = run("recipes/pretrain.lua", "--preset", "tiny", "--out", a, "--steps", "12",
            "--threads", "1", "--eval", "1")
        if rc == nil then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("step    10/12: loss", 1, true), out)
        assert.truthy(out:find("held-out (1 documents of 40 facts", 1, true), out)
        local m = cartridge.model.load(a)
        assert.are.equal("qwen3", m.config.arch)
        local tok = m:tokenizer()
        assert.are.equal("Where does", tok:decode(tok:encode("Where does")))
        assert.truthy(tok:find("<|im_end|>"))
        m:free()
        -- the same run in two parts: 6 steps with a state saved at 6, then --resume to 12
        rc, _, err = run("recipes/pretrain.lua", "--preset", "tiny", "--out", b, "--steps", "12", "--threads", "1",
            "--eval", "0", "--save-every", "6", "--stop-after", "6")
        assert.are.equal(0, rc, err)
        rc, out, err = run("recipes/pretrain.lua", "--preset", "tiny", "--out", b, "--steps", "12", "--threads", "1",
            "--eval", "0", "--resume")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("resumed from", 1, true), out)
        local same = helper.read_file(a) == helper.read_file(b)
        print(("  uninterrupted vs resumed at step 6: the GGUFs are %s"):format(same and "identical" or "different"))
        assert.is_true(same)
        -- bad flags
        rc, _, err = run("recipes/pretrain.lua")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("pass --preset reader", 1, true), err)
    end)

    it("trains on keyed lists first with --lookup-steps, the same bits across a resume", function()
        local a, b = tmp .. "/la.gguf", tmp .. "/lb.gguf"
        local flags = { "recipes/pretrain.lua", "--preset", "tiny", "--steps", "10", "--lookup-steps", "6",
            "--lookup-mix", "0.5", "--threads", "1", "--eval", "0" }
        local function with(...)
            local t = { unpack(flags) }
            for _, x in ipairs({ ... }) do t[#t + 1] = x end
            return run(unpack(t))
        end
        local rc, out, err = with("--out", a, "--save-every", "0")
        if rc == nil then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("step    10/10: loss", 1, true), out)
        rc, _, err = with("--out", b, "--save-every", "4", "--stop-after", "4")
        assert.are.equal(0, rc, err)
        rc, _, err = with("--out", b, "--resume")
        assert.are.equal(0, rc, err)
        local same = helper.read_file(a) == helper.read_file(b)
        print(("  6 lookup steps then documents with half keyed lists, resumed at step 4: the GGUFs are %s")
            :format(same and "identical" or "different"))
        assert.is_true(same)
    end)

    it("runs a preset's second stage as --from would, and keeps only the final GGUF", function()
        local staged, s1, manual = tmp .. "/staged.gguf", tmp .. "/s1.gguf", tmp .. "/manual.gguf"
        local rc, out, err = run("recipes/pretrain.lua", "--preset", "tiny-staged", "--out", staged, "--threads", "1",
            "--eval", "0")
        if rc == nil then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("stage 2: 3 steps from", 1, true), out)
        assert.is_false(helper.exists(tmp .. "/staged.stage1.gguf"))
        -- the same two stages by hand
        rc, _, err = run("recipes/pretrain.lua", "--preset", "tiny", "--steps", "4", "--bot-a-mix", "0.5",
            "--focus-mix", "0.5", "--out", s1, "--threads", "1", "--eval", "0")
        assert.are.equal(0, rc, err)
        rc, _, err = run("recipes/pretrain.lua", "--from", s1, "--out", manual, "--steps", "3", "--batch", "2",
            "--lr", "0.003", "--warmup", "2", "--bot-a-mix", "0.7", "--focus-mix", "1", "--min-facts", "8",
            "--curriculum", "0", "--lookup-mix", "0", "--threads", "1", "--eval", "0")
        assert.are.equal(0, rc, err)
        local same = helper.read_file(staged) == helper.read_file(manual)
        print(("  --preset tiny-staged vs its two stages by hand: the GGUFs are %s"):format(same and "identical"
            or "different"))
        assert.is_true(same)
    end)

    it("trains the same bits at every ISA level this CPU has, and with 1 or 2 threads", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local outs, levels = {}, {}
        for isa = 0, cartridge.C.CART_ISA_COUNT - 1 do
            if cartridge.C.cart_isa_supported(isa) ~= 0 then
                local name = cartridge.ffi.string(cartridge.C.cart_isa_name(isa))
                local path = tmp .. "/isa-" .. name .. ".gguf"
                local threads = #outs % 2 + 1 -- 1, 2, 1, ...
                local rc, _, err = helper.run("CART_ISA=" .. name .. " " .. helper.q(helper.bin) .. " run recipes/pretrain.lua "
                    .. "--preset tiny --steps 6 --threads " .. threads .. " --eval 0 --save-every 0 --out " .. helper.q(path))
                assert.are.equal(0, rc, err)
                outs[#outs + 1], levels[#levels + 1] = helper.read_file(path), ("%s (%d thread%s)"):format(name,
                    threads, threads == 1 and "" or "s")
            end
        end
        for i = 2, #outs do assert.are.equal(outs[1], outs[i], levels[i] .. " trains other bits than " .. levels[1]) end
        print(("  6 steps at %s: identical GGUFs"):format(table.concat(levels, ", ")))
        assert.is_true(#outs >= 2)
    end)

    it("report.lua --qa scores bare, cartridge and ICL answers as N/M", function()
        -- the committed reader: it reads every answer of a held-out document in
        -- context and knows none of them bare or behind an unrelated cartridge
        local model = helper.root .. "/models/reader.gguf"
        if not helper.exists(model) then return pending("models/reader.gguf is not in this checkout") end
        local rc, _, err = run("recipes/make_facts.lua", "--seed", "1004", "--facts", "4", "--out", tmp .. "/q")
        assert.are.equal(0, rc, err)
        local m = cartridge.model.load(model)
        local c = cartridge.cart.from_text(m, "A cartridge of a few rows.")
        c:save(tmp .. "/c.safetensors", m)
        m:free()
        local out
        rc, out, err = run("recipes/report.lua", "--model", model, "--qa", tmp .. "/q/qa.jsonl", "--corpus",
            tmp .. "/q/doc.md", "--load", tmp .. "/c.safetensors", "--threads", "1", "--phrasing", "first")
        assert.are.equal(0, rc, err)
        print(out)
        local want = { ["bare model"] = "0/4", ["cartridge c.safetensors"] = "0/4", ["ICL (corpus in context)"] = "4/4" }
        for arm, count in pairs(want) do
            local line = out:match("\n(" .. arm:gsub("%p", "%%%0") .. "[^\n]*)")
            assert.truthy(line, arm .. " missing from:\n" .. out)
            assert.are.equal(count, line:match("(%d+/%d+)%s+%d+%%%s*$"), line)
        end
        -- by default every phrasing set has its own column: first, held-out (8 questions), reverse
        rc, out, err = run("recipes/report.lua", "--model", model, "--qa", tmp .. "/q/qa.jsonl", "--threads", "1")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("first%s+held%-out%s+reverse"), out)
        assert.truthy(out:match("\nbare model[^\n]* 0/4 [^\n]* 0/8 "), out)
        rc, _, err = run("recipes/report.lua", "--model", model, "--qa", tmp .. "/q/qa.jsonl", "--phrasing", "4")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--phrasing 4 is not a phrasing set", 1, true), err)
        helper.write_file(tmp .. "/bad.jsonl", '{"question":"x"}\n')
        rc, _, err = run("recipes/report.lua", "--model", model, "--qa", tmp .. "/bad.jsonl")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("line 1 is not", 1, true), err)
    end)
end)

describe("models/reader.gguf (committed, made by pretrain.lua --preset reader)", function()
    -- spec documents (seeds 3001 and up): neither the tuning documents
    -- (1001-1010) nor the report documents (2001-2020) of eval_facts.lua
    local protocol = require("cartridge.protocol")

    it("answers held-out documents from its context in every phrasing, and not without them", function()
        local path = helper.root .. "/models/reader.gguf"
        if not helper.exists(path) then return pending("models/reader.gguf is not in this checkout") end
        local m = cartridge.model.load(path)
        local got = { first = { 0, 0 }, ["held-out"] = { 0, 0 }, reverse = { 0, 0 } }
        local bare, chance = 0, 0
        for seed = protocol.SPEC.first, protocol.SPEC.first + 1 do
            local d = facts.document(seed, 40)
            local system = "\n\n# Document: heldout/doc" .. seed .. ".md\n\n" .. d.text
            local qa = facts.questions(d)
            for set, n in pairs(got) do
                local list = facts.select(qa, set)
                n[1], n[2] = n[1] + facts.accuracy(m, list, { system = system, max_a = 16 }), n[2] + #list
            end
            bare = bare + facts.accuracy(m, facts.select(qa, "first"), { max_a = 16 })
            chance = chance + facts.chance(d) * #d.facts
        end
        m:free()
        local n = got.first[2]
        print(("  two held-out 40-fact documents with the document: first phrasing %d/%d (goal >= 95%%), held-out "
            .. "phrasings %d/%d (goal >= 90%%), reverse %d/%d (no goal); bare %d/%d (chance %.1f%%, allowed up to "
            .. "twice that)"):format(got.first[1], n, got["held-out"][1], got["held-out"][2], got.reverse[1],
            got.reverse[2], bare, n, 100 * chance / n))
        assert.is_true(got.first[1] >= 0.95 * n)
        assert.is_true(got["held-out"][1] >= 0.9 * got["held-out"][2])
        assert.is_true(bare <= 2 * chance, ("bare: %d/%d against chance %.1f"):format(bare, n, chance))
    end)

    it("carries a held-out document into a cartridge of tokens / 8 rows in 400 conversations (>= 90% of ICL)", function()
        local path = helper.root .. "/models/reader.gguf"
        if not helper.exists(path) then return pending("models/reader.gguf is not in this checkout") end
        -- a path relative to the checkout: the corpus names its file in every chunk
        local dir = "out/spec-reader-goal"
        local rc, _, err = run("recipes/make_facts.lua", "--seed", tostring(protocol.SPEC.first), "--facts", "40",
            "--out", dir)
        if rc == nil then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        -- bot A with the focus instruction asks the document's own questions (the first phrasing)
        local m = cartridge.model.load(path)
        local qa = facts.select(facts.read_qa(dir .. "/qa.jsonl"), "first")
        local tok = m:tokenizer()
        local corpus = require("cartridge.corpus").load({ dir .. "/doc.md" }, tok)
        local cov = facts.bot_coverage(m, qa, { corpus = corpus, seeds = "focus", groups = 2 })
        local _, all = require("cartridge.selfstudy").init_ids(tok, require("cartridge.chat").for_model(m),
            corpus.text, 16)
        m:free()
        print(("  focus questions: %d of %d exactly the document's, over %d distinct facts; bot B right on %d")
            :format(cov.valid, cov.n, cov.distinct, cov.right))
        assert.is_true(cov.valid >= 0.9 * cov.n and cov.distinct >= 20 and cov.right >= 0.9 * cov.valid)
        local args = protocol.selfstudy_args(path, dir .. "/doc.md", corpus.n_tokens, protocol.p_of(#all))
        for _, a in ipairs({ "--qa", dir .. "/qa.jsonl", "--save", dir .. "/c.safetensors" }) do args[#args + 1] = a end
        local out
        rc, out, err = run("recipes/selfstudy.lua", unpack(args))
        assert.are.equal(0, rc, err)
        local icl, icl_held = out:match("ICL first (%d+)/40, held%-out (%d+)/80")
        local got, held = out:match("step 100 %(400 conversations%): cartridge answers first (%d+)/40, held%-out (%d+)/80")
        print(("  cartridge %s/40 against ICL %s/40 (goal >= 90%% of ICL); held-out phrasings %s/80 against ICL %s/80")
            :format(tostring(got), tostring(icl), tostring(held), tostring(icl_held)))
        got, icl = tonumber(got), tonumber(icl)
        assert.is_true(got ~= nil and icl ~= nil and got >= 0.9 * icl, out)
    end)
end)
