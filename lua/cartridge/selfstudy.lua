-- cartridge.selfstudy: the pieces of self-study that recipes/selfstudy.lua
-- (and the benchmark and report recipes) put together.
--
-- One conversation: a random corpus chunk goes into a system message; bot A
-- (the model, sampling at temperature 0.6) reads it with a seed instruction
-- and writes one user message; bot B (the model, greedy) reads the chunk and
-- that message and answers. The teacher's distribution over B's answer
-- tokens -- the model WITH the chunk in context -- becomes the sparse targets
-- the cartridge is trained to reproduce WITHOUT the chunk: the student sees
-- only the user turn and the answer, behind the cartridge.
--
-- Reuse: the chunk's system block is prefilled once per conversation; bot A
-- continues from it, and bot B rewinds the same cache to it and continues
-- with its own turn. Bot B's greedy decode already computes, at every step,
-- the logits of the model with the chunk in context over exactly the tokens
-- the teacher would score, so the teacher targets are read off those logits
-- (top-k, 0.99 mass) instead of a second forward pass. --teacher-pass runs
-- that second pass anyway (packed, through the training forward) for
-- comparison.

local core = require("cartridge.core")
local chat = require("cartridge.chat")
local trainer_mod = require("cartridge.trainer")
local sampler_mod = require("cartridge.sampler")
local ids_mod = require("cartridge.ids")
local rng_mod = require("cartridge.rng")
local ffi = core.ffi
local C = core.C

local selfstudy = {}

-- The command-line flags of self-study that other recipes take with the
-- same meaning (recipes/selfstudy.lua, recipes/fleet.lua), as
-- cartridge.options specs, in this order; defaults: a table of overrides
-- (e.g. { p = 256 }).
local FLAGS = {
    { "p", type = "int", default = 512, help = "cartridge rows per layer, the frozen ones included" },
    { "frozen", type = "int", default = 1, help = "attention-sink rows kept constant" },
    { "accum", type = "int", default = 4, help = "conversations per optimizer step" },
    { "lr", type = "number", default = 2e-3, help = "Adam learning rate" },
    { "chunk-min", type = "int", default = 256, help = "shortest corpus chunk, tokens" },
    { "chunk-max", type = "int", default = 512, help = "longest corpus chunk, tokens" },
    { "top-k", type = "int", default = 20, help = "teacher entries per supervised token (then cut at 0.99 mass)" },
    { "max-q", type = "int", default = 64, help = "bot A's message budget, tokens" },
    { "max-a", type = "int", default = 192, help = "bot B's answer budget, tokens (and the serve budget)" },
    { "seed", type = "int", default = 42, help = "seeds chunks, seed prompts and bot A's sampling" },
    { "seeds", help = "bot A's seed instructions, a comma-separated list of: structuring, summarization, question, use_case, creative, mechanism, verbatim (the seven, the default), focus (a question about one quoted sentence of the chunk)" },
    { "turns", type = "int", default = 1, help = "question/answer exchanges per conversation: bot B answers bot A's messages in turn, each seeing the earlier ones" },
    { "spec-b", type = "boolean", help = "bot B decodes speculatively, drafting from its own chunk" },
    { "checkpoint", type = "boolean", help = "recompute each layer in the backward (less memory, bit-identical results)" },
    { "teacher-pass", type = "boolean", help = "score B's answers with a separate packed teacher pass instead of reusing B's logits" },
}

function selfstudy.flags(defaults)
    local out = {}
    for i, f in ipairs(FLAGS) do
        local copy = {}
        for k, v in pairs(f) do copy[k] = v end
        local key = f[1]:gsub("%-", "_")
        if defaults and defaults[key] ~= nil then copy.default = defaults[key] end
        out[i] = copy
    end
    return out
end

-- The generation group for --gen-batch (0: the smallest multiple of accum
-- that is at least 16). A group of 16 streams reads each weight once per
-- decode step for all 16: the bots of the next steps' conversations, which
-- do not depend on the training, decode together, the same bits in any
-- group. fail(message) raises when given is no multiple of accum.
function selfstudy.gen_batch(given, accum, fail)
    local n = given == 0 and accum * math.ceil(16 / accum) or given
    if n < accum or n % accum ~= 0 then fail(("--gen-batch %d must be a multiple of --accum %d"):format(n, accum)) end
    return n
end

-- Checks the shared flags' values; fail(message) raises.
function selfstudy.check_flags(opts, fail)
    if opts.accum < 1 then fail("--accum must be at least 1") end
    if opts.chunk_min < 1 or opts.chunk_min > opts.chunk_max then
        fail(("--chunk-min %d and --chunk-max %d: need 0 < chunk-min <= chunk-max"):format(opts.chunk_min,
            opts.chunk_max))
    end
    if opts.top_k < 1 or opts.max_q < 1 or opts.max_a < 1 then fail("--top-k, --max-q and --max-a must be at least 1") end
    if opts.turns < 1 or opts.turns > 64 then fail(("--turns %d: give 1..64 exchanges per conversation"):format(opts.turns)) end
    local ok, why = pcall(selfstudy.seed_kinds, opts.seeds)
    if not ok then fail(why) end
end

-- The system message a chunk (or the whole corpus, for the cartridge's
-- initialization) is wrapped in.
function selfstudy.system_text(body)
    return "\nYou are having a conversation with a user about the information below.\n\n<info>\n"
        .. body .. "\n</info>"
end

-- The text before and after the body in a template's system block: opener,
-- message, turn close. A base model without a chat template (the plain
-- template) gets the body alone: an instruction wrapper would only be text it
-- never saw in training.
function selfstudy.system_parts(template)
    if template.name == "plain" then return "", template.close end
    local head, tail = selfstudy.system_text("\0"):match("^(.*)%z(.*)$")
    return template.system_open .. head, tail .. template.close
end

-- The whole system block of a body, as text.
function selfstudy.system_block(template, body)
    local head, tail = selfstudy.system_parts(template)
    return head .. body .. tail
end

-- The line a chunk's body follows: its provenance, then a blank line.
function selfstudy.chunk_header(path)
    return ("The text below is an excerpt from %s, one document of a larger collection.\n\n"):format(path)
end

-- The chunk body as text: the provenance line, a blank line, the chunk.
function selfstudy.chunk_text(path, body)
    return selfstudy.chunk_header(path) .. body
end

-- The seven seed instructions: they fix the FORM of bot A's message, never
-- its content; the chunk is the only source of content.
selfstudy.SEEDS = {
    { name = "structuring", text = "Write a message asking another assistant to restate one specific part "
        .. "of the information above as JSON. Name the section and the document exactly, and ask for every "
        .. "date, name and number in it to be kept. Reply with the message only." },
    { name = "summarization", text = "Write a message asking another assistant to summarize one specific "
        .. "part of the information above. Identify that part precisely (its title, document, names or "
        .. "dates) so there is no doubt which part you mean. Reply with the message only." },
    { name = "question", text = "Write one question that tests knowledge of the information above. "
        .. "Include enough identifying detail (names, titles, numbers) that the question can only be "
        .. "answered from this information. Reply with the question only." },
    { name = "use_case", text = "Think of a practical task someone could accomplish with the information "
        .. "above, then write the one question such a person would ask to get it done. Reply with the "
        .. "question only." },
    { name = "creative", text = "Write an opening question for a creative, open-ended conversation "
        .. "inspired by the information above. Reply with the question only." },
    { name = "mechanism", text = "Write one question asking WHY or HOW something described in the "
        .. "information above works or happens: ask for the reason or the mechanism, not the bare fact. "
        .. "Include identifying details. Reply with the question only." },
    { name = "verbatim", text = "Write one question asking for the exact wording, full name, precise "
        .. "definition or numeric value of something in the information above, to be answered exactly as "
        .. "it is written there. Include identifying details. Reply with the question only." },
}

-- The focus instruction: one question about one sentence of the chunk,
-- quoted. The recipe picks the sentence at random (Interviews:draw), so the
-- questions spread over the chunk as evenly as its sentences do -- what a
-- large model's sampling gives by itself, and a small one's does not.
selfstudy.FOCUS = { name = "focus", focus = true }
function selfstudy.focus_text(sentence)
    return 'Write one question that this sentence of the information above answers: "' .. sentence
        .. '" Include who or what it is about. Reply with the question only.'
end

-- The seed instructions a comma-separated list names (nil: the seven of
-- selfstudy.SEEDS), as a list of SEEDS entries and selfstudy.FOCUS.
function selfstudy.seed_kinds(list)
    if list == nil then return selfstudy.SEEDS end
    local by_name, names = { focus = selfstudy.FOCUS }, {}
    for _, e in ipairs(selfstudy.SEEDS) do by_name[e.name], names[#names + 1] = e, e.name end
    names[#names + 1] = "focus"
    local out = {}
    for name in (list .. ","):gmatch("([^,]*),") do
        name = name:gsub("^%s+", ""):gsub("%s+$", "")
        local e = by_name[name]
        if not e then
            error(("--seeds: unknown seed instruction '%s'; choose from %s"):format(name, table.concat(names, ", ")), 0)
        end
        out[#out + 1] = e
    end
    return out
end

-- The complete sentences of a chunk's text, in order: runs that end in . ! or
-- ? before a space or the end, never across a line break, trimmed, with 2 to
-- 80 words. The run the text opens with counts only when at_start says the
-- chunk begins at a sentence boundary (else it is the tail of a cut one).
function selfstudy.sentences(text, at_start)
    local out, boundary = {}, at_start and 1 or nil -- where a sentence may begin
    for from, piece, to in text:gmatch("()([^%.!%?\n]*[%.!%?])()") do
        local next_char = text:sub(to, to)
        local ends = next_char == "" or next_char:match("%s") ~= nil
        local complete = ends and (from == boundary or (from > 1 and text:sub(from - 1, from - 1) == "\n"))
        boundary = ends and to or nil
        piece = piece:gsub("^%s+", "")
        local _, words = piece:gsub("%S+", "")
        if complete and words >= 2 and words <= 80 then out[#out + 1] = piece end
    end
    return out
end

-- Generation-level question cleanup: trim, drop a leading think block.
function selfstudy.clean(text)
    text = text:gsub("^%s+", ""):gsub("%s+$", "")
    if text:sub(1, 7) == "<think>" then
        local close = text:find("</think>", 1, true)
        text = close and text:sub(close + 8) or ""
    elseif text:sub(1, 8) == "</think>" then
        text = text:sub(9)
    end
    return (text:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- The token ids a cartridge is initialized from (a cartridge.ids sequence):
-- the whole corpus as a system message; when longer than p, its first
-- p - #close tokens and the closing tokens of the turn, so the cartridge is
-- exactly p rows. Also returns the whole block's ids (the same sequence
-- when it fits in p).
function selfstudy.init_ids(tok, template, corpus_text, p)
    local close = tok:encode_ids(template.close, { special = true })
    if p < #close + 8 then
        error(("CartridgeTooSmall: p = %d leaves no room for the corpus: the turn close alone is %d tokens; "
            .. "use --p %d or more"):format(p, #close, #close + 8), 0)
    end
    local all = tok:encode_ids(selfstudy.system_block(template, corpus_text), { special = true, add_special = true })
    if #all <= p then return all, all end
    return all:sub(0, p - #close):extend(close), all
end

-- Fills cartridge c (p rows) from the model's own K/V of all_ids (the whole
-- corpus as a system message, longer than p): its first `frozen` rows (the
-- sink, BOS) and then p - frozen rows at evenly spaced positions of the
-- rest, the last one included, each keeping the position it was computed
-- at. Every fact of a short corpus then has a row near it from the start,
-- where the opening covers only the first p tokens.
function selfstudy.spread_rows(n, p, frozen)
    local rows = {}
    for r = 0, frozen - 1 do rows[#rows + 1] = r end
    local free = p - frozen
    for k = 0, free - 1 do
        rows[#rows + 1] = frozen + (free == 1 and (n - 1 - frozen) or math.floor(k * (n - 1 - frozen) / (free - 1) + 0.5))
    end
    return rows
end

function selfstudy.init_spread(m, c, all_ids)
    local cart = require("cartridge.cart")
    local n = #all_ids
    if n <= c.p then return c:capture(m, all_ids) end
    local full = cart.new(m, n, c.frozen)
    full:capture(m, all_ids)
    for r, src in ipairs(selfstudy.spread_rows(n, c.p, c.frozen)) do c:copy_rows(r - 1, full, src, 1) end
    full:free()
end

-- A new sequence: a followed by b.
local function concat(a, b)
    return ids_mod.from(a):extend(b)
end

-- The work of a phase's generation, for a floor of its cost: tokens
-- prefilled and the rows they attend to, and per lockstep decode step the
-- streams in it and the rows they read from their caches (a list of {
-- streams, rows }).
local function new_work() return { prefill = 0, prefill_rows = 0, steps = {}, prefill_s = 0, decode_s = 0 } end

-- The interviews: bot A asks about chunks of the corpus, bot B answers with
-- the chunk in context. Holds the model, tokenizer, corpus and settings.
local Interviews = {}
Interviews.__index = Interviews

-- opts: chunk_min, chunk_max, max_q, max_a, top_k, seed (each
-- conversation's draws come from (seed, step, index) alone: see
-- Interviews:group), teacher_pass (bool), trainer (for teacher_pass), template
-- (chat template), spec_b (bool), seeds (a --seeds list; nil: the seven),
-- turns (exchanges per conversation, default 1), record_work (bool: keep
-- each bot's generation work in stats.work.a and .b, new_work's fields).
function selfstudy.interviews(m, tok, corpus, opts)
    local self = setmetatable({ m = m, tok = tok, corpus = corpus, o = opts }, Interviews)
    self.template = opts.template or chat.for_model(m)
    self.stop_id = self.template.stop and tok:find(self.template.stop) or nil
    self.stats = { empty_questions = 0, stopped = 0, conversations = 0,
        time = { a = 0, b = 0, teacher = 0 } }
    if opts.record_work then self.stats.work = { a = new_work(), b = new_work() } end
    self.kinds = selfstudy.seed_kinds(opts.seeds)
    self.turns = opts.turns or 1
    for _, k in ipairs(self.kinds) do self.focus = self.focus or k.focus end
    -- the constant pieces of every prompt, encoded once: the system block
    -- around a chunk, and bot A's turn for each fixed seed instruction
    local T = self.template
    local head, tail = selfstudy.system_parts(T)
    self.sys_head, self.sys_tail = head, tok:encode_ids(tail, { special = true })
    if tok.adds_eos and tok.eos then self.sys_tail:push(tok.eos) end
    self.bos = tok.adds_bos and tok.bos or nil
    self.a_turns = {}
    for i, seed in ipairs(self.kinds) do
        if seed.text then
            self.a_turns[i] = tok:encode_ids(T.user_open .. seed.text .. T.close .. T.opener(false), { special = true })
        end
    end
    -- what closes an assistant turn after its stop token (chatml's newline),
    -- and the whole close when the turn ended without one
    self.after_stop = T.close
    if T.stop and T.close:sub(1, #T.stop) == T.stop then self.after_stop = T.close:sub(#T.stop + 1) end
    return self
end

-- A chunk's system block as ids: the encoded head with the chunk's provenance
-- line, the corpus's own ids of the chunk (never decoded and encoded again),
-- the encoded tail. BOS and EOS as the model adds them to a text.
function Interviews:chunk_block(conv)
    local out = ids_mod.new(conv.chunk_len + 96)
    if self.bos then out:push(self.bos) end
    self.tok:encode_ids(self.sys_head .. selfstudy.chunk_header(conv.path), { special = true }, out)
    out:extend(self.corpus.ids.data + conv.chunk_start, conv.chunk_len)
    return out:extend(self.sys_tail)
end

-- The random draws of one conversation from its own generator r, in the
-- order they are made: chunk length, chunk start, seed instruction, bot A's
-- sampling seed; with a focus instruction among --seeds, the sentence's
-- draw; then the same three for each further turn. A run of one turn
-- without focus draws what it always did.
function Interviews:draw(r)
    local n = self.corpus.n_tokens
    local cmax = math.min(self.o.chunk_max, n)
    local len = r:int(math.min(self.o.chunk_min, cmax), cmax)
    local start = r:int(0, n - len)
    local turns = {}
    for t = 1, self.turns do
        local seed = r:below(#self.kinds) + 1
        local a_seed = r:u64()
        turns[t] = { seed = seed, a_seed = a_seed, pick = self.focus and r:u64() or nil }
    end
    return { chunk_start = start, chunk_len = len, turns = turns }
end

-- The complete sentences of conversation conv's chunk (cached on conv).
function Interviews:chunk_sentences(conv)
    if conv.sentences then return conv.sentences end
    local body = ids_mod.new(conv.chunk_len):extend(self.corpus.ids.data + conv.chunk_start, conv.chunk_len)
    local at_start = conv.chunk_start == 0
    if not at_start then
        local before = self.tok:decode(ids_mod.from({ self.corpus.ids.data[conv.chunk_start - 1] }), { special = true })
        at_start = before:match("[%.!%?]%s*$") ~= nil or before:match("\n%s*$") ~= nil
    end
    conv.sentences = selfstudy.sentences(self.tok:decode(body, { special = true }), at_start)
    return conv.sentences
end

-- Bot A's user turn for turn tt of conversation conv, as ids, and the seed's
-- name. A focus instruction quotes the drawn sentence; a chunk with no
-- complete sentence gets the question instruction instead.
function Interviews:a_turn(conv, tt)
    local kind = self.kinds[tt.seed]
    if not kind.focus then return self.a_turns[tt.seed], kind.name, kind.text end
    local sentences = self:chunk_sentences(conv)
    local T = self.template
    if #sentences == 0 then
        local q = selfstudy.seed_kinds("question")[1]
        return self.tok:encode_ids(T.user_open .. q.text .. T.close .. T.opener(false), { special = true }), q.name, q.text
    end
    local sentence = sentences[tonumber(tt.pick % #sentences) + 1]
    tt.sentence = sentence
    local text = selfstudy.focus_text(sentence)
    return self.tok:encode_ids(T.user_open .. text .. T.close .. T.opener(false), { special = true }), "focus", text
end

-- Decodes generated ids for a stream.
local function decode(tok, ids)
    return tok:decode(ids, { special = true })
end


-- Runs lockstep generation over streams. Each stream: { kv, ids (prompt
-- continuation to prefill), sampler or nil (greedy), max, on_row(stream,
-- logits) optional }. Fills stream.out (a cartridge.ids sequence of the
-- generated ids, stop token excluded) and stream.stopped. work (optional):
-- what the generation computed is added to it (new_work).
function Interviews:generate(streams, work)
    local m, tok = self.m, self.tok
    local kvs, ids = {}, {}
    for i, s in ipairs(streams) do
        kvs[i], ids[i] = s.kv, s.ids
        s.out, s.stopped = ids_mod.new(s.max), false
        if work then
            local n, before = #s.ids, s.kv:len()
            work.prefill = work.prefill + n
            work.prefill_rows = work.prefill_rows + n * before + n * (n + 1) / 2
        end
    end
    local t0 = work and C.cart_now_seconds()
    local logits = m:forward_batch(kvs, ids, "last")
    if work then work.prefill_s = work.prefill_s + (C.cart_now_seconds() - t0) end
    t0 = work and C.cart_now_seconds()
    local active = {}
    for i = 1, #streams do active[i] = i end
    while #active > 0 do
        local next_kvs, next_ids, counts, still = {}, {}, {}, {}
        for row, i in ipairs(active) do
            local s = streams[i]
            local l = logits + (row - 1) * m.n_vocab
            local id = s.sampler and s.sampler:sample(l, m.n_vocab) or C.cart_argmax(l, m.n_vocab)
            if s.on_row then s.on_row(s, l, id) end
            if tok:is_eog(id) then
                s.stopped = true
            else
                if s.sampler then s.sampler:accept(id) end
                s.out:push(id)
                if #s.out < s.max then
                    still[#still + 1] = i
                    next_kvs[#next_kvs + 1] = s.kv
                    -- the id just pushed, read in place by the next forward
                    next_ids[#next_ids + 1], counts[#counts + 1] = s.out.data + (#s.out - 1), 1
                end
            end
        end
        active = still
        if #active == 0 then break end
        if work then
            local rows = 0
            for _, kv in ipairs(next_kvs) do rows = rows + kv:len() + 1 end
            work.steps[#work.steps + 1] = { #next_kvs, rows }
        end
        logits = m:forward_batch(next_kvs, next_ids, "last", counts)
    end
    if work then work.decode_s = work.decode_s + (C.cart_now_seconds() - t0) end
end

local function now() return C.cart_now_seconds() end

-- The group's conversations, drawn (all draws before any generation), each
-- with its chunk's system block and bot A's turns.
function Interviews:draw_group(keys)
    if type(keys) == "number" then
        local n = keys
        keys = {}
        for i = 1, n do keys[i] = { 0, i } end
    end
    local convos = {}
    local g = rng_mod.new(0)
    for i, key in ipairs(keys) do
        convos[i] = self:draw(g:seed_item(self.o.seed, key[1], key[2]))
        convos[i].step, convos[i].index = key[1], key[2]
    end
    for _, conv in ipairs(convos) do
        conv.path = self.corpus:file_of(conv.chunk_start)
        conv.sys_ids = self:chunk_block(conv)
        for _, tt in ipairs(conv.turns) do tt.a_ids, tt.seed_name, tt.seed_text = self:a_turn(conv, tt) end
        conv.seed_name = conv.turns[1].seed_name
    end
    return convos
end

-- Bot A's streams, one per turn, each with its cache and sampler.
function Interviews:a_streams(convos)
    local o, m, K = self.o, self.m, self.turns
    local streams_a = {}
    if K == 1 then
        for i, conv in ipairs(convos) do
            local a_turn = conv.turns[1].a_ids
            -- room for bot A, and usually for bot B too (its turn is the question
            -- plus a few template tokens); B grows the cache when it is not
            local cap = #conv.sys_ids + math.max(#a_turn + o.max_q, o.max_q + 128 + o.max_a) + 16
            conv.kv = m:new_kv(cap, "f16")
            streams_a[i] = { kv = conv.kv, ids = concat(conv.sys_ids, a_turn), max = o.max_q, turn = conv.turns[1] }
        end
    else
        -- the system block once per conversation, copied into each turn's cache
        local kvs, sys = {}, {}
        for i, conv in ipairs(convos) do
            conv.kv = m:new_kv(#conv.sys_ids + K * (o.max_q + 128 + o.max_a) + 16, "f16")
            kvs[i], sys[i] = conv.kv, conv.sys_ids
        end
        m:forward_batch(kvs, sys, "none")
        for _, conv in ipairs(convos) do
            for _, tt in ipairs(conv.turns) do
                local kv = m:new_kv(#conv.sys_ids + #tt.a_ids + o.max_q + 1, "f16")
                kv:copy_from(conv.kv, #conv.sys_ids)
                streams_a[#streams_a + 1] = { kv = kv, ids = tt.a_ids, max = o.max_q, turn = tt, own_kv = true }
            end
        end
    end
    for _, st in ipairs(streams_a) do
        -- temperature 0.6 over the 256 most likely tokens (the reference's
        -- window; the rest of a 150k vocabulary carries no mass at 0.6, and
        -- sorting all of it per token would cost more than the forward)
        st.sampler = sampler_mod.new({ temperature = 0.6, top_k = 256, seed = st.turn.a_seed })
    end
    return streams_a
end

-- Bot A writes the questions; returns when it began (after its caches).
function Interviews:ask(convos)
    local streams_a = self:a_streams(convos)
    local t0 = now()
    self:generate(streams_a, self.stats.work and self.stats.work.a)
    for _, st in ipairs(streams_a) do
        local tt = st.turn
        tt.question = selfstudy.clean(decode(self.tok, st.out))
        st.sampler:free()
        if st.own_kv then st.kv:free() end
        if tt.question == "" then
            -- the model wrote nothing usable (a random-weight model often
            -- does): fall back to the seed instruction's own wording as the
            -- user message, so the conversation still asks about the chunk
            self.stats.empty_questions = self.stats.empty_questions + 1
            tt.question = tt.seed_text
            tt.empty = true
        end
    end
    for _, conv in ipairs(convos) do conv.question, conv.empty = conv.turns[1].question, conv.turns[1].empty end
    return t0
end

-- Bot B's stream for turn t of conv: what goes into the cache now (the last
-- answer and its close, whose rows are dropped after each turn and fed
-- again here, then this turn's user message and the assistant's opener),
-- each scored row appending its teacher entries to the conversation's
-- C-side target list at its place in the student sequence.
function Interviews:b_stream(conv, t)
    local o, m, T, K = self.o, self.m, self.template, self.turns
    local tt = conv.turns[t]
    local feed = ids_mod.new()
    local text = T.user_open .. tt.question .. T.close .. T.opener(false)
    if t > 1 then
        local last = conv.turns[t - 1]
        feed:extend(last.answer)
        if last.stopped then feed:push(self.stop_id) end
        text = (last.stopped and self.after_stop or T.close) .. text
    end
    self.tok:encode_ids(text, { special = true }, feed)
    if t == 1 then conv.prefix = feed end
    local base = #conv.student + #feed -- the student position of the answer's first token
    local targets = conv.targets
    local st = { kv = conv.kv, ids = feed, max = o.max_a, rows = 0, last_start = 0, base = base,
        on_row = function(st, l)
            st.last_start = targets:count()
            targets:append_topk(st.base + st.rows, l, m.n_vocab, o.top_k, 0.99)
            st.rows = st.rows + 1
        end }
    local need = #conv.sys_ids + #conv.student + #feed + o.max_a + 1
    if need > conv.kv:capacity() then
        local kv = m:new_kv(need + (K - t) * (o.max_q + 128 + o.max_a), "f16")
        kv:copy_from(conv.kv, conv.kv:len())
        conv.kv:free()
        conv.kv = kv
        st.kv = kv
    end
    return st
end

-- Bot B's streams decoded: speculatively (each drafting from its own
-- prompt, where the chunk is) or plainly.
function Interviews:b_decode(convos, streams_b)
    if not self.o.spec_b then
        self:generate(streams_b, self.stats.work and self.stats.work.b)
        return
    end
    local speculative = require("cartridge.speculative")
    for i, conv in ipairs(convos) do
        streams_b[i].drafter = speculative.new(concat(conv.sys_ids, conv.student):extend(streams_b[i].ids))
    end
    speculative.decode_batch(self.m, streams_b)
    for _, st in ipairs(streams_b) do
        self.stats.spec_drafted = (self.stats.spec_drafted or 0) + st.drafter.stats.drafted
        self.stats.spec_accepted = (self.stats.spec_accepted or 0) + st.drafter.stats.accepted
        st.drafter:free()
    end
end

-- Turn t's answers into each conversation's student sequence and spans.
function Interviews:b_collect(convos, streams_b, t)
    for i, conv in ipairs(convos) do
        local s, tt = streams_b[i], conv.turns[t]
        tt.answer = s.out
        tt.stopped = s.stopped and self.stop_id ~= nil
        conv.student:extend(s.ids)
        -- the stop token is supervised too, so the cartridge learns when to end
        local len = #s.out + (tt.stopped and 1 or 0)
        conv.spans[t] = { #conv.student, len }
        conv.answer_len = conv.answer_len + len
        -- an end-of-generation row the template names no stop token for is
        -- scored but not supervised
        if s.rows > len then conv.targets:truncate(s.last_start) end
        if tt.stopped then self.stats.stopped = self.stats.stopped + 1 end
        if t < self.turns then
            conv.kv:truncate(#conv.sys_ids + #conv.student)
        else
            conv.student:extend(s.out)
            if tt.stopped then conv.student:push(self.stop_id) end
        end
    end
end

-- Makes the conversations of one lockstep group: keys is a list of {
-- step, index }, and conversation (step, index) draws from a generator
-- seeded by (seed, step, index) alone (rng.h cart_rng_seed_item), so it is
-- the same conversation whichever process makes it, in whatever group. A
-- number n stands for the keys (0, 1) .. (0, n). Returns a list of
-- conversations in key order: { step, index, question, seed_name,
-- chunk_start, chunk_len, path, sys_ids, prefix, answer, student
-- (cartridge.ids sequences), first_answer, answer_len, stopped, empty
-- (bot A wrote no usable question), targets (a trainer.targets list held in
-- C: entries { position in student, token, logprob }), spans (the
-- supervised runs of student, { first, length } per turn), turns (per turn:
-- question, seed_name, answer, stopped, empty, sentence for focus) }.
-- question, prefix, answer and stopped are the first turn's; answer_len
-- counts every turn's supervised tokens.
--
-- With --turns K > 1 bot A writes K messages about the same chunk, each
-- from its own seed instruction and sampling seed, and bot B answers them in
-- order in one conversation: turn t's answer sees the chunk and turns 1..t-1.
-- The student is the whole exchange, every answer supervised.
function Interviews:group(keys)
    local convos = self:draw_group(keys)
    local t0 = self:ask(convos)
    local t1 = now()
    -- bot B: the answers, behind the same system block rows, turn by turn
    for _, conv in ipairs(convos) do
        conv.kv:truncate(#conv.sys_ids)
        conv.targets = trainer_mod.targets()
        conv.student, conv.spans, conv.answer_len = ids_mod.new(), {}, 0
    end
    for t = 1, self.turns do
        local streams_b = {}
        for i, conv in ipairs(convos) do streams_b[i] = self:b_stream(conv, t) end
        self:b_decode(convos, streams_b)
        self:b_collect(convos, streams_b, t)
    end
    local t2 = now()
    for _, conv in ipairs(convos) do
        conv.answer, conv.stopped = conv.turns[1].answer, conv.turns[1].stopped
        conv.first_answer = conv.spans[1][1]
        conv.kv:free()
        conv.kv = nil
    end
    if self.o.teacher_pass then self:teacher_pass(convos) end
    self.stats.time.a = self.stats.time.a + (t1 - t0)
    self.stats.time.b = self.stats.time.b + (t2 - t1)
    self.stats.conversations = self.stats.conversations + #convos
    return convos
end

-- Recomputes every conversation's targets with a teacher forward (chunk
-- system block + student sequence, no prefix) through the training path,
-- one conversation per pass: the training forward's head runs its rows in
-- chunks whose makeup would otherwise depend on the other conversations of
-- the group, and a conversation's targets must not (selfstudy.share).
function Interviews:teacher_pass(convos)
    local t0 = now()
    for _, conv in ipairs(convos) do
        local rows, at = {}, {}
        for _, span in ipairs(conv.spans) do
            for j = 0, span[2] - 1 do
                at[#at + 1] = span[1] + j
                rows[#rows + 1] = #conv.sys_ids + span[1] + j - 1
            end
        end
        local logits = self.o.trainer:logits(nil, { concat(conv.sys_ids, conv.student) }, rows)
        conv.targets = trainer_mod.targets()
        for k, pos in ipairs(at) do
            conv.targets:append_topk(pos, logits + (k - 1) * self.m.n_vocab, self.m.n_vocab, self.o.top_k, 0.99)
        end
    end
    self.stats.time.teacher = self.stats.time.teacher + (now() - t0)
end

-- The conversations of every step are split over the ranks in blocks: rank
-- r of size makes and trains conversations first..last (1-based; none when
-- last < first) of the step's accum.
function selfstudy.share(accum, rank, size)
    return math.floor(rank * accum / size) + 1, math.floor((rank + 1) * accum / size)
end

-- One optimizer step's gradient, the same bits for any number of ranks (and
-- alone): each conversation's gradient is computed by itself (a pass of its
-- own, sum reduction), and the conversations' gradients are added exactly,
-- over all ranks, by the reproducible sum (engine/dist.h), then scaled by 1
-- / (all target entries): the gradient of the step's mean loss.
local Stepper = {}
Stepper.__index = Stepper

-- tr: a trainer; cart: the cartridge; accum: conversations per step; dist:
-- cartridge.dist after init (nil: the job of one).
function selfstudy.stepper(tr, cart, accum, dist)
    dist = dist or require("cartridge.dist")
    local most = 0
    for r = 0, dist.size - 1 do
        local first, last = selfstudy.share(accum, r, dist.size)
        most = math.max(most, last - first + 1)
    end
    return setmetatable({ tr = tr, cart = cart, accum = accum, dist = dist, most = most,
        sum = dist.sum(cart:trainable_count(), math.max(most, 1)) }, Stepper)
end

-- convos: this rank's share of the step's conversations, in index order.
-- Leaves the step's gradient in the cartridge's buffers on every rank and
-- returns the step's loss (the mean over every target entry of every rank's
-- conversations, added in conversation order) and its supervised answer
-- tokens. Afterwards self.waited is the seconds the first collective took
-- (mostly waiting for the slowest rank) and self.summed the seconds of the
-- reproducible sum.
function Stepper:step(convos)
    local c, dist = self.cart, self.dist
    local mine = {}
    for j = 1, self.most do
        local cv = convos[j]
        if cv then
            c:zero_grad()
            local loss = self.tr:distill(c, { cv.student }, cv.targets, { backward = true, mean = false })
            C.cart_cartridge_grad_export(c.handle, self.sum:part(j - 1))
            mine[3 * j - 2], mine[3 * j - 1], mine[3 * j] = loss, cv.targets:count(), cv.answer_len
        else
            mine[3 * j - 2], mine[3 * j - 1], mine[3 * j] = 0, 0, 0
        end
    end
    local t0 = C.cart_now_seconds()
    local all = dist.allgather_doubles(mine)
    local waited = C.cart_now_seconds() - t0
    local loss, entries, tokens = 0, 0, 0
    for r = 0, dist.size - 1 do
        local first, last = selfstudy.share(self.accum, r, dist.size)
        for j = 1, last - first + 1 do
            loss = loss + all[r + 1][3 * j - 2]
            entries = entries + all[r + 1][3 * j - 1]
            tokens = tokens + all[r + 1][3 * j]
        end
    end
    local out = self.sum:part(0)
    t0 = C.cart_now_seconds()
    self.sum:reduce(#convos, entries > 0 and 1 / entries or 0, out)
    self.summed = C.cart_now_seconds() - t0
    self.waited = waited
    C.cart_cartridge_grad_import(c.handle, out)
    return entries > 0 and loss / entries or 0, tokens
end

function Stepper:free() self.sum:free() end

-- The held-out loss of a conversation behind the cartridge (no gradient).
function selfstudy.eval_loss(tr, cart, convo)
    return tr:distill(cart, { convo.student }, convo.targets, { backward = false })
end

return selfstudy
