-- Token ids and distillation targets held in C: cartridge.ids sequences, the
-- trainer's target lists, and self-study's data kept in them end to end.

local cartridge = require("cartridge")
local helper = require("helper")
local ids = require("cartridge.ids")
local trainer = require("cartridge.trainer")
local selfstudy = require("cartridge.selfstudy")
local chat = require("cartridge.chat")
local ffi = cartridge.ffi

local tmp, model_path
setup(function()
    tmp = helper.tmpdir()
    model_path = tmp .. "/q.gguf"
    require("cartridge.randmodel").write({ out = model_path, preset = "qwen3-tiny", dtype = "f32", quiet = true })
end)
teardown(function() helper.rmdir(tmp) end)

describe("cartridge.ids", function()
    it("pushes, extends, slices and truncates in C memory", function()
        local s = ids.new()
        assert.are.equal(0, #s)
        for i = 1, 1000 do s:push(i * 3) end -- grows past its first blocks
        assert.are.equal(1000, #s)
        assert.are.equal(3, s:get(0))
        assert.are.equal(3000, s:last())
        assert.are.equal(30, s.data[9])
        s:extend({ 7, 8 })
        s:extend(ids.from({ 9 }))
        s:extend(s.data, 2) -- its own first two ids, through a pointer
        assert.are.same({ 2997, 3000, 7, 8, 9, 3, 6 }, s:sub(998, 7):list())
        s:truncate(2)
        assert.are.same({ 3, 6 }, s:list())
        assert.is_true(ids.equal(s, { 3, 6 }))
        assert.is_true(ids.equal(s, ids.from({ 3, 6 })))
        assert.is_false(ids.equal(s, { 3, 6, 9 }))
        assert.has_error(function() s:get(2) end, "ids:get(2) of a sequence of 2")
        assert.has_error(function() s:sub(1, 2) end, "ids:sub(1, 2) of a sequence of 2")
        assert.has_error(function() s:truncate(3) end, "ids:truncate(3) of a sequence of 2")
        assert.has_error(function() ids.view("abc") end)
        local ptr, n = ids.view({ 4, 5 })
        assert.are.equal(2, n)
        assert.are.equal(5, ptr[1])
    end)

    it("goes through the tokenizer, the forward pass and capture as a Lua list does", function()
        local m = cartridge.model.load(model_path)
        local tok = m:tokenizer()
        local text = "Hello world, <|im_end|> and more text"
        local list = tok:encode(text, { special = true, add_special = true })
        local seq = tok:encode_ids(text, { special = true, add_special = true })
        assert.is_true(ids.equal(seq, list))
        -- appending onto a sequence continues it
        local both = tok:encode_ids(" again", { special = true }, ids.from(seq))
        assert.are.equal(#list + #tok:encode(" again", { special = true }), #both)
        assert.are.equal(tok:decode(list, { special = true }), tok:decode(seq, { special = true }))
        local function logits(x)
            local kv = m:new_kv(64, "f32")
            local out = ffi.new("float[?]", m.n_vocab)
            ffi.copy(out, m:forward(kv, x), m.n_vocab * 4)
            kv:free()
            return out
        end
        local a, b = logits(list), logits(seq)
        local worst = 0
        for i = 0, m.n_vocab - 1 do worst = math.max(worst, math.abs(a[i] - b[i])) end
        print(("  list vs ids forward: max |dlogit| %g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
        local c1, c2 = cartridge.cart.new(m, #list, 1), cartridge.cart.new(m, #list, 1)
        c1:capture(m, list)
        c2:capture(m, seq)
        assert.are.equal(0, ffi.C.memcmp(c1:rows(1, 0), c2:rows(1, 0), c1.p * c1.row * 4))
        m:free()
    end)
end)

describe("trainer target lists", function()
    it("append a row's top-k, shift when packed, and feed distill like the Lua triples", function()
        local m = cartridge.model.load(model_path)
        local V = m.n_vocab
        local logits = ffi.new("float[?]", V)
        for i = 0, V - 1 do logits[i] = math.sin(i * 0.37) * 4 end
        local tg = trainer.targets()
        local got = tg:append_topk(2, logits, V, 5, 0.99)
        assert.is_true(got >= 1 and got <= 5)
        -- the same entries as trainer.topk gives
        local want = trainer.topk(logits, V, 5, 0.99)
        assert.are.equal(#want, tg:count())
        for i, e in ipairs(want) do
            local pos, id, lp = tg:get(i - 1)
            assert.are.same({ 2, e[1], e[2] }, { pos, id, lp })
        end
        tg:push(3, 11, -0.75)
        local packed = trainer.targets()
        packed:append(tg, 0)
        packed:append(tg, 6)
        assert.are.equal(2 * tg:count(), packed:count())
        local last = packed:list()[packed:count()]
        assert.are.same({ 9, 11, -0.75 }, last)
        -- distill reads the C list and the equivalent Lua triples the same
        local c = cartridge.cart.new(m, 4, 1)
        c:init_random(3, 0.5)
        local tr = trainer.new(m)
        local segs = { ids.from({ 5, 6, 7, 8, 9, 10 }), { 5, 6, 7, 8, 9, 10 } }
        local from_c = tr:distill(c, segs, packed, { backward = false })
        local from_lua = tr:distill(c, segs, packed:list(), { backward = false })
        print(("  C list vs Lua triples: loss %.9f vs %.9f (tolerance 0)"):format(from_c, from_lua))
        assert.are.equal(from_lua, from_c)
        tg:truncate(1)
        assert.are.equal(1, tg:count())
        assert.has_error(function() tg:truncate(5) end)
        tr:free()
        m:free()
    end)
end)

describe("self-study data", function()
    it("keeps the chunk as the corpus's own ids and the targets in C, positioned on the answer", function()
        local m = cartridge.model.load(model_path)
        local tok = m:tokenizer()
        local path = tmp .. "/doc.md"
        local words = {}
        for i = 1, 400 do words[i] = ("word%d"):format(i % 37) end
        helper.write_file(path, table.concat(words, " ") .. "\n")
        local corpus = require("cartridge.corpus").load({ path }, tok)
        assert.is_true(ids.is(corpus.ids))
        local interviews = selfstudy.interviews(m, tok, corpus, { chunk_min = 32, chunk_max = 64, max_q = 6, max_a = 9,
            top_k = 4, seed = 5, template = chat.for_model(m) })
        local group = interviews:group(2)
        for _, c in ipairs(group) do
            -- the system block holds the chunk's corpus ids verbatim
            local chunk = corpus.ids:sub(c.chunk_start, c.chunk_len)
            local found = false
            for at = 0, #c.sys_ids - #chunk do
                if ffi.C.memcmp(c.sys_ids.data + at, chunk.data, #chunk * 4) == 0 then found = true break end
            end
            assert.is_true(found, "the chunk's ids are in the system block")
            assert.is_true(ids.is(c.student) and ids.is(c.prefix) and ids.is(c.answer))
            assert.are.equal(#c.prefix + #c.answer + (c.stopped and 1 or 0), #c.student)
            assert.are.equal(#c.prefix, c.first_answer)
            -- every answer token has its entries, at its own position, in order
            local n, prev = c.targets:count(), c.first_answer
            assert.is_true(n >= c.answer_len)
            local seen = {}
            for i = 0, n - 1 do
                local pos = c.targets:get(i)
                assert.is_true(pos >= prev and pos < #c.student, "position in the answer, ascending")
                seen[pos], prev = true, pos
            end
            for j = 0, c.answer_len - 1 do assert.is_true(seen[c.first_answer + j]) end
        end
        -- conversation (0, 2) made alone is the one made in the group: the same
        -- draws, ids and targets
        local alone = interviews:group({ { 0, 2 } })[1]
        assert.are.same({ 0, 2 }, { alone.step, alone.index })
        assert.are.equal(group[2].chunk_start, alone.chunk_start)
        assert.are.same(group[2].student:list(), alone.student:list())
        assert.are.same(group[2].targets:list(), alone.targets:list())
        m:free()
    end)

    it("--init spread: the sink, then rows spread evenly to the last, each the full prefill's own bits", function()
        for _, case in ipairs({ { 100, 10, 1 }, { 41, 41, 1 }, { 372, 41, 1 }, { 50, 9, 2 }, { 12, 2, 1 } }) do
            local n, p, frozen = case[1], case[2], case[3]
            local rows = selfstudy.spread_rows(n, p, frozen)
            assert.are.equal(p, #rows)
            for r = 1, frozen do assert.are.equal(r - 1, rows[r]) end
            for r = 2, p do assert.is_true(rows[r] > rows[r - 1], "increasing") end
            assert.are.equal(n - 1, rows[p])
        end
        local m = cartridge.model.load(model_path)
        local tok = m:tokenizer()
        local all = tok:encode_ids(("word%d "):rep(1):format(1) .. string.rep("and more text here ", 30),
            { add_special = true })
        local full = cartridge.cart.new(m, #all, 1)
        full:capture(m, all)
        local c = cartridge.cart.new(m, 9, 1)
        selfstudy.init_spread(m, c, all)
        local worst = 0
        for r, src in ipairs(selfstudy.spread_rows(#all, 9, 1)) do
            for l = 0, c.n_layer - 1 do
                for w = 0, 1 do
                    local a, b = c:rows(l, w), full:rows(l, w)
                    for i = 0, c.row - 1 do
                        worst = math.max(worst, math.abs(a[(r - 1) * c.row + i] - b[src * c.row + i]))
                    end
                end
            end
        end
        print(("  spread rows vs the full prefill's: max diff %g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
        c:free()
        full:free()
        m:free()
    end)

    it("splits any text into sentences that are pieces of it, whole, one line each", function()
        local r = require("cartridge.rng").new(11)
        local alphabet = { "a", "b", " ", " ", ".", "!", "?", "\n", "\t", "\xe2\x80\x9c", "\xff", "3", "W" }
        local checked = 0
        for _ = 1, 2000 do
            local parts = {}
            for i = 1, r:int(0, 60) do parts[i] = alphabet[r:below(#alphabet) + 1] end
            local text = table.concat(parts)
            for _, at_start in ipairs({ true, false }) do
                for _, sentence in ipairs(selfstudy.sentences(text, at_start)) do
                    assert.truthy(text:find(sentence, 1, true), sentence)
                    assert.falsy(sentence:find("\n"))
                    assert.truthy(sentence:match("[%.!%?]$") and sentence:match("^%S"), sentence)
                    checked = checked + 1
                end
            end
        end
        assert.is_true(checked > 100)
        assert.are.same({ "Bo lives in Ro.", "Al is 4 years old." },
            selfstudy.sentences("ends here. Bo lives in Ro. Al is 4 years old. Cut", false))
        assert.are.same({ "A b.", "Bo lives in Ro.", "Al is 4 years old." },
            selfstudy.sentences("A b. Bo lives in Ro. Al is 4 years old. Cut", true))
        assert.are.same({ "Next line here." }, selfstudy.sentences("tail of one\nNext line here. 3.5 is cut.", false))
    end)

    it("with --turns 3 and the focus seed: one student of three exchanges, each answer supervised in place", function()
        local m = cartridge.model.load(model_path)
        local tok = m:tokenizer()
        local path = tmp .. "/facts.md"
        local sentences = {}
        for i = 1, 60 do sentences[i] = ("Person%d lives in Town%d."):format(i, i * 7) end
        helper.write_file(path, "# Facts\n\n" .. table.concat(sentences, " ") .. "\n")
        local corpus = require("cartridge.corpus").load({ path }, tok)
        local T = chat.for_model(m)
        local interviews = selfstudy.interviews(m, tok, corpus, { chunk_min = 48, chunk_max = 96, max_q = 6, max_a = 9,
            top_k = 4, seed = 5, template = T, turns = 3, seeds = "focus" })
        local group = interviews:group(2)
        for _, c in ipairs(group) do
            assert.are.equal(3, #c.turns)
            assert.are.equal(3, #c.spans)
            local total = 0
            for t, turn in ipairs(c.turns) do
                -- the focus instruction quoted a complete sentence of this chunk
                assert.are.equal("focus", turn.seed_name)
                assert.truthy(turn.sentence and turn.sentence:match("^Person%d+ lives in Town%d+%.$"), turn.sentence)
                local chunk_text = tok:decode(corpus.ids:sub(c.chunk_start, c.chunk_len))
                assert.truthy(chunk_text:find(turn.sentence, 1, true))
                -- the answer sits at its span, followed by the stop token when it stopped
                local first, len = c.spans[t][1], c.spans[t][2]
                assert.are.equal(#turn.answer + (turn.stopped and 1 or 0), len)
                assert.are.same(turn.answer:list(), c.student:sub(first, #turn.answer):list())
                if turn.stopped then assert.are.equal(interviews.stop_id, c.student:get(first + #turn.answer)) end
                -- just before it: the close of user turn t and the assistant's opener
                local opener = tok:encode_ids(T.close .. T.opener(false), { special = true })
                assert.are.same(opener:list(), c.student:sub(first - #opener, #opener):list())
                local before = tok:decode(c.student:sub(0, first), { special = true })
                local _, user_turns = before:gsub("<|im_start|>user", "")
                assert.are.equal(t, user_turns)
                if t > 1 then assert.is_true(first > c.spans[t - 1][1] + c.spans[t - 1][2]) end
                total = total + len
            end
            assert.are.equal(total, c.answer_len)
            assert.are.equal(c.spans[3][1] + c.spans[3][2], #c.student)
            -- every target entry is inside a span, and every span position has entries
            local seen, inside = {}, {}
            for _, span in ipairs(c.spans) do
                for j = 0, span[2] - 1 do inside[span[1] + j] = true end
            end
            for i = 0, c.targets:count() - 1 do
                local pos = c.targets:get(i)
                assert.is_true(inside[pos], "target position " .. pos .. " is in an answer")
                seen[pos] = true
            end
            for pos in pairs(inside) do assert.is_true(seen[pos], "answer position " .. pos .. " has targets") end
        end
        local alone = interviews:group({ { 0, 2 } })[1]
        assert.are.same(group[2].student:list(), alone.student:list())
        assert.are.same(group[2].targets:list(), alone.targets:list())
        m:free()
    end)
end)
