-- cartridge.randgemma: deterministic random-weight gemma4 GGUFs, dense or
-- MoE, that llama.cpp loads (randmodel.write hands gemma4 to it).
--
--   require("cartridge.randgemma").write{ out = "/tmp/g.gguf", preset = "tiny-dense", dtype = "f32" }
--
-- Presets:
--   tiny-dense  4 layers (sliding, sliding, full, sliding), hidden 64, 4 query
--               heads; the sliding layers 2 KV heads of 16 dims, window 32,
--               RoPE base 1e4 on all 16 dims; the full layer 1 KV head of 32
--               dims, base 1e6 with proportional RoPE (rope_freqs: 4 of its 16
--               pairs rotate, the others get a factor of 1e30); per-layer
--               inputs of 32; layer output scales; soft-capping at 30
--   tiny-moe    the same attention, no per-layer inputs; every layer has 4
--               experts of 64 (top 2) beside a dense FFN of 128
--   26b-a4b     gemma-4-26B-A4B's shape (30 layers, hidden 2816, 128 experts
--               of 704, top 8, window 1024, head_dim 256 / 512, the experts'
--               gate and up merged into ffn_gate_up_exps as the converters
--               write them): for speed figures; its 262,144-token
--               vocabulary is the small SPM one padded, which changes no
--               cost of the forward
-- Fields: out (required), preset, dtype ("f32": matrices; vectors stay f32,
-- and so does the router), seed (1), name, quiet, any preset key (layers,
-- embd, heads, ff, pattern, kv_swa, hd_full, experts, ...), and
-- no_tokenizer (the model alone, for the fuzz seeds; vocab then sets the
-- embedding rows), tokenizer_model ("llama", the default, or "gemma4").
-- The "llama" vocabulary is a small SentencePiece one: <pad> <eos> <bos>
-- <unk>, gemma's chat markers <|turn> <turn|> <|channel> <channel|>, the 256
-- byte tokens, then single characters and common English words with every
-- prefix, so that ordinary text splits into a few tokens per word. The
-- "gemma4" vocabulary is the kind real gemma 4 GGUFs carry
-- (tokenizer.ggml.model "gemma4", as llama.cpp's converter writes it): BPE
-- merges over text whose spaces are U+2581, <0xNN> byte fallback, the same
-- specials plus gemma 4's tool markers, newline-run tokens, and merges
-- learned from a small built-in text (bpe_vocabulary). The chat template is
-- gemma's turn format.

local core = require("cartridge.core")
local gguf = require("cartridge.gguf")
local dtype_mod = require("cartridge.dtype")
local fmt = require("cartridge.fmt")
local ffi = core.ffi
local C = core.C

local randgemma = {}

local SWA, FULL = true, false

randgemma.PRESETS = {
    ["tiny-dense"] = { layers = 4, embd = 64, heads = 4, ff = 128, pattern = { SWA, SWA, FULL, SWA },
        kv_swa = 2, kv_full = 1, hd_swa = 16, hd_full = 32, rot_full_pairs = 4, window = 32,
        theta = 1e6, theta_swa = 1e4, per_layer = 32, softcap = 30.0, out_scales = true, ctx = 4096 },
    ["tiny-moe"] = { layers = 4, embd = 64, heads = 4, ff = 128, pattern = { SWA, SWA, FULL, SWA },
        kv_swa = 2, kv_full = 1, hd_swa = 16, hd_full = 32, rot_full_pairs = 4, window = 32,
        theta = 1e6, theta_swa = 1e4, per_layer = 0, softcap = 30.0, out_scales = true, ctx = 4096,
        experts = 4, experts_used = 2, ff_exp = 64 },
    ["26b-a4b"] = { layers = 30, embd = 2816, heads = 16, ff = 2112, window = 1024,
        pattern = "5:1", kv_swa = 8, kv_full = 2, hd_swa = 256, hd_full = 512, rot_full_pairs = 64,
        theta = 1e6, theta_swa = 1e4, per_layer = 0, softcap = 30.0, out_scales = true, ctx = 262144,
        experts = 128, experts_used = 8, ff_exp = 704, vocab = 262144, merged_experts = true },
}

-- gemma's turn format, as a Jinja template llama.cpp can read
local TEMPLATE = table.concat({
    "{{- bos_token }}",
    "{%- for message in messages %}",
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}",
    "{{- '<|turn>' + role + '\\n' + message['content'] + '<turn|>\\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|turn>model\\n<|channel>thought\\n<channel|>' }}{%- endif %}",
})

local WORDS = {
    "the", "and", "to", "of", "a", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as", "he",
    "she", "they", "be", "at", "one", "have", "this", "from", "by", "not", "but", "what", "all", "were",
    "when", "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each",
    "about", "how", "up", "out", "them", "then", "many", "some", "so", "these", "would", "other", "into",
    "has", "more", "her", "two", "like", "him", "see", "time", "could", "no", "make", "than", "first",
    "been", "its", "who", "now", "people", "my", "made", "over", "did", "down", "only", "way", "find",
    "use", "may", "water", "long", "little", "very", "after", "words", "called", "just", "where", "most",
    "know", "model", "cartridge", "corpus", "question", "answer", "once", "upon", "dog", "park", "went",
    "Once", "The", "What", "Tom", "Lily",
}

-- The vocabulary: tokens, scores and types (SentencePiece, as llama.cpp's
-- "llama" tokenizer model reads them).
local function vocabulary()
    local tokens, scores, types = {}, {}, {}
    local seen = {}
    local function add(text, score, kind)
        if seen[text] then return end
        seen[text] = true
        tokens[#tokens + 1], scores[#scores + 1], types[#types + 1] = text, score, kind
    end
    add("<pad>", 0, 3)
    add("<eos>", 0, 3)
    add("<bos>", 0, 3)
    add("<unk>", 0, 2)
    add("<|turn>", 0, 3)
    add("<turn|>", 0, 3)
    add("<|channel>", 0, 4)
    add("<channel|>", 0, 4)
    for b = 0, 255 do add(("<0x%02X>"):format(b), 0, 6) end
    local SP = "\xe2\x96\x81" -- U+2581, SentencePiece's space
    add(SP, -1, 1)
    add("\n", -1, 1)
    add("\n\n", -0.5, 1)
    for c = 0x21, 0x7e do add(string.char(c), -2, 1) end
    for c = 0x61, 0x7a do add(SP .. string.char(c), -1.5, 1) end
    for c = 0x41, 0x5a do add(SP .. string.char(c), -1.6, 1) end
    for rank, w in ipairs(WORDS) do
        for n = 2, #w do add(SP .. w:sub(1, n), -1 + n * 0.01 - rank * 0.001, 1) end
        for n = 2, #w do add(w:sub(1, n), -1.2 + n * 0.01 - rank * 0.001, 1) end
    end
    return tokens, scores, types
end

-- The text the "gemma4" vocabulary's merges are learned from: prose, digits,
-- indentation, a few accented letters and CJK characters.
local BPE_TEXT = {
    "Once upon a time there was a little dog called Tom. The dog went to the park with Lily.",
    "They were very happy, and the dog ran after the ball all day long until the sun went down.",
    "What is a cartridge? A cartridge is a small trained prefix that a model reads in place of a long corpus,",
    "so that it can answer each question about the corpus without reading it all again.",
    "The model has 2024 words and 1000 questions; the answer is 42 or 365 or 12.5 percent.",
    "def answer(question):    return model.read(corpus)  # one two three",
    "    if the answer is not there, we find it in the corpus and then we use it.",
    "The caf\xc3\xa9 is na\xc3\xafve, the \xc3\xbcber fa\xc3\xa7ade is long, and the ni\xc3\xb1o said no.",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe6\x97\xa5\xe6\x9c\xac \xe6\x9c\xac",
}

-- Learns `count` BPE merges from BPE_TEXT (spaces as U+2581; a word is a run
-- of spaces and the characters after it), the most frequent pair first, ties
-- to the smaller "left right" string, so the result is deterministic; it
-- stops early once every word is one token.
local function learn_merges(count)
    local SP = "\xe2\x96\x81"
    local freq = {}
    for _, line in ipairs(BPE_TEXT) do
        for word in line:gmatch(" *[^ ]*") do
            if #word > 0 then freq[word] = (freq[word] or 0) + 1 end
        end
    end
    local words = {}
    for word, n in pairs(freq) do
        local syms = {}
        for ch in word:gmatch("[%z\1-\127\194-\244][\128-\191]*") do syms[#syms + 1] = ch == " " and SP or ch end
        words[#words + 1] = { s = syms, c = n, key = word }
    end
    table.sort(words, function(a, b) return a.key < b.key end)
    return require("cartridge.bpe").learn(words, count, 1)
end

-- The "gemma4" vocabulary: tokens, scores, types and merges, laid out as
-- llama.cpp's converter writes a gemma 4 tokenizer (the visible tool markers
-- USER_DEFINED, the byte tokens BYTE).
local function bpe_vocabulary()
    local tokens, scores, types = {}, {}, {}
    local seen = {}
    local function add(text, kind)
        if seen[text] then return end
        seen[text] = true
        tokens[#tokens + 1], types[#types + 1] = text, kind
        scores[#scores + 1] = kind == 1 and -#tokens or 0
    end
    add("<pad>", 3)
    add("<eos>", 3)
    add("<bos>", 3)
    add("<unk>", 2)
    add("<mask>", 3)
    add("<|turn>", 3)
    add("<turn|>", 3)
    for _, m in ipairs({ "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
        "<tool_response|>", "<|\"|>" }) do
        add(m, 4)
    end
    add("<unused0>", 3)
    for b = 0, 255 do add(("<0x%02X>"):format(b), 6) end
    for n = 1, 4 do add(("\n"):rep(n), 1) end
    add("\t", 1)
    add("\xe2\x96\x81", 1)
    for c = 0x21, 0x7e do add(string.char(c), 1) end
    for _, line in ipairs(BPE_TEXT) do
        for ch in line:gmatch("[\194-\244][\128-\191]*") do add(ch, 1) end
    end
    local merges = learn_merges(400)
    merges[#merges + 1] = "\n \n"
    for _, m in ipairs(merges) do
        local a, b = m:match("^(.-) (.*)$")
        add(a .. b, 1)
    end
    return tokens, scores, types, merges
end

-- Which layers slide: a list of booleans (repeated over more layers, cut
-- for fewer), or "N:1" (N sliding, then a full one).
local function pattern_of(shape)
    local p = shape.pattern
    if type(p) == "table" then
        local out = {}
        for l = 1, shape.layers do out[l] = p[(l - 1) % #p + 1] end
        return out
    end
    local n = tonumber(p:match("^(%d+):1$"))
    if not n then error("make_model: gemma4 pattern '" .. tostring(p) .. "' is not a list or 'N:1'", 0) end
    local out = {}
    for l = 1, shape.layers do out[l] = l % (n + 1) ~= 0 end
    return out
end

function randgemma.write(opts)
    if not opts.out then error("make_model: out is required", 0) end
    local preset = randgemma.PRESETS[opts.preset or "tiny-dense"]
    if not preset then
        error("make_model: unknown gemma4 preset '" .. tostring(opts.preset) .. "' (tiny-dense, tiny-moe, 26b-a4b)", 0)
    end
    -- make_model's qwen3/llama flags that mean nothing here are refused, not ignored
    local foreign = { kv_heads = "--kv-heads", head_dim = "--head-dim", rope_theta = "--rope-theta",
        tokenizer_from = "--tokenizer-from", tokenizer = "a learned tokenizer" }
    for k, flag in pairs(foreign) do
        if opts[k] ~= nil then
            error(("make_model: %s does not apply to --arch gemma4: its presets set each layer kind's heads, "
                .. "head sizes and RoPE, and its own vocabulary"):format(flag), 0)
        end
    end
    for k, default in pairs({ eps = 1e-6, std_scale = 1.0, out_scale = 4.0, tied = true }) do
        if opts[k] ~= nil and opts[k] ~= default then
            error(("make_model: --%s does not apply to --arch gemma4"):format((k:gsub("_", "-"))), 0)
        end
    end
    local shape = {}
    for k, v in pairs(preset) do shape[k] = v end
    for _, k in ipairs({ "layers", "embd", "ff", "heads", "vocab", "ctx", "pattern", "kv_swa", "kv_full",
        "hd_swa", "hd_full", "rot_full_pairs", "window", "per_layer", "softcap", "out_scales", "experts",
        "experts_used", "ff_exp", "merged_experts" }) do
        if opts[k] ~= nil then shape[k] = opts[k] end
    end
    local seed = opts.seed or 1
    local dtype = dtype_mod.id(opts.dtype or "f16")
    local dtype_name = dtype_mod.name(dtype)
    local FILE_TYPE = { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 7, q5_0 = 8, q5_1 = 9, q2_K = 10,
        q3_K = 12, q4_K = 15, q5_K = 17, q6_K = 18, bf16 = 32 }
    if not FILE_TYPE[dtype_name] then
        error("make_model: --dtype " .. tostring(opts.dtype) .. " is not one of " ..
            "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K", 0)
    end
    local pattern = pattern_of(shape)

    local w = gguf.writer()
    local model = opts.tokenizer_model or "llama"
    if model ~= "llama" and model ~= "gemma4" then
        error(("make_model: --tokenizer-model '%s' is not 'llama' (SentencePiece) or 'gemma4' (gemma 4's BPE)")
            :format(tostring(model)), 0)
    end
    local tokens, scores, types, merges
    if model == "gemma4" then
        tokens, scores, types, merges = bpe_vocabulary()
    else
        tokens, scores, types = vocabulary()
    end
    local n_tok = opts.no_tokenizer and 1 or #tokens
    shape.vocab = shape.vocab or n_tok
    if shape.vocab < n_tok then
        error(("make_model: --vocab %d is smaller than the built-in tokenizer's %d tokens"):format(shape.vocab, n_tok), 0)
    end
    for id = n_tok, shape.vocab - 1 do
        tokens[id + 1], scores[id + 1], types[id + 1] = ("<unused%d>"):format(id), 0, 5
    end
    local A = "gemma4."
    w:set("general.architecture", "gemma4")
    w:set("general.name", opts.name or ("random-gemma4-%s"):format(opts.preset or "tiny-dense"))
    w:set("general.file_type", FILE_TYPE[dtype_name], "uint32")
    if dtype_mod.info(dtype).is_quantized then w:set("general.quantization_version", 2, "uint32") end
    local E, L = shape.embd, shape.layers
    local kv = {}
    for l = 1, L do kv[l] = pattern[l] and shape.kv_swa or shape.kv_full end
    w:set(A .. "block_count", L, "uint32")
    w:set(A .. "context_length", shape.ctx, "uint32")
    w:set(A .. "embedding_length", E, "uint32")
    w:set(A .. "feed_forward_length", shape.ff, "uint32")
    w:set(A .. "attention.head_count", shape.heads, "uint32")
    w:set(A .. "attention.head_count_kv", kv, "array", "int32")
    w:set(A .. "attention.key_length", shape.hd_full, "uint32")
    w:set(A .. "attention.value_length", shape.hd_full, "uint32")
    w:set(A .. "attention.key_length_swa", shape.hd_swa, "uint32")
    w:set(A .. "attention.value_length_swa", shape.hd_swa, "uint32")
    w:set(A .. "attention.layer_norm_rms_epsilon", 1e-6, "float32")
    w:set(A .. "attention.sliding_window", shape.window, "uint32")
    w:set(A .. "attention.sliding_window_pattern", pattern, "array", "bool")
    w:set(A .. "attention.shared_kv_layers", 0, "uint32")
    w:set(A .. "rope.freq_base", shape.theta, "float32")
    w:set(A .. "rope.freq_base_swa", shape.theta_swa, "float32")
    w:set(A .. "rope.dimension_count", shape.hd_full, "uint32")
    w:set(A .. "rope.dimension_count_swa", shape.hd_swa, "uint32")
    w:set(A .. "embedding_length_per_layer_input", shape.per_layer, "uint32")
    w:set(A .. "final_logit_softcapping", shape.softcap, "float32")
    if shape.experts then
        w:set(A .. "expert_count", shape.experts, "uint32")
        w:set(A .. "expert_used_count", shape.experts_used, "uint32")
        w:set(A .. "expert_feed_forward_length", shape.ff_exp, "uint32")
    end
    if not opts.no_tokenizer then randgemma.tokenizer(w, tokens, scores, types, merges) end

    -- tensors: name, row-major shape, kind; matrices take the dtype
    return randgemma.tensors(w, opts, shape, pattern, kv, dtype, dtype_name, seed)
end

-- The vocabulary and gemma's template as tokenizer.* metadata: SentencePiece
-- ("llama"), or with merges gemma 4's BPE ("gemma4", no pre-tokenizer key,
-- as the converter writes it).
function randgemma.tokenizer(w, tokens, scores, types, merges)
    w:set("tokenizer.ggml.model", merges and "gemma4" or "llama")
    if not merges then w:set("tokenizer.ggml.pre", "default") end
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.scores", scores, "array", "float32")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    if merges then w:set("tokenizer.ggml.merges", merges, "array", "string") end
    w:set("tokenizer.ggml.bos_token_id", 2, "uint32")
    w:set("tokenizer.ggml.eos_token_id", 1, "uint32")
    w:set("tokenizer.ggml.unknown_token_id", 3, "uint32")
    w:set("tokenizer.ggml.padding_token_id", 0, "uint32")
    w:set("tokenizer.ggml.add_bos_token", true)
    w:set("tokenizer.ggml.add_eos_token", false)
    w:set("tokenizer.ggml.add_space_prefix", false)
    w:set("tokenizer.chat_template", TEMPLATE)
end

-- The tensors, declared then streamed; returns the path.
-- The tensors of layer l (0-based), added with add(name, shape, kind).
local function layer_tensors(add, shape, l, D, KD)
    local E, Ep, p = shape.embd, shape.per_layer, "blk." .. l .. "."
    local HD = shape.heads * D
    add(p .. "attn_norm.weight", { E }, "norm")
    add(p .. "attn_q.weight", { HD, E }, "matrix")
    add(p .. "attn_k.weight", { KD, E }, "matrix")
    add(p .. "attn_v.weight", { KD, E }, "matrix")
    add(p .. "attn_output.weight", { E, HD }, "matrix")
    add(p .. "attn_q_norm.weight", { D }, "norm")
    add(p .. "attn_k_norm.weight", { D }, "norm")
    add(p .. "post_attention_norm.weight", { E }, "norm")
    add(p .. "ffn_norm.weight", { E }, "norm")
    add(p .. "ffn_gate.weight", { shape.ff, E }, "matrix")
    add(p .. "ffn_up.weight", { shape.ff, E }, "matrix")
    add(p .. "ffn_down.weight", { E, shape.ff }, "matrix")
    add(p .. "post_ffw_norm.weight", { E }, "norm")
    if shape.out_scales then add(p .. "layer_output_scale.weight", { 1 }, "out_scale") end
    if shape.experts then
        local NE, FE = shape.experts, shape.ff_exp
        add(p .. "ffn_gate_inp.weight", { NE, E }, "router")
        add(p .. "ffn_gate_inp.scale", { E }, "norm")
        add(p .. "pre_ffw_norm_2.weight", { E }, "norm")
        add(p .. "post_ffw_norm_1.weight", { E }, "norm")
        add(p .. "post_ffw_norm_2.weight", { E }, "norm")
        if shape.merged_experts then -- as the converters write gemma4: gate rows, then up rows
            add(p .. "ffn_gate_up_exps.weight", { NE, 2 * FE, E }, "matrix")
        else
            add(p .. "ffn_gate_exps.weight", { NE, FE, E }, "matrix")
            add(p .. "ffn_up_exps.weight", { NE, FE, E }, "matrix")
        end
        add(p .. "ffn_down_exps.weight", { NE, E, FE }, "matrix")
        add(p .. "ffn_down_exps.scale", { NE }, "norm")
    end
    if Ep > 0 then
        add(p .. "inp_gate.weight", { Ep, E }, "matrix")
        add(p .. "proj.weight", { E, Ep }, "matrix")
        add(p .. "post_norm.weight", { E }, "norm")
    end
end

-- The model's tensors: { name, shape (row-major), kind }.
local function tensor_list(shape, pattern, kv)
    local E, L, Ep, V = shape.embd, shape.layers, shape.per_layer, shape.vocab
    local list = {}
    local function add(name, shp, kind) list[#list + 1] = { name, shp, kind } end
    add("token_embd.weight", { V, E }, "embed")
    local any_full = false
    for l = 1, L do any_full = any_full or not pattern[l] end
    if any_full then add("rope_freqs.weight", { shape.hd_full / 2 }, "rope_freqs") end -- read by full layers only
    if Ep > 0 then
        add("per_layer_token_embd.weight", { V, L * Ep }, "embed_pl")
        add("per_layer_model_proj.weight", { L * Ep, E }, "matrix")
        add("per_layer_proj_norm.weight", { Ep }, "norm")
    end
    for l = 0, L - 1 do
        local D = pattern[l + 1] and shape.hd_swa or shape.hd_full
        layer_tensors(add, shape, l, D, kv[l + 1] * D)
    end
    add("output_norm.weight", { E }, "out_norm")
    return list
end

-- a matrix whose rows are no whole number of the dtype's blocks takes
-- llama-quantize's fallback (the 26b-a4b experts' rows of 704 under q4_K)
local FALLBACK = { q2_K = "q4_0", q3_K = "q4_0", q4_K = "q5_0", q5_K = "q5_1", q6_K = "q8_0" }

-- Each tensor's dtype (t[4]) and entry; returns how many fell back.
local function add_tensors(w, list, dtype, dtype_name)
    local fell_back = 0
    local function dtype_of(t)
        if not (t[3] == "matrix" or t[3] == "embed" or t[3] == "embed_pl") or dtype == 0 then return 0 end
        local cols = t[2][#t[2]]
        if cols % dtype_mod.info(dtype).block_size == 0 then return dtype end
        fell_back = fell_back + 1
        local alt = FALLBACK[dtype_name] and dtype_mod.id(FALLBACK[dtype_name])
        if alt and cols % dtype_mod.info(alt).block_size == 0 then return alt end
        return dtype_mod.id("f16")
    end
    for _, t in ipairs(list) do
        t[4] = dtype_of(t)
        w:add_tensor(t[1], t[4], t[2], nil)
    end
    return fell_back
end

-- m values of a tensor of this kind into buf, from rng.
local function fill(rng, buf, m, kind, cols, shape)
    if kind == "norm" or kind == "out_norm" then
        C.cart_rng_fill_normal(rng, buf, m, 1.0, 0.1)
        if kind == "out_norm" then
            for i = 0, m - 1 do buf[i] = buf[i] * 4.0 end
        end
    elseif kind == "out_scale" then
        C.cart_rng_fill_normal(rng, buf, m, 0.8, 0.1)
    elseif kind == "rope_freqs" then
        for i = 0, m - 1 do buf[i] = i < shape.rot_full_pairs and 1.0 or 1e30 end
    else
        -- router logits of a few units, so that the top-k choice is clear
        local std = kind == "router" and 3.0 or 1.0 / math.sqrt(cols)
        C.cart_rng_fill_normal(rng, buf, m, 0.0, std)
    end
end

-- Each tensor's values from its own seed, a block of rows at a time (the
-- 26b-a4b embeddings are 738M values).
local function write_weights(w, list, shape, seed)
    local rng = ffi.new("cart_rng")
    for index, t in ipairs(list) do
        local shp, tdtype = t[2], t[4]
        local cols = shp[#shp]
        local n = 1
        for _, d in ipairs(shp) do n = n * d end
        local whole = ffi.new("uint8_t[?]", dtype_mod.nbytes(tdtype, n))
        local rows = n / cols
        local chunk = math.max(1, math.floor(4194304 / cols))
        local buf = ffi.new("float[?]", math.min(rows, chunk) * cols)
        local row_bytes = dtype_mod.nbytes(tdtype, cols)
        C.cart_rng_seed(rng, seed * 1000003 + index)
        for r0 = 0, rows - 1, chunk do
            local m = math.min(chunk, rows - r0) * cols
            fill(rng, buf, m, t[3], cols, shape)
            core.check(C.cart_from_f32(whole + r0 * row_bytes, tdtype, buf, m), "make_model: " .. t[1])
        end
        w:write_tensor(t[1], whole)
    end
end

function randgemma.tensors(w, opts, shape, pattern, kv, dtype, dtype_name, seed)
    local list = tensor_list(shape, pattern, kv)
    local fell_back = add_tensors(w, list, dtype, dtype_name)
    local total = 0
    for _, t in ipairs(list) do
        local n = 1
        for _, d in ipairs(t[2]) do n = n * d end
        total = total + n
    end
    if not opts.quiet then
        io.stderr:write(("make_model: gemma4 %s %dL hidden %d, %s parameters, %s -> %s%s\n"):format(
            opts.preset or "tiny-dense", shape.layers, shape.embd, fmt.int(total), dtype_name, opts.out,
            fell_back > 0 and (" (%d matrices with rows no whole number of %s blocks fall back as llama-quantize's do)")
                :format(fell_back, dtype_name) or ""))
    end
    require("cartridge.fs").mkdirs(require("cartridge.fs").parent(opts.out))
    w:begin(opts.out)
    local started = C.cart_now_seconds()
    write_weights(w, list, shape, seed)
    return require("cartridge.randmodel").finish(w, opts, started)
end

return randgemma
