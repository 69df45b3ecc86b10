-- compare.lua: what a cartridge knows beside every cheaper way to shrink the
-- context to the same KV memory.
--
--   cartridge run recipes/make_facts.lua --seed 2001 --out out/f2001
--   cartridge run recipes/compare.lua --model models/reader.gguf --corpus out/f2001/doc.md \
--       --qa out/f2001/qa.jsonl --png out/f2001/compare.png
--
-- For p = n/32, n/16, n/8 and n/4 rows (--fractions; n = the corpus's tokens
-- as the cartridge's system block), each method builds a p-row cache and
-- answers the questions of --qa (make_facts.lua's), scored per phrasing set
-- (first: the form bot A writes; held-out: phrasings 2 and 3; reverse):
--
--   opening   the corpus's first p tokens (selfstudy --init opening, untrained)
--   spread    p tokens spread evenly over it (--init spread, untrained)
--   evict     per KV head, the p rows the model attends to most when it
--             reads the corpus again (SnapKV/H2O-style; engine/compact.h)
--   compact   those keys with values fitted by least squares so that the
--             attention outputs match (attention matching; no training)
--   selfstudy self-study with the README's settings but from --init
--             spread (--conversations of them)
--   selfstudy+compact  self-study with the README's settings, from --init
--             compact (--compact-conversations of them): the README's cartridge
--
-- beside the bare model and the whole corpus in context (ICL). Prints one
-- table (method, p, KV bytes, build seconds, right/total per set) and, with
-- --png, a plot of accuracy on --plot-set against KV bytes, a line per
-- method, ICL and bare as horizontal lines. --json adds every figure.
--
-- --docs report|tuning|FIRST-LAST instead runs every method on each of
-- those make_facts.lua documents (40 facts; protocol.lua's seed ranges) and
-- prints the same table summed over them (p and KV bytes their means):
--
--   cartridge run recipes/compare.lua --model models/reader.gguf --docs report --png out/compare.png
local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local answering = require("cartridge.answering")
local facts = require("cartridge.facts")
local compact = require("cartridge.compact")
local protocol = require("cartridge.protocol")
local cart = require("cartridge.cart")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local fmt = require("cartridge.fmt")
local fs = require("cartridge.fs")
local C = cartridge.C

local METHODS = { "opening", "spread", "evict", "compact", "selfstudy", "selfstudy+compact" }
local opts = options.parse(arg, {
    summary = "Compare a cartridge with truncation, spreading, KV eviction and attention matching at the same KV memory.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", help = "the document" },
        { "qa", help = "its questions, a JSONL file as make_facts.lua writes" },
        { "docs", help = "instead of --corpus and --qa: report, tuning or FIRST-LAST, make_facts.lua documents by seed" },
        { "fractions", default = "32,16,8,4", help = "p = n / each of these (comma-separated)" },
        { "methods", default = table.concat(METHODS, ","), help = "which methods (comma-separated, of " .. table.concat(METHODS, ", ") .. ")" },
        { "conversations", type = "int", default = 400, help = "selfstudy: conversations (--steps x --accum 4)" },
        { "compact-conversations", type = "int", default = 400, help = "selfstudy+compact: conversations" },
        { "lr", type = "number", default = 0.2, help = "self-study's learning rate" },
        { "seed", type = "int", default = 42, help = "self-study's seed" },
        { "plot-set", default = "held-out", help = "the phrasing set the plot shows (first, held-out, reverse, all)" },
        { "png", help = "write the plot here (.png or .svg)" },
        { "max-a", type = "int", default = 24, help = "answer budget, tokens" },
        { "json", type = "boolean", help = "also print every figure as JSON" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
    },
})
local function fail(msg) error("compare: " .. msg, 0) end
if not opts.docs and (not opts.corpus or not opts.qa) then
    fail("--corpus DOC and --qa FILE are required (make_facts.lua writes both), or --docs report|tuning|FIRST-LAST")
end
local seeds
if opts.docs then
    local first, last = protocol.docs_range(opts.docs, "compare")
    seeds = { first = first, last = last }
end
facts.check_set(opts.plot_set, "compare")
local fractions, methods = {}, {}
for f in opts.fractions:gmatch("[^,]+") do
    local v = tonumber(f)
    if not v or v < 1 then fail(("--fractions: %s is not a number >= 1"):format(f)) end
    fractions[#fractions + 1] = v
end
for name in opts.methods:gmatch("[^,]+") do
    local known = false
    for _, k in ipairs(METHODS) do known = known or k == name end
    if not known then fail(("--methods: %s is not one of %s"):format(name, table.concat(METHODS, ", "))) end
    methods[#methods + 1] = name
end
if opts.conversations % 4 ~= 0 or opts.compact_conversations % 4 ~= 0 or opts.conversations < 4 then
    fail("--conversations and --compact-conversations must be multiples of 4 (steps of --accum 4)")
end

cartridge.set_threads(opts.threads)
local model_path = defaults.pick_model(opts.model)
local m = cartridge.model.load(model_path)
local tok = m:tokenizer()
local template = chat.for_model(m)
local row_bytes = m:kv_bytes(1, "f16") -- one position's K and V over every layer, as a serving cache holds them
local sets = facts.PHRASING_SETS
local corpus, qa, all, n, doc_path -- the document being compared

-- Scores one arm on every set: { [set] = { right, total } }.
local function score(arm)
    local out = {}
    for _, s in ipairs(sets) do
        local list = facts.select(qa, s)
        local right, total = 0, 0
        if #list > 0 then
            right, total = facts.accuracy(m, list, { cartridge = arm.cartridge, system = arm.system, max_a = opts.max_a })
        end
        out[s] = { right = right, total = total }
    end
    return out
end

local tmp = os.tmpname()
local dir = tmp .. ".d"
fs.mkdirs(dir)

-- Self-study as the README runs it (protocol.lua), as its own process.
local function run_selfstudy(p, init, conversations)
    local args = protocol.selfstudy_args(model_path, doc_path, corpus.n_tokens, p, { init = init,
        conversations = conversations, lr = opts.lr, seed = opts.seed, threads = opts.threads })
    return (cart.load(protocol.run_selfstudy(args, ("%s/p%d-%s.safetensors"):format(dir, p, init)), m))
end

local function build(method, p)
    if method == "opening" then
        local ids = selfstudy.init_ids(tok, template, corpus.text, p)
        local c = cart.new(m, #ids, 1)
        c:capture(m, ids)
        return c
    elseif method == "spread" then
        local c = cart.new(m, p, 1)
        selfstudy.init_spread(m, c, all)
        return c
    elseif method == "evict" or method == "compact" then
        local c = cart.new(m, p, 1)
        compact.fill(m, c, all, compact.reread_ids(tok, template, corpus.text),
            method == "compact" and "match" or "evict")
        return c
    elseif method == "selfstudy" then
        return run_selfstudy(p, "spread", opts.conversations)
    end
    return run_selfstudy(p, "compact", opts.compact_conversations)
end

local function cell(r) return r and r.total > 0 and ("%d/%d"):format(r.right, r.total) or "-" end
local function line(name, p, bytes, seconds, r)
    local cols = { ("%-18s %6s %10s %8s"):format(name, p, bytes, seconds) }
    for _, s in ipairs(sets) do cols[#cols + 1] = ("%10s"):format(cell(r[s])) end
    print(table.concat(cols, " "))
end
local function header()
    local head = { ("%-18s %6s %10s %8s"):format("method", "p", "KV bytes", "build s") }
    for _, s in ipairs(sets) do head[#head + 1] = ("%10s"):format(s) end
    print(table.concat(head, " "))
end

-- Every method at every p on one document; quiet: no table.
local function compare_doc(path, qa_list, quiet)
    doc_path, qa = path, qa_list
    corpus = corpus_mod.load({ path }, tok)
    local _
    _, all = selfstudy.init_ids(tok, template, corpus.text, 16)
    n = #all
    if not quiet then header() end
    local show = quiet and function() end or line
    local results = {}
    local bare = score({})
    show("bare", 0, fmt.bytes(0), "-", bare)
    local icl = score({ system = answering.icl_text(corpus, tok, m.config.n_ctx_train) })
    show("ICL", n, fmt.bytes(n * row_bytes), "-", icl)
    results[#results + 1] = { method = "bare", p = 0, kv_bytes = 0, sets = bare }
    results[#results + 1] = { method = "ICL", p = n, kv_bytes = n * row_bytes, sets = icl }
    for _, method in ipairs(methods) do
        for _, f in ipairs(fractions) do
            local p = protocol.p_of(n, f)
            if p < n then
                local t0 = C.cart_now_seconds()
                local c = build(method, p)
                local seconds = C.cart_now_seconds() - t0
                local r = score({ cartridge = c })
                show(method, c.p, fmt.bytes(c.p * row_bytes), ("%.1f"):format(seconds), r)
                results[#results + 1] = { method = method, fraction = f, p = c.p, kv_bytes = c.p * row_bytes,
                    seconds = seconds, sets = r }
                c:free()
            end
        end
    end
    return results
end

-- Sums of several documents' results, entry by entry (the same order).
local function add(total, results, k)
    for i, r in ipairs(results) do
        local t = total[i] or { method = r.method, fraction = r.fraction, p = 0, kv_bytes = 0, seconds = 0, sets = {} }
        total[i] = t
        t.p = t.p + (r.p - t.p) / k
        t.kv_bytes = t.kv_bytes + (r.kv_bytes - t.kv_bytes) / k
        t.seconds = t.seconds + ((r.seconds or 0) - t.seconds) / k
        for s, v in pairs(r.sets) do
            local c = t.sets[s] or { right = 0, total = 0 }
            t.sets[s] = c
            c.right, c.total = c.right + v.right, c.total + v.total
        end
    end
end

local results
if seeds then
    results = {}
    local started = C.cart_now_seconds()
    for seed = seeds.first, seeds.last do
        local d = facts.document(seed, 40)
        local path = ("%s/doc%d.md"):format(dir, seed)
        fs.write_atomic(path, d.text)
        local one = compare_doc(path, facts.questions(d), true)
        add(results, one, seed - seeds.first + 1)
        local icl, sst = one[2].sets, nil
        for _, r in ipairs(one) do if r.method == "selfstudy" and r.fraction == 8 then sst = r.sets end end
        print(("doc %d: n %d; ICL %s first, %s held-out%s (%.1f min so far)"):format(seed, n, cell(icl.first),
            cell(icl["held-out"]), sst and (("; selfstudy at n/8 %s first, %s held-out"):format(cell(sst.first),
            cell(sst["held-out"]))) or "", (C.cart_now_seconds() - started) / 60))
    end
    print(("documents %d-%d (%d), summed; p and KV bytes are means over them; model %s"):format(seeds.first,
        seeds.last, seeds.last - seeds.first + 1, model_path))
    header()
    for _, r in ipairs(results) do
        line(r.method, ("%.0f"):format(r.p), fmt.bytes(r.kv_bytes), r.method == "bare" and "-" or r.method == "ICL"
            and "-" or ("%.1f"):format(r.seconds), r.sets)
    end
else
    local list = facts.read_qa(opts.qa)
    print(("corpus %s; %s; model %s"):format(opts.corpus, opts.qa, model_path))
    results = compare_doc(opts.corpus, list)
end
local bare, icl = results[1].sets, results[2].sets
for _, f in ipairs(fs.list(dir)) do os.remove(dir .. "/" .. f) end -- documents, cartridges, logs
os.remove(dir)
os.remove(tmp)

if opts.png then
    local plot = require("cartridge.plot")
    local function acc(r)
        local right, total = 0, 0
        for _, s in ipairs(sets) do
            if facts.in_set({ phrasing = s == "first" and "1" or s == "reverse" and "reverse" or "2" }, opts.plot_set) then
                right, total = right + r[s].right, total + r[s].total
            end
        end
        return total > 0 and right / total or 0
    end
    local runs = {}
    for _, method in ipairs(methods) do
        local pts = {}
        for _, r in ipairs(results) do
            if r.method == method then pts[#pts + 1] = { r.kv_bytes / 1024, acc(r.sets) } end
        end
        if #pts > 0 then runs[#runs + 1] = { label = method, points = pts } end
    end
    plot.render({ runs = runs, out = opts.png, title = ("QA accuracy, %s, by KV size"):format(
        opts.plot_set), x_label = "KV cache, KiB (f16)", y_label = "accuracy, fraction right",
        hlines = { { y = acc(icl), label = "ICL" }, { y = acc(bare), label = "bare" } } })
    print("wrote " .. opts.png)
end
if opts.json then print(json.encode(results)) end
