-- report_fleet.lua: a fleet's quality, measured against a monolithic
-- cartridge and the right document in context.
--
--   cartridge run recipes/fleet.lua --corpus docs/ --fleet out/fleet --p 128 --rounds 64
--   cartridge run recipes/selfstudy.lua --corpus docs/ --p 1024 --steps 64 --save out/mono.safetensors
--   cartridge run recipes/report_fleet.lua --corpus docs/ --fleet out/fleet --mono out/mono.safetensors
--
-- For every document, --heldout conversations are made from that document
-- as self-study makes them (keys (0, j): never trained on by the fleet,
-- whose rounds start at 1), and each conversation's answer is scored -- the
-- mean distillation loss against the teacher that had the chunk in context
-- -- behind:
--   bare        BOS alone
--   monolithic  one cartridge trained on all the documents (--mono; give it
--               the fleet's total rows and conversations for a fair arm)
--   retrieval   the fleet's cartridges retrieval picks for the question
--               (--rag-docs among the documents of the --rag-chunks best chunks)
--   oracle      the fleet's cartridge of the conversation's document
--   ICL         the conversation's whole document in context (at most
--               --icl-max tokens), as a captured prefix: the same rows a
--               prefill gives (recipes/equiv.lua)
-- Lower is better. The table shows each arm's mean, and the share of the
-- bare -> ICL gap it closes. Retrieval's top-1 accuracy is how often its
-- best document is the conversation's own.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local fleet = require("cartridge.fleet")
local retrieval = require("cartridge.retrieval")
local selfstudy = require("cartridge.selfstudy")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local cart = cartridge.cart
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Held-out loss of a fleet (oracle and retrieval) against a monolithic cartridge and ICL.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "the fleet's documents (as recipes/fleet.lua was given them)" },
        { "fleet", metavar = "DIR", help = "the fleet directory" },
        { "mono", help = "a monolithic cartridge trained on the same documents (optional arm)" },
        { "heldout", type = "int", default = 2, help = "held-out conversations per document" },
        { "rag-docs", type = "int", default = 2, help = "documents retrieval composes" },
        { "rag-chunks", type = "int", default = 8, help = "best chunks whose documents are considered" },
        { "icl-max", type = "int", default = 4096, help = "document tokens in the ICL arm at most" },
        { "json", type = "boolean", help = "print the results as JSON too" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        require("cartridge.cart").FOREIGN_FLAG,
        unpack(selfstudy.flags()),
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

local function fail(msg) error("report_fleet: " .. msg, 0) end
if not opts.fleet then fail("--fleet DIR is required") end
if opts.heldout < 1 then fail("--heldout must be at least 1") end
selfstudy.check_flags(opts, fail)
cartridge.set_threads(opts.threads)
local m = cartridge.model.load(defaults.pick_model(opts.model))
print(m:describe())
local tok = m:tokenizer()
local template = chat.for_model(m)
local dir = opts.fleet
local man = fleet.read_manifest(dir)
fleet.check_model(m, dir, man)
local docs = fleet.documents(opts.corpus, tok)
for i, d in ipairs(docs) do
    if not man.docs[i] or man.docs[i].name ~= d.name or #docs ~= #man.docs then
        fail(("--corpus must give the fleet's documents in order: %s holds %s"):format(dir, fleet.names(man)))
    end
end
local index = retrieval.load(fleet.join(dir, fleet.INDEX), m, #docs)
local tr = cartridge.trainer.new(m)

-- the fixed prefixes
local bos = cart.new(m, 1, 0)
bos:capture(m, { tok.bos or 0 })
local mono = opts.mono and cart.load(opts.mono, m) or nil
local fleet_rows = 0
for _, d in ipairs(man.docs) do fleet_rows = fleet_rows + d.rows end
print(("fleet: %d documents, %d rows in all%s"):format(#docs, fleet_rows,
    mono and (", monolithic cartridge p = %d"):format(mono.p) or ""))

local ARMS = { "bare", "monolithic", "retrieval", "oracle", "ICL" }
local sums, count, right = {}, 0, 0
for _, a in ipairs(ARMS) do sums[a] = 0 end
local rows = {} -- per conversation, for --json
local t0 = C.cart_now_seconds()
for i, d in ipairs(docs) do
    local interviews = selfstudy.interviews(m, tok, d.corpus, { chunk_min = opts.chunk_min, chunk_max = opts.chunk_max,
        max_q = opts.max_q, max_a = opts.max_a, top_k = opts.top_k, seed = opts.seed, template = template,
        seeds = opts.seeds, turns = opts.turns })
    local keys = {}
    for j = 1, opts.heldout do keys[j] = { 0, j } end
    local convos = interviews:group(keys)
    local own = cart.load(fleet.join(dir, man.docs[i].cart_file), m)
    local icl_ids = selfstudy.init_ids(tok, template, d.corpus.text, opts.icl_max)
    local icl = cart.new(m, #icl_ids, 0)
    icl:capture(m, icl_ids)
    for _, cv in ipairs(convos) do
        local hits = index:top_docs(index:query(m, cv.question), opts.rag_chunks, opts.rag_docs)
        local parts, picked = {}, {}
        for k, h in ipairs(hits) do
            parts[k] = cart.load(fleet.join(dir, man.docs[h.doc].cart_file), m)
            picked[k] = man.docs[h.doc].name
        end
        if hits[1].doc == i then right = right + 1 end
        local composed = cart.compose(parts)
        local loss = {
            bare = selfstudy.eval_loss(tr, bos, cv),
            monolithic = mono and selfstudy.eval_loss(tr, mono, cv) or nil,
            retrieval = selfstudy.eval_loss(tr, composed, cv),
            oracle = selfstudy.eval_loss(tr, own, cv),
            ICL = selfstudy.eval_loss(tr, icl, cv),
        }
        composed:free()
        for _, c in ipairs(parts) do c:free() end
        for _, a in ipairs(ARMS) do sums[a] = sums[a] + (loss[a] or 0) end
        count = count + 1
        rows[#rows + 1] = { document = d.name, question = cv.question, retrieved = picked, loss = loss }
    end
    own:free()
    icl:free()
end

print(("%d held-out conversations (%d per document), scored in %.1f s"):format(count, opts.heldout,
    C.cart_now_seconds() - t0))
local mean = {}
for _, a in ipairs(ARMS) do mean[a] = sums[a] / count end
print(("%-12s %12s %14s"):format("arm", "held-out loss", "gap closed"))
for _, a in ipairs(ARMS) do
    if a ~= "monolithic" or mono then
        local gap = mean.bare - mean.ICL
        print(("%-12s %12.4f %13.1f%%"):format(a, mean[a], gap ~= 0 and 100 * (mean.bare - mean[a]) / gap or 0))
    end
end
print(("retrieval top-1 accuracy: %d/%d (%.1f%%)"):format(right, count, 100 * right / count))
if mono then
    print(("fleet (oracle) vs monolithic: %+.4f; oracle vs ICL: %+.4f"):format(mean.oracle - mean.monolithic,
        mean.oracle - mean.ICL))
end
if opts.json then
    print(json.encode({ arms = mean, top1 = right / count, conversations = json.array(rows) }))
end
bos:free()
if mono then mono:free() end
tr:free()
