-- bench_selfstudy.lua: seconds per self-study conversation at the Qwen3-0.6B
-- shape, broken down into bot A, bot B, teacher and training step, next to the
-- floor this machine allows.
--
--   cartridge run recipes/bench_selfstudy.lua               # generates the model once (~1.2 GB)
--   cartridge run recipes/bench_selfstudy.lua --model M --steps 8
--
-- Budgets default to the reference's demo: p 256, chunks 256-512, max-q 64,
-- max-a 160, accum 4, 8 steps. The floor: the FLOPs of a conversation (chunk
-- and prompt prefills, the training forward and backward) at this machine's
-- f32 GEMM peak, plus the bytes its lockstep decode steps read at its read
-- bandwidth. Both are measured here first (probe.h): the peak by a plain
-- 1536^3 GEMM (the faster of OpenBLAS and the engine's f32 kernel), not by the
-- engine's own prefill, and the bandwidth by integer sums over 512 MiB.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local chat = require("cartridge.chat")
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
        { "spec-b", type = "boolean", help = "bot B decodes speculatively" },
        { "teacher-pass", type = "boolean", help = "run the separate packed teacher pass" },
    },
})

cartridge.set_threads(opts.threads)
local bandwidth = C.cart_probe_read_bandwidth(512 * 2 ^ 20, 5, nil)
local engine_gemm = C.cart_probe_engine_gemm(1536, 3, nil)
local gemm_rate = math.max(C.cart_probe_blas_gemm(1536, 3), engine_gemm)
local path = opts.model
if not path then
    path = cartridge.root .. "/models/bench-qwen3-0.6b-f16.gguf"
    if not defaults.exists(path) then
        io.stderr:write("bench_selfstudy: generating " .. path .. " (once)\n")
        randmodel.write({ out = path, preset = "qwen3-0.6b", dtype = "f16", seed = 7 })
    end
end
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
print(("machine: %s; kernels %s; f32 GEMM peak %.0f GFLOP/s; read bandwidth %.1f GB/s")
    :format(cartridge.ffi.string(C.cart_cpu_features()), cartridge.isa(), gemm_rate / 1e9, bandwidth / 1e9))

local template = chat.for_model(m)
local c = cartridge.cart.new(m, math.min(opts.p, #selfstudy.init_ids(tok, template, corpus.text, opts.p)), 1)
c:capture(m, selfstudy.init_ids(tok, template, corpus.text, opts.p))
local tr = cartridge.trainer.new(m)
local opt = cartridge.adam.new(c, { lr = 2e-3 })
local synth = selfstudy.synthesizer(m, tok, corpus, {
    chunk_min = opts.chunk_min, chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a, top_k = 20,
    rng = selfstudy.rng(42), template = template, teacher_pass = opts.teacher_pass, trainer = tr, spec_b = opts.spec_b,
})

local train_s, tokens, convos = 0, 0, 0
local prefill_tokens, student_tokens, head_rows, decode_steps_a, decode_steps_b = 0, 0, 0, 0, 0
local started = now()
for step = 1, opts.steps do
    local group = synth:group(opts.accum)
    local t = now()
    selfstudy.train_step(tr, c, group, true)
    opt:step()
    train_s = train_s + (now() - t)
    local max_q_len, max_a_len = 0, 0
    for _, cv in ipairs(group) do
        convos = convos + 1
        tokens = tokens + cv.answer_len
        prefill_tokens = prefill_tokens + #cv.sys_ids + #cv.prefix + 40 -- + bot A's instruction turn
        student_tokens = student_tokens + #cv.student
        head_rows = head_rows + cv.answer_len
        max_a_len = math.max(max_a_len, cv.answer_len)
    end
    decode_steps_a = decode_steps_a + opts.max_q -- lockstep: the group runs as long as its longest stream
    decode_steps_b = decode_steps_b + max_a_len
    io.stderr:write(("\rstep %d/%d"):format(step, opts.steps))
end
io.stderr:write("\n")
local total = now() - started
local st = synth.stats.time
local per = function(x) return x / convos end
print(("%d conversations, %d supervised answer tokens, %.1f s in all"):format(convos, tokens, total))
print(("measured  %6.2f s/conversation: bot A %.2f, bot B %.2f, teacher %.2f, training step %.2f, other %.2f")
    :format(per(total), per(st.a), per(st.b), per(st.teacher), per(train_s),
        per(total - st.a - st.b - st.teacher - train_s)))
-- the floor
local prefill_flops = 2 * layer_params * prefill_tokens
local train_flops = 4 * layer_params * student_tokens + 4 * head_params * head_rows
local decode_bytes = (decode_steps_a + decode_steps_b) * m.weight_bytes
local floor = (prefill_flops + train_flops) / gemm_rate + decode_bytes / bandwidth
print(("floor     %6.2f s/conversation: %.0f GFLOP at the %.0f GFLOP/s GEMM peak (%.2f s) + %.1f GB of decode reads at %.1f GB/s (%.2f s)")
    :format(per(floor), per(prefill_flops + train_flops) / 1e9, gemm_rate / 1e9,
        per(prefill_flops + train_flops) / gemm_rate, per(decode_bytes) / 1e9, bandwidth / 1e9,
        per(decode_bytes) / bandwidth))
print(("measured / floor: %.2fx"):format(total / floor))
-- OpenBLAS runs at the CPU's best level even when CART_ISA forces a lower one;
-- the floor at the engine's own f32 GEMM rate is the level's own
local level_floor = (prefill_flops + train_flops) / engine_gemm + decode_bytes / bandwidth
print(("at this level's own f32 GEMM rate (%.0f GFLOP/s, %s): floor %.2f s/conversation, measured / floor %.2fx")
    :format(engine_gemm / 1e9, cartridge.isa(), per(level_floor), total / level_floor))
