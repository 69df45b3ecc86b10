local cartridge = require("cartridge")
local helper = require("helper")
local tokenizer = require("cartridge.tokenizer")
local gguf = cartridge.gguf

-- UTF-8 of one code point (LuaJIT has no utf8 library).
local function utf8_char(cp)
    if cp < 0x80 then return string.char(cp) end
    if cp < 0x800 then
        return string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    end
    return string.char(0xE0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64,
        0x80 + cp % 64)
end

-- GPT-2's bytes_to_unicode: the token text of each byte.
local function byte_symbols()
    local printable, out, n = {}, {}, 0
    for b = 0x21, 0x7E do printable[b] = true end
    for b = 0xA1, 0xAC do printable[b] = true end
    for b = 0xAE, 0xFF do printable[b] = true end
    for b = 0, 255 do
        if printable[b] then
            out[b + 1] = utf8_char(b)
        else
            out[b + 1] = utf8_char(256 + n)
            n = n + 1
        end
    end
    return out
end

-- A gpt2/qwen2 vocabulary: id b is byte b, then "<|end|>" (control, eos).
local function write_byte_vocab(path)
    local tokens, types = byte_symbols(), {}
    for i = 1, 256 do types[i] = 1 end
    tokens[257], types[257] = "<|end|>", 3
    local w = gguf.writer()
    w:set("tokenizer.ggml.model", "gpt2")
    w:set("tokenizer.ggml.pre", "qwen2")
    w:set("tokenizer.ggml.tokens", tokens, "array", "string")
    w:set("tokenizer.ggml.token_type", types, "array", "int32")
    w:set("tokenizer.ggml.merges", {}, "array", "string")
    w:set("tokenizer.ggml.eos_token_id", 256, "uint32")
    w:write(path)
    w:free()
end

describe("cartridge.tokenizer", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    it("round-trips text through a vocabulary of the 256 byte symbols", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local tok = tokenizer.load(path)
        assert.are.equal("bpe", tok.kind)
        assert.are.equal(257, tok.vocab_size)
        assert.are.equal(256, tok.eos)
        assert.is_false(tok.adds_bos)
        local text = "Grüße, 世界!\n\ttab"
        local ids = tok:encode(text)
        assert.are.equal(#text, #ids) -- no merges: one token per byte
        assert.are.equal(string.byte("G"), ids[1])
        assert.are.equal(text, tok:decode(ids))
        assert.are.equal("control", tok:token_type(256))
        assert.are.equal("normal", tok:token_type(65))
        assert.are.equal("A", tok:text(65))
        tok:free()
        tok:free() -- a second free is harmless
    end)

    it("parses special token texts only when asked", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local tok = tokenizer.load(path)
        assert.are.same({ 104, 256, 105 }, tok:encode("h<|end|>i", { special = true }))
        assert.are.equal(9, #tok:encode("h<|end|>i"))
        assert.are.equal("hi", tok:decode({ 104, 256, 105 }))
        assert.are.equal("h<|end|>i", tok:decode({ 104, 256, 105 }, { special = true }))
        assert.are.equal("", tok:piece(256))
        assert.are.equal("<|end|>", tok:piece(256, true))
        assert.are.equal(256, tok:find("<|end|>"))
        assert.is_nil(tok:find("<|nope|>"))
        assert.is_true(tok:is_eog(256))
        assert.is_false(tok:is_eog(104))
    end)

    it("streams a character split across tokens only once it is complete", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local tok = tokenizer.load(path)
        local ids = tok:encode("é🙂!") -- 2 + 4 + 1 byte tokens
        assert.are.equal(7, #ids)
        local s = tok:stream()
        local out = {}
        for i, id in ipairs(ids) do out[i] = s:push(id) end
        assert.are.same({ "", "é", "", "", "", "🙂", "!" }, out)
        assert.are.equal("", s:flush())
        -- an unfinished character comes out at flush, as U+FFFD (the text
        -- a stream hands out is always well-formed UTF-8)
        local s2 = tok:stream()
        assert.are.equal("", s2:push(ids[3]))
        assert.are.equal("\239\191\189", s2:flush())
        -- a byte that can never start a character: U+FFFD at once
        local s3 = tok:stream()
        assert.are.equal("\239\191\189", s3:push(ids[4]))
    end)

    it("loads from a gguf File that may be closed afterwards", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local g = gguf.open(path)
        local tok = tokenizer.load(g)
        g:close()
        assert.are.equal("abc", tok:decode(tok:encode("abc")))
    end)

    it("raises errors that name the function", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local tok = tokenizer.load(path)
        assert.has_error(function() tok:decode({ 9999 }) end,
            "tokenizer:decode: cart_tokenizer_decode: ids[0] = 9999 is outside 0..256")
        assert.has_error(function() tok:encode(42) end,
            "tokenizer:encode: expected a string, got number")
        tok:free()
        assert.has_error(function() tok:encode("x") end,
            "tokenizer:encode: the tokenizer was freed")
        local w = gguf.writer()
        w:set("tokenizer.ggml.model", "bert")
        w:write(dir .. "/bert.gguf")
        local ok, err = pcall(tokenizer.load, dir .. "/bert.gguf")
        assert.is_false(ok)
        assert.truthy(err:find("^tokenizer.load: .*'bert' is not supported"))
    end)

    it("encodes stories260K with a BOS when add_special is on", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local tok = tokenizer.load(path)
        assert.are.equal("spm", tok.kind)
        assert.are.equal(1, tok.bos)
        assert.is_true(tok.adds_bos)
        local ids = tok:encode("Hello world")
        assert.are.same({ 346, 306, 414, 263, 304, 341 }, ids)
        assert.are.same({ 1, 346, 306, 414, 263, 304, 341 },
            tok:encode("Hello world", { add_special = true }))
        assert.are.equal("Hello world", tok:decode(ids))
        assert.are.equal(" ", tok:piece(410))
    end)

    it("round-trips Qwen3 text, specials and a streamed emoji", function()
        local path, why = helper.fixture("reference/qwen3-tiny-realvocab-f16.gguf")
        if not path then return pending(why) end
        local tok = tokenizer.load(path)
        assert.are.equal(151936, tok.vocab_size)
        assert.are.equal(151645, tok.eos)
        local text = "<|im_start|>user\nHello<|im_end|>\n"
        local ids = tok:encode(text, { special = true })
        assert.are.same({ 151644, 872, 198, 9707, 151645, 198 }, ids)
        assert.are.equal("user\nHello\n", tok:decode(ids))
        assert.are.equal(text, tok:decode(ids, { special = true }))
        assert.is_true(tok:is_eog(151645))
        assert.is_true(tok:is_eog(128247)) -- "</s>", control and EOG by its text
        -- " 🚀" is three tokens: " \xf0\x9f", "\x9a", "\x80"
        local rocket = tok:encode("café 🚀")
        assert.are.same({ 924, 58858, 11162, 248, 222 }, rocket)
        local s, got = tok:stream(), {}
        for i, id in ipairs(rocket) do got[i] = s:push(id) end
        assert.are.same({ "ca", "fé", " ", "", "🚀" }, got)
        local prose = "Once upon a time, there was a little girl named Lily. 12345 ünïcode"
        assert.are.equal(prose, tok:decode(tok:encode(prose)))
    end)

    it("leaves control-token texts inside plain ranges as text, and checks the ranges", function()
        local path = dir .. "/bytes.gguf"
        write_byte_vocab(path)
        local tok = tokenizer.load(path)
        local text = "a<|end|>b<|end|>c<|end|>"
        local all = tok:encode(text, { special = true })
        assert.are.same({ 97, 256, 98, 256, 99, 256 }, all)
        -- the second marker lies in [8, 16): it stays 7 bytes of text
        local some = tok:encode(text, { special = true, plain = { 8, 16 } })
        assert.are.same({ 97, 256, 98 }, { some[1], some[2], some[3] })
        assert.are.equal(3 + 7 + 2, #some)
        assert.are.equal(text, tok:decode(some, { special = true }))
        -- a range that covers part of a marker keeps all of it text
        assert.are.equal(2 + 7 + 2 + 1, #tok:encode(text, { special = true, plain = { 0, 2 } }))
        -- touching ranges, and empty ones, are fine; disorder and overflow are not
        assert.are.same(all, tok:encode(text, { special = true, plain = { 0, 1, 1, 1, 8, 9 } }))
        for _, bad in ipairs({ { 5, 2 }, { 0, 99 }, { -1, 2 }, { 4, 6, 2, 3 } }) do
            local ok, err = pcall(tok.encode, tok, text, { special = true, plain = bad })
            assert.is_false(ok)
            assert.truthy(err:find("must lie within the text's 24 bytes", 1, true), err)
        end
        tok:free()
    end)
end)
