-- cartridge.tokenizer: text <-> token ids from a GGUF's own tokenizer metadata,
-- matching llama.cpp (engine/tokenizer.h has the rules).
--
--   local tokenizer = require("cartridge.tokenizer")
--   local tok = tokenizer.load("model.gguf")    -- or a gguf File (gguf.open, model.file)
--   local ids = tok:encode("Hello", { special = true, add_special = true })
--   local seq = tok:encode_ids("Hello", opts, seq)  -- onto a cartridge.ids sequence
--   tok:decode(ids, { special = true })          -- the text back
--   tok:piece(ids[1], true)                       -- one token's bytes
--   tok:find("<|im_end|>")                        -- 151645 (nil when no token has that text)
--   tok:is_eog(id), tok.bos, tok.eos, tok.vocab_size, tok.kind ("bpe" | "spm")
--   local s = tok:stream()                        -- for generated ids, one at a time
--   io.write(s:push(id)) ... io.write(s:flush())
--   tok:free()                                    -- or leave it to the GC
--
-- Ids are 0-based (the model's), kept in ordinary 1-based Lua lists. Options:
--   encode: special     = parse control/user-defined token texts as single ids (false)
--           add_special = add BOS/EOS as the model's add_bos/add_eos say (false)
--           plain       = with special: { start, end, ... } 0-based byte ranges
--                         where control tokens stay text (a chat's contents)
--   decode: special        = render control tokens as their text (false)
--           remove_special = drop a leading BOS / trailing EOS the model adds (false)

local core = require("cartridge.core")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local tokenizer = {}

local PARSE_SPECIAL, ADD_SPECIAL = tonumber(C.CART_TOKENIZE_PARSE_SPECIAL), tonumber(C.CART_TOKENIZE_ADD_SPECIAL)
local UNPARSE_SPECIAL, REMOVE_SPECIAL = tonumber(C.CART_TOKENIZE_UNPARSE_SPECIAL), tonumber(C.CART_TOKENIZE_REMOVE_SPECIAL)

-- token type id -> its name in lower case ("normal", "control", "byte", ...)
local TYPE_NAMES = {}
for _, name in ipairs({ "undefined", "normal", "unknown", "control", "user_defined", "unused", "byte" }) do
    TYPE_NAMES[tonumber(C["CART_TOKEN_" .. name:upper()])] = name
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local Stream = {}
Stream.__index = Stream

-- Loads the tokenizer of a GGUF: a path, a gguf File object (anything with a
-- `handle` field holding a cart_gguf *), or a cart_gguf * itself. The
-- tokenizer keeps its own copy; the file may be closed afterwards.
function tokenizer.load(source)
    local handle, opened
    if type(source) == "string" then
        opened = require("cartridge.gguf").open(source)
        handle = opened.handle
    elseif type(source) == "table" and source.handle ~= nil then
        handle = source.handle
    elseif type(source) == "cdata" then
        handle = source
    else
        error("tokenizer.load: expected a path or a GGUF file, got " .. type(source), 0)
    end
    local out = ffi.new("cart_tokenizer *[1]")
    local rc = C.cart_tokenizer_load(out, ffi.cast("const cart_gguf *", handle))
    if opened then opened:close() end
    core.check(rc, "tokenizer.load")
    local h = ffi.gc(out[0], C.cart_tokenizer_free)
    local bos, eos = C.cart_tokenizer_bos(h), C.cart_tokenizer_eos(h)
    return setmetatable({
        handle = h,
        kind = C.cart_tokenizer_kind_of(h) == C.CART_TOKENIZER_SPM and "spm" or "bpe",
        vocab_size = core.int(C.cart_tokenizer_vocab_size(h)),
        bos = bos >= 0 and bos or nil, -- nil when the model has none
        eos = eos >= 0 and eos or nil,
        adds_bos = C.cart_tokenizer_adds_bos(h) ~= 0,
        adds_eos = C.cart_tokenizer_adds_eos(h) ~= 0,
    }, Tokenizer)
end

local function live(self, what)
    if self.handle == nil then error(what .. ": the tokenizer was freed", 0) end
    return self.handle
end

function Tokenizer:free()
    core.free(self, C.cart_tokenizer_free)
end

local n_out = ffi.new("int64_t[1]")

-- opts.plain: a flat list of 0-based byte offsets { start1, end1, start2,
-- end2, ... } of ranges where control tokens are not parsed (engine/
-- tokenizer.h cart_tokenizer_encode_plain), as a cdata array and count.
local function plain_ranges(opts)
    local list = opts.plain
    if not list or #list == 0 then return nil, 0 end
    local arr = ffi.new("int64_t[?]", #list)
    for i = 1, #list do arr[i - 1] = list[i] end
    return arr, #list / 2
end

-- Encodes text; returns an int32_t cdata array and the count (for big texts,
-- where a Lua list would be wasteful).
function Tokenizer:encode_buffer(text, opts)
    local h = live(self, "tokenizer:encode")
    if type(text) ~= "string" then
        error("tokenizer:encode: expected a string, got " .. type(text), 0)
    end
    opts = opts or {}
    local flags = (opts.special and PARSE_SPECIAL or 0) + (opts.add_special and ADD_SPECIAL or 0)
    local plain, n_plain = plain_ranges(opts)
    local cap = #text + 16
    local buf = ffi.new("int32_t[?]", cap)
    core.check(C.cart_tokenizer_encode_plain(h, text, #text, flags, plain, n_plain, buf, cap, n_out),
        "tokenizer:encode")
    local n = tonumber(n_out[0])
    if n > cap then -- invalid bytes can take up to three tokens each
        cap = n
        buf = ffi.new("int32_t[?]", cap)
        core.check(C.cart_tokenizer_encode_plain(h, text, #text, flags, plain, n_plain, buf, cap, n_out),
            "tokenizer:encode")
    end
    return buf, n
end

-- Encodes text onto the end of a cartridge.ids sequence (a new one when
-- `into` is nil); returns the sequence.
function Tokenizer:encode_ids(text, opts, into)
    local h = live(self, "tokenizer:encode")
    if type(text) ~= "string" then
        error("tokenizer:encode: expected a string, got " .. type(text), 0)
    end
    opts = opts or {}
    into = into or ids_mod.new()
    local flags = (opts.special and PARSE_SPECIAL or 0) + (opts.add_special and ADD_SPECIAL or 0)
    local cap = #text + 16
    core.check(C.cart_tokenizer_encode(h, text, #text, flags, into:tail(cap), cap, n_out), "tokenizer:encode")
    local n = tonumber(n_out[0])
    if n > cap then -- invalid bytes can take up to three tokens each
        cap = n
        core.check(C.cart_tokenizer_encode(h, text, #text, flags, into:tail(cap), cap, n_out), "tokenizer:encode")
    end
    into:grow(tonumber(n_out[0]))
    return into
end

-- Encodes text into a Lua list of ids.
function Tokenizer:encode(text, opts)
    local buf, n = self:encode_buffer(text, opts)
    local ids = {}
    for i = 0, n - 1 do ids[i + 1] = buf[i] end
    return ids
end

-- Calls fill(buf, cap) (a C call writing n_out) with a growing buffer; returns the string.
local function read_string(fill, guess, what)
    local cap = guess
    for _ = 1, 2 do
        local buf = ffi.new("char[?]", math.max(cap, 1))
        core.check(fill(buf, cap), what)
        local n = tonumber(n_out[0])
        if n <= cap then return ffi.string(buf, n) end
        cap = n
    end
    error(what .. ": the output kept growing", 0)
end

-- The text of a list of ids (a Lua list, a cartridge.ids sequence, or an
-- int32_t cdata array with its count n).
function Tokenizer:decode(ids, opts, n)
    local h = live(self, "tokenizer:decode")
    opts = opts or {}
    local flags = (opts.special and UNPARSE_SPECIAL or 0) +
        (opts.remove_special and REMOVE_SPECIAL or 0)
    local arr
    if type(ids) == "table" then
        n = #ids
        arr = ffi.new("int32_t[?]", math.max(n, 1))
        for i = 1, n do arr[i - 1] = ids[i] end
    elseif ids_mod.is(ids) then
        arr, n = ids_mod.view(ids)
    else
        arr = ids
        n = n or 0
    end
    return read_string(function(buf, cap)
        return C.cart_tokenizer_decode(h, arr, n, flags, buf, cap, n_out)
    end, 8 * n + 16, "tokenizer:decode")
end

-- The bytes of one token (special: render control tokens as their text).
function Tokenizer:piece(id, special)
    local h = live(self, "tokenizer:piece")
    local flags = special and UNPARSE_SPECIAL or 0
    return read_string(function(buf, cap)
        return C.cart_tokenizer_piece(h, id, flags, buf, cap, n_out)
    end, 32, "tokenizer:piece")
end

-- The id whose stored text is exactly `text`, or nil.
function Tokenizer:find(text)
    local id = C.cart_tokenizer_find(live(self, "tokenizer:find"), text, #text)
    if id < 0 then return nil end
    return id
end

-- The stored text of a token ("" for a bad id).
function Tokenizer:text(id)
    return core.str(C.cart_tokenizer_text(live(self, "tokenizer:text"), id))
end

-- The token type's name: "normal", "control", "user_defined", "byte", ...
function Tokenizer:token_type(id)
    return TYPE_NAMES[C.cart_tokenizer_token_type(live(self, "tokenizer:token_type"), id)]
end

-- Whether the id ends generation (eos, <|im_end|>, <|endoftext|>, ...).
function Tokenizer:is_eog(id)
    return C.cart_tokenizer_is_eog(live(self, "tokenizer:is_eog"), id) ~= 0
end

-- A streaming decoder for generated ids: push(id) returns the text that is
-- safe to print now (complete UTF-8 characters; the bytes of a character
-- split across tokens wait for the rest; bytes that can never form one come
-- out as U+FFFD), flush() whatever is left (an unfinished character: U+FFFD). Each id
-- contributes its piece as llama.cpp prints it while generating, without the
-- leading-space strip that decode applies to a whole text.
-- opts.special renders control tokens as their text.
function Tokenizer:stream(opts)
    opts = opts or {}
    return setmetatable({ tok = self, special = opts.special or false, pending = "" }, Stream)
end

-- Well-formed UTF-8 of text: each ill-formed part becomes U+FFFD, so that
-- what a stream hands out can go into JSON as it is.
local function well_formed(text)
    if #text == 0 or C.cart_utf8_invalid_offset(text, #text) < 0 then return text end
    local out = ffi.new("char[?]", 3 * #text)
    return ffi.string(out, C.cart_utf8_sanitize(text, #text, out))
end
tokenizer.well_formed = well_formed

function Stream:push(id)
    local text = self.pending .. self.tok:piece(id, self.special)
    local k = tonumber(C.cart_utf8_complete_prefix(text, #text))
    self.pending = text:sub(k + 1)
    return well_formed(text:sub(1, k))
end

function Stream:flush()
    local text = self.pending
    self.pending = ""
    return well_formed(text)
end

return tokenizer
