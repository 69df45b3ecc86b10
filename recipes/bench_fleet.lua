-- bench_fleet.lua: what a fleet costs at the Qwen3-0.6B shape: seconds per
-- self-study conversation with the target's cartridge alone and co-loaded
-- with distractors, the retrieval index's seconds per chunk, and the answer
-- latency behind 1 and 2 composed cartridges.
--
--   cartridge run recipes/bench_fleet.lua                    # generates the model once (~1.2 GB)
--   cartridge run recipes/bench_fleet.lua --model models/default.gguf --rounds 1
--
-- Budgets default to the reference's fleet demo: p 256, chunks 256-512,
-- max-q 64, max-a 160, accum 4. The documents are the first three files of
-- --corpus, initialized as recipes/fleet.lua does into a scratch directory.
-- Each arm trains --rounds rounds of the first document as the target:
-- alone, then composed with one and with two distractors (the rows behind
-- the conversations grow from p to 2p and 3p). The index embeds the first
-- --index-chunks chunks of --embed-chunk tokens. Serving maps the
-- cartridges from disk, composes them and answers one question greedily
-- with --answer tokens (no stop), bare first for reference.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local fleet = require("cartridge.fleet")
local retrieval = require("cartridge.retrieval")
local selfstudy = require("cartridge.selfstudy")
local answering = require("cartridge.answering")
local chat = require("cartridge.chat")
local fs = require("cartridge.fs")
local cart = cartridge.cart
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Fleet training, index and serving speed at the Qwen3-0.6B shape.",
    flags = {
        { "model", help = "GGUF (default: a generated random Qwen3-0.6B-shaped f16 model)" },
        { "corpus", repeatable = true, default = { "README.md", "docs" }, help = "documents (the first three are used)" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "p", type = "int", default = 256, help = "cartridge rows per document" },
        { "rounds", type = "int", default = 2, help = "rounds per arm" },
        { "accum", type = "int", default = 4, help = "conversations per round" },
        { "chunk-min", type = "int", default = 256, help = "shortest chunk" },
        { "chunk-max", type = "int", default = 512, help = "longest chunk" },
        { "max-q", type = "int", default = 64, help = "bot A budget" },
        { "max-a", type = "int", default = 160, help = "bot B budget" },
        { "embed-chunk", type = "int", default = 256, help = "index chunk tokens" },
        { "index-chunks", type = "int", default = 4, help = "chunks embedded for the index timing" },
        { "answer", type = "int", default = 32, help = "tokens decoded per served answer" },
    },
})
local function fail(msg) error("bench_fleet: " .. msg, 0) end
if opts.rounds < 1 or opts.accum < 1 or opts.index_chunks < 1 or opts.answer < 1 then
    fail("--rounds, --accum, --index-chunks and --answer must be at least 1")
end
cartridge.set_threads(opts.threads)
local now = C.cart_now_seconds

local path = require("cartridge.defaults").bench_model(opts.model, "bench_fleet")
local m = cartridge.model.load(path)
print(m:describe() .. (", %d threads"):format(cartridge.threads()))
local tok = m:tokenizer()
local template = chat.for_model(m)
local all = fleet.documents(opts.corpus, tok)
if #all < 3 then fail("--corpus must give at least three documents") end
local docs = { all[1], all[2], all[3] }
local dir = os.tmpname()
os.remove(dir)
fs.mkdirs(dir)

-- the fleet: three corpus-init cartridges
local t0 = now()
local man = fleet.init(m, dir, docs, { p = opts.p, frozen = 1, template = template })
print(("init: %d cartridges of p = %d (%s each), %.2f s/document"):format(#docs, opts.p,
    cartridge.fmt.bytes(m.config.n_layer * 2 * opts.p * m.config.n_head_kv * m.config.head_dim * 4),
    (now() - t0) / #docs))

-- training: the first document as the target, alone and co-loaded
local mgr = fleet.manager(m, dir, man, { budget = 3, lr = 2e-3, warmup = 1, rotate_every = 0, evict_frac = 0.5 })
mgr:restore()
local tr = cartridge.trainer.new(m)
local interviews = selfstudy.interviews(m, tok, docs[1].corpus, { chunk_min = opts.chunk_min, chunk_max = opts.chunk_max,
    max_q = opts.max_q, max_a = opts.max_a, top_k = 20, seed = 42, template = template })
local round = 0
for _, parts in ipairs({ { 1 }, { 1, 2 }, { 3, 1, 2 } }) do
    local synth_s, train_s = 0, 0
    for _ = 1, opts.rounds do
        round = round + 1
        local keys = {}
        for j = 1, opts.accum do keys[j] = { round, j } end
        local t1 = now()
        local convos = interviews:group(keys)
        local t2 = now()
        fleet.train_round(mgr, tr, { target = 1, parts = parts }, convos, opts.accum)
        synth_s, train_s = synth_s + (t2 - t1), train_s + (now() - t2)
    end
    local n = opts.rounds * opts.accum
    print(("training %-12s: %.1f s/conversation (synthesis %.1f, distillation behind %d rows %.1f) over %d conversations")
        :format(#parts == 1 and "isolated    " or ("co-loaded x%d"):format(#parts), (synth_s + train_s) / n,
        synth_s / n, opts.p * #parts, train_s / n, n))
end
mgr:checkpoint()
mgr:free()
tr:free()

-- the index: the first chunks of the first document
local first = docs[1].corpus.ids:sub(0, math.min(docs[1].corpus.n_tokens, opts.embed_chunk * opts.index_chunks))
t0 = now()
local index = retrieval.build(m, { { corpus = { ids = first, n_tokens = #first } } }, opts.embed_chunk)
local dt = now() - t0
print(("index: %d chunks of %d tokens in %.1f s (%.2f s/chunk)"):format(index.n, opts.embed_chunk, dt, dt / index.n))

-- serving: bare, then behind 1 and 2 composed cartridges mapped from disk
local question = "What does this document explain, and how do I use it?"
local function timed(prefix, label)
    local r = answering.answer({ model = m, cartridge = prefix, question = question, max_a = opts.answer,
        ignore_eos = true })
    print(("serve %-11s: %.2f s for %d tokens (~%.1f tok/s, %d KV rows in front)"):format(label, r.seconds, #r.ids,
        r.tok_s, prefix and prefix.p or 0))
end
answering.answer({ model = m, question = question, max_a = 1 }) -- warm-up: first-touch costs out of the figures
timed(nil, "bare")
local a, b = cart.map(fleet.join(dir, man.docs[1].cart_file), m), cart.map(fleet.join(dir, man.docs[2].cart_file), m)
timed(cart.stack({ a }), "1 cartridge")
timed(cart.stack({ a, b }), "2 composed")
a:free()
b:free()
m:free()
require("cartridge.fs").remove_tree(dir)
