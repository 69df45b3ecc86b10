-- make_seeds.lua: writes the seed corpora of the fuzz targets into
-- tests/fuzz/corpus/<target>/ (or the directory given as the first argument).
--
--   build/cartridge run tests/fuzz/make_seeds.lua
--
-- Every seed is generated here, deterministically, so the committed binary
-- seeds can be reproduced and reviewed: small GGUF and safetensors files
-- written by the engine's own writers, cartridges saved with Cart:save
-- against the fuzz model (fuzz_util.model_path(), so their fingerprint
-- matches what fuzz_cartridge loads), and the byte layouts that the other
-- targets document in their headers. Nothing is copied from a model file.

local core = require("cartridge.core")
package.path = core.root .. "/tests/fuzz/?.lua;" .. core.root .. "/tests/lua/?.lua;" .. package.path

local util = require("fuzz_util")
local helper = require("helper") -- the specs' file and temporary-directory helpers
local gguf = require("cartridge.gguf")
local safetensors = require("cartridge.safetensors")
local cart = require("cartridge.cart")
local model = require("cartridge.model")
local json = require("cartridge.json")
local fs = require("cartridge.fs")
local ffi = core.ffi

local out_root = arg and arg[1] or (core.root .. "/tests/fuzz/corpus")
local written = {}

local function put(target, name, bytes)
    local dir = out_root .. "/" .. target
    if not written[target] then
        os.execute("rm -rf " .. helper.q(dir) .. " && mkdir -p " .. helper.q(dir)) -- the whole set anew
        written[target] = 0
    end
    helper.write_file(dir .. "/" .. name, bytes)
    written[target] = written[target] + 1
end

local slurp = helper.read_file
local tmp = helper.tmpdir()
local function scratch(name) return tmp .. "/" .. name end

-- Little-endian integers.
local function u32(n)
    return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, math.floor(n / 16777216) % 256)
end
local function u64(n) return u32(n % 4294967296) .. u32(math.floor(n / 4294967296)) end

-- ---------------------------------------------------------------------------
-- GGUF: metadata of every type, tensors of several dtypes, tokenizers of both
-- kinds, alignment and version variants.

local function floats(n, f)
    local buf = ffi.new("float[?]", n)
    for i = 0, n - 1 do buf[i] = f(i) end
    return buf
end

local function gguf_seed(name, build)
    local w = gguf.writer()
    local keep = build(w) -- buffers the tensors borrow until written
    local path = scratch(name)
    w:write(path)
    local bytes = slurp(path)
    put("fuzz_gguf", name, bytes)
    return bytes, keep
end

gguf_seed("meta_types.gguf", function(w)
    w:set("general.architecture", "llama")
    w:set("general.name", "seed")
    for _, v in ipairs({ { "uint8", 200 }, { "int8", -5 }, { "uint16", 65535 }, { "int16", -300 },
        { "uint32", 4000000000 }, { "int32", -70000 }, { "float32", 1.5 }, { "bool", true }, { "uint64", 2 ^ 40 },
        { "int64", -2 ^ 40 }, { "float64", -0.25 } }) do
        w:set("a." .. v[1], v[2], v[1])
    end
    w:set("a.empty", "", "string")
    w:set("a.arr_u8", { 1, 2, 3 }, "array", "uint8")
    w:set("a.arr_f32", { 0.5, -1 }, "array", "float32")
    w:set("a.arr_bool", { true, false }, "array", "bool")
    w:set("a.arr_f64", { 1e300 }, "array", "float64")
    w:set("a.arr_str", { "x", "", "\xe2\x96\x81y" }, "array", "string")
    w:set("a.arr_empty", {}, "array", "int32")
    w:set("a.nested", { { 1, 2 }, { 3 }, {} }, "array", "array")
    w:set("a.deep", { { { { 7 } } } }, "array", "array")
end)

local tensor_data = {}
gguf_seed("tensors.gguf", function(w)
    w:set("general.architecture", "llama")
    local f32 = floats(8, function(i) return i - 3.5 end)
    local f16 = ffi.new("uint16_t[16]")
    for i = 0, 15 do f16[i] = core.C.cart_f32_to_f16(i / 4) end
    local q8 = ffi.new("uint8_t[34]") -- one q8_0 block: f16 scale + 32 int8
    q8[1] = 0x3c
    for i = 2, 33 do q8[i] = (i * 7) % 256 end
    local q4 = ffi.new("uint8_t[18]") -- one q4_0 block
    q4[1] = 0x3c
    for i = 2, 17 do q4[i] = (i * 37) % 256 end
    local q4k = ffi.new("uint8_t[144]") -- one q4_K super-block
    for i = 0, 143 do q4k[i] = (i * 13 + 5) % 256 end
    local i32 = ffi.new("int32_t[4]", { 1, -1, 2147483647, -2147483648 })
    tensor_data = { f32, f16, q8, q4, q4k, i32 }
    w:add_tensor("vec.f32", "f32", { 8 }, f32)
    w:add_tensor("mat.f16", "f16", { 2, 8 }, f16)
    w:add_tensor("blk.q8_0", "q8_0", { 32 }, q8)
    w:add_tensor("blk.q4_0", "q4_0", { 1, 32 }, q4)
    w:add_tensor("blk.q4_K", "q4_K", { 256 }, q4k)
    w:add_tensor("ints.i32", "i32", { 2, 2 }, i32)
    return tensor_data
end)

-- A GPT-2 byte-level BPE vocabulary: the 256 byte symbols of the fuzz model's
-- built-in tokenizer (lua/cartridge/randmodel.lua), a few merges, specials.
local byte_symbols = {}
do
    local g = gguf.open(util.model_path())
    local tokens = g:get("tokenizer.ggml.tokens")
    for i = 1, 256 do byte_symbols[i] = tokens[i] end
    g:close()
end

local function bpe_vocab(w, pre)
    local tokens, types = {}, {}
    for i = 1, 256 do tokens[i], types[i] = byte_symbols[i], 1 end
    local space = byte_symbols[32 + 1] -- the symbol of byte ' '
    local merges = { "h e", "l l", "he ll", "hell o", space .. " w", "o r", "1 2" }
    for _, t in ipairs({ "he", "ll", "hell", "hello", space .. "w", "or", "12" }) do
        tokens[#tokens + 1] = t
        types[#types + 1] = 1
    end
    for _, s in ipairs({ { "<|endoftext|>", 3 }, { "<|im_start|>", 3 }, { "<|im_end|>", 3 }, { "<think>", 4 },
        { "</s>", 1 } }) do
        tokens[#tokens + 1] = s[1]
        types[#types + 1] = s[2]
    end
    w:set("tokenizer.ggml.model", "gpt2")
    w:set("tokenizer.ggml.pre", pre)
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    w:set("tokenizer.ggml.merges", merges, "array", "string")
    w:set("tokenizer.ggml.bos_token_id", #tokens - 5, "uint32")
    w:set("tokenizer.ggml.eos_token_id", #tokens - 3, "uint32")
    w:set("tokenizer.ggml.add_bos_token", pre == "llama-bpe")
    w:set("tokenizer.chat_template", "<|im_start|>")
    return tokens
end

gguf_seed("tok_qwen2.gguf", function(w) bpe_vocab(w, "qwen2") end)

-- gemma 4's BPE (tokenizer.ggml.model "gemma4"): <0xNN> byte tokens,
-- U+2581 for spaces, newline runs, merges by text, gemma's markers.
gguf_seed("tok_gemma4.gguf", function(w)
    local SP = "\xe2\x96\x81"
    local tokens, types = { "<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>" },
        { 3, 3, 3, 2, 3, 3, 4 }
    for b = 0, 255 do
        tokens[#tokens + 1], types[#types + 1] = ("<0x%02X>"):format(b), 6
    end
    for _, t in ipairs({ SP, "\n", "\n\n", "h", "e", "l", "o", "he", "ll", "hell", "hello", SP .. "hello",
        "1", "2", "12", "\xc3\xa9" }) do
        tokens[#tokens + 1], types[#types + 1] = t, 1
    end
    w:set("tokenizer.ggml.model", "gemma4")
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    w:set("tokenizer.ggml.merges", { "h e", "l l", "he ll", "hell o", SP .. " hello", "1 2", "\n \n" },
        "array", "string")
    w:set("tokenizer.ggml.bos_token_id", 2, "uint32")
    w:set("tokenizer.ggml.eos_token_id", 1, "uint32")
    w:set("tokenizer.ggml.add_bos_token", true)
    w:set("tokenizer.ggml.add_space_prefix", false)
end)
gguf_seed("tok_llama3.gguf", function(w) bpe_vocab(w, "llama-bpe") end)
gguf_seed("tok_gpt2.gguf", function(w) bpe_vocab(w, "gpt-2") end)

-- Whole small models for the model loader (fuzz_model): a qwen3 with its
-- tokenizer, a qwen2 with its q/k/v biases, a gemma4 with both attention kinds, per-layer inputs and
-- output scales, and a gemma4 MoE with merged gate and up experts; each
-- under the target's 16 KiB.
local function model_seed(name, write)
    local path = scratch(name)
    write(path)
    put("fuzz_model", name, slurp(path))
end

model_seed("model_qwen3.gguf", function(path)
    require("cartridge.randmodel").write({ out = path, arch = "qwen3", layers = 1, embd = 8, ff = 8, heads = 2,
        kv_heads = 1, head_dim = 4, dtype = "f16", quiet = true })
end)
model_seed("model_qwen2.gguf", function(path)
    require("cartridge.randmodel").write({ out = path, arch = "qwen2", layers = 1, embd = 8, ff = 8, heads = 2,
        kv_heads = 1, dtype = "f16", quiet = true })
end)
model_seed("model_gemma4.gguf", function(path)
    require("cartridge.randgemma").write({ out = path, preset = "tiny-dense", layers = 2, pattern = { true, false },
        embd = 16, heads = 2, ff = 16, kv_swa = 2, kv_full = 1, hd_swa = 8, hd_full = 8, rot_full_pairs = 2,
        per_layer = 4, vocab = 16, no_tokenizer = true, dtype = "f16", quiet = true })
end)
model_seed("model_gemma4_moe.gguf", function(path)
    require("cartridge.randgemma").write({ out = path, preset = "tiny-moe", layers = 2, pattern = { true, false },
        embd = 16, heads = 2, ff = 8, kv_swa = 1, kv_full = 1, hd_swa = 8, hd_full = 8, rot_full_pairs = 2,
        experts = 3, experts_used = 2, ff_exp = 8, vocab = 16, merged_experts = true, no_tokenizer = true,
        dtype = "f16", quiet = true })
end)

-- A SentencePiece vocabulary with byte fallback.
gguf_seed("tok_spm.gguf", function(w)
    local tokens = { "<unk>", "<s>", "</s>" }
    local types = { 2, 3, 3 }
    local scores = { 0, 0, 0 }
    for b = 0, 255 do
        tokens[#tokens + 1] = ("<0x%02X>"):format(b)
        types[#types + 1] = 6
        scores[#scores + 1] = 0
    end
    for i, t in ipairs({ "\xe2\x96\x81", "\xe2\x96\x81a", "\xe2\x96\x81the", "he", "ll", "o", "\xe2\x96\x81\xe2\x96\x81",
        "lo", "\xe2\x96\x81h", "e" }) do
        tokens[#tokens + 1] = t
        types[#types + 1] = 1
        scores[#scores + 1] = -i
    end
    tokens[#tokens + 1] = "<user>"
    types[#types + 1] = 4
    scores[#scores + 1] = 0
    w:set("general.alignment", 64, "uint32")
    w:set("tokenizer.ggml.model", "llama")
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    w:set("tokenizer.ggml.scores", scores, "array", "float32")
    w:set("tokenizer.ggml.add_space_prefix", true)
    w:set("tokenizer.ggml.bos_token_id", 1, "uint32")
    w:set("tokenizer.ggml.eos_token_id", 2, "uint32")
    w:set("tokenizer.ggml.unknown_token_id", 0, "uint32")
end)

-- The same layout as version 2 (which differs from 3 only in its number).
do
    local bytes = slurp(scratch("tensors.gguf"))
    put("fuzz_gguf", "tensors_v2.gguf", bytes:sub(1, 4) .. u32(2) .. bytes:sub(9))
    put("fuzz_gguf", "empty.gguf", "GGUF" .. u32(3) .. u64(0) .. u64(0))
end

-- ---------------------------------------------------------------------------
-- safetensors: every dtype, scalars, empty tensors, metadata, a hand-written
-- header with escapes and whitespace.

local function st_seed(name, tensors, meta)
    local path = scratch(name)
    safetensors.write(path, tensors, meta)
    local bytes = slurp(path)
    put("fuzz_safetensors", name, bytes)
    return bytes
end

do
    local bytes = ffi.new("uint8_t[64]")
    for i = 0, 63 do bytes[i] = (i * 29 + 3) % 256 end
    st_seed("one_f32.safetensors", { { name = "w", dtype = "F32", shape = { 2, 3 }, data = bytes } })
    local all = {}
    for i, dt in ipairs({ "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL" }) do
        all[#all + 1] = { name = "t." .. dt:lower(), dtype = dt, shape = { 2 }, data = bytes }
        if i == 1 then all[#all].shape = { 1, 2 } end
    end
    st_seed("all_dtypes.safetensors", all, { format = "pt", note = "seed \xc3\xa9" })
    st_seed("scalar_empty.safetensors", {
        { name = "scalar", dtype = "F32", shape = {}, data = bytes },
        { name = "empty", dtype = "F16", shape = { 0, 4 }, data = bytes },
        { name = "\xe6\x97\xa5\xe6\x9c\xac", dtype = "U8", shape = { 3 }, data = bytes },
    })
    local header = '{ "__metadata__" : { "k\\u00e9y" : "v\\n" },\n "a\\/b" : { "dtype" : "I32", "shape" : [ 2 ],'
        .. ' "data_offsets" : [ 0 , 8 ] } }'
    put("fuzz_safetensors", "handwritten.safetensors", u64(#header) .. header .. ("\1\0\0\0\255\255\255\127"))
end

-- ---------------------------------------------------------------------------
-- Cartridges saved against the fuzz model, with and without the checksum
-- Cart:save stores (a mutated tensor byte fails the checksum; the ones
-- without it let mutations reach the structure checks).

do
    local m = model.load(util.model_path())
    local function save(name, c, opts)
        local path = scratch(name)
        c:save(path, m, opts)
        local bytes = slurp(path)
        put("fuzz_cartridge", name, bytes)
        return path
    end
    local c = cart.new(m, 3, 1)
    c:init_random(1, 0.5)
    save("p3_frozen1.safetensors", c, { training = { steps = 2, lr = 1e-3 }, draft_reference = { 5, 6, 7 } })
    local c0 = cart.new(m, 2, 0)
    c0:init_random(2, 0.5)
    save("p2_frozen0.safetensors", c0)
    -- another model's geometry (1 layer, 2 KV heads of 4): refused against
    -- the fuzz model, loads only without a model
    local other_path = scratch("other_model.gguf")
    require("cartridge.randmodel").write({ out = other_path, arch = "qwen3", layers = 1, embd = 8, ff = 8, heads = 2,
        kv_heads = 2, head_dim = 4, dtype = "f16", quiet = true })
    local other = model.load(other_path)
    local g = cart.new_geometry(1, 2, 4, 2, 1)
    g:init_random(3, 0.5)
    local g_path = scratch("other_geometry.safetensors")
    g:save(g_path, other)
    put("fuzz_cartridge", "other_geometry.safetensors", slurp(g_path))
    other:free()
    -- without the checksum: the same tensors and metadata, written plainly
    for _, name in ipairs({ "p3_frozen1.safetensors", "p2_frozen0.safetensors" }) do
        local f = safetensors.open(scratch(name))
        local tensors, meta = {}, {}
        for _, t in ipairs(f:tensors()) do
            tensors[#tensors + 1] = { name = t.name, dtype = t.dtype_name, shape = t.shape, data = t.data }
        end
        for k, v in pairs(f.metadata) do
            if not k:find("checksum", 1, true) then meta[k] = v end
        end
        local path = scratch("plain_" .. name)
        safetensors.write(path, tensors, meta)
        f:close()
        put("fuzz_cartridge", "plain_" .. name, slurp(path))
    end
    m:free()
end

-- ---------------------------------------------------------------------------
-- Tokenizer texts. Byte 0: bit 0 the vocabulary (0 SentencePiece, 1 BPE;
-- bit 5 set: 2 gemma 4's BPE), bit 1 PARSE_SPECIAL, bit 2 ADD_SPECIAL, bit 7
-- the short-buffer check.

local TEXTS = {
    "Hello world",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "  two leading spaces and trailing  ",
    "it's don't we'll I'M they've YOU'RE",
    "12345 67 8.9 1e10 0x1F 3,141",
    "tabs\tand\nnew\r\nlines\n\n\n",
    "\xc3\xbcmlaut caf\xc3\xa9 na\xc3\xafve \xc3\x9f",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88",
    "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd and \xe2\x80\x8d joiners",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s> </s> <unk> <0x41>",
    "<think>\nhm\n</think>\n\nok",
    "\xe2\x96\x81under\xe2\x96\x81score",
    "\xff\xfe bad \xc3 utf8 \xed\xa0\x80 \xc0\x80",
    "nul\0byte",
    ("abc"):rep(60),
    "def f(x):\n    return x ** 2  # square\n",
    "HeLLo WoRLD!!! ???... ,,,",
    "",
    "<|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
}
for i, text in ipairs(TEXTS) do
    for _, sel in ipairs({ 0, 1, 3, 4, 5 + 128, 32, 32 + 2, 32 + 4 + 128 }) do
        put("fuzz_tokenizer", ("text%02d_%d"):format(i, sel), string.char(sel) .. text)
    end
end

-- ---------------------------------------------------------------------------
-- HTTP: byte 0 cuts, close and (virtual) clock flags, bytes 1-2 the answer actions (3 bits per
-- request), then the client's bytes.

local function actions(...)
    local v = 0
    for i, a in ipairs({ ... }) do v = v + a * 8 ^ (i - 1) end
    return string.char(v % 256, math.floor(v / 256) % 256)
end

local function body_request(method, path, body, extra)
    return ("%s %s HTTP/1.1\r\nHost: localhost\r\n%sContent-Length: %d\r\n\r\n%s"):format(method, path, extra or "",
        #body, body)
end

local HTTP = {
    { "get", 0, actions(0), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" },
    { "post_echo", 3, actions(1), body_request("POST", "/v1/chat/completions", '{"a":1}', "Content-Type: application/json\r\n") },
    { "pipelined", 5, actions(0, 2, 3, 4, 1), "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"
        .. body_request("POST", "/c?x=1&y", "abc") .. "GET /d HTTP/1.1\r\n\r\n" .. body_request("PUT", "/e", "") },
    { "head", 2, actions(0, 3), "HEAD /x HTTP/1.1\r\n\r\nHEAD /y HTTP/1.1\r\n\r\n" },
    { "http10_stream", 1, actions(3), "GET /s HTTP/1.0\r\n\r\n" },
    { "http10_keep", 0, actions(0), "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" },
    { "expect", 4, actions(1), "POST /up HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello" },
    { "expect_bad", 0, actions(0), "POST /up HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx" },
    { "chunked", 0, actions(0), "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" },
    { "te_gzip", 0, actions(0), "POST /c HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n" },
    { "too_big", 0, actions(0), "POST /big HTTP/1.1\r\nContent-Length: 99999\r\n\r\n" },
    { "cl_conflict", 0, actions(0), "POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\nab" },
    { "http2", 0, actions(0), "GET / HTTP/2.0\r\n\r\n" },
    { "bad_line", 0, actions(0), "GET/HTTP/1.1\r\n\r\n" },
    { "fold", 0, actions(0), "GET / HTTP/1.1\r\nX-A: 1\r\n  continued\r\n\r\n" },
    { "absolute", 1, actions(0, 0), "GET http://example.com/p?q HTTP/1.1\r\n\r\nOPTIONS * HTTP/1.1\r\n\r\n" },
    { "bare_lf", 2, actions(7, 6), "GET /lf HTTP/1.1\nHost: a\n\nGET /big HTTP/1.1\n\n" },
    { "close", 8 + 2, actions(0, 0), "GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\nGET /never HTTP/1.1\r\n\r\n" },
    { "leading_crlf", 0, actions(2), "\r\n\r\nGET / HTTP/1.1\r\n\r\n" },
    { "many_headers", 0, actions(0), "GET / HTTP/1.1\r\n" .. ("X-H: v\r\n"):rep(20) .. "\r\n" },
    { "long_header", 0, actions(0), "GET / HTTP/1.1\r\nX-Long: " .. ("a"):rep(1100) .. "\r\n\r\n" },
    { "ctl_in_value", 0, actions(0), "GET / HTTP/1.1\r\nX-A: a\1b\r\n\r\n" },
    { "deferred", 0x10, actions(5, 0), "GET /wait HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n" },
    { "half_close", 0x10 + 1, actions(4), "GET /half HTTP/1.1\r\n\r\n" },
    { "partial_head_wait", 0x20 + 2, actions(0), "GET /slow HTTP/1.1\r\nHost:" },
    { "partial_body_wait", 0x40, actions(0), "POST /slow HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc" },
    { "idle_wait", 0x60 + 8, actions(0), "GET /a HTTP/1.1\r\n\r\n" },
    { "silent_wait", 0x20, actions(0), "" },
    { "midway_timeout", 0x80 + 3, actions(1, 1), body_request("POST", "/m", "0123456789") .. "GET /after HTTP/1.1\r\n\r\n" },
    { "bad_calls", 3, actions(7, 7), "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n" },
    { "big", 0, actions(6, 6, 6), "GET /b1 HTTP/1.1\r\n\r\nGET /b2 HTTP/1.1\r\n\r\nGET /b3 HTTP/1.1\r\n\r\n" },
    { "empty", 0, actions(0), "" },
}
for _, h in ipairs(HTTP) do put("fuzz_http", h[1], string.char(h[2]) .. h[3] .. h[4]) end

-- ---------------------------------------------------------------------------
-- Request bodies. Byte 0 (mod 4): 0 chat, 1 /v1/completions, 2 Messages, 3 Responses.

local REQUESTS = {
    { 0, { messages = { { role = "user", content = "Hello" } } } },
    { 0, { model = "m", messages = { { role = "system", content = "Be terse." }, { role = "user", content = "Hi" },
        { role = "assistant", content = "<think>x</think>Hey" }, { role = "developer", content = "More." },
        { role = "user", content = { { type = "text", text = "a" }, { type = "text", text = "b" } } } },
        max_tokens = 16, temperature = 0.7, top_p = 0.9, top_k = 40, min_p = 0.05, seed = 42, stop = { "\n", "END" },
        stream = true, stream_options = { include_usage = true }, n = 1 } },
    { 0, { messages = { { role = "user", content = "x" } }, max_completion_tokens = 3, stop = "." } },
    { 0, { messages = { { role = "assistant", content = json.null }, { role = "user", content = "q" } } } },
    { 0, { messages = { { role = "user", content = "<|im_start|>system\nhi<|im_end|>" } }, seed = -1 } },
    { 1, { prompt = "Once upon a time", max_tokens = 8, temperature = 0 } },
    { 1, { prompt = { "one" }, model = "m", seed = 18446744073709551615, top_k = 2147483647 } },
    { 1, { prompt = "x", max_tokens = 300 } },
    { 0, { messages = {} } },
    { 0, { messages = { { role = "tool", content = "x" } } } },
    { 1, { prompt = 5 } },
    { 0, { model = "nope", messages = { { role = "user", content = "x" } } } },
    { 0, { messages = { { role = "user", content = "x" } }, frequency_penalty = 0.5, presence_penalty = -1,
        repeat_penalty = 1.1, repeat_last_n = -1 } },
    { 0, { messages = { { role = "user", content = "x" } }, tool_choice = "required", parallel_tool_calls = false,
        tools = { { type = "function", ["function"] = { name = "get", description = "d",
            parameters = { type = "object", properties = { a = { type = "string" } } } } } } } },
    { 0, { messages = { { role = "user", content = "x" }, { role = "assistant", content = json.null,
        tool_calls = { { id = "c", type = "function", ["function"] = { name = "get", arguments = "{}" } } } },
        { role = "tool", tool_call_id = "c", content = "r" } },
        tool_choice = { type = "function", ["function"] = { name = "get" } },
        tools = { { type = "function", ["function"] = { name = "get" } } } } },
    -- Anthropic Messages (byte 0 = 2)
    { 2, { model = "m", max_tokens = 8, messages = { { role = "user", content = "Hello" } } } },
    { 2, { max_tokens = 16, system = { { type = "text", text = "Be terse." } }, temperature = 0.5, top_p = 0.9,
        top_k = 5, stop_sequences = { "\n", "END" }, stream = true,
        messages = { { role = "user", content = { { type = "text", text = "a" } } },
            { role = "assistant", content = "Sure" } } } },
    { 2, { messages = { { role = "user", content = { { type = "image", source = { type = "base64" } } } } },
        max_tokens = 1 } },
    { 2, { messages = { { role = "user", content = "x" } } } },
    -- OpenAI Responses (byte 0 = 3)
    { 3, { model = "m", input = "Hello", instructions = "Be terse.", max_output_tokens = 8 } },
    { 3, { input = { { role = "developer", content = "x" }, { type = "message", role = "user",
        content = { { type = "input_text", text = "a" } } } }, temperature = 0.5, top_p = 0.5, stream = true } },
    { 3, { input = "x", previous_response_id = "resp_1" } },
    -- structured output
    { 0, { messages = { { role = "user", content = "x" } }, response_format = { type = "json_schema", json_schema = {
        name = "p", strict = true, schema = { type = "object", properties = { a = { type = "integer", minimum = 0 },
            b = { type = "array", items = { enum = { "x", 1 } }, maxItems = 2 } }, required = { "a" } } } } } },
    { 0, { messages = { { role = "user", content = "x" } }, response_format = { type = "json_object" } } },
    { 3, { input = "x", text = { format = { type = "json_schema", name = "s", schema = { anyOf = {
        { type = "string", maxLength = 3 }, { ["$ref"] = "#/$defs/n" } }, ["$defs"] = { n = { type = "null" } } } } } } },
    -- Anthropic tools: a conversation with a call and its result, then a forced call
    { 2, { max_tokens = 8, tools = { { name = "get", description = "d", input_schema = { type = "object",
        properties = { a = { type = "string", maxLength = 4 } }, required = { "a" } } } },
        tool_choice = { type = "auto", disable_parallel_tool_use = true }, messages = {
            { role = "user", content = "x" },
            { role = "assistant", content = { { type = "text", text = "t" }, { type = "tool_use", id = "toolu_1",
                name = "get", input = { a = "b" } } } },
            { role = "user", content = { { type = "tool_result", tool_use_id = "toolu_1", content = "r",
                is_error = true }, { type = "text", text = "and?" } } } } } },
    { 2, { max_tokens = 8, tools = { { name = "get", input_schema = { type = "object" } } },
        tool_choice = { type = "tool", name = "get" }, messages = { { role = "user", content = "x" } } } },
    -- completions' response_format, Responses' metadata, a wrong parallel_tool_calls
    { 1, { prompt = "x", response_format = { type = "json_schema", json_schema = { name = "n", schema = {
        type = "integer", minimum = 0, maximum = 9 } } } } },
    { 3, { input = "x", metadata = { user = "u", k = "v" }, parallel_tool_calls = true } },
    { 0, { messages = { { role = "user", content = "x" } }, parallel_tool_calls = "no" } },
}
for i, r in ipairs(REQUESTS) do put("fuzz_request", ("req%02d"):format(i), string.char(r[1]) .. json.encode(r[2])) end
for i, text in ipairs({ '{"prompt":"a","max_tokens":1e309}', '{"prompt":"a","temperature":-0.0,"top_p":0}',
    '{"prompt":"\\ud83d\\ude00 \\u0000","stop":[]}', '{"messages":[{"role":"user","content":"a"}],"seed":1e19}',
    '[1,2]', '{"prompt":"a",}', ' {"prompt" : "a" , "stream" : false } ', '{"a":[[[[[[[[[[]]]]]]]]]]}' }) do
    put("fuzz_request", ("raw%02d"):format(i), string.char(i % 2) .. text)
end
-- a tool whose schema holds a number no JSON text can (a finding of CI's fuzzing: a 500 before)
put("fuzz_request", "raw09", "\0" .. '{"messages":[{"role":"user","content":"x"}],"tool_choice":"required",'
    .. '"tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":1e999}}}]}')

-- the web page's routes (byte 0 with bit 4): a QA score, a training query, a metrics file
put("fuzz_request", "web01", "\16" .. '{"replies":[{"index":0,"reply":"Longri."},{"index":1,"reply":"Tarn"}]}')
put("fuzz_request", "web02", "\17" .. "run=run&since=1")
put("fuzz_request", "web03", "\18" .. '{"event":"start","settings":{"steps":2}}\n{"step":1,"steps":2,"loss":0.5}\n{"step":2')
put("fuzz_request", "web04", "\18" .. '{"step":1,"steps":2,"loss":1e999}\n{"step":2,"steps":2,"loss":0.5}\n')

-- ---------------------------------------------------------------------------
-- Chat templates. Byte 0: bits 0-1 template, bit 2 by name, bit 3 no
-- generation prompt, bit 4 thinking, bit 5 no opts; then messages separated
-- by \x1e, each a tag byte (0: role \x1f content) and its payload.

local function messages(...)
    local parts = {}
    for _, m in ipairs({ ... }) do parts[#parts + 1] = "\0" .. m[1] .. "\x1f" .. m[2] end
    return table.concat(parts, "\x1e")
end
local CONVO = messages({ "system", "You are terse." }, { "user", "What is a cartridge?" },
    { "assistant", "<think>\nhmm\n</think>\n\nA KV prefix." }, { "user", "More <|im_end|> please" })
for ctl = 0, 3 do put("fuzz_template", ("convo_%d"):format(ctl), string.char(ctl) .. CONVO) end
put("fuzz_template", "by_name_thinking", string.char(4 + 16) .. CONVO)
put("fuzz_template", "no_prompt_last_assistant", string.char(8 + 1) .. messages({ "user", "a" }, { "assistant", "b" }))
put("fuzz_template", "last_assistant", string.char(0) .. messages({ "user", "a" }, { "assistant", "b" }))
put("fuzz_template", "no_opts", string.char(32 + 2) .. messages({ "user", "" }))
put("fuzz_template", "bad_kinds", string.char(1) .. "\4norole\x1e\5user\x1fx\x1e\6\x1e\7user\x1fy")
put("fuzz_template", "empty", string.char(0))

-- ---------------------------------------------------------------------------
-- JSON texts: one of each form, and the edges the parser draws.
for i, text in ipairs({ '{"a":[1,-2.5e-3,true,false,null],"b":{"":"x"}}', '"\\u00e9\\ud83d\\ude00\\n\\"\\\\\\/"',
    "[9007199254740993,1e400,-0,0.1]", ' \t\r\n[ ]', "{}", ("["):rep(200) .. ("]"):rep(200), '{"a":1,"a":2}',
    '"\xc3\xa9\xe2\x82\xac"', "01", '"\\ud800"', '{"a":1,}', '"\xff"' }) do
    put("fuzz_json", ("doc%02d"):format(i), text)
end

-- ---------------------------------------------------------------------------
-- Spill files of the server's disk tier, written by kvstore:spill against
-- the fuzz model: for the cartridge fuzz_kvspill serves and for the bare
-- model, f16 rows (what the target's store reads) and f32 (a foreign file).

do
    local kvstore = require("cartridge.kvstore")
    local m = model.load(util.model_path())
    local c = util.kvspill_cartridge(m)
    local ids = m:tokenizer():encode("<|im_start|>user\nWhat is in the cartridge?<|im_end|>\n", { special = true })
    for _, case in ipairs({ { "cart_f16", c, "f16" }, { "bare_f16", nil, "f16" }, { "cart_f32", c, "f32", 8 },
        { "short_f16", c, "f16", 3 } }) do
        local name, with, dtype, n = case[1], case[2], case[3], case[4] or #ids
        local dir = scratch("kvspill_" .. name)
        local store = kvstore.open({ dir = dir, max_bytes = 2 ^ 30, model = m, kv = dtype, cartridges = { a = c },
            model_name = "fuzz-model" })
        local kv = m:new_kv(64 + #ids, dtype)
        if with then with:append_to(kv) end
        m:forward(kv, ids)
        local tokens = {}
        for i = 1, n do tokens[i] = ids[i] end
        store:spill(with, tokens, kv)
        local file = fs.list(dir)[1]
        put("fuzz_kvspill", name .. ".safetensors", slurp(dir .. "/" .. file))
        kv:free()
    end
    m:free()
end
-- A fleet's manifest and retrieval index (fuzz_fleet): byte 0 even, then a
-- manifest's text; byte 0 = 3 (two documents), then an index file, saved with
-- and without its checksum.
do
    local fleet = require("cartridge.fleet")
    local retrieval = require("cartridge.retrieval")
    local corpus = require("cartridge.corpus")
    local m = model.load(util.model_path())
    local tok = m:tokenizer()
    local docs = {
        { name = "a.md", corpus = corpus.document("a.md", ("Cartridges are trained KV prefixes. "):rep(6), tok) },
        { name = "b.md", corpus = corpus.document("b.md", ("The server maps fleets from disk. "):rep(6), tok) },
    }
    local man = fleet.new_manifest(m, docs, { p = 16, frozen = 1, settings = { lr = 0.002 } })
    man.rounds, man.docs[1].steps, man.docs[1].entered, man.docs[1].resident = 3, 2, 1, true
    put("fuzz_fleet", "manifest.json", "\0" .. json.encode(man))
    man.docs[2] = nil
    put("fuzz_fleet", "manifest_one.json", "\2" .. json.encode(man))
    put("fuzz_fleet", "manifest_bad.json", "\0" .. '{"format":"cartridge-fleet","version":1,"docs":[{}]}')
    local index = retrieval.build(m, docs, 32)
    local path = scratch("index.safetensors")
    index:save(path, m)
    put("fuzz_fleet", "index.safetensors", "\3" .. slurp(path))
    index:save(path, m, { checksum = false })
    put("fuzz_fleet", "plain_index.safetensors", "\3" .. slurp(path))
    m:free()
end

-- Grammars: byte 0 control (bit 0 lenient, bit 1 json_object, bits 2-4 mask
-- check interval, bits 5-7 walk seed), a schema, NUL, a document.
local GRAMMARS = {
    { 0, '{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,'
        .. '"maximum":120}},"required":["name","age"],"additionalProperties":false}', '{"name": "Ann", "age": 42}' },
    { 4, '{"type":"array","items":{"enum":["red",7,null,[1]]},"minItems":1,"maxItems":3}', '["red", 7,\n  null]' },
    { 8, '{"anyOf":[{"type":"number","minimum":-1.5,"maximum":2.25},{"type":"string","minLength":2},{"type":"null"}]}',
        '-1.25' },
    { 12, '{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":'
        .. '{"$ref":"#/$defs/n"},"maxItems":2}},"required":["v","kids"]}},"$ref":"#/$defs/n"}',
        '{"v":1,"kids":[{"v":2,"kids":[]}]}' },
    { 16, '{"type":"object","properties":{"s":{"type":"string"},"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},'
        .. '"required":["s","next"]}', '{"s":"\\u00e9\\"\xc3\xa9","next":null}' },
    { 20, '{"const":{"a":[true,false,null,0.1,"x"]}}', '{"a":[true,false,null,0.1,"x"]}' },
    { 2, "", '{"k": [1, {"x": "y"}, -2e+10], "z": {}}' },
    { 1, '{"type":"string","format":"email","pattern":"@","oneOf":[{}]}', '"a@b"' },
    { 0, '{"type":"integer","multipleOf":3}', "3" },
    { 0, '{"type":"object","properties":{"n":{"$ref":"#"}},"required":["n"]}', "{" },
    { 0, '{"anyOf":[{"$ref":"#"},{"type":"null"}]}', "null" },
    { 0, '{"type":"string","maxLength":1e999,"minimum":"x"}', '""' },
    { 0, '{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1e-300}', "0.0000000000000001" },
    { 0, "true", "[[[[[]]]]]" },
    { 0, '{"type":"boolean"}', "tru" },
}
for i, c in ipairs(GRAMMARS) do put("fuzz_grammar", ("schema%02d"):format(i), string.char(c[1]) .. c[2] .. "\0" .. c[3]) end

helper.rmdir(tmp)
local names = {}
for target, n in pairs(written) do names[#names + 1] = ("%s %d"):format(target, n) end
table.sort(names)
print("make_seeds: wrote " .. table.concat(names, ", ") .. " seeds under " .. out_root)
