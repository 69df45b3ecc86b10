-- bench_infer.lua: inference speed at the Qwen3-0.6B shape.
--
--   cartridge run recipes/bench_infer.lua                 # generates the model once (~1.2 GB)
--   cartridge run recipes/bench_infer.lua --model M --threads 2 --prompt 512 --decode 128
--
-- Measures prefill tok/s of one prompt, single-stream decode tok/s, and the
-- aggregate decode tok/s of B lockstep streams (one weight pass per step for
-- all of them). Prints each figure with its ratio to llama.cpp's on this
-- machine kind (same shape and dtype, 2 threads, its best settings: about
-- 115 tok/s prefill and 22 tok/s decode) and the fraction of the machine
-- limit it reaches: prefill FLOP/s over the ~370 GFLOP/s AVX-512 f32 GEMM
-- peak; decode bytes read per second over ~50 GB/s of memory bandwidth.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local defaults = require("cartridge.defaults")
local ffi = cartridge.ffi
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Inference speed at the Qwen3-0.6B shape: prefill, decode, lockstep batches.",
    flags = {
        { "model", help = "GGUF to measure (default: a generated random Qwen3-0.6B-shaped f16 model)" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "prompt", type = "int", default = 512, help = "prefill prompt length" },
        { "decode", type = "int", default = 128, help = "decode steps" },
        { "batch", type = "int", repeatable = true, default = { 4, 16 }, help = "lockstep stream counts" },
        { "batch-steps", type = "int", default = 32, help = "decode steps per lockstep run" },
        { "kv", default = "f16", choices = { "f16", "f32" }, help = "KV cache dtype" },
        { "widen", type = "boolean", help = "also measure prefill with f32-widened weights" },
    },
})

local LLAMA_PREFILL, LLAMA_DECODE = 115, 22 -- tok/s, llama.cpp on this machine kind
local GEMM_PEAK, BANDWIDTH = 370e9, 50e9      -- FLOP/s, bytes/s

cartridge.set_threads(opts.threads)
local path = opts.model
if not path then
    path = cartridge.root .. "/models/bench-qwen3-0.6b-f16.gguf"
    if not defaults.exists(path) then
        io.stderr:write("bench_infer: generating " .. path .. " (once)\n")
        randmodel.write({ out = path, preset = "qwen3-0.6b", dtype = "f16", seed = 7 })
    end
end

local now = C.cart_now_seconds

local function bench_model(widen)
    local m = cartridge.model.load(path, { widen = widen })
    local c = m.config
    -- FLOPs of one token through the layers (matrices + attention at length n),
    -- and bytes of weights a decode step streams.
    local layer_params = c.n_layer * (c.n_embd * (c.n_head + 2 * c.n_head_kv) * c.head_dim
        + c.n_head * c.head_dim * c.n_embd + 3 * c.n_embd * c.n_ff)
    local head_params = c.n_vocab * c.n_embd
    local function attention_flops(pos) return 4 * c.n_layer * c.n_head * c.head_dim * (pos + 1) end
    return m, c, layer_params, head_params, attention_flops
end

local rng = ffi.new("cart_rng")
C.cart_rng_seed(rng, 5)
local function random_ids(n, vocab)
    local ids = {}
    for i = 1, n do ids[i] = tonumber(C.cart_rng_below(rng, math.min(vocab, 50000))) end
    return ids
end

local function prefill_run(m, c, layer_params, head_params, attention_flops, label)
    local kv = m:new_kv(opts.prompt + opts.decode + 8, opts.kv)
    m:forward(kv, random_ids(16, c.n_vocab)) -- warm up pages and threads
    kv:truncate(0)
    local ids = random_ids(opts.prompt, c.n_vocab)
    local t0 = now()
    m:forward(kv, ids)
    local dt = now() - t0
    local flops = 2 * layer_params * opts.prompt + 2 * head_params
    for p = 0, opts.prompt - 1 do flops = flops + attention_flops(p) end
    local tok_s = opts.prompt / dt
    print(("prefill %-14s %4d tokens  %7.1f tok/s  %5.2fx llama.cpp  %6.1f GFLOP/s = %3.0f%% of the GEMM peak")
        :format(label, opts.prompt, tok_s, tok_s / LLAMA_PREFILL, flops / dt / 1e9, 100 * flops / dt / GEMM_PEAK))
    return kv
end

local m, c, layer_params, head_params, attention_flops = bench_model(false)
print(("model %s: %s, %d layers, hidden %d, %d heads / %d kv, vocab %d, weights %s; %d threads, %s KV")
    :format(path, c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
        cartridge.fmt.bytes(m.weight_bytes), cartridge.threads(), opts.kv))

local kv = prefill_run(m, c, layer_params, head_params, attention_flops, "(compact)")

-- single-stream decode from the end of the prompt
local id = m:argmax(m:forward(kv, { 1 }))
local t0 = now()
for _ = 1, opts.decode do id = m:argmax(m:forward(kv, { id })) end
local dt = now() - t0
-- a decode step streams every matrix once; an untied embedding table is only
-- looked up (one row), a tied one is also the output head
local bytes_per_token = m.weight_bytes
if not c.tied_output then bytes_per_token = bytes_per_token - m.file:tensor("token_embd.weight").nbytes end
local tok_s = opts.decode / dt
print(("decode  1 stream     %4d steps   %7.1f tok/s  %5.2fx llama.cpp  %6.1f GB/s   = %3.0f%% of bandwidth")
    :format(opts.decode, tok_s, tok_s / LLAMA_DECODE, bytes_per_token * tok_s / 1e9,
        100 * bytes_per_token * tok_s / BANDWIDTH))
kv:free()

-- lockstep streams: each with its own short history, one weight pass per step
for _, B in ipairs(opts.batch) do
    local kvs, ids = {}, {}
    for b = 1, B do
        kvs[b] = m:new_kv(64 + opts.batch_steps + 8, opts.kv)
        m:forward(kvs[b], random_ids(32 + b % 7, c.n_vocab), "none")
        ids[b] = { b }
    end
    local t = now()
    for _ = 1, opts.batch_steps do
        local logits = m:forward_batch(kvs, ids, "last")
        for b = 1, B do ids[b] = { m:argmax(logits, b - 1) } end
    end
    local d = now() - t
    local agg = B * opts.batch_steps / d
    print(("decode %2d streams    %4d steps   %7.1f tok/s aggregate (%5.2fx llama.cpp single-stream), %.1f tok/s each")
        :format(B, opts.batch_steps, agg, agg / LLAMA_DECODE, agg / B))
    for b = 1, B do kvs[b]:free() end
end
m:free()

if opts.widen then
    local mw, cw, lp, hp, af = bench_model(true)
    io.stderr:write(("widened weights to f32: +%s\n"):format(cartridge.fmt.bytes(mw.widened_bytes)))
    prefill_run(mw, cw, lp, hp, af, "(widened f32)"):free()
    mw:free()
end
