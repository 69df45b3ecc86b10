-- pretrain.lua: train a model's weights -- from random initialization or
-- continuing a GGUF -- and write the result as a GGUF.
--
--   cartridge run recipes/pretrain.lua --preset reader            # models/reader.gguf
--   cartridge run recipes/pretrain.lua --from models/reader.gguf --steps 200 --out models/reader2.gguf
--   cartridge run recipes/pretrain.lua --preset reader --resume   # continue from out's .state file
--
-- The data is the synthetic reading task of lua/cartridge/facts.lua:
-- documents of invented facts (seeds below 1000; make_facts.lua's held-out
-- seeds start at 1000) in the chat template, with the forms the recipes
-- show a model -- the whole document in the system message, an excerpt under
-- self-study's provenance line, an excerpt with a seed instruction answered
-- by a question -- and question/answer turns. The loss is the next-token
-- cross-entropy of the assistant's replies only: the document's own tokens
-- (invented names and values) cannot be predicted, and learning to guess them
-- would only slow the lookups down. AdamW (decay 0.1 on the matrices),
-- gradient clipping at 1.0, a
-- linear warm-up and a cosine decay to a tenth of --lr (per phase, with
-- --lookup-steps: see lr_at).
--
-- Deterministic for a seed, on any CPU and thread count: step s draws its
-- conversations from (seed, s) alone, so --resume continues the same run,
-- and the weight gradients go through the engine's own kernels, which give
-- the same bits at every ISA level.
-- Every --save-every steps the weights, the optimizer state and the step go
-- to OUT.state.safetensors (atomically); at the end the GGUF is written
-- (atomically) and, with --eval N, scored on N held-out documents with the
-- document in context and without it.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local facts = require("cartridge.facts")
local bpe = require("cartridge.bpe")
local chat = require("cartridge.chat")
local ids = require("cartridge.ids")
local trainer = require("cartridge.trainer")
local progress = require("cartridge.progress")
local fs = require("cartridge.fs")
local json = require("cartridge.json")
local C = cartridge.C

local PRESETS = {
    -- the reader: a small synthetic-task model that learns to answer from its context
    reader = { layers = 3, embd = 128, ff = 384, heads = 4, kv_heads = 4, head_dim = 32, ctx = 4096, merges = 1500,
        steps = 3600, lookup_steps = 3000, lookup_mix = 0.1, min_facts = 1, curriculum = 0.5, bot_a_mix = 0.2,
        focus_mix = 0.5, phrasings = true, reverse = 0.2, batch = 16, lr = 3e-3, out = "models/reader.gguf",
        dtype = "f16",
        -- then bot A's focus instruction, continuing the f16 GGUF of the above
        -- with a fresh optimizer (what --from does)
        stage2 = { steps = 400, batch = 16, lr = 3e-3, warmup = 20, bot_a_mix = 0.7, focus_mix = 1, min_facts = 8,
            curriculum = 0, lookup_mix = 0.05, phrasings = true, reverse = 0.2 } },
    -- a few steps of a tiny one, for the tests
    tiny = { layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, head_dim = 16, ctx = 2048, merges = 200,
        steps = 20, batch = 2, lr = 3e-3, out = "out/tiny-reader.gguf", dtype = "f32" },
    -- the tiny one in two stages, for the test of a staged preset
    ["tiny-staged"] = { layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, head_dim = 16, ctx = 2048,
        merges = 200, steps = 4, batch = 2, lr = 3e-3, bot_a_mix = 0.5, focus_mix = 0.5, out = "out/tiny-staged.gguf",
        dtype = "f32", stage2 = { steps = 3, batch = 2, lr = 3e-3, warmup = 2, bot_a_mix = 0.7, focus_mix = 1,
            min_facts = 8, curriculum = 0, lookup_mix = 0 } },
}

local opts = options.parse(arg, {
    summary = "Train a model's weights on the synthetic reading task and write it as a GGUF.",
    flags = {
        { "preset", choices = { "reader", "tiny", "tiny-staged" }, help = "shape, vocabulary and budget of a new model" },
        { "from", help = "continue this GGUF instead of a new model" },
        { "out", help = "the GGUF to write (default: the preset's, e.g. models/reader.gguf)" },
        { "steps", type = "int", help = "optimizer steps (default: the preset's)" },
        { "batch", type = "int", help = "conversations per step (default: the preset's)" },
        { "lr", type = "number", help = "peak learning rate (default: the preset's)" },
        { "warmup", type = "int", default = 100, help = "linear warm-up steps" },
        { "min-facts", type = "int", help = "fewest facts in a training document (default: the preset's, else 4)" },
        { "max-facts", type = "int", default = 40, help = "most facts in a training document" },
        { "curriculum", type = "number", help = "the fraction of the document steps (those after --lookup-steps) over which the most facts grow from --min-facts + 4 to --max-facts (0: from the start; default: the preset's, else 0.4)" },
        { "lookup-steps", type = "int", help = "first train this many steps on keyed lists (key, filler, value), the lookup that reading needs, before the documents (default: the preset's, else 0)" },
        { "lookup-mix", type = "number", help = "after --lookup-steps, this fraction of the conversations stays keyed lists (default: the preset's, else 0)" },
        { "bot-a-mix", type = "number", help = "the fraction of document conversations that teach bot A's part: an excerpt and a seed instruction, answered with a question about one of its facts (default: one in ten)" },
        { "focus-mix", type = "number", help = "of bot A's conversations, the fraction whose instruction quotes one sentence of the excerpt (self-study's focus seed) (default: the preset's, else none)" },
        { "phrasings", type = "boolean", help = "reading turns ask each fact in any of its three phrasings (default: the preset's, else the first only); bot A's question is always the first" },
        { "reverse", type = "number", help = "the fraction of reading turns asked in reverse (\"Who lives in X?\"), where the document has one (default: the preset's, else none)" },
        { "seed", type = "int", default = 1, help = "initialization and data" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        { "save-every", type = "int", default = 100, help = "write the training state every N steps (0: never)" },
        { "resume", type = "boolean", help = "continue from OUT.state.safetensors" },
        { "stop-after", type = "int", help = "stop after this step, saving the state (--resume continues)" },
        { "eval", type = "int", default = 20, help = "held-out documents to score at the end (0: none)" },
        { "eval-every", type = "int", default = 0, help = "also score one held-out document every N steps (0: never)" },
        { "eval-facts", type = "int", default = 40, help = "facts in each held-out document" },
        { "dtype", choices = { "f32", "f16" }, help = "matrices of the written GGUF (default: the preset's; f32 with --from)" },
    },
})

local function fail(msg) error("pretrain: " .. msg, 0) end
if not opts.preset and not opts.from then fail("pass --preset reader (a new model) or --from GGUF (continue one)") end
local preset = PRESETS[opts.preset or "reader"]
local steps = opts.steps or preset.steps
local batch = opts.batch or preset.batch
local peak_lr = opts.lr or preset.lr
local out = opts.out or (opts.from and error("pretrain: --from needs --out", 0)) or preset.out
-- a preset with a second stage: this run writes OUT.stage1.gguf (its state
-- and metrics beside it), and the second stage continues it into OUT
local final_out, final_eval
if opts.preset and preset.stage2 and not opts.from then
    final_out, final_eval = out, opts.eval
    out = out:gsub("%.gguf$", "") .. ".stage1.gguf"
    opts.eval = 0
end
-- the schedule's flags: what is passed, else the preset's (a new model), else the plain default
local function schedule(name, plain)
    if opts[name] ~= nil then return end
    if opts.preset and preset[name] ~= nil then opts[name] = preset[name] else opts[name] = plain end
end
schedule("min_facts", 4)
schedule("curriculum", 0.4)
schedule("lookup_steps", 0)
schedule("lookup_mix", 0)
schedule("bot_a_mix", nil)
schedule("focus_mix", nil)
schedule("phrasings", nil)
schedule("reverse", nil)
if opts.reverse and (opts.reverse < 0 or opts.reverse > 1) then fail("--reverse is a fraction: give a number in 0..1") end
if steps < 1 or batch < 1 then fail("--steps and --batch must be at least 1") end
if opts.min_facts < 1 or opts.min_facts > opts.max_facts then fail("need 1 <= --min-facts <= --max-facts") end
if opts.lookup_steps < 0 then fail("--lookup-steps must be at least 0") end
if opts.lookup_mix < 0 or opts.lookup_mix > 1 then fail("--lookup-mix is a fraction: give a number in 0..1") end
if opts.bot_a_mix and (opts.bot_a_mix < 0 or opts.bot_a_mix > 1) then
    fail("--bot-a-mix is a fraction: give a number in 0..1")
end
if opts.focus_mix and (opts.focus_mix < 0 or opts.focus_mix > 1) then
    fail("--focus-mix is a fraction: give a number in 0..1")
end
local state_path = out:gsub("%.gguf$", "") .. ".state.safetensors"
local metrics_path = out:gsub("%.gguf$", "") .. ".metrics.jsonl"
cartridge.set_threads(opts.threads)
fs.mkdirs(fs.parent(out))

-- ---------------------------------------------------------------------------
-- The model: a new one (a vocabulary learned from the task's own text,
-- random weights) or the one to continue

local init_path = opts.from
if not init_path then
    init_path = out:gsub("%.gguf$", "") .. ".init.gguf"
    local t0 = C.cart_now_seconds()
    local texts = {}
    for s = 0, 199 do
        local d = facts.document(1000000 + s, 40) -- vocabulary text: seeds outside both ranges
        texts[#texts + 1] = d.text
        -- the first phrasings only: the vocabulary (and so the keyed-list
        -- phase, whose learning jumps at a step that moves with it) stays
        -- the one the first readers learnt; other phrasings split finer
        for _, f in ipairs(d.facts) do texts[#texts + 1] = f.question .. "\n" .. f.answer end
    end
    for _, seed in ipairs(require("cartridge.selfstudy").SEEDS) do texts[#texts + 1] = seed.text end
    -- every name often enough that it becomes one token
    for _ = 1, 20 do texts[#texts + 1] = " " .. table.concat(facts.NAMES, " ") end
    local vocab = bpe.train(texts, preset.merges)
    randmodel.write({ out = init_path, arch = "qwen3", layers = preset.layers, embd = preset.embd, ff = preset.ff,
        heads = preset.heads, kv_heads = preset.kv_heads, head_dim = preset.head_dim, ctx = preset.ctx,
        dtype = "f32", tokenizer = vocab, seed = opts.seed, out_scale = 1, quiet = true,
        name = "cartridge-reader-" .. (opts.preset or "reader") })
    print(("new model: qwen3 %d layers, hidden %d, %d heads of %d, ff %d; vocabulary of %d tokens (%d merges "
        .. "learned in %.1f s)"):format(preset.layers, preset.embd, preset.heads, preset.head_dim, preset.ff,
        #vocab.tokens + 5, #vocab.merges, C.cart_now_seconds() - t0))
end
local m = cartridge.model.load(init_path, { widen = true })
local tok = m:tokenizer()
local T = chat.for_model(m)
local params = cartridge.params.new(m)
local tr = trainer.new(m)
tr:set_params(params)
local opt = cartridge.adam.new(params, { lr = peak_lr, weight_decay = 0.1, decoupled = true, beta2 = 0.99 })
do
    local split = {}
    for _, name in ipairs(facts.NAMES) do
        if #tok:encode(" " .. name, { add_special = false }) ~= 1 then split[#split + 1] = name end
    end
    if #split > 0 then
        print(("note: %d of the %d names are more than one token (%s ...)"):format(#split, #facts.NAMES, split[1]))
    end
end
print(("training %s parameters in %d tensors; %d steps of %d conversations; lr %g; %d threads")
    :format(require("cartridge.fmt").int(params:total()), params:count(), steps, batch, peak_lr, cartridge.threads()))

local first_step = 1
if opts.resume then
    if fs.kind(state_path) ~= "file" then fail("--resume: no training state at " .. state_path) end
    local meta = params:load_state(state_path, opt)
    first_step = tonumber(meta["pretrain.step"]) + 1
    print(("resumed from %s at step %d"):format(state_path, first_step - 1))
end

-- ---------------------------------------------------------------------------
-- Data: step s, conversation i is drawn from (seed, s, i) alone

-- One warm-up and cosine over `n` steps at peak `lr`.
local function cosine(step, n, lr, warmup)
    if step <= warmup then return lr * step / warmup end
    local t = (step - warmup) / math.max(1, n - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * math.min(t, 1))))
end

-- With --lookup-steps before documents, each phase has its own: the lists
-- warm up and stay at --lr (the jump to long lists and long values needs
-- it: with a cosine over the lists alone, a run at 2600 list steps was still
-- at list loss 0.9 where one at the full rate was at 0.01), then decay over
-- their last fifth to a tenth so the lookup settles; then the documents at
-- half --lr with a warm-up of half --warmup, which adapts the lookup to
-- prose without undoing it.
local function lr_at(step)
    local lists = opts.lookup_steps
    if lists <= 0 or lists >= steps then return cosine(step, steps, peak_lr, opts.warmup) end
    if step <= lists then
        local stable = math.floor(0.8 * lists)
        if step <= stable then return math.min(peak_lr, peak_lr * step / opts.warmup) end
        return cosine(step - stable, lists - stable, peak_lr, 0)
    end
    return cosine(step - lists, steps - lists, peak_lr / 2, math.max(1, math.floor(opts.warmup / 2)))
end

-- The most facts a document has at a step: short documents first, where a
-- lookup has few distractors, growing to --max-facts.
local function facts_at(step)
    local span = opts.curriculum * math.max(0, steps - opts.lookup_steps)
    local t = step - opts.lookup_steps -- documents start after the lookup steps
    if span <= 0 or t >= span then return opts.max_facts end
    local lo = math.min(opts.min_facts + 4, opts.max_facts)
    return math.floor(lo + (opts.max_facts - lo) * math.max(0, t) / span + 0.5)
end

-- The lookup warm-up: a list of pairs, each a key (a person's name), a
-- filler of 0 to 4 tokens (a relation's words: one to three fillers per
-- list, each pair with one of them) and a value (any word, later with one
-- or two word pieces after it, as an invented name is), then the pairs
-- again in a fresh order, where every token after a key is supervised.
-- Predicting a value needs the key some tokens back and the place in the
-- list where that key stands, by the key and not by the filler alone: the
-- circuit that answering from a document needs, learnt where nothing else is
-- in the way. Lists grow to 40 pairs, so the lookups reach as far back as
-- a document's do.
local lookup_keys, lookup_words, lookup_pieces
local function lookup_pools()
    if lookup_keys then return end
    lookup_keys, lookup_words, lookup_pieces = {}, {}, {}
    local is_key = {}
    for i, name in ipairs(facts.NAMES) do -- a name's tokens (one each in the reader's vocabulary)
        lookup_keys[i] = tok:encode(" " .. name, { add_special = false })
        if #lookup_keys[i] == 1 then is_key[lookup_keys[i][1]] = true end
    end
    for id = 0, m.n_vocab - 1 do -- whole words with their space, three letters or more
        local text = tok:decode({ id })
        if not is_key[id] and text and text:match("^ %a%a%a+$") then lookup_words[#lookup_words + 1] = id end
        if text and text:match("^%l%l+$") then lookup_pieces[#lookup_pieces + 1] = id end
    end
    if #lookup_words < 50 then -- a small vocabulary: any letters with their space
        lookup_words = {}
        for id = 0, m.n_vocab - 1 do
            local text = tok:decode({ id })
            if not is_key[id] and text and text:match("^ %a+$") then lookup_words[#lookup_words + 1] = id end
        end
    end
    if #lookup_words < 2 then fail("--lookup-steps: the vocabulary has no word tokens (' word') to use as values") end
    print(("keyed lists: %d keys, %d value words, %d word pieces"):format(#lookup_keys, #lookup_words, #lookup_pieces))
end

local function lookup_list(g, step)
    lookup_pools()
    local function word() return lookup_words[g:below(#lookup_words) + 1] end
    local seq, spans = ids.new(), {}
    if tok.bos then seq:push(tok.bos) end
    -- the first half of --lookup-steps: 2..8 pairs, one filler of 0..2
    -- tokens and one-token values, where the lookup forms; then lists grow
    -- to 40 pairs with one to three fillers of 0..4 tokens and values of one
    -- to three tokens by 85%, and stay so (--lookup-mix too)
    local t = opts.lookup_steps > 0 and step / opts.lookup_steps or 1
    local n, fillers, long_values = 8, {}, t >= 0.5 and #lookup_pieces > 0
    if t < 0.5 then
        fillers[1] = {}
        for i = 1, g:int(0, 2) do fillers[1][i] = word() end
    else
        n = math.floor(8 + 32 * math.min(1, (t - 0.5) / 0.35) + 0.5)
        for k = 1, g:int(1, 3) do
            fillers[k] = {}
            for i = 1, g:int(0, 4) do fillers[k][i] = word() end
        end
    end
    n = g:int(2, n)
    local keys = g:shuffle({ unpack(lookup_keys) })
    local list = {}
    for i = 1, n do
        local value = { word() }
        if long_values then
            for k = 2, ({ 1, 1, 2, 2, 3 })[g:int(1, 5)] do value[k] = lookup_pieces[g:below(#lookup_pieces) + 1] end
        end
        list[i] = { key = keys[i], filler = fillers[g:below(#fillers) + 1], value = value }
    end
    local stop = tok:encode(".", { add_special = false })[1]
    local function put(pair, supervised)
        for _, id in ipairs(pair.key) do seq:push(id) end
        local from = #seq
        for _, f in ipairs(pair.filler) do seq:push(f) end
        for _, v in ipairs(pair.value) do seq:push(v) end
        seq:push(stop)
        if supervised then spans[#spans + 1] = { from, #seq } end
    end
    for i = 1, n do put(list[i], false) end
    seq:push(stop)
    g:shuffle(list)
    for i = 1, math.min(n, 12) do put(list[i], true) end
    return seq, spans
end

local function conversation(step, i)
    local g = facts.rng(opts.seed * 1000003 + step * 1009 + i)
    if step <= opts.lookup_steps or (opts.lookup_mix > 0 and g:below(1000) < opts.lookup_mix * 1000) then return lookup_list(g, step) end
    -- a few relations or all of them: facts of one relation, told apart by
    -- their people alone, from the shortest documents on
    local n = g:int(opts.min_facts, facts_at(step))
    local d = facts.document(g:below(1000), n, { relations = g:int(1, math.min(8, n)) })
    local seq, spans = ids.new(), {}
    for k, piece in ipairs(facts.conversation(g, d, T, { bot_a = opts.bot_a_mix, focus = opts.focus_mix,
        phrasings = opts.phrasings, reverse = opts.reverse })) do
        local from = #seq
        tok:encode_ids(piece.text, { special = true, add_special = k == 1 }, seq)
        if piece.supervised then spans[#spans + 1] = { from, #seq } end
    end
    return seq, spans
end

local metrics = assert(io.open(metrics_path, opts.resume and "a" or "w"))
local function record(t)
    metrics:write(json.encode(t), "\n")
    metrics:flush()
end
if not opts.resume then
    record({ event = "start", settings = { preset = opts.preset, from = opts.from, steps = steps, batch = batch,
        lr = peak_lr, warmup = opts.warmup, seed = opts.seed, params = params:total() } })
end

-- ---------------------------------------------------------------------------
-- Held-out documents (seeds 1001 and up, never trained on): exact-match
-- accuracy with the document in context, and without it. A short one has
-- fewer relations, about five facts each as in a 40-fact document, so that
-- its questions need the person's name there too.

-- Held-out document k: the document and its text as the corpus shows it.
local function heldout(k)
    local d = facts.document(1000 + k, opts.eval_facts, { relations = math.min(8, math.ceil(opts.eval_facts / 5)) })
    local path = "heldout/doc" .. k .. ".md"
    return d, path, "\n\n# Document: " .. path .. "\n\n" .. d.text
end

-- ICL accuracy on the first phrasing (icl), the held-out phrasings 2 and 3
-- (icl_held) and the reverse questions (icl_rev, of n_rev); bare on the
-- first phrasing.
local function evaluate(n_docs)
    local r = { icl = 0, bare = 0, n = 0, chance = 0, icl_held = 0, n_held = 0, icl_rev = 0, n_rev = 0 }
    for k = 1, n_docs do
        local d, _, system = heldout(k)
        local qa = facts.questions(d)
        local first, held, rev = facts.select(qa, "first"), facts.select(qa, "held-out"), facts.select(qa, "reverse")
        r.chance = r.chance + facts.chance(d) * #d.facts
        r.icl = r.icl + facts.accuracy(m, first, { system = system, max_a = 16 })
        r.bare = r.bare + facts.accuracy(m, first, { max_a = 16 })
        r.n = r.n + #first
        if opts.phrasings then
            r.icl_held, r.n_held = r.icl_held + facts.accuracy(m, held, { system = system, max_a = 16 }), r.n_held + #held
        end
        if opts.reverse and #rev > 0 then
            r.icl_rev, r.n_rev = r.icl_rev + facts.accuracy(m, rev, { system = system, max_a = 16 }), r.n_rev + #rev
        end
    end
    r.chance = r.chance / r.n
    return r
end

local bar = progress.new(steps, "pretrain")
local started, tokens_seen = C.cart_now_seconds(), 0
local window_tokens, window_t = 0, C.cart_now_seconds()
for step = first_step, steps do
    local segments, targets, base, supervised = {}, trainer.targets(), 0, 0
    for i = 1, batch do
        local seq, spans = conversation(step, i)
        segments[i] = seq
        for _, span in ipairs(spans) do
            targets:append_labels(seq, span[1], span[2], base)
            supervised = supervised + span[2] - span[1]
        end
        base = base + #seq
    end
    opt:set_lr(lr_at(step))
    params:zero_grad()
    local loss = tr:distill(nil, segments, targets, { backward = true })
    if loss ~= loss or loss == math.huge then
        bar:clear()
        fail(("step %d: the loss is not finite (%s); lower --lr. The last state written is %s"):format(step,
            tostring(loss), state_path))
    end
    local norm = params:clip(1.0)
    opt:step()
    tokens_seen, window_tokens = tokens_seen + base, window_tokens + base
    if step % 10 == 0 or step == steps then
        local now = C.cart_now_seconds()
        local rate = window_tokens / math.max(now - window_t, 1e-9)
        bar:clear()
        local data = step <= opts.lookup_steps and "keyed lists" or ("up to %d facts"):format(facts_at(step))
        print(("step %5d/%d: loss %.4f (%d reply tokens), grad norm %.2f, lr %.2e, %s, %.0f tokens/s")
            :format(step, steps, loss, supervised, norm, lr_at(step), data, rate))
        io.stdout:flush()
        window_tokens, window_t = 0, now
    end
    record({ step = step, steps = steps, loss = loss, lr = lr_at(step), grad_norm = norm, tokens = tokens_seen,
        seconds = C.cart_now_seconds() - started })
    if opts.eval_every > 0 and step % opts.eval_every == 0 then
        local r = evaluate(math.max(1, math.ceil(40 / opts.eval_facts)))
        bar:clear()
        print(("step %5d: held-out document: with it %d/%d (held-out phrasings %d/%d, reverse %d/%d), bare %d/%d")
            :format(step, r.icl, r.n, r.icl_held, r.n_held, r.icl_rev, r.n_rev, r.bare, r.n))
        record({ event = "eval", step = step, icl = r.icl, bare = r.bare, n = r.n, icl_held = r.icl_held,
            n_held = r.n_held, icl_rev = r.icl_rev, n_rev = r.n_rev })
    end
    if (opts.save_every > 0 and step % opts.save_every == 0 and step < steps) or step == opts.stop_after then
        params:save_state(state_path, opt, { ["pretrain.step"] = step, ["pretrain.seed"] = opts.seed })
    end
    bar:update(step)
    if step == opts.stop_after then
        bar:finish()
        print(("stopped after step %d; the state is in %s (--resume continues)"):format(step, state_path))
        if not opts.from then os.remove(init_path) end
        return
    end
end
bar:finish()
local elapsed = C.cart_now_seconds() - started
params:write_gguf(out, opts.dtype or (opts.preset and preset.dtype) or "f32", "cartridge-reader-" .. (opts.preset or "continued"))
print(("trained %d steps in %.1f min (%.0f tokens/s); wrote %s"):format(steps - first_step + 1, elapsed / 60,
    tokens_seen / math.max(elapsed, 1e-9), out))
if not opts.from then os.remove(init_path) end

if opts.eval > 0 then
    local r = evaluate(opts.eval)
    local function pct(a, b) return b > 0 and ("%d/%d = %.1f%%"):format(a, b, 100 * a / b) or "not asked" end
    print(("held-out (%d documents of %d facts, seeds 1001-%d): with the document %s (held-out phrasings %s, "
        .. "reverse %s), bare %s (chance %.1f%%)"):format(opts.eval, opts.eval_facts, 1000 + opts.eval,
        pct(r.icl, r.n), pct(r.icl_held, r.n_held), pct(r.icl_rev, r.n_rev), pct(r.bare, r.n), 100 * r.chance))
    record({ event = "eval", step = steps, icl = r.icl, bare = r.bare, n = r.n, chance = r.chance,
        icl_held = r.icl_held, n_held = r.n_held, icl_rev = r.icl_rev, n_rev = r.n_rev })
    -- bot A's part: self-study's conversations on a few of the held-out
    -- documents, as selfstudy.lua draws them (chunks a quarter to a half of
    -- the document); a question counts when it is exactly one of the
    -- document's, the only questions whose answers a cartridge is scored on
    local docs = math.min(opts.eval, 4)
    for _, seeds in ipairs({ { name = "the seven seed instructions" }, { name = "the focus instruction", list = "focus" } }) do
        local cov = { n = 0, valid = 0, distinct = 0, right = 0, facts = 0 }
        for k = 1, docs do
            local d, path, text = heldout(k)
            local corpus = require("cartridge.corpus").document(path, text, tok)
            local quarter = math.floor(corpus.n_tokens / 4)
            local r = facts.bot_coverage(m, d.facts, { corpus = corpus, chunk_min = quarter, chunk_max = 2 * quarter,
                groups = 4, seeds = seeds.list })
            for key, v in pairs(r) do cov[key] = cov[key] + v end
        end
        print(("self-study on %d of them (%d conversations, %s): %d questions ask one of the document's facts "
            .. "exactly (%d distinct of %d), bot B answered %d of those right"):format(docs, cov.n, seeds.name,
            cov.valid, cov.distinct, cov.facts, cov.right))
        record({ event = "bot_coverage", seeds = seeds.list or "default", step = steps, conversations = cov.n,
            valid = cov.valid, distinct = cov.distinct, facts = cov.facts, right = cov.right })
    end
end

-- The preset's second stage: this recipe again, continuing the GGUF just
-- written (--from: f32 out, a fresh optimizer), with the stage's settings.
if final_out then
    local s2 = preset.stage2
    print(("stage 2: %d steps from %s (bot A's share %g, focus %g), into %s"):format(s2.steps, out, s2.bot_a_mix,
        s2.focus_mix, final_out))
    arg = { "--from", out, "--out", final_out, "--seed", tostring(opts.seed), "--threads", tostring(opts.threads),
        "--eval", tostring(final_eval), "--eval-facts", tostring(opts.eval_facts), "--save-every",
        tostring(opts.save_every) }
    for _, k in ipairs({ "steps", "batch", "lr", "warmup", "bot_a_mix", "focus_mix", "min_facts", "curriculum",
        "lookup_mix", "reverse" }) do
        if s2[k] ~= nil then arg[#arg + 1], arg[#arg + 2] = "--" .. k:gsub("_", "-"), tostring(s2[k]) end
    end
    if s2.phrasings then arg[#arg + 1] = "--phrasings" end
    dofile((debug.getinfo(1, "S").source:gsub("^@", "")))
    os.remove(out)
end
