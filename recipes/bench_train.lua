-- bench_train.lua: cartridge training speed at the Qwen3-0.6B shape.
--
--   cartridge run recipes/bench_train.lua                # generates the model once (~1.2 GB)
--   cartridge run recipes/bench_train.lua --model M --p 256 --seqs 4 --len 224
--
-- Times one forward + backward of the distillation loss into a p-row
-- cartridge over --seqs sequences of --len tokens (answer tokens supervised
-- with 20 teacher entries each), four ways: packed into one pass or one
-- sequence at a time, each with and without recompute. Every way runs in its
-- own process so the peak RSS it prints is its own. The FLOP rate is
-- compared with the inference prefill rate: the backward through frozen
-- weights costs about one more forward (dX only, no dW).

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local json = require("cartridge.json")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Cartridge training speed (forward + backward into the rows) at the Qwen3-0.6B shape.",
    flags = {
        { "model", help = "GGUF (default: a generated random Qwen3-0.6B-shaped f16 model)" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "p", type = "int", default = 256, help = "cartridge rows" },
        { "seqs", type = "int", default = 4, help = "sequences per step" },
        { "len", type = "int", default = 224, help = "tokens per sequence" },
        { "answer", type = "int", default = 160, help = "supervised (answer) tokens at the end of each sequence" },
        { "repeat", type = "int", default = 2, help = "timed repetitions (best is reported)" },
        { "case", help = "internal: run one configuration (packed|flat)-(plain|recompute) and print JSON" },
    },
})

local path = defaults.bench_model(opts.model, "bench_train")

local function rss_peak_kib()
    for line in io.lines("/proc/self/status") do
        local v = line:match("^VmHWM:%s+(%d+) kB")
        if v then return tonumber(v) end
    end
    return 0
end

if opts.case then
    -- one configuration, in this process
    cartridge.set_threads(opts.threads)
    local packed, recompute = opts.case:match("^(%a+)%-(%a+)$")
    local m = cartridge.model.load(path)
    local c = cartridge.cart.new(m, opts.p, 1)
    c:init_random(1, 0.5)
    local tr = cartridge.trainer.new(m, { recompute = recompute == "recompute" })
    local rng = require("cartridge.rng").new(3)
    local segs, per_seq = {}, {}
    local base = 0
    for s = 1, opts.seqs do
        local ids = {}
        for i = 1, opts.len do ids[i] = rng:below(math.min(50000, m.n_vocab)) end
        segs[s] = ids
        local targets = {}
        for pos = opts.len - opts.answer, opts.len - 1 do
            for k = 0, 19 do targets[#targets + 1] = { pos, (ids[pos + 1] + k * 97) % m.n_vocab, -3.0 - 0.1 * k } end
        end
        per_seq[s] = targets
    end
    local all = {}
    for s = 1, opts.seqs do
        for _, e in ipairs(per_seq[s]) do all[#all + 1] = { base + e[1], e[2], e[3] } end
        base = base + opts.len
    end
    local best = math.huge
    for _ = 1, opts["repeat"] do
        c:zero_grad()
        local t0 = C.cart_now_seconds()
        if packed == "packed" then
            tr:distill(c, segs, all, { backward = true })
        else
            for s = 1, opts.seqs do
                tr:distill(c, { segs[s] }, per_seq[s], { backward = true, mean = false, scale = 1 / #all })
            end
        end
        best = math.min(best, C.cart_now_seconds() - t0)
    end
    local mc = m.config
    local layer_params = mc.n_layer * (mc.n_embd * (mc.n_head + 2 * mc.n_head_kv) * mc.head_dim
        + mc.n_head * mc.head_dim * mc.n_embd + 3 * mc.n_embd * mc.n_ff)
    local tokens = opts.seqs * opts.len
    local head_rows = opts.seqs * opts.answer
    local flops = 4 * layer_params * tokens + 4 * mc.n_vocab * mc.n_embd * head_rows
    for i = 0, opts.len - 1 do -- attention: forward 4 p D H per row pair, backward about twice that
        flops = flops + opts.seqs * 12 * mc.n_layer * mc.n_head * mc.head_dim * (opts.p + i + 1)
    end
    print(json.encode({ case = opts.case, seconds = best, tokens = tokens, flops = flops,
        activations = tr:peak_bytes(), rss_kib = rss_peak_kib() }))
    return
end

-- the matrix: each configuration in its own process
local results = {}
local exe = package.loaded["cartridge.host"] and package.loaded["cartridge.host"].executable or "build/cartridge"
print(("kernels %s; model %s, p %d, %d sequences x %d tokens (%d supervised each, 20 teacher entries per token), %d threads")
    :format(cartridge.isa(), path, opts.p, opts.seqs, opts.len, opts.answer, opts.threads))
for _, case in ipairs({ "packed-plain", "flat-plain", "packed-recompute", "flat-recompute" }) do
    local _, out = require("cartridge.proc").capture({ exe, "run", arg[0], "--case", case, "--model", path,
        "--threads", opts.threads, "--p", opts.p, "--seqs", opts.seqs, "--len", opts.len, "--answer", opts.answer,
        "--repeat", opts["repeat"] })
    local line = out:match("(%b{})%s*$")
    if not line then error("bench_train: case " .. case .. " failed:\n" .. out, 0) end
    local r = json.decode(line)
    results[case] = r
    print(("%-17s %6.2f s/step  %7.1f tok/s  %6.1f GFLOP/s  activations %7.1f MiB  peak RSS %7.1f MiB"):format(case,
        r.seconds, r.tokens / r.seconds, r.flops / r.seconds / 1e9, r.activations / 1048576, r.rss_kib / 1024))
end
local pk, fl = results["packed-plain"], results["flat-plain"]
print(("packed vs one at a time: %.2fx; recompute costs %.0f%% more time and holds %.0f%% of the activations")
    :format(fl.seconds / pk.seconds, 100 * (results["packed-recompute"].seconds / pk.seconds - 1),
        100 * results["packed-recompute"].activations / pk.activations))
