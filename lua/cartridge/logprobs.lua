-- cartridge.logprobs: the server's log-probabilities and logit biases, in
-- the shapes of OpenAI's APIs.
--
--   local o = logprobs.options(route, body, ctx)   -- the request's fields, checked
--   local saved = logprobs.bias(o.bias, logits)    -- before sampling ...
--   logprobs.unbias(saved, logits)                 -- ... and after
--   local e = logprobs.entry(logits, n_vocab, id, o.top)
--   logprobs.chat(tok, entries, i, j)              -- chat's / Responses' list
--   logprobs.legacy(tok, entries, i, j, offset)    -- completions' object
--
-- What a log-probability is: the model's own distribution at that step, the
-- untempered log-softmax of its logits before penalties, biases and a
-- grammar (engine/sampler.h's cart_token_logprobs), as llama.cpp's server
-- reports by default. A token's reported entry is the one the sampler chose;
-- the end-of-generation token, which ends a reply, has none.
--
-- logit_bias: OpenAI's object {"<id>": bias} with bias in [-100, 100], added
-- to the logit before sampling; llama-server's array [[id, bias], ...] too,
-- where bias false bans the token and an id may be a string whose tokens are
-- all biased. Ids are checked against the vocabulary.

local core = require("cartridge.core")
local json = require("cartridge.json")
local sampler = require("cartridge.sampler")
local C = core.C

local logprobs = {}

local MAX_TOP = 20 -- OpenAI's limit for top_logprobs
logprobs.MAX_TOP = MAX_TOP

-- ctx: reject(status, message, param), shown(v, parent, key), n_vocab, tok
local function int_in(ctx, v, lo, hi, name, parent, key)
    if type(v) ~= "number" or v ~= math.floor(v) or v < lo or v > hi then
        ctx.reject(400, ("%s must be an integer in [%d, %d]; got %s"):format(name, lo, hi, ctx.shown(v, parent, key)),
            name)
    end
    return v
end

local function present(v) return v ~= nil and v ~= json.null end

-- One bias entry: key an id (a number, or a string of digits in the object
-- form) or, in the array form, a string of text; value a number in
-- [-100, 100] or (array form) false.
local function add_bias(ctx, out, key, value, where, text_ok)
    local ids
    local as_number = type(key) == "number" and key or (type(key) == "string" and key:match("^%d+$") and tonumber(key))
    if as_number then
        if as_number ~= math.floor(as_number) or as_number < 0 or as_number >= ctx.n_vocab then
            ctx.reject(400, ("%s: token id %s is not in this model's vocabulary [0, %d)"):format(where,
                ctx.shown(key), ctx.n_vocab), "logit_bias")
        end
        ids = { as_number }
    elseif text_ok and type(key) == "string" and key ~= "" then
        if C.cart_utf8_invalid_offset(key, #key) >= 0 then
            ctx.reject(400, where .. ": the text is not valid UTF-8", "logit_bias")
        end
        ids = ctx.tok:encode(key, { special = false, add_special = false })
    else
        ctx.reject(400, ("%s: a key must be a token id%s; got %s"):format(where, text_ok and " or a non-empty text"
            or " (a string of digits)", ctx.shown(key)), "logit_bias")
    end
    local b
    if value == false and text_ok then b = -math.huge
    elseif type(value) == "number" and value >= -100 and value <= 100 then b = value
    else
        ctx.reject(400, ("%s: a bias must be a number in [-100, 100]%s; got %s"):format(where,
            text_ok and " or false (never this token)" or "", ctx.shown(value)), "logit_bias")
    end
    for _, id in ipairs(ids) do out[id] = b end
end

local function bias_field(ctx, body)
    local v = body.logit_bias
    if not present(v) then return nil end
    local out, n = {}, 0
    if json.kind(v) == "object" then
        for k, b in pairs(v) do
            add_bias(ctx, out, k, b, "logit_bias[" .. ctx.shown(k) .. "]", false)
            n = n + 1
        end
    elseif json.kind(v) == "array" then
        for i, pair in ipairs(v) do
            local where = ("logit_bias[%d]"):format(i - 1)
            if json.kind(pair) ~= "array" or #pair ~= 2 then
                ctx.reject(400, where .. " must be a pair [token id or text, bias]; got " .. ctx.shown(pair, v, i),
                    "logit_bias")
            end
            add_bias(ctx, out, pair[1], pair[2], where, true)
            n = n + 1
        end
    else
        ctx.reject(400, 'logit_bias must be an object {"<token id>": bias} or an array of [id, bias] pairs; got '
            .. ctx.shown(v, body, "logit_bias"), "logit_bias")
    end
    if n > 1024 then ctx.reject(400, ("logit_bias holds at most 1024 entries; got %d"):format(n), "logit_bias") end
    return next(out) and out or nil
end

-- The Responses API asks for log-probabilities through include.
local function includes_logprobs(ctx, body)
    local inc = body.include
    if not present(inc) then return false end
    if json.kind(inc) ~= "array" then
        ctx.reject(400, "include must be an array of strings; got " .. ctx.shown(inc, body, "include"), "include")
    end
    local on = false
    for i, item in ipairs(inc) do
        if item == "message.output_text.logprobs" then on = true
        elseif type(item) ~= "string" then
            ctx.reject(400, ("include[%d] must be a string; got %s"):format(i - 1, ctx.shown(item, inc, i)), "include")
        else
            ctx.reject(400, ('include[%d]: %s is not something this server can include (it can include '
                .. '"message.output_text.logprobs")'):format(i - 1, ctx.shown(item)), "include")
        end
    end
    return on
end

-- The request's log-probability, echo and bias fields for a route:
-- { on, top, bias, echo }.
function logprobs.options(route, body, ctx)
    local o = { on = false, top = 0, echo = false }
    if route == "/v1/chat/completions" then
        local lp = body.logprobs
        if present(lp) and type(lp) ~= "boolean" then
            ctx.reject(400, "logprobs must be a boolean; got " .. ctx.shown(lp, body, "logprobs"), "logprobs")
        end
        o.on = lp == true
        if present(body.top_logprobs) then
            o.top = int_in(ctx, body.top_logprobs, 0, MAX_TOP, "top_logprobs", body, "top_logprobs")
            if not o.on then ctx.reject(400, "top_logprobs needs logprobs: true", "top_logprobs") end
        end
        o.bias = bias_field(ctx, body)
    elseif route == "/v1/completions" then
        if present(body.logprobs) then
            o.on, o.top = true, int_in(ctx, body.logprobs, 0, MAX_TOP, "logprobs", body, "logprobs")
        end
        local echo = body.echo
        if present(echo) and type(echo) ~= "boolean" then
            ctx.reject(400, "echo must be a boolean; got " .. ctx.shown(echo, body, "echo"), "echo")
        end
        o.echo = echo == true
        if o.echo and o.on then
            ctx.reject(400, "echo with logprobs (the prompt's own log-probabilities) is not supported: ask for one "
                .. "of them", "echo")
        end
        o.bias = bias_field(ctx, body)
    elseif route == "/v1/responses" then
        o.on = includes_logprobs(ctx, body)
        if present(body.top_logprobs) then
            o.top = int_in(ctx, body.top_logprobs, 0, MAX_TOP, "top_logprobs", body, "top_logprobs")
        end
    end
    return o
end

-- Adds the biases to a row of logits (a float*) in place; returns what to
-- put back after sampling (nil: nothing was changed).
function logprobs.bias(bias, logits)
    if not bias then return nil end
    local saved = {}
    for id, b in pairs(bias) do
        saved[id] = logits[id]
        logits[id] = logits[id] + b
    end
    return saved
end

function logprobs.unbias(saved, logits)
    for id, v in pairs(saved or {}) do logits[id] = v end
end

-- The entry of a chosen token: { id, lp, top = { { id, logprob }, ... } }.
function logprobs.entry(logits, n_vocab, id, top)
    local lp, list = sampler.logprobs(logits, n_vocab, id, top)
    return { id = id, lp = lp, top = list }
end

-- A token's text for a log-probability entry: its bytes when they are valid
-- UTF-8, else each byte written as \xNN (as OpenAI shows a piece of a
-- character); the bytes as numbers; and the piece itself.
local function token_text(tok, id)
    local piece = tok:piece(id, true)
    local bytes = json.array({ piece:byte(1, -1) })
    if C.cart_utf8_invalid_offset(piece, #piece) < 0 then return piece, bytes, piece end
    return (piece:gsub(".", function(c) return ("\\x%02x"):format(c:byte()) end)), bytes, piece
end

-- Entries i .. j in the chat completions and Responses shape: a list of
-- { token, logprob, bytes, top_logprobs = [{ token, logprob, bytes }] }.
function logprobs.chat(tok, entries, i, j)
    local out = json.array()
    for k = i, j do
        local e = entries[k]
        local text, bytes = token_text(tok, e.id)
        local top = json.array()
        for n, t in ipairs(e.top) do
            local tt, tb = token_text(tok, t.id)
            top[n] = { token = tt, logprob = t.logprob, bytes = tb }
        end
        out[#out + 1] = { token = text, logprob = e.lp, bytes = bytes, top_logprobs = top }
    end
    return out
end

-- Entries i .. j in the completions (legacy) shape: { tokens,
-- token_logprobs, top_logprobs = [{ token: logprob }], text_offset }, the
-- offsets in characters of the choice's text from `offset` on; and the
-- offset after entry j.
function logprobs.legacy(tok, entries, i, j, offset)
    local o = { tokens = json.array(), token_logprobs = json.array(), top_logprobs = json.array(),
        text_offset = json.array() }
    for k = i, j do
        local e = entries[k]
        local text, _, piece = token_text(tok, e.id)
        local top = json.object()
        for _, t in ipairs(e.top) do top[(token_text(tok, t.id))] = t.logprob end
        local n = #o.tokens + 1
        o.tokens[n], o.token_logprobs[n], o.top_logprobs[n], o.text_offset[n] = text, e.lp, top, offset
        offset = offset + select(2, piece:gsub("[^\128-\191]", "")) -- characters begun in this piece
    end
    return o, offset
end

return logprobs
