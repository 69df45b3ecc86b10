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
--
-- Across processes and hosts (docs/scale-out.md):
--   mpirun -np 8 cartridge run recipes/selfstudy.lua --threads 1 --accum 32 ...
-- Conversation i of step s is drawn from (--seed, s, i) alone; each rank
-- makes and trains its block of every step's --accum conversations, and the
-- gradients are added exactly over the ranks, so the artifact has the same
-- bits for any number of processes. Rank 0 alone prints, writes the metrics,
-- the checkpoints and the artifact.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local cart = require("cartridge.cart")
local selfstudy = require("cartridge.selfstudy")
local answering = require("cartridge.answering")
local progress = require("cartridge.progress")
local json = require("cartridge.json")
local chat = require("cartridge.chat")
local fs = require("cartridge.fs")
local fmt = require("cartridge.fmt")
local C = cartridge.C

local flags = selfstudy.flags()
local opts = options.parse(arg, {
    summary = "Train a cartridge on a corpus by self-study (or, with --load and --ask, answer from one).",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "a UTF-8 text file, or a directory of .md files (repeatable)" },
        { "steps", type = "int", default = 20, help = "optimizer steps" },
        { "icl-max", type = "int", default = 4096, help = "serve: corpus tokens given to the ICL comparison" },
        { "save", default = "out/cartridge.safetensors", help = "where the cartridge is written (atomically)" },
        { "save-every", type = "int", default = 0, help = "checkpoint to --save every N steps (0: at the end only)" },
        { "resume", help = "start from a saved cartridge's rows (Adam restarts)" },
        { "init", choices = { "opening", "spread", "evict", "compact" }, default = "opening", help = "the rows' start: the model's K/V of the corpus opening (p tokens); of p tokens spread evenly over the whole corpus; the p rows per KV head the model attends to most when it reads the corpus again (evict); or those keys with values fitted to match its attention outputs (compact: attention matching). All but opening prefill the whole corpus once (it must fit the model's context)" },
        { "draft-ref", type = "boolean", help = "embed the corpus token ids (for corpus-drafted serving)" },
        { "gen-batch", type = "int", default = 0, help = "conversations generated per lockstep group (a multiple of --accum; 0: the smallest multiple that is at least 16); the same bits" },
        { "qa", help = "a JSONL file of {\"question\", \"answer\"} lines: exact-match accuracy of the cartridge as it trains" },
        { "heldout-every", type = "int", default = 0, help = "measure the held-out distill loss every N steps too "
            .. "(0: before and after only); the metrics' heldout lines, the web page's held-out curve" },
        { "qa-every", type = "int", default = 0, help = "with --qa: score every N steps (0: at the end only), with bare and ICL at the start" },
        { "threads", type = "int", default = 0, help = "threads (0: every core this process may use; under mpirun, the rank's)" },
        { "load", help = "serve mode: a saved cartridge" },
        { "ask", help = "with --load: answer this from the cartridge; without: train, save, then answer it" },
        { "expect", help = "with --ask: the expected answer; each arm is marked right or wrong (its first line holds it, case-insensitive)" },
        { "spec-serve", type = "boolean", help = "serve mode: corpus-drafted speculative decoding" },
        require("cartridge.cart").FOREIGN_FLAG,
        unpack(flags),
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

-- ---------------------------------------------------------------------------
-- The job (one process unless an MPI launcher started several), and the
-- checks that do not need the model

local dist = require("cartridge.dist").init()
-- every rank runs the same code on the same data; only rank 0 speaks
local print = dist.print
-- an error every rank meets at the same point (so it is printed once)
local function fail(msg) dist.fail("selfstudy: " .. msg) end
if opts.load and not opts.ask then fail("--load needs --ask \"question\"") end
if opts.expect and not opts.ask then fail("--expect needs --ask \"question\"") end
if opts.load and dist.size > 1 then
    fail(("serving (--load) runs in one process, and this one is rank %d of %d: run it without mpirun")
        :format(dist.rank, dist.size))
end
if opts.steps < 1 then fail("--steps must be at least 1") end
selfstudy.check_flags(opts, fail)
local gen_batch = selfstudy.gen_batch(opts.gen_batch, opts.accum, fail)
if opts.accum < dist.size then
    fail(("--accum %d is below the %d ranks: every rank needs a conversation each step; use --accum %d or a "
        .. "multiple of it"):format(opts.accum, dist.size, dist.size))
end

cartridge.set_threads(opts.threads)
if dist.size > 1 then
    -- first of all: how many processes share the work
    print(("dist: %d ranks (%s), %d thread%s on rank 0; each step's %d conversations split %s"):format(dist.size,
        dist.library():match("^[^,]+"), cartridge.threads(), cartridge.threads() == 1 and "" or "s", opts.accum,
        opts.accum % dist.size == 0 and ("evenly, " .. math.floor(opts.accum / dist.size) .. " per rank")
            or ("unevenly (a multiple of " .. dist.size .. " balances them)")))
end
local started = C.cart_now_seconds()
local m = cartridge.model.load(defaults.pick_model(opts.model))
local tok = m:tokenizer()
print(m:describe())
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
    answering.print_three({ model = m, cartridge = c, question = opts.ask, expected = opts.expect, max_a = opts.max_a,
        corpus = corpus,
        icl_max = opts.icl_max, speculative = spec, spec_label = label })
    return
end

-- ---------------------------------------------------------------------------
-- Training

if not corpus then fail("--corpus is required for training (a text file or a directory of .md files)") end

local training = {
    model = m.path, corpus = opts.corpus, p = opts.p, frozen = opts.frozen, steps = opts.steps, accum = opts.accum,
    lr = opts.lr, init = opts.init, chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, top_k = opts.top_k,
    max_q = opts.max_q, max_a = opts.max_a, seed = opts.seed, gen_batch = gen_batch,
    checkpoint = opts.checkpoint or false, resumed_from = opts.resume,
    teacher_pass = opts.teacher_pass or false, spec_b = opts.spec_b or false, seeds = opts.seeds, turns = opts.turns,
}
-- fingerprints: ranks that read another model, corpus or flags stop here,
-- before any work (the model's path may differ between hosts, its content
-- not: every weight byte is hashed, so a damaged copy or a fine-tune of the
-- same model is caught too)
if dist.size > 1 then
    local settings = {}
    for k, v in pairs(training) do settings[k] = v end
    settings.model = nil
    local text = json.encode(settings)
    local ptr, n = require("cartridge.ids").view(corpus.ids)
    local weights, seconds = m:content_hash()
    dist.agree({ { "model", weights, m.path }, { "corpus", dist.hash(ptr, n * 4) },
        { "flags", dist.hash(text, #text) } },
        "every rank must read the same model (every weight byte is compared), the same corpus files at the same "
        .. "paths, and the same flags")
    print(("dist: the %d ranks agree on every weight byte (%s hashed in %.2f s on rank 0), the corpus and the flags")
        :format(dist.size, fmt.bytes(m.weight_bytes), seconds))
end

-- the rows are initialized from the corpus opening (p tokens) unless they are
-- resumed; the chunks need chunk_min tokens either way
local ok, why = pcall(function()
    if opts.resume then
        corpus:require_tokens(opts.chunk_min + 2, ("lower --chunk-min (now %d), or add text"):format(opts.chunk_min))
    else
        corpus:require_tokens(math.max(opts.p, opts.chunk_min) + 2,
            ("lower --p (now %d) or --chunk-min (now %d), or add text"):format(opts.p, opts.chunk_min))
    end
end)
if not ok then dist.fail(why) end

local template = chat.for_model(m)
local c, draft_ref
if opts.resume then
    -- rank 0 reads the file and sends the rows to the others, so only its
    -- host needs it (where the checkpoints were written)
    local shape = cartridge.ffi.new("int64_t[2]")
    if dist.root() then
        local info
        c, info = cart.load(opts.resume, m)
        draft_ref = info.draft_reference
        local step = info.metadata["cartridge.step"]
        print(("cartridge resumed from %s%s: p = %d rows/layer x %d layers"):format(opts.resume,
            step and (" (written after step " .. step .. ")") or "", c.p, c.n_layer))
        shape[0], shape[1] = c.p, c.frozen
    end
    dist.broadcast(shape, 16, 0)
    -- the artifact's rows set p and frozen: a different --p or --frozen on
    -- the command line is a conflict, never silently overridden
    for _, f in ipairs({ { "p", tonumber(shape[0]) }, { "frozen", tonumber(shape[1]) } }) do
        if options.given(opts, f[1]) and opts[f[1]] ~= f[2] then
            fail(("--%s %d conflicts with --resume %s, whose cartridge has %s = %d (a resumed run keeps the "
                .. "artifact's rows): leave --%s out, or start a new run without --resume")
                :format(f[1], opts[f[1]], opts.resume, f[1], f[2], f[1]))
        end
    end
    if not dist.root() then c = cart.new(m, tonumber(shape[0]), tonumber(shape[1])) end
else
    local ids, all = selfstudy.init_ids(tok, template, corpus.text, opts.p)
    if opts.frozen >= #ids then fail(("--frozen %d must be below the %d init rows"):format(opts.frozen, #ids)) end
    c = cart.new(m, #ids, opts.frozen)
    if opts.init ~= "opening" then
        local reread = opts.init ~= "spread" and #all > c.p
            and require("cartridge.compact").reread_ids(tok, template, corpus.text) or {}
        if #all + #reread > m.config.n_ctx_train then
            fail(("--init %s prefills the whole corpus, %d tokens as a system message%s, and the model's context "
                .. "is %d: use --init opening, or a shorter corpus"):format(opts.init, #all,
                #reread > 0 and (" and %d more reading it again"):format(#reread) or "", m.config.n_ctx_train))
        end
    end
    if opts.init == "spread" then
        if dist.root() then selfstudy.init_spread(m, c, all) end
        print(("cartridge initialized from %d of the %d rows of the corpus in context (its %d tokens in a system "
            .. "message), spread evenly: p = %d rows/layer x %d layers"):format(c.p, #all, corpus.n_tokens, c.p,
            c.n_layer))
    elseif (opts.init == "evict" or opts.init == "compact") and #all > c.p then
        local info = { seconds = 0, error = 0 }
        if dist.root() then
            local compact = require("cartridge.compact")
            info = compact.fill(m, c, all, compact.reread_ids(tok, template, corpus.text),
                opts.init == "compact" and "match" or "evict")
        end
        print(("cartridge initialized by %s from the %d rows of the corpus in context (its %d tokens in a system "
            .. "message): p = %d rows/layer x %d layers, in %.1f s (attention output error on re-reading %.3f)")
            :format(opts.init == "compact" and "attention matching" or "eviction", #all, corpus.n_tokens, c.p,
            c.n_layer, info.seconds, info.error))
    else
        if dist.root() then c:capture(m, ids) end
        print(("cartridge initialized from the corpus opening: p = %d rows/layer x %d layers"):format(c.p, c.n_layer))
    end
end
for l = 0, c.n_layer - 1 do
    for which = 0, 1 do dist.broadcast(c:rows(l, which), c.p * c.row * 4, 0) end
end
training.p, training.frozen = c.p, c.frozen
if opts.draft_ref then
    if draft_ref then
        print(("draft reference kept from the resumed artifact: %d tokens"):format(#draft_ref))
    else
        draft_ref = corpus.ids
        print(("draft reference embedded: %d corpus tokens"):format(#draft_ref))
    end
end

-- The rows of every rank are the same bits (the same gradient, the same
-- Adam step): checked at every checkpoint and at the end.
local function check_rows(step)
    if dist.size == 1 then return end
    local h
    for l = 0, c.n_layer - 1 do
        for which = 0, 1 do h = dist.hash(c:rows(l, which), c.p * c.row * 4, h) end
    end
    dist.agree({ { ("cartridge after step %d"):format(step), h } }, "the ranks computed different bits from the "
        .. "same data: are they running the same build of cartridge? (cartridge --version on every host)")
end

local tr = cartridge.trainer.new(m, { recompute = opts.checkpoint })
local opt = cartridge.adam.new(c, { lr = opts.lr })
local interviews = selfstudy.interviews(m, tok, corpus, {
    chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a,
    top_k = opts.top_k, seed = opts.seed, template = template, teacher_pass = opts.teacher_pass, trainer = tr,
    spec_b = opts.spec_b, seeds = opts.seeds, turns = opts.turns,
})
local stepper = selfstudy.stepper(tr, c, opts.accum, dist)
local first, last = selfstudy.share(opts.accum, dist.rank, dist.size) -- this rank's conversations of each step

-- The metrics of the artifact at --save are <stem>.metrics.jsonl, and
-- always describe the rows beside them: the run appends its lines to
-- <stem>.metrics.jsonl.partial as it goes, and each save that succeeds
-- writes everything so far to <stem>.metrics.jsonl (atomically). A run that
-- stops before its first save leaves the earlier artifact's metrics as
-- they were.
local metrics, metrics_path, metrics_live, metrics_failed
local metrics_lines = {}
local function record(t)
    if not dist.root() then return end
    local line = json.encode(t) .. "\n"
    metrics_lines[#metrics_lines + 1] = line
    local ok, err = metrics:write(line)
    if ok then ok, err = metrics:flush() end
    if not ok and not metrics_failed then
        metrics_failed = true
        io.stderr:write(("selfstudy: cannot append to %s (%s); the lines are kept in memory and written with the "
            .. "cartridge\n"):format(metrics_live, tostring(err)))
    end
end

-- Bytes a save of the rows takes: the tensors, the draft reference, and a
-- margin for the header (tensor table and metadata) and the metrics.
local function save_bytes()
    local n = c:bytes() + (draft_ref and 8 * #draft_ref or 0) + 65536
    for _, line in ipairs(metrics_lines) do n = n + #line end
    return n
end

-- nil when the filesystem of path has room for a save, else why not
local function no_room(path)
    local free, need = fs.free_bytes(path), save_bytes()
    if free >= need then return nil end
    return ("its filesystem has %s free, and the cartridge needs %s (%d rows x %d layers, f32, with its "
        .. "metrics)"):format(fmt.bytes(free), fmt.bytes(need), c.p, c.n_layer)
end

if dist.root() then
    fs.mkdirs(fs.parent(opts.save))
    fs.sweep_temps(opts.save) -- what a killed earlier run left beside the artifact
    metrics_path = opts.save:gsub("%.safetensors$", "") .. ".metrics.jsonl"
    metrics_live = metrics_path .. ".partial"
    -- before any work: none is ever written over a device, FIFO,
    -- directory or symbolic link, and the cartridge fits the disk
    fs.check_output(opts.save)
    fs.check_output(metrics_path)
    fs.check_output(metrics_live)
    local why = no_room(opts.save)
    if why then
        error(("selfstudy: --save %s: %s; free space there or save elsewhere, before the run rather than after it")
            :format(opts.save, why), 0)
    end
    metrics = assert(io.open(metrics_live, "w"))
end
record({ event = "start", settings = training })

-- rank 0 writes (atomically: a temporary file, fsynced, renamed), then the
-- metrics so far beside it; `step` is the number of optimizer steps in the
-- rows. Returns true, or false and why (nothing at path changed then).
local function save(path, step)
    if not dist.root() then return true end
    local why = no_room(path)
    if why then return false, why end
    local ok, err = pcall(c.save, c, path, m, { training = training, draft_reference = draft_ref,
        extra_meta = { ["cartridge.step"] = step } })
    if not ok then return false, err end
    local metrics_for = path:gsub("%.safetensors$", "") .. ".metrics.jsonl"
    ok, err = pcall(fs.write_atomic, metrics_for, table.concat(metrics_lines))
    if not ok then
        io.stderr:write(("selfstudy: the cartridge is saved to %s, but its metrics are not (%s); they are in %s\n")
            :format(path, err, metrics_live))
    end
    return true
end


-- held-out: a conversation of its own, (seed, step 0), never trained on;
-- rank 0 makes and scores it
local heldout, heldout_before
if dist.root() then
    heldout = interviews:group({ { 0, 1 } })[1]
    print("held-out question: " .. heldout.question:gsub("\n", " "))
    heldout_before = selfstudy.eval_loss(tr, c, heldout)
    print(("held-out distill loss before training: %.4f"):format(heldout_before))
    record({ event = "heldout_before", loss = heldout_before })
end

-- exact-match accuracy on --qa: bare and ICL once, the cartridge as it
-- trains (rank 0 alone; the others wait at the next step's collectives).
-- right/total: the first phrasing (make_facts.lua's files; a file without
-- phrasings is all first); held-out and reverse beside it when the file has
-- them, as "sets".
local qa, facts
local function score_sets(arm)
    local out, first = {}, nil
    for _, set in ipairs(facts.PHRASING_SETS) do
        local list = facts.select(qa, set)
        if #list > 0 then
            local right, total = facts.accuracy(m, list, { cartridge = arm.cartridge, system = arm.system, max_a = 32 })
            out[set] = { right = right, total = total }
            first = first or out[set]
        end
    end
    return out, out.first or first
end
local function sets_text(sets)
    local parts = {}
    for _, set in ipairs(facts.PHRASING_SETS) do
        if sets[set] then parts[#parts + 1] = ("%s %d/%d"):format(set, sets[set].right, sets[set].total) end
    end
    return table.concat(parts, ", ")
end
local function score_qa(step)
    local t0 = C.cart_now_seconds()
    local sets, first = score_sets({ cartridge = c })
    print(("step %3d (%d conversations): cartridge answers %s of %s (%.1f s)"):format(step, step * opts.accum,
        sets_text(sets), opts.qa, C.cart_now_seconds() - t0))
    record({ event = "qa", step = step, conversations = step * opts.accum, right = first.right, total = first.total,
        sets = sets })
end
if opts.qa and dist.root() then -- only rank 0's host needs the file
    facts = require("cartridge.facts")
    qa = facts.read_qa(opts.qa)
    local bare, bare_first = score_sets({})
    local icl, icl_first = score_sets({ system = (answering.icl_text(corpus, tok, opts.icl_max)) })
    print(("qa: %d questions; bare %s; ICL %s"):format(#qa, sets_text(bare), sets_text(icl)))
    record({ event = "qa_reference", bare = bare_first.right, icl = icl_first.right, total = icl_first.total,
        sets = { bare = bare, icl = icl } })
    score_qa(0)
end

local bar = dist.root() and progress.new(opts.steps, "self-study")
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
-- The final save: at --save, or where there is room when it fails there, so
-- that a run is never lost to a full disk. Raises after a rescue, naming
-- where the rows are and how to finish.
local function save_final(step)
    local ok, why = save(opts.save, step)
    if ok then return end
    local base = opts.save:match("([^/]+)$"):gsub("%.safetensors$", "")
    local rescue = ("%s/%s.rescued-%s.safetensors"):format(os.getenv("TMPDIR") or "/tmp", base,
        os.date("%Y%m%d-%H%M%S"))
    local saved, why2 = save(rescue, step)
    if saved then
        error(("selfstudy: could not save the cartridge to %s (%s), so the trained rows are in %s: move it "
            .. "there once there is room (mv %s %s), or continue with --resume %s"):format(opts.save, why, rescue,
            rescue, opts.save, rescue), 0)
    end
    error(("selfstudy: could not save the cartridge to %s (%s), nor to %s (%s); %s"):format(opts.save, why, rescue,
        why2, kept()), 0)
end
local function clear() if bar then bar:clear() end end
local steps_per_group = math.floor(gen_batch / opts.accum)
local pending, answer_tokens = {}, 0
local train_started = C.cart_now_seconds()
for step = 1, opts.steps do
    local t0 = C.cart_now_seconds()
    if (step - 1) % steps_per_group == 0 then
        -- this rank's share of the next steps, as one lockstep group, never
        -- more than the remaining steps need
        local keys = {}
        for s = step, math.min(step + steps_per_group - 1, opts.steps) do
            for i = first, last do keys[#keys + 1] = { s, i } end
        end
        pending = interviews:group(keys)
    end
    local batch = {}
    for i = 1, last - first + 1 do batch[i] = table.remove(pending, 1) end
    local loss, tokens = stepper:step(batch)
    -- a non-finite loss or gradient stops the run before the update, so the
    -- rows and the last checkpoint on disk stay as they were (every rank has
    -- the same loss and gradient, so every rank stops here)
    local bad = loss ~= loss or loss == math.huge or loss == -math.huge
    if bad or C.cart_cartridge_check_finite(c.handle, 1) ~= 0 then
        clear()
        local last_kept = kept()
        fail(("step %d: the %s is not finite (%s); stopping before the update: %s. Lower --lr, or check the "
            .. "model and corpus"):format(step, bad and "distill loss" or "gradient",
            bad and tostring(loss) or require("cartridge.core").last_error(), last_kept))
    end
    opt:step()
    if C.cart_cartridge_check_finite(c.handle, 0) ~= 0 then
        clear()
        fail(("step %d: the update made the cartridge rows non-finite (%s); stopping: %s. Lower --lr"):format(step,
            require("cartridge.core").last_error(), kept()))
    end
    answer_tokens = answer_tokens + tokens
    local dt = C.cart_now_seconds() - t0
    clear()
    -- the rate so far (generation groups make single steps uneven) and the
    -- clock time the last step should end at
    local so_far = C.cart_now_seconds() - train_started
    local left = so_far / step * (opts.steps - step)
    print(("step %3d/%d: distill loss %.4f (%d answer tokens so far, %.1f s); %.1f conversations/min, done at %s")
        :format(step, opts.steps, loss, answer_tokens, dt, step * opts.accum / so_far * 60,
            os.date("%H:%M:%S", os.time() + math.floor(left + 0.5))))
    io.stdout:flush()
    local rec = { step = step, steps = opts.steps, loss = loss, answer_tokens = answer_tokens, seconds = dt,
        lr = opts.lr, conversations = step * opts.accum }
    if dist.size > 1 then
        -- rank 0's seconds in the step's collectives: waiting for the others, then the sum
        rec.wait_seconds, rec.sum_seconds = stepper.waited, stepper.summed
    end
    record(rec)
    if opts.save_every > 0 and step % opts.save_every == 0 and step < opts.steps then
        check_rows(step)
        local ok, why = save(opts.save, step)
        if ok then
            last_saved = step
            print(("checkpoint saved to %s (step %d)"):format(opts.save, step))
        else
            clear()
            io.stderr:write(("selfstudy: checkpoint of step %d not saved to %s: %s; the run goes on, and the next "
                .. "save tries again\n"):format(step, opts.save, why))
        end
    end
    if heldout and opts.heldout_every > 0 and step % opts.heldout_every == 0 and step < opts.steps then
        local loss_now = selfstudy.eval_loss(tr, c, heldout)
        clear()
        print(("step %3d: held-out distill loss %.4f"):format(step, loss_now))
        record({ event = "heldout", step = step, loss = loss_now })
    end
    if qa and opts.qa_every > 0 and step % opts.qa_every == 0 and step < opts.steps then
        clear()
        score_qa(step)
    end
    if bar then bar:update(step) end
end
if bar then bar:finish() end
if qa then score_qa(opts.steps) end
check_rows(opts.steps)
local empty = 0
for _, r in ipairs(dist.allgather_doubles({ interviews.stats.empty_questions })) do empty = empty + r[1] end
stepper:free()

local elapsed = C.cart_now_seconds() - train_started
local conversations = opts.steps * opts.accum
print(("self-study: %d conversations, %d supervised answer tokens, %.1f min (%.1f s/conversation)"):format(
    conversations, answer_tokens, elapsed / 60, elapsed / conversations))
if not dist.root() then return end
local heldout_after = selfstudy.eval_loss(tr, c, heldout)
print(("held-out distill loss after training: %.4f (before %.4f)"):format(heldout_after, heldout_before))
record({ event = "heldout_after", loss = heldout_after })
if empty > 0 then
    print(("note: bot A wrote no usable question %d times; those conversations asked the seed instruction itself")
        :format(empty))
end
metrics:close()
save_final(opts.steps)
os.remove(metrics_live)
print("cartridge saved to " .. opts.save)
if opts.ask then
    print(("cartridge: p = %d rows/layer x %d layers, %s of f16 KV served (%s as trained and saved, f32)"):format(
        c.p, c.n_layer, cartridge.fmt.bytes(m:kv_bytes(c.p, "f16")), cartridge.fmt.bytes(c:bytes())))
    answering.print_three({ model = m, cartridge = c, question = opts.ask, expected = opts.expect, max_a = opts.max_a,
        corpus = corpus,
        icl_max = opts.icl_max })
end
io.stderr:write(("(total %.1f s; metrics in %s)\n"):format(C.cart_now_seconds() - started, metrics_path))
