-- cartridge.embeddings: POST /v1/embeddings, OpenAI's shape over the bare
-- model's final hidden states (cartridge.server_utility routes it).
--
-- Each input is tokenized with the model's special tokens (a BOS where the
-- model has one), run alone through the bare model, and its rows after the
-- last block and the output norm (cart_model_forward_hidden: what the output
-- head reads) are pooled: "mean" over the tokens (the default) or "last", the
-- last token's (serve.lua --pooling), then scaled to unit length, as
-- llama-server's /v1/embeddings does. The work runs at once, so the inputs'
-- tokens are bounded (MAX_INPUTS inputs, the server's --ctx tokens each,
-- MAX_TOKENS in all).
--
-- Request: input (a string, a list of strings, a list of token ids, or a
-- list of such lists), model (the bare model's name or an alias; a
-- cartridge's name is a 400), encoding_format ("float" or "base64": little-
-- endian float32s, what OpenAI's clients ask for by default), dimensions
-- (only the model's own), user (ignored, as it carries no instruction).

local bit = require("bit")
local ffi = require("ffi")
local json = require("cartridge.json")

local embeddings = {}

embeddings.MAX_INPUTS = 256
embeddings.MAX_TOKENS = 16384
embeddings.POOLING = { mean = true, last = true }

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- The base64 text of n bytes at p.
local function base64(p, n)
    local out = {}
    for i = 0, n - 1, 3 do
        local a, b, c = p[i], i + 1 < n and p[i + 1] or 0, i + 2 < n and p[i + 2] or 0
        local v = bit.bor(bit.lshift(a, 16), bit.lshift(b, 8), c)
        local q = {}
        for k = 1, 4 do q[k] = B64:byte(bit.band(bit.rshift(v, 6 * (4 - k)), 63) + 1) end
        if i + 1 >= n then q[3] = 61 end -- '='
        if i + 2 >= n then q[4] = 61 end
        out[#out + 1] = string.char(q[1], q[2], q[3], q[4])
    end
    return table.concat(out)
end
embeddings.base64 = base64

-- The inputs as lists of token ids.
local function inputs(srv, body)
    local u = srv.util
    local input = body.input
    local function ids_of(v, where)
        if type(v) == "string" then
            if v == "" then u.reject(400, where .. " is an empty string", "input") end
            u.check_utf8(v, where)
            return srv.tok:encode(v, { add_special = true, special = false })
        end
        if json.kind(v) == "array" and #v > 0 and type(v[1]) == "number" then
            for i, id in ipairs(v) do
                if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= srv.m.n_vocab then
                    u.reject(400, ("%s[%d] must be a token id in [0, %d); got %s"):format(where, i - 1, srv.m.n_vocab,
                        u.shown(id, v, i)), "input")
                end
            end
            return v
        end
        u.reject(400, ("%s must be a non-empty string or a list of token ids; got %s"):format(where, u.shown(v)),
            "input")
    end
    if type(input) == "string" or json.kind(input) == "array" and type(input[1]) == "number" then
        return { ids_of(input, "input") }
    end
    if json.kind(input) ~= "array" or #input == 0 then
        u.reject(400, "input must be a string, a list of strings or token ids, or a list of such lists; got "
            .. u.shown(input, body, "input"), "input")
    end
    if #input > embeddings.MAX_INPUTS then
        u.reject(400, ("input holds %d items; this server embeds at most %d per request"):format(#input,
            embeddings.MAX_INPUTS), "input")
    end
    local out = {}
    for i, v in ipairs(input) do out[i] = ids_of(v, ("input[%d]"):format(i - 1)) end
    return out
end

-- The pooled, unit-length embedding of one id list, as a float array.
local function embed(srv, ids)
    local m, dim = srv.m, srv.m.config.n_embd
    local kv = m:new_kv(#ids, "f16")
    local ok, rows = pcall(m.forward_batch, m, { kv }, { ids }, "all", nil, true)
    kv:free()
    if not ok then error(rows, 0) end
    local v = ffi.new("float[?]", dim)
    if srv.pooling == "last" then
        ffi.copy(v, rows + (#ids - 1) * dim, dim * 4)
    else
        for d = 0, dim - 1 do
            local s = 0
            for t = 0, #ids - 1 do s = s + rows[t * dim + d] end
            v[d] = s / #ids
        end
    end
    require("cartridge.retrieval").normalize(v, dim)
    return v
end

function embeddings.handle(srv, body)
    local u = srv.util
    if json.kind(body) ~= "object" then u.reject(400, "the body must be a JSON object", nil) end
    local name = body.model
    if name ~= nil and name ~= json.null then
        if type(name) ~= "string" then u.reject(400, "model must be a string; got " .. u.shown(name), "model") end
        if name ~= srv.model_name and not srv.aliases[name] then
            u.reject(400, ("model %s: embeddings come from the bare model (%s); a cartridge's rows do not make "
                .. "embeddings"):format(u.shown(name), srv.model_name), "model")
        end
    end
    local format = body.encoding_format
    if format == nil or format == json.null then format = "float" end
    if format ~= "float" and format ~= "base64" then
        u.reject(400, 'encoding_format must be "float" or "base64"; got ' .. u.shown(format), "encoding_format")
    end
    local dim = srv.m.config.n_embd
    local dims = body.dimensions
    if dims ~= nil and dims ~= json.null and dims ~= dim then
        u.reject(400, ("dimensions: this model's embeddings have %d; got %s"):format(dim, u.shown(dims)), "dimensions")
    end
    local lists = inputs(srv, body)
    local total = 0
    for i, ids in ipairs(lists) do
        if #ids > srv.ctx then
            u.reject(400, ("input %d has %d tokens; this server's context (--ctx) holds %d"):format(i - 1, #ids,
                srv.ctx), "input", "context_length_exceeded")
        end
        total = total + #ids
    end
    if total > embeddings.MAX_TOKENS then
        u.reject(400, ("the inputs hold %d tokens; this server embeds at most %d per request"):format(total,
            embeddings.MAX_TOKENS), "input")
    end
    local data = json.array()
    for i, ids in ipairs(lists) do
        local v = embed(srv, ids)
        local value
        if format == "base64" then
            value = base64(ffi.cast("const uint8_t *", v), dim * 4)
        else
            value = json.array()
            for d = 0, dim - 1 do value[d + 1] = v[d] end
        end
        data[i] = { object = "embedding", index = i - 1, embedding = value }
    end
    return json.encode({ object = "list", data = data, model = srv.model_name,
        usage = { prompt_tokens = total, total_tokens = total } })
end

return embeddings
