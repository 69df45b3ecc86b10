-- selfstudy.lua: train a cartridge on a corpus by self-study, then save it.
--
--   cartridge run recipes/selfstudy.lua --corpus README.md --p 256 --steps 8 --save out/readme.safetensors
--   cartridge run recipes/selfstudy.lua --load out/readme.safetensors --ask "What does cartridge do?"
--
-- Each optimizer step consumes --accum conversations. A conversation: a random
-- corpus chunk of --chunk-min..--chunk-max tokens in a system message; bot A
-- (temperature 0.6) writes a user message in one of seven forms; bot B
-- (greedy) answers it with the chunk in context. The teacher's top-k
-- distribution over B's answer (the model WITH the chunk) is distilled into
-- the cartridge: the student sees the user turn and the answer only, behind
-- the p trainable KV rows. One conversation, drawn first and never trained
-- on, measures the held-out loss before and after. See docs/selfstudy.md.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local cart = require("cartridge.cart")
local selfstudy = require("cartridge.selfstudy")
local serve = require("cartridge.serve")
local progress = require("cartridge.progress")
local json = require("cartridge.json")
local chat = require("cartridge.chat")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Train a cartridge on a corpus by self-study (or, with --load and --ask, answer from one).",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "a UTF-8 text file, or a directory of .md files (repeatable)" },
        { "p", type = "int", default = 512, help = "cartridge rows per layer, the frozen ones included" },
        { "frozen", type = "int", default = 1, help = "attention-sink rows kept constant" },
        { "steps", type = "int", default = 20, help = "optimizer steps" },
        { "accum", type = "int", default = 4, help = "conversations per optimizer step" },
        { "lr", type = "number", default = 2e-3, help = "Adam learning rate" },
        { "chunk-min", type = "int", default = 256, help = "shortest corpus chunk, tokens" },
        { "chunk-max", type = "int", default = 512, help = "longest corpus chunk, tokens" },
        { "top-k", type = "int", default = 20, help = "teacher entries per supervised token (then cut at 0.99 mass)" },
        { "max-q", type = "int", default = 64, help = "bot A's message budget, tokens" },
        { "max-a", type = "int", default = 192, help = "bot B's answer budget, tokens (and the serve budget)" },
        { "seed", type = "int", default = 42, help = "seeds chunks, seed prompts and bot A's sampling" },
        { "icl-max", type = "int", default = 4096, help = "serve: corpus tokens given to the ICL comparison" },
        { "save", default = "out/cartridge.safetensors", help = "where the cartridge is written (atomically)" },
        { "save-every", type = "int", default = 0, help = "checkpoint to --save every N steps (0: at the end only)" },
        { "resume", help = "start from a saved cartridge's rows (Adam restarts)" },
        { "draft-ref", type = "boolean", help = "embed the corpus token ids (for corpus-drafted serving)" },
        { "gen-batch", type = "int", default = 0, help = "conversations generated per lockstep group (a multiple of --accum; 0: --accum)" },
        { "spec-b", type = "boolean", help = "bot B decodes speculatively, drafting from its own chunk" },
        { "checkpoint", type = "boolean", help = "recompute each layer in the backward (less memory, bit-identical results)" },
        { "no-pack", type = "boolean", help = "one conversation per forward/backward (the packed gradient up to rounding)" },
        { "teacher-pass", type = "boolean", help = "score B's answers with a separate packed teacher pass instead of reusing B's logits" },
        { "qa", help = "a JSONL file of {\"question\", \"answer\"} lines: exact-match accuracy of the cartridge as it trains" },
        { "qa-every", type = "int", default = 0, help = "with --qa: score every N steps (0: at the end only), with bare and ICL at the start" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        { "load", help = "serve mode: a saved cartridge" },
        { "ask", help = "with --load: answer this from the cartridge; without: train, save, then answer it" },
        { "spec-serve", type = "boolean", help = "serve mode: corpus-drafted speculative decoding" },
    },
})

-- ---------------------------------------------------------------------------
-- Checks that do not need the model

local function fail(msg) error("selfstudy: " .. msg, 0) end
if opts.load and not opts.ask then fail("--load needs --ask \"question\"") end
if opts.steps < 1 or opts.accum < 1 then fail("--steps and --accum must be at least 1") end
if opts.chunk_min < 1 or opts.chunk_min > opts.chunk_max then
    fail(("--chunk-min %d and --chunk-max %d: need 0 < chunk-min <= chunk-max"):format(opts.chunk_min, opts.chunk_max))
end
local gen_batch = opts.gen_batch == 0 and opts.accum or opts.gen_batch
if gen_batch % opts.accum ~= 0 then
    fail(("--gen-batch %d must be a multiple of --accum %d"):format(gen_batch, opts.accum))
end
if opts.top_k < 1 or opts.max_q < 1 or opts.max_a < 1 then fail("--top-k, --max-q and --max-a must be at least 1") end

cartridge.set_threads(opts.threads)
local started = C.cart_now_seconds()
local m = cartridge.model.load(defaults.pick_model(opts.model))
local mc = m.config
local tok = m:tokenizer()
print(("model: %s (%d layers, hidden %d, kv_heads %d, head_dim %d)"):format(m.path, mc.n_layer, mc.n_embd,
    mc.n_head_kv, mc.head_dim))
local corpus
if #opts.corpus > 0 then
    corpus = corpus_mod.load(opts.corpus, tok)
    print(("corpus: %d files, %d tokens"):format(#corpus.files, corpus.n_tokens))
end

-- ---------------------------------------------------------------------------
-- Serve mode

if opts.load then
    local c = cart.load(opts.load, m)
    print(("cartridge loaded from %s: p = %d (%d layers)"):format(opts.load, c.p, c.n_layer))
    local spec, label
    if opts.spec_serve then
        local speculative = require("cartridge.speculative")
        spec, label = speculative.for_serving(opts.load, corpus, m)
    end
    serve.print_three({ model = m, cartridge = c, question = opts.ask, max_a = opts.max_a, corpus = corpus,
        icl_max = opts.icl_max, speculative = spec, spec_label = label })
    return
end

-- ---------------------------------------------------------------------------
-- Training

if not corpus then fail("--corpus is required for training (a text file or a directory of .md files)") end
-- the rows are initialized from the corpus opening (p tokens) unless they are
-- resumed; the chunks need chunk_min tokens either way
if opts.resume then
    corpus:require_tokens(opts.chunk_min + 2, ("lower --chunk-min (now %d), or add text"):format(opts.chunk_min))
else
    corpus:require_tokens(math.max(opts.p, opts.chunk_min) + 2,
        ("lower --p (now %d) or --chunk-min (now %d), or add text"):format(opts.p, opts.chunk_min))
end

local template = chat.for_model(m)
local c, draft_ref
if opts.resume then
    local info
    c, info = cart.load(opts.resume, m)
    draft_ref = info.draft_reference
    print(("cartridge resumed from %s: p = %d rows/layer x %d layers"):format(opts.resume, c.p, c.n_layer))
else
    local ids = selfstudy.init_ids(tok, template, corpus.text, opts.p)
    if opts.frozen >= #ids then fail(("--frozen %d must be below the %d init rows"):format(opts.frozen, #ids)) end
    c = cart.new(m, #ids, opts.frozen)
    c:capture(m, ids)
    print(("cartridge initialized from the corpus opening: p = %d rows/layer x %d layers"):format(c.p, c.n_layer))
end
if opts.draft_ref then
    if draft_ref then
        print(("draft reference kept from the resumed artifact: %d tokens"):format(#draft_ref))
    else
        draft_ref = corpus.ids
        print(("draft reference embedded: %d corpus tokens"):format(#draft_ref))
    end
end

local tr = cartridge.trainer.new(m, { recompute = opts.checkpoint })
local opt = cartridge.adam.new(c, { lr = opts.lr })
local rng = selfstudy.rng(opts.seed)
local synth = selfstudy.synthesizer(m, tok, corpus, {
    chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a,
    top_k = opts.top_k, rng = rng, template = template, teacher_pass = opts.teacher_pass, trainer = tr,
    spec_b = opts.spec_b,
})

local training = {
    model = m.path, corpus = opts.corpus, p = c.p, frozen = c.frozen, steps = opts.steps, accum = opts.accum,
    lr = opts.lr, chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, top_k = opts.top_k,
    max_q = opts.max_q, max_a = opts.max_a, seed = opts.seed, gen_batch = gen_batch,
    packed = not opts.no_pack, checkpoint = opts.checkpoint or false, resumed_from = opts.resume,
}
require("cartridge.fs").mkdirs(require("cartridge.fs").parent(opts.save))
require("cartridge.fs").sweep_temps(opts.save) -- what a killed earlier run left beside the artifact
local metrics_path = opts.save:gsub("%.safetensors$", "") .. ".metrics.jsonl"
local metrics = assert(io.open(metrics_path, "w"))
local function record(t)
    metrics:write(json.encode(t), "\n")
    metrics:flush()
end
record({ event = "start", settings = training })

local function save(path)
    c:save(path, m, { training = training, draft_reference = draft_ref })
end

-- held-out: the first conversation drawn, never trained on
local heldout = synth:group(1)[1]
print("held-out question: " .. heldout.question:gsub("\n", " "))
local heldout_before = selfstudy.eval_loss(tr, c, heldout)
print(("held-out distill loss before training: %.4f"):format(heldout_before))
record({ event = "heldout_before", loss = heldout_before })

-- exact-match accuracy on --qa: bare and ICL once, the cartridge as it trains
local qa, facts
local function score_qa(step)
    local t0 = C.cart_now_seconds()
    local right, total = facts.accuracy(m, qa, { cartridge = c, max_a = 32 })
    print(("step %3d (%d conversations): cartridge answers %d/%d of %s (%.1f s)"):format(step, step * opts.accum,
        right, total, opts.qa, C.cart_now_seconds() - t0))
    record({ event = "qa", step = step, conversations = step * opts.accum, right = right, total = total })
end
if opts.qa then
    facts = require("cartridge.facts")
    qa = facts.read_qa(opts.qa)
    local bare = facts.accuracy(m, qa, { max_a = 32 })
    local icl_text = serve.icl_text(corpus, tok, opts.icl_max)
    local icl = facts.accuracy(m, qa, { system = icl_text, max_a = 32 })
    print(("qa: %d questions; bare %d/%d, ICL %d/%d"):format(#qa, bare, #qa, icl, #qa))
    record({ event = "qa_reference", bare = bare, icl = icl, total = #qa })
    score_qa(0)
end

local bar = progress.new(opts.steps, "self-study")
local last_saved -- the step of the last checkpoint written
-- What a stopped run leaves at --save, for its message.
local function kept()
    if last_saved then return ("the last good checkpoint, step %d, is %s"):format(last_saved, opts.save) end
    local f = io.open(opts.save, "rb")
    if f then
        f:close()
        return "this run saved nothing, and " .. opts.save .. " is as it was"
    end
    return "nothing was saved"
end
local pending, answer_tokens = {}, 0
local train_started = C.cart_now_seconds()
for step = 1, opts.steps do
    local t0 = C.cart_now_seconds()
    if #pending < opts.accum then
        -- refill with a lockstep group, never more than the remaining steps need
        local want = math.min(gen_batch, (opts.steps - step + 1) * opts.accum)
        for _, convo in ipairs(synth:group(want)) do pending[#pending + 1] = convo end
    end
    local batch = {}
    for i = 1, opts.accum do batch[i] = table.remove(pending, 1) end
    local loss, tokens = selfstudy.train_step(tr, c, batch, not opts.no_pack)
    -- a non-finite loss or gradient stops the run before the update, so the
    -- rows and the last checkpoint on disk stay as they were
    local bad = loss ~= loss or loss == math.huge or loss == -math.huge
    if bad or C.cart_cartridge_check_finite(c.handle, 1) ~= 0 then
        bar:clear()
        local last = kept()
        fail(("step %d: the %s is not finite (%s); stopping before the update: %s. Lower --lr, or check the "
            .. "model and corpus"):format(step, bad and "distill loss" or "gradient",
            bad and tostring(loss) or require("cartridge.core").last_error(), last))
    end
    opt:step()
    if C.cart_cartridge_check_finite(c.handle, 0) ~= 0 then
        bar:clear()
        fail(("step %d: the update made the cartridge rows non-finite (%s); stopping: %s. Lower --lr"):format(step,
            require("cartridge.core").last_error(), kept()))
    end
    answer_tokens = answer_tokens + tokens
    local dt = C.cart_now_seconds() - t0
    bar:clear()
    print(("step %3d/%d: distill loss %.4f (%d answer tokens so far, %.1f s)"):format(step, opts.steps, loss,
        answer_tokens, dt))
    io.stdout:flush()
    record({ step = step, steps = opts.steps, loss = loss, answer_tokens = answer_tokens, seconds = dt,
        lr = opts.lr, conversations = step * opts.accum })
    if opts.save_every > 0 and step % opts.save_every == 0 and step < opts.steps then
        save(opts.save)
        last_saved = step
        print(("checkpoint saved to %s (step %d)"):format(opts.save, step))
    end
    if qa and opts.qa_every > 0 and step % opts.qa_every == 0 and step < opts.steps then
        bar:clear()
        score_qa(step)
    end
    bar:update(step)
end
bar:finish()
if qa then score_qa(opts.steps) end

local elapsed = C.cart_now_seconds() - train_started
local conversations = opts.steps * opts.accum
print(("self-study: %d conversations, %d supervised answer tokens, %.1f min (%.1f s/conversation)"):format(
    conversations, answer_tokens, elapsed / 60, elapsed / conversations))
local heldout_after = selfstudy.eval_loss(tr, c, heldout)
print(("held-out distill loss after training: %.4f (before %.4f)"):format(heldout_after, heldout_before))
record({ event = "heldout_after", loss = heldout_after })
if synth.stats.empty_questions > 0 then
    print(("note: bot A wrote no usable question %d times; those conversations asked the seed instruction itself")
        :format(synth.stats.empty_questions))
end
save(opts.save)
print("cartridge saved to " .. opts.save)
metrics:close()
if opts.ask then
    print(("cartridge: p = %d rows/layer x %d layers, %s"):format(c.p, c.n_layer, cartridge.fmt.bytes(c:bytes())))
    serve.print_three({ model = m, cartridge = c, question = opts.ask, max_a = opts.max_a, corpus = corpus,
        icl_max = opts.icl_max })
end
io.stderr:write(("(total %.1f s; metrics in %s)\n"):format(C.cart_now_seconds() - started, metrics_path))
