-- equiv.lua: the equivalence gate. A cartridge captured from the model's own
-- K/V of the first p corpus tokens must score the next tokens exactly like a
-- real prefill of the whole span.
--
--   cartridge run recipes/equiv.lua --model M --corpus README.md --p 256 --suffix-max 128
--
-- First the model's shape-sensitivity envelope: the same p + s tokens
-- prefilled in one pass and in two (p, then s), the largest difference of
-- the last s rows' logits. The engine's products give a row the same bits
-- in any batch on the GEMM path (more than 16 tokens a call, matmul.h), so
-- with p and s above 16 it is 0; below, the GEMV path's sums round
-- otherwise (and gemma4's GELU table or q8_0 activations can turn that into
-- a few thousandths).
-- Teacher: one prefill of the first p + s corpus tokens (s = min(suffix-max,
-- tokens - p)). Student: a cartridge captured from the first p tokens, written
-- into an empty cache, then the next s tokens evaluated behind it. Passes when
-- the greedy choice agrees at all s rows and the student is within the
-- envelope of the teacher (exit 0), else FAIL (exit 1). The corpus ids are the
-- raw concatenated documents, not chat-wrapped.
--
-- --compose: the composed gate. The first 2p tokens are captured once and
-- split into two parts, A = rows 0..p-1 and B = rows p..2p-1 (B keeps the
-- positions it was captured at); their composition (cart.compose, the
-- fleet's) must score the next s tokens like the real prefill of 2p + s.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local cart = require("cartridge.cart")
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Check that a corpus-init cartridge scores the next tokens exactly like a real prefill.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "corpus", repeatable = true, help = "a text file, or a directory of .md files (repeatable; required)" },
        { "p", type = "int", default = 256, help = "cartridge rows (the prefix length)" },
        { "frozen", type = "int", default = 1, help = "attention-sink rows" },
        { "suffix-max", type = "int", default = 64, help = "suffix tokens scored at most" },
        { "kv", default = "f32", choices = { "f32", "f16" }, help = "KV cache dtype on both sides (the capture too)" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        { "compose", type = "boolean", help = "the composed gate: capture 2p tokens, split them into two parts of p rows, compose them" },
    },
})

cartridge.set_threads(opts.threads)
if #opts.corpus == 0 then error("equiv: --corpus is required (a text file or a directory of .md files)", 0) end
if opts.p < 1 or opts.suffix_max < 1 then error("equiv: --p and --suffix-max must be at least 1", 0) end
local m = cartridge.model.load(defaults.pick_model(opts.model))
local c = m.config
print(m:describe())
local corpus = corpus_mod.load(opts.corpus, m:tokenizer())
print(("corpus: %d files, %d tokens"):format(#corpus.files, corpus.n_tokens))
local parts = opts.compose and 2 or 1
corpus:require_tokens(parts * opts.p + 2, ("lower --p (at most %d for this corpus%s) or add text"):format(
    math.max(1, math.floor((corpus.n_tokens - 2) / parts)), opts.compose and " with --compose" or ""))

local p = parts * opts.p -- the rows in front of the suffix
local s = math.min(opts.suffix_max, corpus.n_tokens - p)
local full = corpus.ids:sub(0, p + s)
local prefix, suffix = full:sub(0, p), full:sub(p, s)
local V = m.n_vocab
local now = C.cart_now_seconds

-- teacher: the real prefill of p + s tokens, logits of the last s rows
local t0 = now()
local kv_t = m:new_kv(p + s, opts.kv)
local rows = {}
for i = 1, s do rows[i] = p + i - 1 end
local teacher_ptr = m:forward(kv_t, full, rows)
local teacher = cartridge.ffi.new("float[?]", s * V)
cartridge.ffi.copy(teacher, teacher_ptr, s * V * 4)
kv_t:free()
local teacher_s = now() - t0

-- the envelope: the same tokens in two passes (p, then s)
local kv_e = m:new_kv(p + s, opts.kv)
m:forward(kv_e, prefix, "none")
local split = m:forward(kv_e, suffix, "all")
local envelope = 0
for i = 0, s * V - 1 do
    local d = math.abs(teacher[i] - split[i])
    if d > envelope then envelope = d end
end
kv_e:free()
print(("model shape-sensitivity envelope (m=%d vs m=%d, no cartridge): max |dlogit| %.6f%s"):format(s, p + s,
    envelope, envelope == 0 and " (bitwise)" or ""))
local t1 = now()

-- student: capture, write into an empty cache, evaluate the suffix behind it
local cr = cart.new(m, p, opts.frozen)
cr:capture(m, prefix, opts.kv) -- through the same cache dtype as the teacher
if opts.compose then
    -- split the capture into A and B (rows kept where they were computed),
    -- then compose them again as a fleet composes its documents' cartridges
    local q = opts.p
    local a, b = cart.new(m, q, opts.frozen), cart.new(m, q, opts.frozen)
    a:copy_rows(0, cr, 0, q)
    b:copy_rows(0, cr, q, q)
    cr:free()
    cr = cart.compose({ a, b })
    a:free()
    b:free()
    print(("composed gate: A = rows 0..%d, B = rows %d..%d (positions kept), %d rows composed"):format(q - 1, q,
        2 * q - 1, cr.p))
end
local kv_s = m:new_kv(p + s, opts.kv)
cr:append_to(kv_s)
local t2 = now()
local student = m:forward(kv_s, suffix, "all")
local t3 = now()

local max_d, sum_d, agree = 0, 0, 0
for r = 0, s - 1 do
    for v = 0, V - 1 do
        local d = math.abs(teacher[r * V + v] - student[r * V + v])
        if d > max_d then max_d = d end
        sum_d = sum_d + d
    end
    if C.cart_argmax(teacher + r * V, V) == C.cart_argmax(student + r * V, V) then agree = agree + 1 end
end
print(("prefill-equivalence over %d suffix tokens: max |dlogit| %.6f, mean %.7f, greedy agreement %d/%d")
    :format(s, max_d, sum_d / (s * V), agree, s))
print(("timings: teacher prefill %.3f s, capture+init %.3f s, cartridge eval %.3f s (%s KV)"):format(
    teacher_s, t2 - t1, t3 - t2, opts.kv))
kv_s:free()
cr:free()
m:free()
if agree == s and max_d <= envelope then
    print(("PASS: %s is behaviorally identical to the real prefill (%s)"):format(
        opts.compose and "the composition of the two parts" or "untrained corpus-init cartridge",
        max_d == 0 and "bitwise" or "within the envelope"))
elseif agree ~= s then
    print(("FAIL: greedy agreement %d/%d; the cartridge does not reproduce the prefill"):format(agree, s))
    os.exit(1)
else
    print(("FAIL: max |dlogit| %.6f is beyond the model's envelope %.6f; the cartridge does not reproduce the "
        .. "prefill"):format(max_d, envelope))
    os.exit(1)
end
