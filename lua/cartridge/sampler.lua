-- cartridge.sampler: picking tokens from logits (engine/sampler.h).
--
--   local s = sampler.new{ temperature = 0.7, top_p = 0.9, seed = 42 }
--   local id = s:sample(logits, n_vocab)   -- logits: a float*
--   local id = s:sample(logits, n_vocab, mask)  -- only tokens whose bit is set (cartridge.grammar); -1: none
--   s:accept(id)                           -- feeds the repetition penalty
--   s:accept_prompt(ids)                   -- the prompt's ids, before the first sample
--   local lp, top = sampler.logprobs(logits, n_vocab, id, 5)  -- the model's own: id's, and the 5 likeliest
--
-- Fields (defaults): temperature 0 (greedy), top_k 0 (off), top_p 1 (off),
-- min_p 0 (off), repeat_penalty 1 (off), repeat_last_n 64, frequency_penalty
-- and presence_penalty 0 (off), seed 0. The steps run in llama.cpp's order;
-- see engine/sampler.h.
--
-- The penalties' window holds the last repeat_last_n accepted tokens. As in
-- llama.cpp's server and CLI, the prompt counts: callers pass every prompt
-- token (cached ones included) to accept_prompt before the first sample,
-- then accept each generated token.

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local sampler = {}

local Sampler = {}
Sampler.__index = Sampler

local FIELDS = { "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty",
    "presence_penalty", "seed" }

function sampler.new(params)
    params = params or {}
    local p = ffi.new("cart_sampler_params")
    C.cart_sampler_default_params(p)
    for key in pairs(params) do
        local known = false
        for _, f in ipairs(FIELDS) do known = known or f == key end
        if not known then
            error("sampler.new: unknown parameter '" .. tostring(key) .. "' (known: " ..
                table.concat(FIELDS, ", ") .. ")", 0)
        end
    end
    for _, f in ipairs(FIELDS) do
        if params[f] ~= nil then p[f] = params[f] end
    end
    return setmetatable({ handle = core.new("cart_sampler", C.cart_sampler_new, C.cart_sampler_free, "sampler.new", p),
        greedy = p.temperature <= 0, window = p.repeat_last_n }, Sampler)
end

function Sampler:sample(logits, n_vocab, mask)
    if mask then return C.cart_sampler_sample_masked(self.handle, logits, n_vocab, mask) end
    return C.cart_sampler_sample(self.handle, logits, n_vocab)
end

function Sampler:accept(id)
    C.cart_sampler_accept(self.handle, id)
end

-- Feeds a Lua list of prompt ids to the penalties' window, as llama.cpp
-- does once the prompt is processed. Only the last repeat_last_n can stay
-- in the window, so only those are passed to C.
function Sampler:accept_prompt(ids)
    for i = math.max(1, #ids - self.window + 1), #ids do C.cart_sampler_accept(self.handle, ids[i]) end
end

function Sampler:reset(seed)
    C.cart_sampler_reset(self.handle, seed or 0)
end

-- The model's own log-probabilities at a row of logits (the untempered
-- log-softmax, before penalties, biases and grammar: engine/sampler.h's
-- cart_token_logprobs): token id's, and the k most likely as a list of
-- { id =, logprob = }, most likely first, ties to the lower id.
function sampler.logprobs(logits, n_vocab, id, k)
    local lp = ffi.new("float[1]")
    local ids, lps = ffi.new("int32_t[?]", math.max(k, 1)), ffi.new("float[?]", math.max(k, 1))
    core.check(C.cart_token_logprobs(logits, n_vocab, id, k, lp, ids, lps), "sampler.logprobs")
    local top = {}
    for i = 0, math.min(k, n_vocab) - 1 do top[i + 1] = { id = ids[i], logprob = lps[i] } end
    return lp[0], top
end

function Sampler:free()
    core.free(self, C.cart_sampler_free)
end

return sampler
