-- report.lua: how much of the corpus a cartridge carries, measured.
--
-- Scores held-out, corpus-grounded text three ways -- by the bare model, behind
-- each cartridge, and with the corpus in context (ICL) -- and prints the mean
-- negative log-likelihood per token of each, the fraction of the bare -> ICL
-- gap each cartridge recovers, and the KV rows and bytes each needs.
--
--   # a story corpus the model writes itself: beginnings for training, endings held out
--   cartridge run recipes/report.lua --model stories260K.gguf --make-stories out/stories
--   cartridge run recipes/selfstudy.lua --model stories260K.gguf --corpus out/stories/corpus.md \
--       --p 128 --steps 30 --save out/stories/p128.safetensors
--   cartridge run recipes/report.lua --model stories260K.gguf --corpus out/stories/corpus.md \
--       --heldout out/stories/heldout.json --load out/stories/p128.safetensors
--
-- Held-out file: a JSON array of texts, or of { "context": ..., "text": ... }
-- objects. Each text is scored on its own, after its context (which every arm
-- sees and which is not scored): after BOS (bare), after the cartridge rows,
-- or after the corpus wrapped as a system message (ICL). A text without a
-- context has its first token serve as one. Lower NLL is better; "gap
-- recovered" is (bare - cartridge) / (bare - ICL). --make-stories writes the
-- endings of the stories with the 16 tokens before each ending as context:
-- the rest of each story -- its names, objects and events -- is only in the
-- corpus.
--
-- --qa FILE instead answers the questions of a JSONL file (make_facts.lua
-- writes one) in each arm, greedily, and counts an answer when the reply's
-- first line holds the expected answer as a whole word (case-insensitive)
-- and none of the question's "others" (the document's other values of that
-- relation). Each phrasing set is scored on its own (--phrasing): first
-- (the form self-study's bot A writes), held-out (phrasings 2 and 3, which
-- bot A never writes) and reverse. --json also gives every question's reply
-- and verdict per arm and set:
--
--   cartridge run recipes/report.lua --model models/reader.gguf --qa out/facts/qa.jsonl \
--       --corpus out/facts/doc.md --load out/facts/c.safetensors

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local answering = require("cartridge.answering")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local fmt = require("cartridge.fmt")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Score held-out corpus-grounded text bare, behind cartridges, and with the corpus in context.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "the corpus the cartridges were trained on (for the ICL arm)" },
        { "heldout", help = "a JSON array of held-out texts to score" },
        { "qa", help = "instead: a JSONL file of {\"question\", \"answer\"[, \"others\"]} lines to answer (the answer as a whole word of the reply's first line, none of the others beside it)" },
        { "max-a", type = "int", default = 24, help = "--qa: answer budget, tokens" },
        { "phrasing", default = "each", help = "--qa: which questions: each (every phrasing set on its own: first, held-out, reverse), all, first, held-out, reverse, 1, 2 or 3" },
        { "load", repeatable = true, help = "a cartridge to score (repeatable)" },
        { "icl-max", type = "int", default = 4096, help = "corpus tokens in the ICL context at most" },
        { "make-stories", help = "instead: write a story corpus (corpus.md) and held-out endings (heldout.json) here" },
        { "stories", type = "int", default = 16, help = "--make-stories: how many stories" },
        { "story-tokens", type = "int", default = 200, help = "--make-stories: tokens per story" },
        { "split", type = "number", default = 0.6, help = "--make-stories: fraction of each story in the corpus" },
        { "seed", type = "int", default = 1, help = "--make-stories: sampling seed" },
        { "cue", type = "int", default = 16, help = "--make-stories: tokens before each ending given to every arm" },
        { "json", type = "boolean", help = "print the results as JSON" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        require("cartridge.cart").FOREIGN_FLAG,
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

cartridge.set_threads(opts.threads)
local m = cartridge.model.load(defaults.pick_model(opts.model))
local tok = m:tokenizer()
local V = m.n_vocab

-- The width of a table's first column: its longest arm name, at least 46.
local function name_width(arms)
    local w = 46
    for _, a in ipairs(arms) do w = math.max(w, #a.name) end
    return w
end

local function concat_ids(a, b)
    local out = {}
    for i = 1, #a do out[i] = a[i] end
    for i = 1, #b do out[#out + 1] = b[i] end
    return out
end

local write_file = require("cartridge.fs").write_atomic

-- ---------------------------------------------------------------------------
-- The story corpus

if opts.make_stories then
    local generate = require("cartridge.generate")
    local openings = { "Once upon a time", "One day", "There was a little", "Tom and Lily", "Once there was a big",
        "In a small town", "The sun was shining", "A little bird" }
    require("cartridge.fs").mkdirs(opts.make_stories)
    local parts, heldout = {}, {}
    for i = 1, opts.stories do
        local prompt = openings[(i - 1) % #openings + 1]
        local ids = tok:encode(prompt, { add_special = true })
        local r = generate.run({ model = m, tokenizer = tok, prompt_ids = ids, max_tokens = opts.story_tokens,
            sampling = { temperature = 0.8, top_p = 0.95, seed = opts.seed * 1000 + i } })
        -- the head keeps the prompt's own ids, so SentencePiece spacing survives decoding
        local head, tail = {}, {}
        for _, id in ipairs(ids) do if id ~= tok.bos then head[#head + 1] = id end end
        local cut = math.floor(#r.ids * opts.split)
        for j, id in ipairs(r.ids) do
            if j <= cut then head[#head + 1] = id else tail[#tail + 1] = id end
        end
        parts[#parts + 1] = tok:decode(head)
        if #tail > 8 then
            -- the ending, scored after the last words before it (which every
            -- arm sees); the rest of the story is only in the corpus
            local cue = {}
            for j = math.max(1, #head - opts.cue + 1), #head do cue[#cue + 1] = head[j] end
            heldout[#heldout + 1] = { context = tok:decode(cue), text = tok:decode(concat_ids(cue, tail)):sub(#tok:decode(cue) + 1) }
        end
    end
    write_file(opts.make_stories .. "/corpus.md", table.concat(parts, "\n\n") .. "\n")
    write_file(opts.make_stories .. "/heldout.json", json.encode(json.array(heldout)) .. "\n")
    print(("wrote %s/corpus.md (%d stories) and %s/heldout.json (%d held-out endings)"):format(opts.make_stories,
        #parts, opts.make_stories, #heldout))
    return
end

-- ---------------------------------------------------------------------------
-- Question answering: exact-match accuracy of greedy answers

-- bytes of K and V rows per position at f16, as a serving cache holds them
local row_bytes = m:kv_bytes(1, "f16") -- one position's K and V over every layer, as the cache holds them

if opts.qa then
    local facts = require("cartridge.facts")
    local qa = facts.read_qa(opts.qa)
    local arms = { { name = "bare model" } }
    for _, path in ipairs(opts.load) do
        local c, info = cartridge.cart.load(path, m)
        local training = info.training or {}
        arms[#arms + 1] = { name = ("cartridge %s (p=%d, %s steps)"):format(path:match("[^/]+$"), c.p,
            tostring(training.steps or "?")), cartridge = c }
    end
    if #opts.corpus > 0 then
        local corpus = corpus_mod.load(opts.corpus, tok)
        local text, _, truncated = answering.icl_text(corpus, tok, opts.icl_max)
        arms[#arms + 1] = { name = "ICL (corpus in context" .. (truncated and ", truncated)" or ")"), system = text }
    end
    local started = C.cart_now_seconds()
    local sets = {}
    if opts.phrasing == "each" then
        for _, set in ipairs(facts.PHRASING_SETS) do
            if #facts.select(qa, set) > 0 then sets[#sets + 1] = set end
        end
    else
        sets[1] = facts.check_set(opts.phrasing, "report")
        if #facts.select(qa, sets[1]) == 0 then
            error(("report: %s has no questions of phrasing set %s"):format(opts.qa, sets[1]), 0)
        end
    end
    print(("questions: %d from %s (%s); model %s"):format(#qa, opts.qa, table.concat(sets, ", "), m.path))
    local w = name_width(arms)
    local head = { ("%-" .. w .. "s %8s %10s"):format("arm", "KV rows", "KV bytes") }
    for _, set in ipairs(sets) do head[#head + 1] = ("%14s"):format(set) end
    print(table.concat(head, " "))
    local rows_out = {}
    for _, a in ipairs(arms) do
        local out = { arm = a.name, sets = {} }
        local cols = {}
        for _, set in ipairs(sets) do
            local right, total, rows, replies = facts.accuracy(m, facts.select(qa, set), { cartridge = a.cartridge,
                system = a.system, max_a = opts.max_a })
            a.rows = rows
            cols[#cols + 1] = ("%14s"):format(("%d/%d %3.0f%%"):format(right, total, 100 * right / total))
            out.sets[set] = { right = right, total = total, answers = replies }
            if #sets == 1 then out.right, out.total, out.answers = right, total, replies end
        end
        out.kv_rows, out.kv_bytes = a.rows, a.rows * row_bytes
        print(("%-" .. w .. "s %8d %10s %s"):format(a.name, a.rows, fmt.bytes(a.rows * row_bytes),
            table.concat(cols, " ")))
        rows_out[#rows_out + 1] = out
    end
    print(("(%.1f s)"):format(C.cart_now_seconds() - started))
    if opts.json then print(json.encode(rows_out)) end
    return
end

-- ---------------------------------------------------------------------------
-- Scoring

if not opts.heldout then error("report: --heldout FILE (a JSON array of texts) is required", 0) end
local f = io.open(opts.heldout, "rb")
if not f then error("report: cannot open " .. opts.heldout, 0) end
local ok, texts = pcall(json.decode, f:read("*a"))
f:close()
if not ok or type(texts) ~= "table" or #texts == 0 then
    error("report: " .. opts.heldout .. " must hold a non-empty JSON array of strings", 0)
end

-- Sum of -log p(token) over the text ids, fed after `prefix` ids (on top of
-- whatever kv holds) and the entry's own context ids.
local function nll(kv, prefix, entry)
    local seq = concat_ids(prefix, entry.context)
    local first = #seq
    for i = 1, #entry.text do seq[#seq + 1] = entry.text[i] end
    local rows = {}
    for i = 1, #entry.text do rows[i] = first + i - 2 end -- the row before each text token
    local logits = m:forward(kv, seq, rows)
    local sum = 0
    for r = 0, #entry.text - 1 do
        local l = logits + r * V
        local max = l[0]
        for v = 1, V - 1 do if l[v] > max then max = l[v] end end
        local s = 0
        for v = 0, V - 1 do s = s + math.exp(l[v] - max) end
        sum = sum + (max + math.log(s) - l[entry.text[r + 1]])
    end
    return sum
end

local scored = {}
local n_tokens = 0
for i, e in ipairs(texts) do
    local context, text
    if type(e) == "string" then
        local ids = tok:encode(e, {})
        context, text = { ids[1] }, {}
        for j = 2, #ids do text[#text + 1] = ids[j] end
    elseif type(e) == "table" and type(e.text) == "string" and type(e.context or "") == "string" then
        context = tok:encode(e.context or "", {})
        text = tok:encode(e.text, {})
        if #context == 0 and #text > 0 then
            context = { table.remove(text, 1) }
        end
    else
        error(("report: held-out entry %d is neither a string nor {\"context\", \"text\"}"):format(i), 0)
    end
    if #text < 1 then error(("report: held-out entry %d has no text to score"):format(i), 0) end
    scored[i] = { context = context, text = text }
    n_tokens = n_tokens + #text
end

-- arm: { name, rows (KV rows in front of the text), cartridge or prefix ids }
local function score(arm)
    local total = 0
    local prefix = arm.prefix or {}
    local p = arm.cartridge and arm.cartridge.p or 0
    for _, entry in ipairs(scored) do
        local kv = m:new_kv(p + #prefix + #entry.context + #entry.text + 1, "f32")
        if arm.cartridge then arm.cartridge:append_to(kv) end
        total = total + nll(kv, prefix, entry)
        kv:free()
    end
    arm.nll = total / n_tokens
    return arm
end

local template = chat.for_model(m)
local arms = {}
local bos_ctx = tok.bos and tok.adds_bos and { tok.bos } or {}
arms[#arms + 1] = score({ name = "bare model", rows = #bos_ctx, prefix = bos_ctx })

local corpus
if #opts.corpus > 0 then corpus = corpus_mod.load(opts.corpus, tok) end

for _, path in ipairs(opts.load) do
    local c, info = cartridge.cart.load(path, m)
    local training = info.training or {}
    arms[#arms + 1] = score({ name = ("cartridge %s (p=%d, %s steps)"):format(path:match("[^/]+$"), c.p,
        tostring(training.steps or "?")), cartridge = c, rows = c.p })
end

if corpus then
    -- the corpus in context must leave room for the longest held-out entry
    -- within the model's trained context
    local longest = 0
    for _, e in ipairs(scored) do longest = math.max(longest, #e.context + #e.text + 1) end
    local n_ctx = m.config.n_ctx_train
    local wrap = #tok:encode(selfstudy.system_block(template, ""), { special = true, add_special = true })
    local icl_max = opts.icl_max
    if n_ctx and n_ctx > 0 and math.min(icl_max, corpus.n_tokens) + wrap + longest > n_ctx then
        icl_max = math.max(0, n_ctx - wrap - longest)
        print(("note: the ICL arm gets the first %d corpus tokens (of %d; --icl-max %d), so that the corpus, its "
            .. "template and the longest held-out text fit the model's %d-token context"):format(
            math.min(icl_max, corpus.n_tokens), corpus.n_tokens, opts.icl_max, n_ctx))
    end
    local text, _, truncated = answering.icl_text(corpus, tok, icl_max)
    local ctx = tok:encode(selfstudy.system_block(template, text),
        { special = true, add_special = true })
    arms[#arms + 1] = score({ name = "ICL (corpus in context" .. (truncated and ", truncated)" or ")"),
        prefix = ctx, rows = #ctx })
end

local bare, icl = arms[1], corpus and arms[#arms] or nil
local rows_out = {}
print(("held-out: %d texts, %d scored tokens; model %s"):format(#scored, n_tokens, m.path))
local w = name_width(arms)
print(("%-" .. w .. "s %8s %10s %10s %14s"):format("arm", "KV rows", "KV bytes", "NLL/token", "gap recovered"))
local gap_note
if not icl then
    gap_note = "gap recovered needs an ICL arm: pass --corpus"
elseif bare.nll <= icl.nll then
    gap_note = ("gap recovered is undefined: the model scores these texts no better with the corpus in context "
        .. "(ICL %.4f >= bare %.4f), so there is no gap to recover; a model too small to read its context, "
        .. "such as stories260K, does this"):format(icl.nll, bare.nll)
end
for _, a in ipairs(arms) do
    local gap = ""
    if a ~= bare and a ~= icl then
        gap = gap_note and "n/a" or ("%.0f%%"):format(100 * (bare.nll - a.nll) / (bare.nll - icl.nll))
    end
    print(("%-" .. w .. "s %8d %10s %10.4f %14s"):format(a.name, a.rows, fmt.bytes(a.rows * row_bytes), a.nll, gap))
    rows_out[#rows_out + 1] = { arm = a.name, kv_rows = a.rows, kv_bytes = a.rows * row_bytes, nll = a.nll }
end
if gap_note and #opts.load > 0 then print("note: " .. gap_note) end
if opts.json then print(json.encode(rows_out)) end
