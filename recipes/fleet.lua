-- fleet.lua: one cartridge per document, trained together so that they
-- compose.
--
--   cartridge run recipes/fleet.lua --corpus docs/ --fleet out/fleet --p 256 --rounds 24
--   cartridge run recipes/fleet.lua --corpus docs/ --fleet out/fleet --resume --rounds 24
--   cartridge run recipes/fleet.lua --fleet out/fleet --ask "How do I install it?"
--
-- Each file is one document. The first run initializes a cartridge per
-- document from its own opening (as self-study does) and saves it; then each
-- round picks a target among the resident documents (in proportion to their
-- tokens), composes its cartridge alone (probability --p-iso) or with 1 to
-- --distract-max other residents' as distractors, in a shuffled order,
-- makes --accum self-study conversations from the target document, and
-- trains every part of the composition on them, each with its own Adam and a
-- learning rate that warms up over --warmup steps from the part's entry into
-- memory. At most --budget documents are resident; every --rotate-every
-- rounds the most-stepped half (--evict-frac) leaves for disk and the
-- least-stepped absent ones come in. Every run ends by building the
-- retrieval index (index.safetensors) from the model's own hidden states
-- over chunks of the documents; --rounds 0 only rebuilds it.
--
-- --ask Q: retrieval picks the documents (--rag-docs among the documents of
-- the --rag-chunks best chunks; --oracle NAME picks them instead), their
-- cartridges are mapped from disk and composed in front of the question,
-- and the answer prints beside the bare model's. See docs/fleet.md.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local fleet = require("cartridge.fleet")
local selfstudy = require("cartridge.selfstudy")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local fs = require("cartridge.fs")
local retrieval = require("cartridge.retrieval")
local answering = require("cartridge.answering")
local cart = cartridge.cart
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Train a fleet of per-document cartridges that compose.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "a document (UTF-8 text file), or a directory of .md documents (repeatable)" },
        { "fleet", metavar = "DIR", help = "the fleet directory (written by training)" },
        { "resume", type = "boolean", help = "continue the fleet in --fleet (the documents must match its manifest)" },
        { "rounds", type = "int", default = 20, help = "training rounds (one optimizer step of every part each)" },
        { "budget", type = "int", default = 4, help = "documents resident in memory at once (at most 64)" },
        { "rotate-every", type = "int", default = 10, help = "rounds between rotations (0: never rotate)" },
        { "evict-frac", type = "number", default = 0.5, help = "fraction of the residents evicted at a rotation" },
        { "warmup", type = "int", default = 8, help = "steps over which a part's learning rate ramps up after it enters" },
        { "p-iso", type = "number", default = 0.75, help = "probability that a round trains its target alone" },
        { "distract-max", type = "int", default = 3, help = "most distractor cartridges composed with the target" },
        { "save-every", type = "int", default = 0, help = "checkpoint every N rounds besides the rotations (0: at the end)" },
        { "embed-chunk", type = "int", default = 256, help = "tokens per chunk of the retrieval index" },
        { "ask", help = "answer this behind the cartridges retrieval picks from --fleet (no training)" },
        { "oracle", repeatable = true, metavar = "NAME", help = "with --ask: compose these documents' cartridges instead of retrieving (repeatable)" },
        { "rag-docs", type = "int", default = 2, help = "with --ask: most documents composed" },
        { "rag-chunks", type = "int", default = 8, help = "with --ask: best chunks whose documents are considered" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        -- self-study's, with the same meanings (--accum: conversations per round)
        require("cartridge.cart").FOREIGN_FLAG,
        unpack(selfstudy.flags({ p = 256 })),
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

local function fail(msg) error("fleet: " .. msg, 0) end
local launched = require("cartridge.dist").launched_size()
if launched > 1 then
    fail(("fleet.lua trains and serves in one process, and a launcher started %d copies, which would all write the "
        .. "same fleet: run it without mpirun (selfstudy.lua is the recipe that trains across processes)")
        :format(launched))
end
if not opts.fleet then fail("--fleet DIR is required (where the fleet is written, or read with --ask)") end
if #opts.oracle > 0 and not opts.ask then fail("--oracle picks the cartridges for --ask; pass --ask \"question\"") end
if opts.rag_docs < 1 or opts.rag_chunks < 1 then fail("--rag-docs and --rag-chunks must be at least 1") end
if opts.embed_chunk < 1 then fail("--embed-chunk must be at least 1") end
if opts.rounds < 0 then fail("--rounds must be at least 0") end
if opts.budget < 1 or opts.budget > fleet.MAX_BUDGET then
    fail(("--budget %d: it must be 1 to %d"):format(opts.budget, fleet.MAX_BUDGET))
end
if opts.rotate_every < 0 then fail("--rotate-every must be at least 0") end
if not (opts.evict_frac > 0 and opts.evict_frac <= 1) then fail("--evict-frac must be in (0, 1]") end
if opts.warmup < 1 then fail("--warmup must be at least 1 (1: no warm-up)") end
if not (opts.p_iso >= 0 and opts.p_iso <= 1) then fail("--p-iso must be in [0, 1]") end
if opts.distract_max < 0 then fail("--distract-max must be at least 0") end
selfstudy.check_flags(opts, fail)

cartridge.set_threads(opts.threads)
local started = C.cart_now_seconds()
local m = cartridge.model.load(defaults.pick_model(opts.model))
local tok = m:tokenizer()
print(m:describe())
local dir = opts.fleet

-- ---------------------------------------------------------------------------
-- Serve mode

if opts.ask then
    local man = fleet.read_manifest(dir)
    fleet.check_model(m, dir, man)
    local chosen = {}
    if #opts.oracle > 0 then
        for _, name in ipairs(opts.oracle) do
            local found = fleet.find(man, name)
            if not found then
                fail(("--oracle %s: no such document in %s (it holds %s)"):format(name, dir, fleet.names(man)))
            end
            chosen[#chosen + 1] = found
        end
        print(("oracle: %s"):format(table.concat(opts.oracle, ", ")))
    else
        local index = retrieval.load(fleet.join(dir, fleet.INDEX), m, #man.docs)
        local t0 = C.cart_now_seconds()
        local hits = index:top_docs(index:query(m, opts.ask), opts.rag_chunks, opts.rag_docs)
        local shown = {}
        for k, h in ipairs(hits) do
            chosen[k] = h.doc
            shown[k] = ("%s (%.3f)"):format(man.docs[h.doc].name, h.score)
        end
        print(("retrieved: %s (%.2f s)"):format(table.concat(shown, ", "), C.cart_now_seconds() - t0))
    end
    local parts = {}
    for k, i in ipairs(chosen) do parts[k] = cart.map(fleet.join(dir, man.docs[i].cart_file), m) end
    local prefix = cart.stack(parts)
    local r = answering.answer({ model = m, cartridge = prefix, question = opts.ask, max_a = opts.max_a })
    print(("[%d composed cartridge(s), %d KV rows] (%.2f s, ~%.1f tok/s)"):format(#parts, prefix.p, r.seconds, r.tok_s))
    print(r.text)
    local bare = answering.answer({ model = m, question = opts.ask, max_a = opts.max_a })
    print("[bare model, no context]")
    print(bare.text)
    for _, c in ipairs(parts) do c:free() end
    return
end

local docs = fleet.documents(opts.corpus, tok)
local total_tokens = 0
for _, d in ipairs(docs) do total_tokens = total_tokens + d.corpus.n_tokens end
print(("documents: %d, %d tokens"):format(#docs, total_tokens))

fs.mkdirs(dir)
local template = chat.for_model(m)
local settings = {
    model = m.path, accum = opts.accum, lr = opts.lr, budget = opts.budget, rotate_every = opts.rotate_every,
    evict_frac = opts.evict_frac, warmup = opts.warmup, p_iso = opts.p_iso, distract_max = opts.distract_max,
    chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, top_k = opts.top_k, max_q = opts.max_q,
    max_a = opts.max_a, seed = opts.seed, checkpoint = opts.checkpoint or false,
    teacher_pass = opts.teacher_pass or false, spec_b = opts.spec_b or false,
}

-- ---------------------------------------------------------------------------
-- The manifest: a new fleet (each document's cartridge initialized from its
-- own opening and saved at once), or the one being resumed

local man
local has_manifest = fs.kind(fleet.join(dir, fleet.MANIFEST)) ~= "missing"
if opts.resume then
    man = fleet.read_manifest(dir)
    if #man.docs ~= #docs then
        fail(("%s holds %d documents and --corpus gives %d; resume with the documents it was trained on"):format(dir,
            #man.docs, #docs))
    end
    for i, d in ipairs(docs) do
        if man.docs[i].name ~= d.name then
            fail(("document %d is %s in %s and %s in --corpus; resume with the documents it was trained on, in "
                .. "the same order"):format(i, man.docs[i].name, dir, d.name))
        end
        if man.docs[i].tokens ~= d.corpus.n_tokens then
            print(("note: %s is %d tokens now, %d when the fleet started"):format(d.name, d.corpus.n_tokens,
                man.docs[i].tokens))
            man.docs[i].tokens = d.corpus.n_tokens
        end
    end
    man.settings = json.object(settings)
    print(("fleet resumed from %s: %d documents, p = %d, %d rounds so far"):format(dir, #man.docs, man.p, man.rounds))
else
    if has_manifest then
        fail(("%s already holds a fleet; pass --resume to continue it, or choose an empty directory"):format(dir))
    end
    local t0 = C.cart_now_seconds()
    man = fleet.init(m, dir, docs, { p = opts.p, frozen = opts.frozen, settings = settings,
        embed_chunk = opts.embed_chunk, template = template })
    print(("fleet initialized in %s: %d cartridges of up to p = %d rows (%.2f s/document)"):format(dir, #docs, opts.p,
        (C.cart_now_seconds() - t0) / #docs))
end

-- ---------------------------------------------------------------------------
-- Training (none with --rounds 0)

local function names(list)
    local out = {}
    for k, i in ipairs(list) do out[k] = man.docs[i].name end
    return table.concat(out, ", ")
end

local function train()
    local mgr = fleet.manager(m, dir, man, { budget = opts.budget, lr = opts.lr, warmup = opts.warmup,
        rotate_every = opts.rotate_every, evict_frac = opts.evict_frac, log = print })
    mgr:restore()
    print(("resident: %s (budget %d)"):format(names(mgr:residents()), opts.budget))
    local tr = cartridge.trainer.new(m, { recompute = opts.checkpoint })
    local interviewers = {}
    local function interviews(i)
        interviewers[i] = interviewers[i] or selfstudy.interviews(m, tok, docs[i].corpus, {
            chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a,
            top_k = opts.top_k, seed = opts.seed, template = template, teacher_pass = opts.teacher_pass, trainer = tr,
            spec_b = opts.spec_b, seeds = opts.seeds, turns = opts.turns })
        return interviewers[i]
    end

    -- the held-out conversation: (seed, step 0) of the first document, never
    -- trained on, scored behind that document's cartridge alone
    local function heldout_loss(convo)
        local r = mgr.resident[1]
        local c = r and r.cart or cart.load(fleet.join(dir, man.docs[1].cart_file), m)
        local loss = selfstudy.eval_loss(tr, c, convo)
        if not r then c:free() end
        return loss
    end
    local heldout = interviews(1):group({ { 0, 1 } })[1]
    local before = heldout_loss(heldout)
    print(("held-out distill loss (%s, isolated) before: %.4f"):format(man.docs[1].name, before))

    local metrics = assert(io.open(fleet.join(dir, "fleet.metrics.jsonl"), "a"))
    local function record(t)
        metrics:write(json.encode(t), "\n")
        metrics:flush()
    end
    record({ event = "start", rounds = opts.rounds, from_round = man.rounds, settings = settings })

    local spent = { isolated = { 0, 0 }, ["co-loaded"] = { 0, 0 } } -- seconds, conversations
    local train_started = C.cart_now_seconds()
    for k = 1, opts.rounds do
        local round = man.rounds + 1
        local t0 = C.cart_now_seconds()
        local plan = fleet.plan(mgr, opts.seed, round, { p_iso = opts.p_iso, distract_max = opts.distract_max })
        local keys = {}
        for j = 1, opts.accum do keys[j] = { round, j } end
        local convos = interviews(plan.target):group(keys)
        local ok, loss = pcall(fleet.train_round, mgr, tr, plan, convos, opts.accum)
        if not ok then fail(("round %d: %s (the fleet on disk is its last checkpoint)"):format(round, loss)) end
        man.rounds = round
        local dt = C.cart_now_seconds() - t0
        local kind = plan.isolated and "isolated" or "co-loaded"
        spent[kind][1], spent[kind][2] = spent[kind][1] + dt, spent[kind][2] + opts.accum
        print(("round %d/%d: target doc %d (%s), %s, distill loss %.4f (%.1f s)"):format(k, opts.rounds,
            plan.target - 1, man.docs[plan.target].name,
            plan.isolated and "isolated" or ("co-loaded x%d"):format(#plan.parts), loss, dt))
        io.stdout:flush()
        record({ round = round, target = man.docs[plan.target].name, parts = names(plan.parts),
            isolated = plan.isolated, loss = loss, seconds = dt })
        local evicted, loaded = mgr:rotate()
        if evicted then
            print(("rotation after round %d: evicted %s; loaded %s"):format(round, names(evicted),
                #loaded > 0 and names(loaded) or "none"))
        elseif opts.save_every > 0 and k % opts.save_every == 0 and k < opts.rounds then
            mgr:checkpoint()
            print(("checkpoint: %s (round %d)"):format(dir, round))
        end
    end
    mgr:checkpoint()

    local elapsed = C.cart_now_seconds() - train_started
    local function per(kind)
        local s = spent[kind]
        return s[2] > 0 and ("%.1f s/conversation %s (%d)"):format(s[1] / s[2], kind, s[2]) or ("none " .. kind)
    end
    print(("fleet: %d rounds, %d conversations, %.1f min; %s, %s"):format(opts.rounds, opts.rounds * opts.accum,
        elapsed / 60, per("isolated"), per("co-loaded")))
    local after = heldout_loss(heldout)
    print(("held-out distill loss (%s, isolated) after: %.4f (before %.4f)"):format(man.docs[1].name, after, before))
    record({ event = "heldout", before = before, after = after })
    metrics:close()
    mgr:free()
    tr:free()
end
if opts.rounds > 0 then train() end

-- ---------------------------------------------------------------------------
-- The retrieval index

local t0 = C.cart_now_seconds()
local index = retrieval.build(m, docs, opts.embed_chunk)
index:save(fleet.join(dir, fleet.INDEX), m)
man.embed_chunk, man.embed_dim = opts.embed_chunk, index.dim
fleet.write_manifest(dir, man)
local dt = C.cart_now_seconds() - t0
print(("index: %d chunks of up to %d tokens from %d documents, %d dims, built in %.1f s (%.2f s/chunk)"):format(
    index.n, opts.embed_chunk, #docs, index.dim, dt, dt / index.n))

local steps = {}
for i, d in ipairs(man.docs) do steps[i] = d.steps end
print(("steps per document: %s (fleet round %d)"):format(table.concat(steps, "/"), man.rounds))
print("fleet saved to " .. dir)
io.stderr:write(("(total %.1f s)\n"):format(C.cart_now_seconds() - started))
