-- eval_facts.lua: the reading task's figures, by the fixed protocol
-- (lua/cartridge/protocol.lua): the README's self-study settings on the
-- report documents (seeds 2001-2020), which nothing was tuned on.
--
--   cartridge run recipes/eval_facts.lua --model models/reader.gguf
--   cartridge run recipes/eval_facts.lua --docs tuning      # seeds 1001-1010, for choosing settings
--
-- For each document: make_facts.lua's document and questions, self-study at
-- p = n/8 for 400 conversations, then bare, ICL and the cartridge answer
-- every question (recipes/report.lua's scoring), per phrasing set: first
-- (the form bot A writes), held-out (phrasings 2 and 3, never written by
-- bot A, so never trained on) and reverse. Prints one line per document,
-- then per arm and set the mean, min and max accuracy over documents, the
-- 95% interval of the mean (Student's t over documents), and the
-- cartridge's pooled accuracy as a fraction of ICL's. --out DIR keeps each
-- document, its cartridge and self-study's log; --json adds every figure.
local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local protocol = require("cartridge.protocol")
local facts = require("cartridge.facts")
local selfstudy = require("cartridge.selfstudy")
local answering = require("cartridge.answering")
local corpus_mod = require("cartridge.corpus")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local fs = require("cartridge.fs")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Score bare, ICL and self-study cartridges on the report documents of the reading task.",
    flags = {
        { "model", help = "GGUF model (default: models/reader.gguf)" },
        { "docs", default = "report", help = "report (seeds 2001-2020), tuning (1001-1010), or FIRST-LAST" },
        { "facts", type = "int", default = 40, help = "facts per document" },
        { "conversations", type = "int", default = protocol.SETTINGS.conversations, help = "self-study conversations per document" },
        { "fraction", type = "number", default = protocol.SETTINGS.fraction, help = "p = n / this" },
        { "init", default = protocol.SETTINGS.init, help = "self-study's --init" },
        { "seed", type = "int", default = 42, help = "self-study's seed" },
        { "lr", type = "number", default = protocol.SETTINGS.lr, help = "self-study's --lr" },
        { "turns", type = "int", default = protocol.SETTINGS.turns, help = "self-study's --turns" },
        { "accum", type = "int", default = protocol.SETTINGS.accum, help = "self-study's --accum (conversations per optimizer step)" },
        { "seeds", default = protocol.SETTINGS.seeds, help = "self-study's --seeds (bot A's instructions)" },
        { "out", help = "keep documents, cartridges and logs here (default: a temporary directory, removed)" },
        { "json", type = "boolean", help = "also print every figure as JSON" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
    },
})
local function fail(msg) error("eval_facts: " .. msg, 0) end
local first, last = protocol.docs_range(opts.docs, "eval_facts")
if opts.accum < 1 or opts.conversations < opts.accum or opts.conversations % opts.accum ~= 0 then
    fail("--conversations must be a multiple of --accum")
end

cartridge.set_threads(opts.threads)
local model_path = opts.model or (cartridge.root .. "/models/reader.gguf")
local m = cartridge.model.load(model_path)
local tok, T = m:tokenizer(), chat.for_model(m)
local tmp = not opts.out and os.tmpname() or nil
local dir = opts.out or (tmp .. ".d")
fs.mkdirs(dir)

local ARMS = { "bare", "ICL", "cartridge" }
local per = {} -- per[arm][set] = { fractions per document }, pooled right and total
for _, a in ipairs(ARMS) do
    per[a] = {}
    for _, s in ipairs(facts.PHRASING_SETS) do per[a][s] = { xs = {}, right = 0, total = 0 } end
end
local docs_out = {}
print(("documents %d-%d (%s), %d facts each; self-study at p = n/%g, %d conversations, --init %s, --lr %g, "
    .. "--turns %d, --seeds %s; model %s"):format(first, last, opts.docs, opts.facts, opts.fraction,
    opts.conversations, opts.init, opts.lr, opts.turns, opts.seeds, model_path))
local started = C.cart_now_seconds()
for seed = first, last do
    local d = facts.document(seed, opts.facts)
    local ddir = ("%s/%d"):format(dir, seed)
    fs.mkdirs(ddir)
    local doc = ddir .. "/doc.md"
    fs.write_atomic(doc, d.text)
    local qa = facts.questions(d)
    local corpus = corpus_mod.load({ doc }, tok)
    local _, all = selfstudy.init_ids(tok, T, corpus.text, 16)
    local p = protocol.p_of(#all, opts.fraction)
    local t0 = C.cart_now_seconds()
    local args = protocol.selfstudy_args(model_path, doc, corpus.n_tokens, p, { conversations = opts.conversations,
        init = opts.init, seed = opts.seed, threads = opts.threads, lr = opts.lr, turns = opts.turns,
        seeds = opts.seeds, accum = opts.accum })
    local c = cartridge.cart.load(protocol.run_selfstudy(args, ddir .. "/cartridge.safetensors"), m)
    local train_s = C.cart_now_seconds() - t0
    local row = { seed = seed, n = #all, p = p, train_seconds = train_s, arms = {} }
    local line = { ("doc %d: n %d, p %d, %.0f s;"):format(seed, #all, p, train_s) }
    local icl_text = answering.icl_text(corpus, tok, m.config.n_ctx_train)
    for _, a in ipairs(ARMS) do
        local arm = { cartridge = a == "cartridge" and c or nil, system = a == "ICL" and icl_text or nil }
        local cells = {}
        row.arms[a] = {}
        for _, s in ipairs(facts.PHRASING_SETS) do
            local list = facts.select(qa, s)
            if #list > 0 then
                local right, total = facts.accuracy(m, list, { cartridge = arm.cartridge, system = arm.system })
                local acc = per[a][s]
                acc.xs[#acc.xs + 1] = right / total
                acc.right, acc.total = acc.right + right, acc.total + total
                cells[#cells + 1] = ("%d/%d"):format(right, total)
                row.arms[a][s] = { right = right, total = total }
            end
        end
        line[#line + 1] = ("%s %s"):format(a, table.concat(cells, " "))
    end
    c:free()
    print(table.concat(line, " "))
    docs_out[#docs_out + 1] = row
end

print(("\n%d documents in %.1f min; accuracy over documents (first: the phrasing bot A writes; held-out: "
    .. "phrasings 2 and 3; reverse: who has the value):"):format(#docs_out, (C.cart_now_seconds() - started) / 60))
print(("%-10s %-9s %7s %7s %7s %16s %10s"):format("arm", "set", "mean", "min", "max", "95% interval", "x ICL"))
local summary = {}
for _, a in ipairs(ARMS) do
    summary[a] = {}
    for _, s in ipairs(facts.PHRASING_SETS) do
        local acc = per[a][s]
        if #acc.xs > 0 then
            local r = protocol.summary(acc.xs)
            local icl = per.ICL[s]
            r.pooled = acc.right / acc.total
            r.of_icl = icl.right > 0 and (acc.right / acc.total) / (icl.right / icl.total) or nil
            summary[a][s] = r
            print(("%-10s %-9s %6.1f%% %6.1f%% %6.1f%% %16s %10s"):format(a, s, 100 * r.mean, 100 * r.min, 100 * r.max,
                r.half and ("%.1f-%.1f%%"):format(100 * math.max(0, r.mean - r.half), 100 * math.min(1, r.mean + r.half)) or "-",
                r.of_icl and ("%.2f"):format(r.of_icl) or "-"))
        end
    end
end
if tmp then
    for seed = first, last do
        local ddir = ("%s/%d"):format(dir, seed)
        for _, f in ipairs(fs.list(ddir)) do os.remove(ddir .. "/" .. f) end
        os.remove(ddir)
    end
    os.remove(dir)
    os.remove(tmp)
end
if opts.json then print(json.encode({ documents = docs_out, summary = summary })) end
