-- cartridge.grammar: structured output -- JSON documents a JSON Schema
-- accepts, enforced token by token (engine/grammar.h has the rules).
--
--   local grammar = require("cartridge.grammar")
--   local g = grammar.schema('{"type": "object", ...}')   -- text or a decoded table; raises
--   local g = grammar.schema(t, { lenient = true })        -- unsupported keywords ignored
--   local g = grammar.json_object()                        -- any JSON object
--   local g = grammar.from_file("schema.json", "--json-schema")
--   g:max_bytes()                        -- longest document, or nil when unbounded
--   local v = grammar.vocab(tok, n_vocab) -- a tokenizer's tries, built once and cached
--   local m = grammar.matcher(g, v)
--   local mask, n = m:mask()             -- uint32_t* bits (owned by m), allowed count
--   sampler:sample(logits, n_vocab, mask)
--   m:accept(id)                         -- raises when id cannot continue the document
--   m:can_end(), m:done(), m:bytes(), m:try(text), m:accept_text(text)
--
-- A schema error raises "grammar.schema: schema: #/properties/age: the
-- keyword 'multipleOf' is not supported ...", the JSON pointer naming the
-- place.

local core = require("cartridge.core")
local json = require("cartridge.json")
local ffi = core.ffi
local C = core.C

local grammar = {}

local LENIENT = tonumber(C.CART_GRAMMAR_LENIENT)

local Grammar = {}
Grammar.__index = Grammar

local Matcher = {}
Matcher.__index = Matcher

-- Compiles a JSON Schema: its JSON text, or a table from cartridge.json
-- (written back with its keys in their source order, which is the order
-- properties are written in). opts.lenient ignores unsupported keywords.
function grammar.schema(schema, opts)
    opts = opts or {}
    local text = schema
    if type(schema) ~= "string" then
        local ok, t = pcall(json.encode, schema, { ordered = true })
        if not ok then error("grammar.schema: " .. (tostring(t):gsub("^json%.encode: ", "")), 0) end
        text = t
    end
    local handle = core.new("cart_grammar", C.cart_grammar_from_schema, C.cart_grammar_free, "grammar.schema", text,
        #text, opts.lenient and LENIENT or 0)
    return setmetatable({ handle = handle }, Grammar)
end

-- The grammar of any JSON object (response_format json_object).
function grammar.json_object()
    return setmetatable({ handle = core.new("cart_grammar", C.cart_grammar_any_object, C.cart_grammar_free,
        "grammar.json_object") }, Grammar)
end

-- Reads and compiles a schema file; errors name the file and `flag`.
function grammar.from_file(path, flag, opts)
    local f, err = io.open(path, "rb")
    if not f then error(("%s: cannot read the schema file: %s"):format(flag, tostring(err)), 0) end
    local text = f:read("*a")
    f:close()
    local ok, g = pcall(grammar.schema, text, opts)
    if not ok then error(("%s %s: %s"):format(flag, path, (tostring(g):gsub("^grammar%.schema: ", ""))), 0) end
    return g
end

-- The longest document in bytes, or nil when documents are unbounded.
function Grammar:max_bytes()
    local n = tonumber(C.cart_grammar_max_bytes(self.handle))
    return n >= 0 and n or nil
end

function Grammar:free()
    core.free(self, C.cart_grammar_free)
end

-- A tokenizer's vocabulary tries for n_vocab ids, cached with the tokenizer.
local vocabs = setmetatable({}, { __mode = "k" })

function grammar.vocab(tok, n_vocab)
    n_vocab = n_vocab or tok.vocab_size
    vocabs[tok] = vocabs[tok] or {}
    local v = vocabs[tok][n_vocab]
    if not v then
        local handle = core.new("cart_vocab", C.cart_vocab_new, C.cart_vocab_free, "grammar.vocab", tok.handle, n_vocab)
        v = { handle = handle, n = n_vocab, words = tonumber(C.cart_vocab_mask_words(handle)) }
        vocabs[tok][n_vocab] = v
    end
    return v
end

-- A matcher at the start of a document of g over vocabulary v (both kept
-- alive by it).
function grammar.matcher(g, v)
    local handle = core.new("cart_matcher", C.cart_matcher_new, C.cart_matcher_free, "grammar.matcher", g.handle,
        v.handle)
    return setmetatable({ handle = handle, grammar = g, vocab = v, buf = ffi.new("uint32_t[?]", v.words),
        count = ffi.new("int64_t[1]") }, Matcher)
end

-- The allowed tokens as bits (valid until the next call) and their count.
function Matcher:mask()
    core.check(C.cart_matcher_mask(self.handle, self.buf, self.vocab.words, self.count), "grammar.mask")
    return self.buf, tonumber(self.count[0])
end

function Matcher:accept(id)
    core.check(C.cart_matcher_accept(self.handle, id), "grammar.accept")
end

function Matcher:accept_text(text)
    core.check(C.cart_matcher_accept_bytes(self.handle, text, #text), "grammar.accept")
end

-- Whether text could be accepted now (nothing changes).
function Matcher:try(text)
    return C.cart_matcher_try_bytes(self.handle, text, #text) ~= 0
end

function Matcher:can_end() return C.cart_matcher_can_end(self.handle) ~= 0 end
function Matcher:done() return C.cart_matcher_is_done(self.handle) ~= 0 end
function Matcher:bytes() return tonumber(C.cart_matcher_bytes(self.handle)) end
function Matcher:reset() C.cart_matcher_reset(self.handle) end

function Matcher:free()
    core.free(self, C.cart_matcher_free)
end

return grammar
