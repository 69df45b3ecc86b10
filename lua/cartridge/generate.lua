-- cartridge.generate: the decode loop recipes share.
--
--   local generate = require("cartridge.generate")
--   local r = generate.run{
--       model = m, tokenizer = tok,
--       prompt_ids = ids,             -- Lua list
--       kv = kv,                      -- optional: a cache to continue (its rows stay in front)
--       max_tokens = 128,
--       sampling = { temperature = 0.7, top_p = 0.9, seed = 1 },  -- default greedy
--       stop = { "\n\n" },            -- optional stop strings (not included in the text)
--       on_text = io.write,           -- optional: receives text as soon as it is final
--       grammar = g,                  -- optional: a cartridge.grammar; the text is then a document of it
--       history = ids,                -- optional: tokens already in kv that the penalties see too
--   }
--   r.ids, r.text, r.finish ("stop" | "length"), r.prompt_tokens, r.timings
--
-- Generation stops at an end-of-generation token (the tokenizer's is_eog; it
-- is not part of the text or the ids), at a stop string, or after max_tokens.
-- With a grammar, every token is drawn from those that can continue its
-- document (greedy included), and generation also stops ("stop") as soon as
-- the document is complete and nothing can follow it.
-- The penalties (sampling.repeat_penalty, frequency_penalty,
-- presence_penalty) look at the last repeat_last_n tokens of history, prompt
-- and output together, as llama.cpp's CLI and server count them.
-- Streaming holds back text that may still turn into a stop string and bytes
-- of an unfinished UTF-8 character.

local sampler_mod = require("cartridge.sampler")
local grammar_mod = require("cartridge.grammar")
local core = require("cartridge.core")
local C = core.C

local generate = {}

local function now()
    return C.cart_now_seconds()
end

-- The length of the longest suffix of text that is a proper prefix of a stop
-- string: text a stream must hold back until it knows it is not a stop.
local function pending_stop(text, stops)
    local keep = 0
    for _, s in ipairs(stops) do
        for n = math.min(#s - 1, #text), 1, -1 do
            if n > keep and text:sub(-n) == s:sub(1, n) then
                keep = n
                break
            end
        end
    end
    return keep
end

function generate.run(opts)
    local m, tok = opts.model, opts.tokenizer
    local prompt = opts.prompt_ids
    local max_tokens = opts.max_tokens or 128
    local stops = opts.stop or {}
    if #prompt == 0 then error("generate: the prompt is empty (no tokens to start from)", 0) end
    local kv, own_kv = opts.kv, false
    if not kv then
        kv = m:new_kv(#prompt + max_tokens + 1, opts.kv_dtype)
        own_kv = true
    end
    if kv:len() + #prompt + max_tokens > kv:capacity() then
        error(("generate: %d cached + %d prompt + %d new tokens exceed the cache of %d rows"):format(
            kv:len(), #prompt, max_tokens, kv:capacity()), 0)
    end
    local s = sampler_mod.new(opts.sampling)
    -- the penalties see the prompt, as llama-cli's do: the history given
    -- (tokens already in kv), then the prompt
    s:accept_prompt(opts.history or {})
    s:accept_prompt(prompt)
    local stream = tok:stream()
    local matcher = opts.grammar and grammar_mod.matcher(opts.grammar, grammar_mod.vocab(tok, m.n_vocab))

    local t0 = now()
    local logits = m:forward(kv, prompt)
    local t1 = now()
    local ids, text, shown = {}, "", 0
    local finish = "length"
    local emit = opts.on_text
    for _ = 1, max_tokens do
        local id = s:sample(logits, m.n_vocab, matcher and (matcher:mask()))
        if id < 0 then
            error("generate: no token of the vocabulary can continue the structured output (it lacks the bytes " ..
                "or the end-of-generation token the document needs)", 0)
        end
        if tok:is_eog(id) then
            finish = "stop"
            break
        end
        if matcher then matcher:accept(id) end
        s:accept(id)
        ids[#ids + 1] = id
        text = text .. stream:push(id)
        local cut
        for _, stop in ipairs(stops) do
            local at = text:find(stop, 1, true)
            if at and (not cut or at < cut) then cut = at end
        end
        if cut then
            text = text:sub(1, cut - 1)
            finish = "stop"
            break
        end
        if emit then
            local ready = #text - pending_stop(text, stops)
            if ready > shown then
                emit(text:sub(shown + 1, ready))
                shown = ready
            end
        end
        if matcher and matcher:done() then
            finish = "stop"
            break
        end
        if #ids == max_tokens then break end
        logits = m:forward(kv, { id })
    end
    if finish == "length" then text = text .. stream:flush() end
    if emit and #text > shown then emit(text:sub(shown + 1)) end
    local t2 = now()
    s:free()
    if matcher then matcher:free() end
    if own_kv then kv:free() end
    local decode_s = t2 - t1
    return {
        ids = ids,
        text = text,
        finish = finish,
        prompt_tokens = #prompt,
        timings = {
            prompt_s = t1 - t0,
            decode_s = decode_s,
            prompt_tok_s = #prompt / math.max(t1 - t0, 1e-9),
            decode_tok_s = #ids / math.max(decode_s, 1e-9),
        },
    }
end

generate.pending_stop = pending_stop
return generate
