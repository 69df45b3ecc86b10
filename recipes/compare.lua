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
--   selfstudy self-study with the README's settings (--init spread,
--             --conversations of them)
--   selfstudy+compact  self-study from --init compact, --compact-conversations
--
-- beside the bare model and the whole corpus in context (ICL). Prints one
-- table (method, p, KV bytes, build seconds, right/total per set) and, with
-- --png, a plot of accuracy on --plot-set against KV bytes, a line per
-- method, ICL and bare as horizontal lines. --json adds every figure.
local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local serve = require("cartridge.serve")
local facts = require("cartridge.facts")
local compact = require("cartridge.compact")
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
        { "corpus", help = "the document (required)" },
        { "qa", help = "its questions, a JSONL file as make_facts.lua writes (required)" },
        { "fractions", default = "32,16,8,4", help = "p = n / each of these (comma-separated)" },
        { "methods", default = table.concat(METHODS, ","), help = "which methods (comma-separated, of " .. table.concat(METHODS, ", ") .. ")" },
        { "conversations", type = "int", default = 400, help = "selfstudy: conversations (--steps x --accum 4)" },
        { "compact-conversations", type = "int", default = 100, help = "selfstudy+compact: conversations" },
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
if not opts.corpus or not opts.qa then fail("--corpus DOC and --qa FILE are required (make_facts.lua writes both)") end
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
local corpus = corpus_mod.load({ opts.corpus }, tok)
local qa = facts.read_qa(opts.qa)
local _, all = selfstudy.init_ids(tok, template, corpus.text, 16)
local n = #all
local row_bytes = 0 -- one position's K and V over every layer, f16 as a serving cache holds them
for _, g in ipairs(m.layers) do row_bytes = row_bytes + 2 * g.n_head_kv * g.head_dim * 2 end
local sets = {}
for _, s in ipairs(facts.PHRASING_SETS) do
    if #facts.select(qa, s) > 0 then sets[#sets + 1] = s end
end

-- Scores one arm on every set: { [set] = { right, total } }.
local function score(arm)
    local out = {}
    for _, s in ipairs(sets) do
        local right, total = facts.accuracy(m, facts.select(qa, s), { cartridge = arm.cartridge, system = arm.system,
            max_a = opts.max_a })
        out[s] = { right = right, total = total }
    end
    return out
end

local tmp = os.tmpname()
local dir = tmp .. ".d"
fs.mkdirs(dir)
local host = package.loaded["cartridge.host"]
local exe = host and host.executable or (cartridge.root .. "/build/cartridge")
local function q(x) return "'" .. tostring(x):gsub("'", "'\\''") .. "'" end

-- Self-study as the README runs it (chunks a quarter to a half of the
-- corpus), as its own process; returns the cartridge.
local function run_selfstudy(p, init, conversations)
    local quarter = math.floor(corpus.n_tokens / 4)
    local save = ("%s/p%d-%s.safetensors"):format(dir, p, init)
    local args = { "--model", model_path, "--corpus", opts.corpus, "--p", p, "--lr", opts.lr, "--steps",
        conversations / 4, "--accum", 4, "--chunk-min", quarter, "--chunk-max", 2 * quarter, "--max-q", 32,
        "--max-a", 32, "--seeds", "focus", "--turns", 6, "--init", init, "--seed", opts.seed, "--threads",
        opts.threads, "--save", save }
    local quoted = {}
    for i, a in ipairs(args) do quoted[i] = q(a) end
    local cmd = q(exe) .. " run " .. q(cartridge.root .. "/recipes/selfstudy.lua") .. " " .. table.concat(quoted, " ")
        .. " > " .. q(save .. ".log") .. " 2>&1"
    if not os.execute(cmd) then
        local f = io.open(save .. ".log", "rb")
        local log = f and f:read("*a") or ""
        if f then f:close() end
        fail(("self-study at p = %d failed:\n%s"):format(p, log:sub(-2000)))
    end
    return (cart.load(save, m))
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

local function cell(r) return r and ("%d/%d"):format(r.right, r.total) or "-" end
local function line(name, p, bytes, seconds, r)
    local cols = { ("%-18s %6s %10s %8s"):format(name, p, bytes, seconds) }
    for _, s in ipairs(sets) do cols[#cols + 1] = ("%10s"):format(cell(r[s])) end
    print(table.concat(cols, " "))
end

print(("corpus %s: n = %d tokens as a system block; %d questions (%s); model %s"):format(opts.corpus, n, #qa,
    table.concat(sets, ", "), model_path))
local head = { ("%-18s %6s %10s %8s"):format("method", "p", "KV bytes", "build s") }
for _, s in ipairs(sets) do head[#head + 1] = ("%10s"):format(s) end
print(table.concat(head, " "))
local results = {}
local bare = score({})
line("bare", 0, fmt.bytes(0), "-", bare)
local icl_text = serve.icl_text(corpus, tok, m.config.n_ctx_train)
local icl = score({ system = icl_text })
line("ICL", n, fmt.bytes(n * row_bytes), "-", icl)
results[#results + 1] = { method = "bare", p = 0, kv_bytes = 0, sets = bare }
results[#results + 1] = { method = "ICL", p = n, kv_bytes = n * row_bytes, sets = icl }
for _, method in ipairs(methods) do
    for _, f in ipairs(fractions) do
        local p = math.max(16, math.floor(n / f + 0.5))
        if p < n then
            local t0 = C.cart_now_seconds()
            local c = build(method, p)
            local seconds = C.cart_now_seconds() - t0
            local r = score({ cartridge = c })
            line(method, c.p, fmt.bytes(c.p * row_bytes), ("%.1f"):format(seconds), r)
            results[#results + 1] = { method = method, fraction = f, p = c.p, kv_bytes = c.p * row_bytes,
                seconds = seconds, sets = r }
            c:free()
        end
    end
end
for _, f in ipairs(fs.list(dir)) do os.remove(dir .. "/" .. f) end
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
    plot.render({ runs = runs, out = opts.png, title = ("QA accuracy (%s phrasings) against KV memory"):format(
        opts.plot_set), x_label = "KV cache, KiB (f16)", y_label = "accuracy, fraction right",
        hlines = { { y = acc(icl), label = "ICL" }, { y = acc(bare), label = "bare" } } })
    print("wrote " .. opts.png)
end
if opts.json then print(json.encode(results)) end
