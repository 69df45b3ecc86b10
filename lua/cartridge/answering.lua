-- cartridge.answering: answering a question behind a cartridge, from the bare
-- model, and with the corpus in context (ICL), as recipes/ask.lua and
-- `selfstudy.lua --load F --ask Q` print them.
--
--   local answering = require("cartridge.answering")
--   local r = answering.answer{ model = m, cartridge = c, question = "...", max_a = 192 }
--   r.text, r.ids, r.seconds, r.tok_s, r.rows (KV rows in front of the prompt),
--   r.prompt_tokens, r.question_tokens (the question's turn within the prompt)
--
-- Every arm decodes greedily up to max_a tokens and stops at the template's
-- end of turn (not included); with a grammar (cartridge.grammar) the answer
-- is a document of it, greedy among the tokens that can continue it, and
-- ends when the document is complete. The prompt is the user turn and the assistant
-- opener (thinking off); the cartridge arm writes the cartridge rows into an
-- empty cache first and prefills the prompt at position p.

local core = require("cartridge.core")
local chat = require("cartridge.chat")
local selfstudy = require("cartridge.selfstudy")
local grammar_mod = require("cartridge.grammar")
local sampler_mod = require("cartridge.sampler")
local C = core.C

local answering = {}

local function now() return C.cart_now_seconds() end

-- opts: model, question, max_a (192), cartridge (optional), system (optional
-- system-message text, for ICL), kv ("f16"), speculative (optional: a
-- speculative drafter with :decode, see cartridge.speculative), template,
-- grammar (optional, not with speculative), ignore_eos (greedy decoding goes
-- on past the end of the turn: a benchmark's fixed length).
function answering.answer(opts)
    local m = opts.model
    local tok = m:tokenizer()
    local T = opts.template or chat.for_model(m)
    local max_a = opts.max_a or 192
    local prompt_text = T.user_open .. opts.question .. T.close .. T.opener(false)
    local question_tokens = #tok:encode(prompt_text, { special = true })
    if opts.system then
        prompt_text = selfstudy.system_block(T, opts.system) .. prompt_text
    end
    local prompt = tok:encode(prompt_text, { special = true, add_special = opts.cartridge == nil })
    local p = opts.cartridge and opts.cartridge.p or 0
    local kv = m:new_kv(p + #prompt + max_a + 16, opts.kv or "f16")
    local t0 = now()
    if opts.cartridge then opts.cartridge:append_to(kv) end
    local ids
    if opts.speculative and opts.grammar then
        error("answering.answer: a grammar and speculative decoding together are not supported (drafted tokens are not "
            .. "checked against the grammar)", 0)
    end
    if opts.grammar then
        local matcher = grammar_mod.matcher(opts.grammar, grammar_mod.vocab(tok, m.n_vocab))
        local greedy = sampler_mod.new()
        ids = {}
        local logits = m:forward(kv, prompt)
        for _ = 1, max_a do
            local id = greedy:sample(logits, m.n_vocab, (matcher:mask()))
            if id < 0 or tok:is_eog(id) then break end
            matcher:accept(id)
            ids[#ids + 1] = id
            if #ids == max_a or matcher:done() then break end
            logits = m:forward(kv, { id })
        end
        greedy:free()
        matcher:free()
    elseif opts.speculative then
        ids = opts.speculative:decode(m, kv, prompt, max_a)
    else
        ids = {}
        local logits = m:forward(kv, prompt)
        for _ = 1, max_a do
            local id = m:argmax(logits)
            if tok:is_eog(id) and not opts.ignore_eos then break end
            ids[#ids + 1] = id
            if #ids == max_a then break end
            logits = m:forward(kv, { id })
        end
    end
    local dt = now() - t0
    kv:free()
    local text = tok:decode(ids, { special = false })
    return {
        text = selfstudy.clean(text),
        ids = ids,
        seconds = dt,
        tok_s = #ids / math.max(dt, 1e-9),
        rows = p,
        prompt_tokens = #prompt,
        question_tokens = question_tokens, -- the question's own turn (the rest of the prompt is a system block or BOS)
    }
end

-- The corpus text for the ICL arm: the whole corpus, or the text of its first
-- icl_max tokens. Returns text, rows it will take, truncated (bool).
function answering.icl_text(corpus, tok, icl_max)
    if corpus.n_tokens <= icl_max then return corpus.text, corpus.n_tokens, false end
    return tok:decode(corpus.ids:sub(0, icl_max), { special = true }), icl_max, true
end

-- Prints the three answers one under the other: the cartridge's, the bare
-- model's, and the one with the corpus in context, each under a header line
-- with its KV rows in front of the question's turn (the cartridge's p; the
-- corpus's system block) and speed.
-- opts: model, cartridge, cartridge_path, question, max_a, corpus (optional),
-- icl_max, speculative (optional), spec_label (text after "KV rows"),
-- grammar (optional: every answer a document of it).
function answering.print_three(opts)
    local m, c = opts.model, opts.cartridge
    local tok = m:tokenizer()
    -- with opts.expected, each label says whether the reply's first line
    -- holds it (facts.correct: trimmed, case-insensitive)
    local function verdict(r)
        if not opts.expected then return "" end
        return require("cartridge.facts").correct(r.text, opts.expected) and " -- right" or " -- wrong"
    end
    if opts.expected then print(("question: %s (expected: %s)"):format(opts.question, opts.expected)) end
    local r = answering.answer({ model = m, cartridge = c, question = opts.question, max_a = opts.max_a,
        speculative = opts.speculative, grammar = opts.grammar })
    print(("[cartridge, %d KV rows%s] (%.2f s, ~%.1f tok/s)%s"):format(c.p, opts.spec_label or "", r.seconds, r.tok_s,
        verdict(r)))
    print(r.text)
    local bare = answering.answer({ model = m, question = opts.question, max_a = opts.max_a, grammar = opts.grammar })
    print("[bare model, no context]" .. verdict(bare))
    print(bare.text)
    local icl
    if opts.corpus then
        local text, _, truncated = answering.icl_text(opts.corpus, tok, opts.icl_max or 4096)
        icl = answering.answer({ model = m, question = opts.question, max_a = opts.max_a, system = text,
            grammar = opts.grammar })
        -- rows in front of the question's turn, as the cartridge's p and
        -- report.lua's ICL arm count them (facts.accuracy): the system block
        local rows = icl.prompt_tokens - icl.question_tokens
        if truncated then
            print(("[ICL, %d KV rows — %.1fx the cartridge; corpus TRUNCATED from %d tokens]%s"):format(
                rows, rows / c.p, opts.corpus.n_tokens, verdict(icl)))
        else
            print(("[ICL, %d KV rows — %.1fx the cartridge]%s"):format(rows, rows / c.p, verdict(icl)))
        end
        print(icl.text)
    end
    return r, bare, icl
end

return answering
