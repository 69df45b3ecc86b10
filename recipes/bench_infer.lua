-- bench_infer.lua: inference speed at the Qwen3-0.6B shape, against this
-- machine's own limits and, optionally, llama.cpp in the same run.
--
--   cartridge run recipes/bench_infer.lua                        # generated f16 model (~1.2 GB, once)
--   cartridge run recipes/bench_infer.lua --dtype q8_0           # a generated Q8_0 (or q4_K, ...) model
--   cartridge run recipes/bench_infer.lua --dtype all --vs-llama /tmp/llama-peer   # the whole table
--   cartridge run recipes/bench_infer.lua --model models/gemma4-26b-a4b-q4_K.gguf --vs-llama /tmp/llama-peer
--   CART_ISA=avx2 cartridge run recipes/bench_infer.lua          # a lower ISA level, for comparison
--
-- It first measures the machine: read bandwidth (integer sums over 512 MiB,
-- best of 5 passes) and the f32 GEMM peak (a 1536^3 product through
-- OpenBLAS and through the engine's own kernels; the higher counts). Then,
-- for each model, it prints what loading cost (seconds, and the repacked
-- copies of block-type matrices: their bytes and seconds) and times prefill
-- of one prompt, single-stream decode and B lockstep streams, best of --reps
-- runs each, and prints every figure as a fraction of those limits: prefill
-- FLOP/s of the GEMM peak (prefill is compute-bound), decode weight bytes
-- per second of the read bandwidth (decode streams every matrix once per
-- token). With --vs-llama DIR it runs DIR/bench_llama.mjs (see
-- ../shared/bench/README.md: llama.cpp from npm, installed outside this
-- repository) on the same model and prints the ratios. With several dtypes
-- (--dtype all: f16 q8_0 q6_K q5_K q4_K) it ends with one table of them all.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local json = require("cartridge.json")
local ffi = cartridge.ffi
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Inference speed at the Qwen3-0.6B shape against the machine's limits (and llama.cpp).",
    flags = {
        { "model", help = "GGUF to measure (default: a generated random Qwen3-0.6B-shaped model of --dtype)" },
        { "dtype", default = "f16", help = "weight dtype(s) of the generated model: one (f16, bf16, f32, q8_0, q4_0, q4_K, q5_K, q6_K, ...), a comma list, or all (f16,q8_0,q6_K,q5_K,q4_K)" },
        { "preset", default = "qwen3-0.6b", help = "shape of the generated model (cartridge.randmodel's presets)" },
        { "no-repack", type = "boolean", help = "multiply block-type matrices from the file's rows instead of repacked copies (the same bits, for comparison)" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "prompt", type = "int", default = 512, help = "prefill prompt length" },
        { "decode", type = "int", default = 128, help = "decode steps" },
        { "reps", type = "int", default = 3, help = "runs of prefill and of decode; the best counts" },
        { "batch", type = "int", repeatable = true, default = { 4, 16 }, help = "lockstep stream counts" },
        { "batch-steps", type = "int", default = 32, help = "decode steps per lockstep run" },
        { "batch-ctx", type = "int", default = 32, help = "cached tokens per lockstep stream before its steps "
            .. "(plus 0-6, so that streams differ); self-study's bot B decodes after about 870" },
        { "kv", default = "f16", choices = { "f16", "f32" }, help = "KV cache dtype" },
        { "widen", type = "boolean", help = "also measure prefill with f32-widened weights" },
        { "vs-llama", help = "folder with llama.cpp's bench_llama.mjs installed (npm install there)" },
    },
})

cartridge.set_threads(opts.threads)
local now = C.cart_now_seconds

local DTYPES_ALL = { "f16", "q8_0", "q6_K", "q5_K", "q4_K" }
local dtypes = {}
if opts.dtype == "all" then dtypes = DTYPES_ALL
else for d in opts.dtype:gmatch("[^,]+") do dtypes[#dtypes + 1] = d end end
for _, f in ipairs({ "threads", "prompt", "decode", "reps", "batch_steps", "batch_ctx" }) do
    if opts[f] < 1 then
        error(("--%s must be at least 1; got %d"):format(f:gsub("_", "-"), opts[f]), 0)
    end
end
for _, B in ipairs(opts.batch) do
    if B < 1 then error(("--batch must be at least 1; got %d"):format(B), 0) end
end
if opts.model and #dtypes > 1 then error("--model measures one file: give --dtype one value or leave it out", 0) end
for _, d in ipairs(dtypes) do require("cartridge.dtype").id(d) end -- an unknown name stops here

-- the file to measure for a dtype: --model, or a generated random model of
-- the preset's shape (written once into models/)
local function model_path(dtype)
    return defaults.bench_model(opts.model, "bench_infer", opts.preset, dtype)
end

-- the machine's limits, measured now
local bandwidth = C.cart_probe_read_bandwidth(512 * 2 ^ 20, 5, nil)
local blas_gemm = C.cart_probe_blas_gemm(1536, 3)
local engine_gemm = C.cart_probe_engine_gemm(1536, 3, nil)
local gemm_peak = math.max(blas_gemm, engine_gemm)
print(("machine: %s; kernels %s; %d threads; read bandwidth %.1f GB/s; f32 GEMM %.0f GFLOP/s (OpenBLAS %.0f, engine %.0f)")
    :format(ffi.string(C.cart_cpu_features()), cartridge.isa(), cartridge.threads(), bandwidth / 1e9,
        gemm_peak / 1e9, blas_gemm / 1e9, engine_gemm / 1e9))

local function load_model(path, widen)
    local t0 = now()
    local m = cartridge.model.load(path, { widen = widen, no_repack = opts.no_repack })
    local load_s = now() - t0
    local c = m.config
    -- FLOPs of one token through the layers (the matrices a token runs --
    -- on an MoE layer its experts only -- and attention over the rows its
    -- layer sees at position p: a sliding layer at most its window)
    local E, Ep = c.n_embd, c.n_embd_per_layer
    local layer_params = c.n_layer * Ep * E -- gemma4's per-layer input projection
    for _, g in ipairs(m.layers) do
        layer_params = layer_params + E * (g.n_head + 2 * g.n_head_kv) * g.head_dim + g.n_head * g.head_dim * E
            + 3 * E * g.n_ff + 2 * E * Ep
        if g.moe then layer_params = layer_params + E * c.n_expert + c.n_expert_used * 3 * E * c.n_ff_exp end
    end
    local head_params = c.n_vocab * c.n_embd
    local flops = 2 * layer_params * opts.prompt + 2 * head_params
    for p = 0, opts.prompt - 1 do
        for _, g in ipairs(m.layers) do
            local seen = g.window > 0 and math.min(p + 1, g.window) or p + 1
            flops = flops + 4 * g.n_head * g.head_dim * seen
        end
    end
    return m, c, flops, load_s
end

local rng = ffi.new("cart_rng")
C.cart_rng_seed(rng, 5)
local function random_ids(n, vocab)
    local ids = {}
    for i = 1, n do ids[i] = tonumber(C.cart_rng_below(rng, math.min(vocab, 50000))) end
    return ids
end

-- best prefill tok/s over the reps; the cache of the last run is returned for decode
local function prefill(m, c, label, flops)
    local kv = m:new_kv(opts.prompt + opts.decode + 8, opts.kv)
    m:forward(kv, random_ids(16, c.n_vocab)) -- warm up pages and threads
    local ids = random_ids(opts.prompt, c.n_vocab)
    local best = math.huge
    for _ = 1, opts.reps do
        kv:truncate(0)
        local t0 = now()
        m:forward(kv, ids)
        best = math.min(best, now() - t0)
    end
    local tok_s = opts.prompt / best
    -- OpenBLAS runs at the CPU's best level even when CART_ISA forces a lower
    -- one: the engine's own f32 GEMM is then the yardstick of the level
    print(("prefill %-14s %4d tokens  %7.1f tok/s  %6.1f GFLOP/s = %3.0f%% of the GEMM peak, %3.0f%% of the engine's f32 GEMM")
        :format(label, opts.prompt, tok_s, flops / best / 1e9, 100 * flops / best / gemm_peak,
            100 * flops / best / engine_gemm))
    return kv, tok_s
end

-- bytes one decode step reads: every matrix but the embedding tables (one
-- row each), and of the experts only the n_expert_used a token runs
local function decode_bytes(m, c)
    local bytes = m.weight_bytes
    for _, t in ipairs(m.file:tensors()) do
        if (t.name == "token_embd.weight" and not c.tied_output) or t.name == "per_layer_token_embd.weight" then
            bytes = bytes - t.nbytes
        elseif t.name:match("_exps%.weight$") then
            bytes = bytes - t.nbytes * (1 - c.n_expert_used / c.n_expert)
        end
    end
    return bytes
end

-- single-stream decode from the end of the prompt (the cache is cut back
-- to the prompt between reps)
local function decode_one(m, c, kv)
    local bytes_per_token = decode_bytes(m, c)
    local best = math.huge
    for _ = 1, opts.reps do
        kv:truncate(opts.prompt)
        local id = 1
        local t0 = now()
        for _ = 1, opts.decode do id = m:argmax((m:forward(kv, { id }))) end
        best = math.min(best, now() - t0)
    end
    local tok_s = opts.decode / best
    local share = bytes_per_token * tok_s / bandwidth
    print(("decode  1 stream     %4d steps   %7.1f tok/s  %6.1f GB/s   = %3.0f%% of the read bandwidth")
        :format(opts.decode, tok_s, bytes_per_token * tok_s / 1e9, 100 * share))
    return tok_s, share
end

-- lockstep streams: each with its own short history, one weight pass per
-- step; the aggregate tok/s of each count
local function decode_batches(m, c)
    local agg = {}
    for _, B in ipairs(opts.batch) do
        local kvs, ids = {}, {}
        for b = 1, B do
            kvs[b] = m:new_kv(opts.batch_ctx + 8 + opts.batch_steps + 8, opts.kv)
            m:forward(kvs[b], random_ids(opts.batch_ctx + b % 7, c.n_vocab), "none")
            ids[b] = { b }
        end
        local t = now()
        for _ = 1, opts.batch_steps do
            local logits = m:forward_batch(kvs, ids, "last")
            for b = 1, B do ids[b] = { m:argmax(logits, b - 1) } end
        end
        agg[B] = B * opts.batch_steps / (now() - t)
        print(("decode %2d streams    %4d steps   %7.1f tok/s aggregate, %.1f tok/s each%s")
            :format(B, opts.batch_steps, agg[B], agg[B] / B,
                opts.batch_ctx ~= 32 and (" (after %d cached tokens)"):format(opts.batch_ctx) or ""))
        for b = 1, B do kvs[b]:free() end
    end
    return agg
end

-- llama.cpp's prefill and decode tok/s on the same file (nil without --vs-llama)
local function llama(path)
    if not opts.vs_llama then return nil end
    local script = opts.vs_llama .. "/bench_llama.mjs"
    if not defaults.exists(script) then
        error(("--vs-llama: %s not found; install llama.cpp's peer as ../shared/bench/README.md shows"):format(script), 0)
    end
    -- the peer runs in its own directory: a relative --model is made absolute
    if path:sub(1, 1) ~= "/" then path = (os.getenv("PWD") or ".") .. "/" .. path end
    local argv = { "node", "bench_llama.mjs", path, "--threads", opts.threads, "--pp", opts.prompt, "--tg", opts.decode,
        "--reps", opts.reps, "--flash-attn", "on", "--no-mmap" }
    io.stderr:write(("bench_infer: running llama.cpp in %s: %s\n"):format(opts.vs_llama, table.concat(argv, " ")))
    local _, out = require("cartridge.proc").capture(argv, { cwd = opts.vs_llama, stderr = "/dev/null" })
    local ok, r = pcall(json.decode, out:match("%b{}") or "")
    if not ok or type(r) ~= "table" or not r.best then
        error("--vs-llama: llama.cpp's benchmark printed no result:\n" .. out, 0)
    end
    print(("llama.cpp (%s): prefill %.1f tok/s, decode %.1f tok/s (best of %d)")
        :format(r.system_info or "?", r.best.pp_tok_s, r.best.tg_tok_s, opts.reps))
    return r.best
end

-- every figure of one model file
local function measure(dtype)
    local path = model_path(dtype)
    local m, c, flops, load_s = load_model(path, false)
    print(("model %s: %s, %d layers, hidden %d, %d heads / %d kv, vocab %d, weights %s, %s KV%s")
        :format(path, c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
            cartridge.fmt.bytes(m.weight_bytes), opts.kv,
            c.n_expert > 0 and (", %d of %d experts per token"):format(c.n_expert_used, c.n_expert) or ""))
    print(("load    %.2f s, of which repacking %.2f s: %s of repacked block-type matrices%s")
        :format(load_s, m.repack_seconds, cartridge.fmt.bytes(m.packed_bytes),
            opts.no_repack and " (--no-repack)" or ""))
    -- the label names the weights the file holds (its first layer's q projection)
    local q = m.file:tensor("blk.0.attn_q.weight")
    local weights = q and q.dtype_name or dtype
    local row = { dtype = weights }
    local label = "(" .. weights .. ")"
    local kv
    kv, row.prefill = prefill(m, c, label, flops)
    row.decode, row.share = decode_one(m, c, kv)
    kv:free()
    row.batch = decode_batches(m, c)
    m:free()
    if opts.widen then
        local mw, cw, fw = load_model(path, true)
        io.stderr:write(("widened weights to f32: +%s\n"):format(cartridge.fmt.bytes(mw.widened_bytes)))
        prefill(mw, cw, "(widened f32)", fw):free()
        mw:free()
    end
    row.llama = llama(path)
    if row.llama then
        print(("ratio ours / llama.cpp: prefill %.2fx, decode %.2fx (%s kernels, %s weights)")
            :format(row.prefill / row.llama.pp_tok_s, row.decode / row.llama.tg_tok_s, cartridge.isa(), row.dtype))
    end
    return row
end

local rows = {}
for i, d in ipairs(dtypes) do
    if i > 1 then print("") end
    rows[i] = measure(d)
end

-- the table of every dtype: ours, llama.cpp's, the ratios, the share of
-- the read bandwidth, and each lockstep batch against one stream
if #rows > 1 then
    print("")
    local head, rule = "", ""
    for _, B in ipairs(opts.batch) do
        head = head .. (" %d streams, x one stream |"):format(B)
        rule = rule .. "---|"
    end
    print(("| weights | kernels | prefill tok/s (x llama.cpp) | decode tok/s (x llama.cpp) | decode, share of %.0f GB/s |%s")
        :format(bandwidth / 1e9, head))
    print("|---|---|---|---|---|" .. rule)
    local function ratio(ours, theirs) return theirs and (" (%.2fx)"):format(ours / theirs) or "" end
    for _, r in ipairs(rows) do
        local cells = ""
        for _, B in ipairs(opts.batch) do cells = cells .. (" %.1f (%.1fx) |"):format(r.batch[B], r.batch[B] / r.decode) end
        print(("| %s | %s | %.1f%s | %.1f%s | %.0f%% |%s"):format(r.dtype, cartridge.isa(), r.prefill,
            ratio(r.prefill, r.llama and r.llama.pp_tok_s), r.decode, ratio(r.decode, r.llama and r.llama.tg_tok_s),
            100 * r.share, cells))
    end
end
