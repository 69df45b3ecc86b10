-- bench_grammar.lua: what structured output costs at the Qwen3-0.6B shape:
-- the token mask per decoding step (its mean, and its worst), against the
-- decode step it rides on, and decode tok/s with and without a schema.
--
--   cartridge run recipes/bench_grammar.lua                    # generated 0.6B-shaped f16 model, real Qwen3 vocabulary
--   cartridge run recipes/bench_grammar.lua --schema s.json --tokens 256
--   cartridge run recipes/bench_grammar.lua --model models/Qwen3-0.6B-f16.gguf
--
-- The generated model (once, ~1.2 GB) has random weights and the real
-- Qwen3 tokenizer (151,936 ids) copied from --vocab-from, so the mask walks
-- the vocabulary a real model has; random weights make the decoding wander
-- through every kind of position (keys, free string bodies, numbers,
-- whitespace). Decoding samples at temperature 1; when a document ends the
-- matcher starts a new one on the same cache, so every step of --tokens
-- carries a mask. The figures: the vocabulary's build time, decode ms per
-- step without a schema (and the sampler's part of it), mask ms per step
-- (mean, p50, p99, max) and as a share of the unconstrained step, accept ms
-- per step, and tok/s with the schema and with json_object. (At temperature
-- 1 without top-k the sampler sorts every candidate: a mask that leaves few
-- makes sampling cheaper, which can make a constrained step the faster.)

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local defaults = require("cartridge.defaults")
local grammar = require("cartridge.grammar")
local sampler_mod = require("cartridge.sampler")
local ffi = cartridge.ffi
local C = cartridge.C

local opts = options.parse(arg, {
    summary = "Mask cost per token and decode tok/s with and without a JSON Schema at the Qwen3-0.6B shape.",
    flags = {
        { "model", help = "GGUF to decode with (default: a generated random Qwen3-0.6B-shaped f16 model)" },
        { "vocab-from", default = "../shared/reference/qwen3-tiny-realvocab-f16.gguf",
          help = "GGUF whose tokenizer the generated model copies (the real Qwen3 vocabulary)" },
        { "schema", help = "JSON Schema file (default: a person with strings, numbers, an enum array, a nested object)" },
        { "tokens", type = "int", default = 128, help = "decode steps per run" },
        { "threads", type = "int", default = 2, help = "threads" },
        { "seed", type = "int", default = 1, help = "sampling seed" },
    },
})

local DEFAULT_SCHEMA = [[{"type":"object","properties":{
  "name":{"type":"string","maxLength":40},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "score":{"type":"number","minimum":-10,"maximum":10},
  "tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":4},
  "address":{"type":"object","properties":{"city":{"type":"string","maxLength":30},"zip":{"type":"string",
    "maxLength":10}},"required":["city","zip"],"additionalProperties":false},
  "bio":{"type":"string","maxLength":200}},
 "required":["name","age","score","tags","address","bio"],"additionalProperties":false}]]

cartridge.set_threads(opts.threads)
local now = C.cart_now_seconds

local function cpu_model()
    local f = io.open("/proc/cpuinfo")
    local text = f and f:read("*a") or ""
    if f then f:close() end
    return text:match("model name%s*:%s*([^\n]+)") or text:match("CPU part%s*:%s*([^\n]+)") or "unknown CPU"
end

local path = opts.model
if not path then
    local vocab_from = opts.vocab_from
    if vocab_from:sub(1, 1) ~= "/" then vocab_from = cartridge.root .. "/" .. vocab_from end
    if not defaults.exists(vocab_from) then
        error(("bench_grammar: %s not found; it gives the generated model the real Qwen3 vocabulary (give "
            .. "--vocab-from another Qwen3 GGUF, or --model)"):format(vocab_from), 0)
    end
    path = cartridge.root .. "/models/bench-qwen3-0.6b-f16-qwen3vocab.gguf"
    if not defaults.exists(path) then
        io.stderr:write("bench_grammar: generating " .. path .. " (once)\n")
        randmodel.write({ out = path, preset = "qwen3-0.6b", dtype = "f16", seed = 7, tokenizer_from = vocab_from })
    end
end

local schema_text = DEFAULT_SCHEMA
if opts.schema then
    local f = assert(io.open(opts.schema, "rb"), "bench_grammar: cannot read " .. opts.schema)
    schema_text = f:read("*a")
    f:close()
end

print(("machine: %s; %s; kernels %s; %d threads"):format(cpu_model(), ffi.string(C.cart_cpu_features()),
    cartridge.isa(), cartridge.threads()))
local m = cartridge.model.load(path)
local tok = m:tokenizer()
print(("model %s: %d layers, hidden %d, vocab %d"):format(path, m.config.n_layer, m.config.n_embd, m.n_vocab))
local t0 = now()
local v = grammar.vocab(tok, m.n_vocab)
print(("vocabulary tries and plain-token masks built in %.0f ms"):format((now() - t0) * 1e3))
local g = grammar.schema(schema_text)
print(("schema: longest document %s bytes"):format(g:max_bytes() or "unbounded"))

local prompt = tok:encode("Describe a person as JSON.", { add_special = true })

local function percentile(xs, p)
    local s = {}
    for i, x in ipairs(xs) do s[i] = x end
    table.sort(s)
    return s[math.max(1, math.ceil(p * #s))]
end

-- Decodes opts.tokens steps; with a grammar, each step's mask and accept are
-- timed. Returns step ms (whole step), mask ms list, accept ms list, documents finished.
local function run(gr)
    local kv = m:new_kv(#prompt + opts.tokens + 8, "f16")
    local s = sampler_mod.new({ temperature = 1, seed = opts.seed })
    local mt = gr and grammar.matcher(gr, v)
    local masks, accepts, docs, sample_s = {}, {}, 0, 0
    local logits = m:forward(kv, prompt)
    local start = now()
    for _ = 1, opts.tokens do
        local mask
        if mt then
            local a = now()
            mask = mt:mask()
            masks[#masks + 1] = (now() - a) * 1e3
        end
        local a0 = now()
        local id = s:sample(logits, m.n_vocab, mask)
        sample_s = sample_s + now() - a0
        if mt then
            local a = now()
            if tok:is_eog(id) then
                mt:reset()
                docs = docs + 1
            else
                mt:accept(id)
                if mt:done() then
                    mt:reset()
                    docs = docs + 1
                end
            end
            accepts[#accepts + 1] = (now() - a) * 1e3
        end
        s:accept(id)
        logits = m:forward(kv, { id })
    end
    local step_ms = (now() - start) / opts.tokens * 1e3
    s:free()
    if mt then mt:free() end
    kv:free()
    return step_ms, masks, accepts, docs, sample_s / opts.tokens * 1e3
end

local function mean(xs)
    local sum = 0
    for _, x in ipairs(xs) do sum = sum + x end
    return sum / math.max(#xs, 1)
end

run(nil) -- warm up pages and threads
local plain_ms, _, _, _, plain_sample = run(nil)
print(("decode without a schema:   %6.2f ms/step  %7.1f tok/s; sampling %.2f ms of it"):format(plain_ms, 1e3 / plain_ms,
    plain_sample))
for _, case in ipairs({ { "json_schema", g }, { "json_object", grammar.json_object() } }) do
    local step_ms, masks, accepts, docs, sample_ms = run(case[2])
    local mask_ms = mean(masks)
    print(("decode with %-12s  %6.2f ms/step  %7.1f tok/s  (%.2fx the speed without); sampling %.2f ms; %d documents "
        .. "finished"):format(case[1], step_ms, 1e3 / step_ms, plain_ms / step_ms, sample_ms, docs))
    print(("  mask per token: mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f = %.1f%% of a decode step; accept %.3f ms")
        :format(mask_ms, percentile(masks, 0.5), percentile(masks, 0.99), percentile(masks, 1), 100 * mask_ms / plain_ms,
            mean(accepts)))
end
m:free()
