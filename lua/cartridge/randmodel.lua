-- cartridge.randmodel: deterministic random-weight GGUFs (recipes/make_model.lua,
-- the benchmarks and the tests use it).
--
--   require("cartridge.randmodel").write{ out = "/tmp/m.gguf", preset = "qwen3-tiny", dtype = "f32" }
--
-- Fields: out (required), preset ("default", "qwen3-0.6b", "qwen3-tiny",
-- "qwen2-tiny", "llama-tiny"; with arch "gemma4" the presets of cartridge.randgemma), arch, layers, embd, ff, heads, kv_heads, head_dim, vocab,
-- ctx, rope_theta, eps (1e-6), dtype ("f16"), tied (true), seed (1),
-- std_scale (1), out_scale (4), tokenizer_from (a GGUF path), tokenizer (a
-- learned vocabulary, cartridge.bpe), tokenizer_model (gemma4 only: see
-- cartridge.randgemma), name, quiet.
-- The same fields give the same bytes. Weights are normal with std
-- 1/sqrt(fan_in) (embeddings too, since they double as the tied head), norm
-- weights 1 + N(0, 0.1) and the final norm scaled by out_scale, so a random
-- model's logits have a spread of a few units: its next-token distribution is
-- neither flat nor a spike. The tokenizer is copied from another GGUF, or is a
-- small built-in byte-level BPE (256 byte tokens + ChatML specials, no merges)
-- that needs no download.

local core = require("cartridge.core")
local gguf = require("cartridge.gguf")
local dtype_mod = require("cartridge.dtype")
local fmt = require("cartridge.fmt")
local ffi = core.ffi
local C = core.C

local randmodel = {}

randmodel.PRESETS = {
    -- the embedded default model: small enough to train on two cores in minutes
    default = { arch = "qwen3", layers = 4, embd = 256, ff = 768, heads = 4, kv_heads = 2, head_dim = 64, ctx = 8192 },
    ["qwen3-0.6b"] = { arch = "qwen3", layers = 28, embd = 1024, ff = 3072, heads = 16, kv_heads = 8, head_dim = 128,
        ctx = 40960, vocab = 151936 },
    ["qwen3-tiny"] = { arch = "qwen3", layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, head_dim = 16, ctx = 4096 },
    ["qwen2-tiny"] = { arch = "qwen2", layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, head_dim = 16, ctx = 4096 },
    ["llama-tiny"] = { arch = "llama", layers = 2, embd = 64, ff = 128, heads = 4, kv_heads = 2, head_dim = 16, ctx = 2048 },
}

local PRESETS = randmodel.PRESETS

-- opts' defaults filled in; the model's shape (the preset's, with opts'
-- overrides), RoPE base and weight dtype id.
local function resolve(opts)
    opts.eps = opts.eps or 1e-6
    opts.dtype = opts.dtype or "f16"
    if opts.tied == nil then opts.tied = true end
    opts.seed = opts.seed or 1
    opts.std_scale = opts.std_scale or 1.0
    opts.out_scale = opts.out_scale or 4.0
    local preset = PRESETS[opts.preset or "default"]
    if not preset then error("make_model: unknown preset '" .. tostring(opts.preset) .. "'", 0) end
    local shape = {}
    for k, v in pairs(preset) do shape[k] = v end
    for _, k in ipairs({ "arch", "layers", "embd", "ff", "heads", "kv_heads", "head_dim", "vocab", "ctx" }) do
        if opts[k] ~= nil then shape[k] = opts[k] end
    end
    if shape.arch == "llama" or shape.arch == "qwen2" then shape.head_dim = shape.embd / shape.heads end
    if not ({ qwen3 = true, qwen2 = true, llama = true })[shape.arch] then
        error("make_model: --arch " .. tostring(shape.arch) .. " is not one of qwen3, qwen2, llama, gemma4", 0)
    end
    if shape.heads % shape.kv_heads ~= 0 then
        error(("make_model: %d heads are not a multiple of %d kv heads"):format(shape.heads, shape.kv_heads), 0)
    end
    local theta = opts.rope_theta or (shape.arch == "llama" and 1e4 or 1e6)
    return shape, theta, dtype_mod.id(opts.dtype)
end

local CHATML_TEMPLATE = table.concat({
    "{%- for message in messages %}",
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
})

-- Qwen2.5's ChatML: no think block, a default system message.
local QWEN2_TEMPLATE = table.concat({
    "{%- if messages[0]['role'] != 'system' %}",
    "{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}",
    "{%- endif %}",
    "{%- for message in messages %}",
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}",
})

local CHATML_SPECIALS = {
    { "<|endoftext|>", 3 }, { "<|im_start|>", 3 }, { "<|im_end|>", 3 }, { "<think>", 4 }, { "</think>", 4 },
}

-- The ChatML specials after tokens[1 .. first] and the keys that name them.
local function chatml_keys(w, tokens, types, first, arch)
    for _, sp in ipairs(CHATML_SPECIALS) do
        tokens[#tokens + 1], types[#types + 1] = sp[1], sp[2]
    end
    w:set("tokenizer.ggml.model", "gpt2")
    w:set("tokenizer.ggml.pre", "qwen2")
    w:set("tokenizer.ggml.bos_token_id", first, "uint32")     -- <|endoftext|>
    w:set("tokenizer.ggml.eos_token_id", first + 2, "uint32") -- <|im_end|>
    w:set("tokenizer.ggml.padding_token_id", first, "uint32")
    w:set("tokenizer.ggml.add_bos_token", false)
    w:set("tokenizer.chat_template", arch == "qwen2" and QWEN2_TEMPLATE or CHATML_TEMPLATE)
end

-- the built-in byte-level vocabulary: 256 byte tokens, the ChatML specials
local function builtin_tokenizer(w, arch)
    local tokens, types = require("cartridge.bpe").byte_symbols(), {}
    for i = 1, 256 do types[i] = 1 end -- NORMAL
    chatml_keys(w, tokens, types, 256, arch)
    return tokens, types, #tokens
end

-- a learned vocabulary: v = { tokens (byte symbols and merged tokens,
-- cartridge.bpe), merges }; the ChatML specials follow
local function learned_tokenizer(w, v, arch)
    local tokens, types = {}, {}
    for i, t in ipairs(v.tokens) do tokens[i], types[i] = t, 1 end
    chatml_keys(w, tokens, types, #tokens, arch)
    w:set("tokenizer.ggml.merges", v.merges, "array", "string")
    return tokens, types, #tokens
end

local function pad_vocab(tokens, types, vocab)
    for id = #tokens, vocab - 1 do
        tokens[id + 1] = ("[PAD%d]"):format(id)
        types[id + 1] = 5 -- UNUSED
    end
end

-- The tokenizer's keys: copied from opts.tokenizer_from, or the learned or
-- built-in vocabulary; fills shape.vocab when opts leave it open.
local function write_tokenizer(w, opts, shape)
    if opts.tokenizer_from then
        local src = gguf.open(opts.tokenizer_from)
        for _, kv in ipairs(src:metadata(true)) do
            if kv.key:match("^tokenizer%.") then w:set(kv.key, kv.raw) end
        end
        local n_tok = #src:get("tokenizer.ggml.tokens")
        shape.vocab = shape.vocab or n_tok
        if shape.vocab < n_tok then
            error(("make_model: --vocab %d is smaller than the tokenizer's %d tokens"):format(shape.vocab, n_tok), 0)
        end
        if shape.vocab > n_tok then
            local tokens, types = src:get("tokenizer.ggml.tokens"), src:get("tokenizer.ggml.token_type")
            pad_vocab(tokens, types, shape.vocab)
            w:set("tokenizer.ggml.tokens", tokens, "array", "string")
            w:set("tokenizer.ggml.token_type", types, "array", "int32")
        end
        src:close()
        return
    end
    local tokens, types, n_tok
    if opts.tokenizer then tokens, types, n_tok = learned_tokenizer(w, opts.tokenizer, shape.arch)
    else tokens, types, n_tok = builtin_tokenizer(w, shape.arch) end
    shape.vocab = shape.vocab or n_tok
    if shape.vocab < n_tok then
        error(("make_model: --vocab %d is smaller than the built-in tokenizer's %d tokens"):format(shape.vocab, n_tok), 0)
    end
    pad_vocab(tokens, types, shape.vocab)
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    if not opts.tokenizer then w:set("tokenizer.ggml.merges", {}, "array", "string") end
end

local FILE_TYPE = { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 7, q5_0 = 8, q5_1 = 9, q2_K = 10,
    q3_K = 12, q4_K = 15, q5_K = 17, q6_K = 18, bf16 = 32 }

-- The model's own keys (general.*, the architecture's hyperparameters).
local function write_config(w, opts, shape, theta, dtype)
    local arch, dtype_name = shape.arch, dtype_mod.name(dtype)
    if not FILE_TYPE[dtype_name] then
        error("make_model: --dtype " .. opts.dtype .. " is not one of " ..
            "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K", 0)
    end
    w:set("general.architecture", arch)
    w:set("general.name", opts.name or ("random-%s-%dL-%d"):format(arch, shape.layers, shape.embd))
    w:set("general.file_type", FILE_TYPE[dtype_name], "uint32")
    if dtype_mod.info(dtype).is_quantized then w:set("general.quantization_version", 2, "uint32") end
    w:set(arch .. ".block_count", shape.layers, "uint32")
    w:set(arch .. ".context_length", shape.ctx, "uint32")
    w:set(arch .. ".embedding_length", shape.embd, "uint32")
    w:set(arch .. ".feed_forward_length", shape.ff, "uint32")
    w:set(arch .. ".attention.head_count", shape.heads, "uint32")
    w:set(arch .. ".attention.head_count_kv", shape.kv_heads, "uint32")
    if arch == "qwen3" then
        w:set(arch .. ".attention.key_length", shape.head_dim, "uint32")
        w:set(arch .. ".attention.value_length", shape.head_dim, "uint32")
    end
    w:set(arch .. ".rope.dimension_count", shape.head_dim, "uint32")
    w:set(arch .. ".rope.freq_base", theta, "float32")
    w:set(arch .. ".attention.layer_norm_rms_epsilon", opts.eps, "float32")
end

-- The tensors: { name, shape (row-major), kind }. Matrices take the
-- weight dtype, vectors f32.
local function tensor_list(shape, tied)
    local E, F, D = shape.embd, shape.ff, shape.head_dim
    local HD, KD = shape.heads * D, shape.kv_heads * D
    local list = { { "token_embd.weight", { shape.vocab, E }, "embed" } }
    for l = 0, shape.layers - 1 do
        local p = "blk." .. l .. "."
        list[#list + 1] = { p .. "attn_norm.weight", { E }, "norm" }
        list[#list + 1] = { p .. "attn_q.weight", { HD, E }, "matrix" }
        list[#list + 1] = { p .. "attn_k.weight", { KD, E }, "matrix" }
        list[#list + 1] = { p .. "attn_v.weight", { KD, E }, "matrix" }
        list[#list + 1] = { p .. "attn_output.weight", { E, HD }, "matrix" }
        if shape.arch == "qwen2" then
            list[#list + 1] = { p .. "attn_q.bias", { HD }, "bias" }
            list[#list + 1] = { p .. "attn_k.bias", { KD }, "bias" }
            list[#list + 1] = { p .. "attn_v.bias", { KD }, "bias" }
        end
        if shape.arch == "qwen3" then
            list[#list + 1] = { p .. "attn_q_norm.weight", { D }, "norm" }
            list[#list + 1] = { p .. "attn_k_norm.weight", { D }, "norm" }
        end
        list[#list + 1] = { p .. "ffn_norm.weight", { E }, "norm" }
        list[#list + 1] = { p .. "ffn_gate.weight", { F, E }, "matrix" }
        list[#list + 1] = { p .. "ffn_up.weight", { F, E }, "matrix" }
        list[#list + 1] = { p .. "ffn_down.weight", { E, F }, "matrix" }
    end
    list[#list + 1] = { "output_norm.weight", { E }, "out_norm" }
    if not tied then list[#list + 1] = { "output.weight", { shape.vocab, E }, "matrix" } end
    return list
end

-- The tensors' entries, each matrix's rows a whole number of dtype's blocks.
local function add_tensors(w, list, dtype)
    local info, dtype_name = dtype_mod.info(dtype), dtype_mod.name(dtype)
    for _, t in ipairs(list) do
        local cols = t[2][#t[2]]
        local tdtype = #t[2] == 2 and dtype or 0
        if #t[2] == 2 and cols % info.block_size ~= 0 then
            error(("make_model: %s has rows of %d, not a multiple of %s's block of %d; pick a shape "
                .. "whose dims are multiples of %d or another --dtype"):format(t[1], cols, dtype_name,
                info.block_size, info.block_size), 0)
        end
        w:add_tensor(t[1], tdtype, t[2], nil)
    end
end

-- Each tensor's values from its own seed: norms 1 + N(0, 0.1) (the final
-- one times out_scale), biases N(0, 0.5) (Qwen2's are large, its keys'
-- above all), the rest N(0, std_scale / sqrt(fan_in)).
local function write_weights(w, list, opts, dtype)
    local rng = ffi.new("cart_rng")
    for index, t in ipairs(list) do
        local rows, cols = t[2][1], t[2][2] or 1
        local n = rows * cols
        local buf = ffi.new("float[?]", n)
        C.cart_rng_seed(rng, opts.seed * 1000003 + index)
        local kind = t[3]
        if kind == "norm" or kind == "out_norm" then
            C.cart_rng_fill_normal(rng, buf, n, 1.0, 0.1)
            if kind == "out_norm" then
                for i = 0, n - 1 do buf[i] = buf[i] * opts.out_scale end
            end
            w:write_tensor(t[1], buf)
        elseif kind == "bias" then
            C.cart_rng_fill_normal(rng, buf, n, 0.0, 0.5)
            w:write_tensor(t[1], buf)
        else
            local std = opts.std_scale / math.sqrt(cols) -- embeddings too: they double as the tied head
            C.cart_rng_fill_normal(rng, buf, n, 0.0, std)
            if #t[2] == 2 and dtype ~= 0 then
                w:write_tensor(t[1], dtype_mod.from_f32(dtype, buf, n))
            else
                w:write_tensor(t[1], buf)
            end
        end
    end
end

function randmodel.write(opts)
    if not opts.out then error("make_model: out is required", 0) end
    local randgemma = require("cartridge.randgemma")
    if opts.arch == "gemma4" or randgemma.PRESETS[opts.preset or ""] then
        if opts.arch and opts.arch ~= "gemma4" then
            error(("make_model: preset '%s' is a gemma4 shape, not %s"):format(opts.preset, opts.arch), 0)
        end
        local g = {}
        for k, v in pairs(opts) do g[k] = v end
        if g.preset == nil or g.preset == "default" then g.preset = "tiny-dense" end
        return randgemma.write(g)
    end
    if opts.tokenizer_model then
        error("make_model: --tokenizer-model applies to --arch gemma4 only (qwen3 and llama take --tokenizer-from)", 0)
    end
    local shape, theta, dtype = resolve(opts)
    local w = gguf.writer()
    write_tokenizer(w, opts, shape)
    write_config(w, opts, shape, theta, dtype)
    local list = tensor_list(shape, opts.tied)
    add_tensors(w, list, dtype)
    local total_params = 0
    for _, t in ipairs(list) do total_params = total_params + t[2][1] * (t[2][2] or 1) end
    if not opts.quiet then
        io.stderr:write(("make_model: %s %dL hidden %d, %s parameters, %s -> %s\n"):format(shape.arch, shape.layers,
            shape.embd, fmt.int(total_params), dtype_mod.name(dtype), opts.out))
    end
    require("cartridge.fs").mkdirs(require("cartridge.fs").parent(opts.out))
    w:begin(opts.out)
    local started = C.cart_now_seconds()
    write_weights(w, list, opts, dtype)
    return randmodel.finish(w, opts, started)
end

-- Closes the file a writer streamed (atomically) and says so unless quiet.
function randmodel.finish(w, opts, started)
    w:finish()
    if not opts.quiet then
        io.stderr:write(("make_model: wrote %s in %.1f s\n"):format(opts.out, C.cart_now_seconds() - started))
    end
    return opts.out
end

return randmodel
