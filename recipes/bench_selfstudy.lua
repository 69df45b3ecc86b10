-- bench_selfstudy.lua: seconds per self-study conversation at the Qwen3-0.6B
-- shape, broken down into bot A, bot B, teacher and training step, next to the
-- floor this machine allows; with --ranks N, self-study's speed at 1 and N
-- processes and a projection to many hosts.
--
--   cartridge run recipes/bench_selfstudy.lua               # generates the model once (~1.2 GB)
--   cartridge run recipes/bench_selfstudy.lua --model M --steps 8
--   cartridge run recipes/bench_selfstudy.lua --model models/default.gguf --ranks 2
--
-- Budgets default to the reference's demo: p 256, chunks 256-512, max-q 64,
-- max-a 160, accum 4, 8 steps. The floor is counted phase by phase from
-- the work this run did: bot A's and bot B's prefills (every token they
-- actually fed, and the cached rows each one attends to), each of their
-- lockstep decode steps as it actually ran (its streams, the rows they
-- read), the teacher pass when there is one, the training forward and
-- backward of every student sequence through the cartridge, and Adam. A
-- prefill or training term is its FLOPs at this machine's f32 GEMM peak; a
-- decode step takes the longer of its FLOPs at the peak and its bytes (the
-- weights once, every stream's cache rows) at the read bandwidth; Adam is
-- bytes. Both rates are measured here (probe.h), before the run and again
-- after it, and the better of the two counts (on a shared machine a probe
-- taken while a neighbour is busy would lower the floor): the peak by a
-- plain 1536^3 GEMM (the faster of OpenBLAS and the engine's f32 kernel),
-- not by the engine's own prefill, and the bandwidth by integer sums over
-- 512 MiB.
--
-- --ranks N runs recipes/selfstudy.lua itself three times with these
-- budgets: one process of one thread, N ranks of one thread under
-- `--mpirun` (default `mpirun --oversubscribe`), and one process of N
-- threads (the same cores as threads). It prints the conversations per
-- second of each (from the per-step seconds of their metrics), the speed-up and the
-- efficiency (goal: at least 0.9 N), whether the two artifacts are the same
-- bits, the bytes each step's gradient sum sends, and a projected speed-up
-- for 8, 64 and 512 hosts from the measured compute per conversation and a
-- ring-allreduce model at --bandwidth Gbit/s and --latency microseconds
-- (docs/scale-out.md states the model).

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local dist = require("cartridge.dist")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Self-study seconds per conversation at the Qwen3-0.6B shape, with its breakdown and floor.",
    flags = {
        { "model", help = "GGUF (default: a generated random Qwen3-0.6B-shaped f16 model)" },
        { "corpus", repeatable = true, default = { "README.md", "docs" }, help = "corpus (default: README.md and docs/)" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "p", type = "int", default = 256, help = "cartridge rows" },
        { "steps", type = "int", default = 8, help = "optimizer steps" },
        { "accum", type = "int", default = 4, help = "conversations per step (and per lockstep group)" },
        { "chunk-min", type = "int", default = 256, help = "shortest chunk" },
        { "chunk-max", type = "int", default = 512, help = "longest chunk" },
        { "max-q", type = "int", default = 64, help = "bot A budget" },
        { "max-a", type = "int", default = 160, help = "bot B budget" },
        { "gen-batch", type = "int", default = 0, help = "conversations per lockstep generation group (a multiple of --accum; 0: as selfstudy.lua, the smallest multiple that is at least 16)" },
        { "spec-b", type = "boolean", help = "bot B decodes speculatively" },
        { "teacher-pass", type = "boolean", help = "run the separate teacher pass" },
        { "ranks", type = "int", default = 0, help = "measure self-study alone and with this many processes (one thread each)" },
        { "mpirun", default = "mpirun --oversubscribe", help = "with --ranks: the launcher, given -np N" },
        { "bandwidth", type = "number", default = 10, help = "with --ranks: the projection's link bandwidth, Gbit/s" },
        { "latency", type = "number", default = 50, help = "with --ranks: the projection's link latency, microseconds" },
    },
})
local function fail(msg) error("bench_selfstudy: " .. msg, 0) end

local path = defaults.bench_model(opts.model, "bench_selfstudy")

-- ---------------------------------------------------------------------------
-- --ranks N: the recipe alone and under mpirun, and the projection

-- A run's seconds from its metrics file: of its steps in all, and of them
-- rank 0's in the step's collectives (waiting for the other ranks, then the
-- sum; 0 alone).
local function run_seconds(metrics)
    local total, collectives, steps = 0, 0, 0
    for line in io.lines(metrics) do
        local rec = json.decode(line)
        if rec.step then
            steps = steps + 1
            total = total + rec.seconds
            collectives = collectives + (rec.wait_seconds or 0) + (rec.sum_seconds or 0)
        end
    end
    return total, collectives, steps
end

-- Ring allreduce of `bytes` over n hosts: 2 (n - 1) steps, each a latency
-- and 1/n of the bytes at the link's bandwidth (bytes/s).
local function ring_allreduce(n, bytes, latency, bandwidth)
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * bytes / bandwidth
end

-- One self-study run of --ranks mode: n processes (under --mpirun when n >
-- 1) of `threads` threads each, its files in dir; argv0 the recipe and its
-- flags. Returns { seconds, collectives, steps, bytes (the artifact's) }.
local function run_self_study(dir, argv0, n, threads)
    local save = ("%s/n%d-t%d.safetensors"):format(dir, n, threads)
    local argv = {}
    if n > 1 then
        for word in opts.mpirun:gmatch("%S+") do argv[#argv + 1] = word end
        argv[#argv + 1], argv[#argv + 2] = "-np", n
    end
    for _, a in ipairs(argv0) do argv[#argv + 1] = a end
    for _, a in ipairs({ "--threads", threads, "--save", save }) do argv[#argv + 1] = a end
    io.stderr:write(("bench_selfstudy: self-study with %d process%s of %d thread%s ...\n"):format(n,
        n == 1 and "" or "es", threads, threads == 1 and "" or "s"))
    -- as root, Open MPI's mpirun wants its two confirmation variables
    pcall(cartridge.ffi.cdef, "unsigned int getuid(void);")
    local root_env = C.getuid() == 0 and { OMPI_ALLOW_RUN_AS_ROOT = 1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1 } or nil
    local status = require("cartridge.proc").run(argv, { stdin = "/dev/null", stdout = dir .. "/out",
        stderr = dir .. "/err", env = n > 1 and root_env or nil })
    if status ~= 0 then
        for _, name in ipairs({ "/out", "/err" }) do
            local f = io.open(dir .. name, "rb")
            local text = f and f:read("*a") or ""
            if f then f:close() end
            io.stderr:write(text:sub(-2000))
        end
        fail(("the run with %d process%s failed (its output is above; the files are in %s)"):format(n,
            n == 1 and "" or "es", dir))
    end
    local total, collectives, steps = run_seconds(save:gsub("%.safetensors$", "") .. ".metrics.jsonl")
    local f = assert(io.open(save, "rb"))
    local r = { seconds = total, collectives = collectives, steps = steps, bytes = f:read("*a") }
    f:close()
    return r
end

local function ranks_mode()
    local N = opts.ranks
    if N < 2 then fail("--ranks N needs N >= 2 (one process is measured anyway)") end
    if opts.accum % N ~= 0 then
        fail(("--accum %d must be a multiple of --ranks %d, so that every rank has as many conversations"):format(
            opts.accum, N))
    end
    if C.cart_dist_built_with_mpi() == 0 then
        fail("this build has no MPI: install libopenmpi-dev (and openmpi-bin) and rebuild, cmake finds it")
    end
    local fs = require("cartridge.fs")
    local base = os.tmpname() -- an empty file of a fresh name: the directory beside it is ours alone
    local dir = base .. ".d"
    fs.mkdirs(dir)
    local host = package.loaded["cartridge.host"]
    local exe = host and host.executable or (cartridge.root .. "/build/cartridge")
    local args = { "--model", path, "--p", opts.p, "--steps", opts.steps, "--accum", opts.accum,
        "--chunk-min", opts.chunk_min, "--chunk-max", opts.chunk_max, "--max-q", opts.max_q, "--max-a", opts.max_a }
    for _, c in ipairs(opts.corpus) do args[#args + 1], args[#args + 2] = "--corpus", c end
    if opts.spec_b then args[#args + 1] = "--spec-b" end
    if opts.teacher_pass then args[#args + 1] = "--teacher-pass" end
    local argv0 = { exe, "run", cartridge.root .. "/recipes/selfstudy.lua" }
    for _, a in ipairs(args) do argv0[#argv0 + 1] = a end
    -- one process with one thread, N ranks of one thread each, and one
    -- process with N threads (the same cores shared the other way)
    local runs, threaded = {}, nil
    for _, run in ipairs({ { 1, 1 }, { N, 1 }, { 1, N } }) do
        local n, threads = run[1], run[2]
        local r = run_self_study(dir, argv0, n, threads)
        if threads > 1 then threaded = r else runs[n] = r end
    end
    local one, many = runs[1], runs[N]
    local conversations = opts.steps * opts.accum
    local rate1, rateN = conversations / one.seconds, conversations / many.seconds
    print(("self-study on %s: %d steps x %d conversations, chunks %d-%d, max-q %d, max-a %d, one thread per process")
        :format(path, opts.steps, opts.accum, opts.chunk_min, opts.chunk_max, opts.max_q, opts.max_a))
    print(("machine: %s; %d cores; shared with whatever else runs on it"):format(
        cartridge.ffi.string(C.cart_cpu_features()), C.cart_cpu_count()))
    print(("  N = 1: %6.1f s of steps, %.3f conversations/s"):format(one.seconds, rate1))
    print(("  N = %d: %6.1f s of steps, %.3f conversations/s (%s)"):format(N, many.seconds, rateN, opts.mpirun))
    print(("  speed-up %.2fx, efficiency %.2f (goal 0.90), against one process of one thread"):format(rateN / rate1,
        rateN / rate1 / N))
    local rateT = conversations / threaded.seconds
    print(("  one process of %d threads: %6.1f s of steps, %.3f conversations/s; %d ranks of one thread are %.2fx it")
        :format(N, threaded.seconds, rateT, N, rateN / rateT))
    print(("  artifacts: %s"):format((one.bytes == many.bytes and one.bytes == threaded.bytes) and "the same bits, all three"
        or "DIFFERENT"))
    -- the reduction each step: the trainable rows' gradient, summed reproducibly
    local meta = require("cartridge.safetensors").open(dir .. "/n1-t1.safetensors").metadata
    local layers, kv_heads, head_dim = tonumber(meta["cartridge.n_layer"]), tonumber(meta["cartridge.kv_heads"]),
        tonumber(meta["cartridge.head_dim"])
    local p, frozen = tonumber(meta["cartridge.p"]), tonumber(meta["cartridge.frozen"])
    local n = layers * 2 * (p - frozen) * kv_heads * head_dim
    local sum_bytes, sum_calls = dist.sum_traffic(n)
    print(("per step: the gradient is (p - frozen) x layers x 2 x kv_heads x head_dim x 4 = %d x %d x 2 x %d x %d x 4 "
        .. "= %s; the reproducible sum sends %s (int16 exponents and int64 fixed point, 10 bytes a value) in %d "
        .. "allreduces, and the step's losses in one allgather"):format(p - frozen, layers, kv_heads, head_dim,
        cartridge.fmt.bytes(n * 4), cartridge.fmt.bytes(sum_bytes), sum_calls))
    -- the projection: weak scaling, every host doing what one rank did here
    local per_conv = one.seconds / conversations
    local k = opts.accum / N
    local compute = (many.seconds - many.collectives) / many.steps -- rank 0's k conversations a step
    print(("  of the %d-rank steps, rank 0 spent %.1f s computing its %g conversation%s a step and %.1f s in the "
        .. "collectives (waiting for the other ranks, then the sum)"):format(N, many.seconds - many.collectives, k,
        k == 1 and "" or "s", many.collectives))
    local lat, bw = opts.latency * 1e-6, opts.bandwidth * 1e9 / 8
    print(("projection to hosts: each does what rank 0 did here (%g conversation%s a step, %.3f s), one host alone "
        .. "%.3f s a conversation (N = 1 above), the global --accum grows with the hosts; every collective a ring "
        .. "allreduce at %g Gbit/s and %g us"):format(k, k == 1 and "" or "s", compute, per_conv, opts.bandwidth,
        opts.latency))
    print("   hosts  accum  compute/step  reduce/step  speed-up  efficiency")
    for _, hosts in ipairs({ 8, 64, 512 }) do
        -- the sum's allreduces (a latency term per call, the bytes once) and the losses' allgather
        local reduce = ring_allreduce(hosts, sum_bytes, lat, bw) + (sum_calls - 1) * 2 * (hosts - 1) * lat
            + (hosts - 1) * lat
        local speedup = hosts * k * per_conv / (compute + reduce)
        print(("   %5d  %5d  %10.3f s  %9.4f s  %7.1fx  %10.3f"):format(hosts, hosts * k, compute, reduce, speedup,
            speedup / hosts))
    end
    for _, name in ipairs(fs.list(dir)) do os.remove(dir .. "/" .. name) end
    os.remove(dir)
    os.remove(base)
end

if opts.ranks ~= 0 then return ranks_mode() end

-- ---------------------------------------------------------------------------
-- One process: the breakdown and the floor

cartridge.set_threads(opts.threads)
-- the machine's rates: the best of a probe now and (below) after the run
local bandwidth, engine_gemm, gemm_rate = 0, 0, 0
local function probe()
    local bw, eg = C.cart_probe_read_bandwidth(512 * 2 ^ 20, 5, nil), C.cart_probe_engine_gemm(1536, 3, nil)
    local g = math.max(C.cart_probe_blas_gemm(1536, 3), eg)
    bandwidth, engine_gemm, gemm_rate = math.max(bandwidth, bw), math.max(engine_gemm, eg), math.max(gemm_rate, g)
    return g, bw
end
probe()
local now = C.cart_now_seconds
local m = cartridge.model.load(path)
local mc = m.config
local tok = m:tokenizer()
local corpus = corpus_mod.load(opts.corpus, tok)
print(("model %s (%d layers, hidden %d); corpus %d files, %d tokens; %d threads"):format(path, mc.n_layer,
    mc.n_embd, #corpus.files, corpus.n_tokens, cartridge.threads()))

local layer_params = mc.n_layer * (mc.n_embd * (mc.n_head + 2 * mc.n_head_kv) * mc.head_dim
    + mc.n_head * mc.head_dim * mc.n_embd + 3 * mc.n_embd * mc.n_ff)
local head_params = mc.n_vocab * mc.n_embd
print(("machine: %s; kernels %s; f32 GEMM peak %.0f GFLOP/s; read bandwidth %.1f GB/s (probed before the run)")
    :format(cartridge.ffi.string(C.cart_cpu_features()), cartridge.isa(), gemm_rate / 1e9, bandwidth / 1e9))

local template = chat.for_model(m)
local init_ids = selfstudy.init_ids(tok, template, corpus.text, opts.p) -- the opening (its first value)
local c = cartridge.cart.new(m, math.min(opts.p, #init_ids), 1)
c:capture(m, init_ids)
local tr = cartridge.trainer.new(m)
local opt = cartridge.adam.new(c, { lr = 2e-3 })
local interviews = selfstudy.interviews(m, tok, corpus, {
    chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a, top_k = 20,
    seed = 42, template = template, teacher_pass = opts.teacher_pass, trainer = tr, spec_b = opts.spec_b,
    record_work = true,
})
local stepper = selfstudy.stepper(tr, c, opts.accum)

local gen_batch = selfstudy.gen_batch(opts.gen_batch, opts.accum, fail)
local steps_per_group = math.floor(gen_batch / opts.accum)
local pending = {}
local train_s, tokens, convos = 0, 0, 0
local student_tokens, student_pairs, head_rows, teacher_tokens, teacher_pairs = 0, 0, 0, 0, 0
local started = now()
for step = 1, opts.steps do
    if (step - 1) % steps_per_group == 0 then
        local keys = {}
        for s = step, math.min(step + steps_per_group - 1, opts.steps) do
            for i = 1, opts.accum do keys[#keys + 1] = { s, i } end
        end
        pending = interviews:group(keys)
    end
    local group = {}
    for i = 1, opts.accum do group[i] = table.remove(pending, 1) end
    local t = now()
    stepper:step(group)
    opt:step()
    train_s = train_s + (now() - t)
    for _, cv in ipairs(group) do
        convos = convos + 1
        tokens = tokens + cv.answer_len
        local T = #cv.student
        student_tokens = student_tokens + T
        student_pairs = student_pairs + T * c.p + T * (T + 1) / 2 -- each token: the rows, then its own segment
        head_rows = head_rows + cv.answer_len
        if opts.teacher_pass then
            local n = #cv.sys_ids + T
            teacher_tokens, teacher_pairs = teacher_tokens + n, teacher_pairs + n * (n + 1) / 2
        end
    end
    io.stderr:write(("\rstep %d/%d"):format(step, opts.steps))
end
io.stderr:write("\n")
local total = now() - started
local after_gemm, after_bw = probe()
print(("probed again after the run: f32 GEMM peak %.0f GFLOP/s, read bandwidth %.1f GB/s; the floor takes the better "
    .. "of each"):format(after_gemm / 1e9, after_bw / 1e9))
local st = interviews.stats.time
local per = function(x) return x / convos end
print(("%d conversations, %d supervised answer tokens, %.1f s in all"):format(convos, tokens, total))
print(("measured  %6.2f s/conversation: bot A %.2f, bot B %.2f, teacher %.2f, training step %.2f, other %.2f")
    :format(per(total), per(st.a), per(st.b), per(st.teacher), per(train_s),
        per(total - st.a - st.b - st.teacher - train_s)))

-- the floor, phase by phase
local pair_flops = 4 * mc.n_layer * mc.n_head * mc.head_dim -- a query against a row: scores and values
local kv_row_bytes = mc.n_layer * 2 * mc.n_head_kv * mc.head_dim * 2 -- f16 caches
local token_flops = 2 * layer_params
local function prefill_flops(w, streams)
    return token_flops * w.prefill + pair_flops * w.prefill_rows + 2 * head_params * streams
end
local function decode_floor(w)
    local s, flops, bytes, stream_steps = 0, 0, 0, 0
    for _, step in ipairs(w.steps) do
        local f = step[1] * (token_flops + 2 * head_params) + step[2] * pair_flops
        local b = m.weight_bytes + step[2] * kv_row_bytes
        s = s + math.max(f / gemm_rate, b / bandwidth)
        flops, bytes, stream_steps = flops + f, bytes + b, stream_steps + step[1]
    end
    return s, flops, bytes, #w.steps, stream_steps
end
local wa, wb = interviews.stats.work.a, interviews.stats.work.b
local a_pre = prefill_flops(wa, convos)
local a_dec, a_dflops, a_dbytes, a_steps, a_ss = decode_floor(wa)
local b_pre = prefill_flops(wb, convos)
local b_dec, b_dflops, b_dbytes, b_steps, b_ss = decode_floor(wb)
local teacher = opts.teacher_pass and token_flops * teacher_tokens + pair_flops * teacher_pairs
    + 2 * head_params * head_rows or 0
-- training: the forward, then the backward through the frozen weights (the
-- input gradients only: as many FLOPs again) and attention's backward
-- (five products of the forward's two: 2.5 times its FLOPs)
local train_flops = 2 * (token_flops * student_tokens + 2 * head_params * head_rows) + 3.5 * pair_flops * student_pairs
local adam_bytes = opts.steps * 7 * 4 * c:trainable_count() -- rows, gradient, two moments: read and written
-- { name, floor s, what it counts, measured s (nil: timed with the phase above) }
local terms = {
    { "bot A prefill", a_pre / gemm_rate, ("%d tokens, %.0f GFLOP"):format(wa.prefill, a_pre / 1e9), wa.prefill_s },
    { "bot A decode", a_dec, ("%d lockstep steps, %d stream-steps: %.0f GFLOP, %.1f GB"):format(a_steps, a_ss,
        a_dflops / 1e9, a_dbytes / 1e9), wa.decode_s },
    { "bot B prefill", b_pre / gemm_rate, ("%d tokens, %.0f GFLOP"):format(wb.prefill, b_pre / 1e9), wb.prefill_s },
    { "bot B decode", b_dec, ("%d lockstep steps, %d stream-steps: %.0f GFLOP, %.1f GB"):format(b_steps, b_ss,
        b_dflops / 1e9, b_dbytes / 1e9), wb.decode_s },
    { "teacher pass", teacher / gemm_rate, opts.teacher_pass and ("%d tokens"):format(teacher_tokens)
        or "none: bot B's logits are the targets", st.teacher },
    { "training", train_flops / gemm_rate, ("%d student tokens, %d supervised: %.0f GFLOP"):format(student_tokens,
        head_rows, train_flops / 1e9), train_s },
    { "Adam", adam_bytes / bandwidth, ("%.2f GB"):format(adam_bytes / 1e9) },
}
local floor = 0
for _, t in ipairs(terms) do floor = floor + t[2] end
print(("floor     %6.2f s/conversation at the %.0f GFLOP/s GEMM peak and %.1f GB/s (a decode step: the longer of "
    .. "its FLOPs and its bytes):"):format(per(floor), gemm_rate / 1e9, bandwidth / 1e9))
for _, t in ipairs(terms) do
    -- beside each term the phase's measured seconds and their ratio to it
    local m_s = t[4] and ("measured %5.2f (%s)"):format(per(t[4]), t[2] > 0 and ("%.2fx"):format(t[4] / t[2]) or "-")
        or "measured with training"
    print(("  %-14s %6.2f s/conversation  %-24s %s"):format(t[1], per(t[2]), m_s, t[3]))
end
print(("measured / floor: %.2fx (bots %.2fx, training step %.2fx)"):format(total / floor,
    per(st.a + st.b) / per(terms[1][2] + terms[2][2] + terms[3][2] + terms[4][2]),
    per(train_s) / per(terms[6][2] + terms[7][2])))
if m.weight_bytes < 1.9 * (layer_params + head_params) then
    print(("note: %.2f bytes a weight: block-type weights, whose inference products (the bots) are integer dot "
        .. "products on quantized activations, faster than the f32 peak (tests/c/bench_matmul); the bots' FLOP terms "
        .. "above are then more than their floor, the training's (exact f32 products) are not")
        :format(m.weight_bytes / (layer_params + head_params)))
end
-- OpenBLAS runs at the CPU's best level even when CART_ISA forces a lower one;
-- the floor at the engine's own f32 GEMM rate is the level's own
if engine_gemm < gemm_rate then
    local flop_s = (a_pre + b_pre + teacher + train_flops) / gemm_rate
    local level_floor = floor + flop_s * (gemm_rate / engine_gemm - 1)
    print(("at this level's own f32 GEMM rate (%.0f GFLOP/s, %s; prefill and training terms only): floor %.2f "
        .. "s/conversation, measured / floor %.2fx"):format(engine_gemm / 1e9, cartridge.isa(), per(level_floor),
        total / level_floor))
end
