-- cartridge.speculative: lossless greedy speculative decoding drafted from a
-- reference token sequence (the corpus), for serving and for bot B.
--
--   local speculative = require("cartridge.speculative")
--   local drafter = speculative.new(corpus_ids)           -- builds the suffix automaton once
--   local ids = drafter:decode(m, kv, prompt_ids, 192)     -- same ids as plain greedy
--   drafter.stats  -- { steps, drafted, accepted, forwards }
--
-- Each step feeds the last committed token plus up to 8 drafted ones through
-- one forward pass, commits the model's own argmax at every row while it
-- agrees with the draft, and truncates the cache to what was committed. The
-- output is the plain greedy output: the model decides every token. The draft
-- only decides how many tokens a pass commits.
--
-- An acceptance gate keeps a bad reference from costing time: after 16
-- drafted tokens, when fewer than 35% were accepted, drafting pauses until
-- 32 more tokens are emitted, then probes again.
--
-- Byte identity with plain greedy holds because a pass of at most 16 tokens
-- runs the same matmul kernels as a one-token step (engine/matmul.h): with 8
-- drafted tokens a pass has at most 9.

local core = require("cartridge.core")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local speculative = {}

speculative.MAX_DRAFT = 8
speculative.GATE_MIN_DRAFTED = 16
speculative.GATE_RATE = 0.35
speculative.PROBE_AFTER = 32

local Drafter = {}
Drafter.__index = Drafter

-- A drafter over a reference: a Lua list, a cartridge.ids sequence, or an
-- int32_t* with n.
function speculative.new(reference, n)
    local buf
    buf, n = ids_mod.view(reference, n)
    local t0 = C.cart_now_seconds()
    local self = setmetatable({
        sam = core.new("cart_sam", C.cart_sam_build, C.cart_sam_free, "speculative.new", buf, n),
        n = n,
        build_ms = (C.cart_now_seconds() - t0) * 1000,
        draft_buf = ffi.new("int32_t[?]", speculative.MAX_DRAFT),
        stats = { steps = 0, drafted = 0, accepted = 0, forwards = 0 },
    }, Drafter)
    return self
end

function Drafter:free()
    core.free(self, C.cart_sam_free, "sam")
end

-- A fresh per-stream state: cursor fed with `history`, gate counters.
function Drafter:stream(history)
    local cur = ffi.new("cart_sam_cursor")
    C.cart_sam_cursor_reset(cur)
    local st = { cursor = cur, drafted = 0, accepted = 0, emitted = 0, probe_at = 0 }
    if history and #history > 0 then self:observe(st, history) end
    return st
end

function Drafter:observe(st, ids)
    local buf, n = ids_mod.view(ids)
    C.cart_sam_feed(self.sam, st.cursor, buf, n)
end

-- Up to `max` drafted tokens for a stream (a Lua list), gate included.
function Drafter:propose(st, max)
    max = math.min(max, speculative.MAX_DRAFT)
    if max <= 0 then return {} end
    if st.drafted >= speculative.GATE_MIN_DRAFTED and st.accepted < speculative.GATE_RATE * st.drafted then
        if st.emitted < st.probe_at then return {} end
        st.drafted, st.accepted = 0, 0 -- probe again
        st.probe_at = st.emitted + speculative.PROBE_AFTER
    end
    local k = C.cart_sam_draft(self.sam, st.cursor, 1, self.draft_buf, max)
    local out = {}
    for i = 0, k - 1 do out[i + 1] = self.draft_buf[i] end
    return out
end

-- Greedy decoding of up to max_new tokens after prompt_ids into kv (which may
-- already hold a cartridge's rows), stopping at an end-of-generation token
-- (not included). Returns the generated ids.
function Drafter:decode(m, kv, prompt_ids, max_new)
    local tok = m:tokenizer()
    if kv:len() + #prompt_ids + max_new + speculative.MAX_DRAFT + 1 > kv:capacity() then
        error(("speculative: %d cached + %d prompt + %d new + %d draft rows exceed the cache of %d"):format(
            kv:len(), #prompt_ids, max_new, speculative.MAX_DRAFT + 1, kv:capacity()), 0)
    end
    local st = self:stream(prompt_ids)
    local logits = m:forward(kv, prompt_ids)
    self.stats.forwards = self.stats.forwards + 1
    local out = {}
    local carry = m:argmax(logits)
    if tok:is_eog(carry) or max_new <= 0 then return out end
    out[1] = carry
    st.emitted = 1
    self:observe(st, { carry })
    while #out < max_new do
        local draft = self:propose(st, max_new - #out)
        local span = { carry }
        for i = 1, #draft do span[#span + 1] = draft[i] end
        local before = kv:len()
        local rows = m:forward(kv, span, "all")
        self.stats.forwards = self.stats.forwards + 1
        self.stats.steps = self.stats.steps + 1
        local committed, accepted, stop = {}, 0, false
        for i = 0, #span - 1 do
            local id = m:argmax(rows, i)
            if tok:is_eog(id) then
                stop = true
                break
            end
            committed[#committed + 1] = id
            if #out + #committed >= max_new then break end
            if i < #draft and id == draft[i + 1] then accepted = accepted + 1 else break end
        end
        -- the cache keeps the carry and the accepted drafts
        kv:truncate(before + 1 + accepted)
        st.drafted = st.drafted + #draft
        st.accepted = st.accepted + accepted
        self.stats.drafted = self.stats.drafted + #draft
        self.stats.accepted = self.stats.accepted + accepted
        for _, id in ipairs(committed) do out[#out + 1] = id end
        st.emitted = #out
        if #committed > 0 then self:observe(st, committed) end
        if stop or #committed == 0 then break end
        carry = committed[#committed]
    end
    return out
end

-- Lockstep greedy speculative decoding of several streams in one forward
-- pass per step. streams: list of { kv, ids (the prompt continuation to
-- prefill), max, drafter (each stream its own), on_row = function(stream,
-- logits_row, id) (optional: called for every committed position, the stop
-- row included) }. Fills stream.out (a cartridge.ids sequence) and
-- stream.stopped. With several streams
-- a pass can exceed 16 tokens, where the matmul kernels differ from the
-- one-token ones in the last bits: on a near-tie such a stream may pick
-- another token than a plain batched decode would (a single stream never).
function speculative.decode_batch(m, streams)
    local tok = m:tokenizer()
    local kvs, prompts = {}, {}
    for i, st in ipairs(streams) do
        kvs[i], prompts[i] = st.kv, st.ids
        st.out, st.stopped = ids_mod.new(st.max), false
        st.state = st.drafter:stream(st.ids)
    end
    local logits = m:forward_batch(kvs, prompts, "last")
    local active = {}
    for i, st in ipairs(streams) do
        local row = logits + (i - 1) * m.n_vocab
        local id = m:argmax(row)
        if st.on_row then st.on_row(st, row, id) end
        if tok:is_eog(id) then
            st.stopped = true
        elseif st.max > 0 then
            st.out:push(id)
            st.carry = id
            st.state.emitted = 1
            st.drafter:observe(st.state, { id })
            if st.max > 1 then active[#active + 1] = st end
        end
    end
    while #active > 0 do
        local step_kvs, spans, drafts, before = {}, {}, {}, {}
        for i, st in ipairs(active) do
            drafts[i] = st.drafter:propose(st.state, st.max - #st.out)
            local span = { st.carry }
            for _, d in ipairs(drafts[i]) do span[#span + 1] = d end
            step_kvs[i], spans[i], before[i] = st.kv, span, st.kv:len()
        end
        local rows = m:forward_batch(step_kvs, spans, "all")
        local base, still = 0, {}
        for i, st in ipairs(active) do
            local draft, committed, accepted, stop = drafts[i], {}, 0, false
            for r = 0, #spans[i] - 1 do
                local row = rows + (base + r) * m.n_vocab
                local id = m:argmax(row)
                if st.on_row then st.on_row(st, row, id) end
                if tok:is_eog(id) then
                    stop = true
                    break
                end
                committed[#committed + 1] = id
                if #st.out + #committed >= st.max then break end
                if r < #draft and id == draft[r + 1] then accepted = accepted + 1 else break end
            end
            base = base + #spans[i]
            st.kv:truncate(before[i] + 1 + accepted)
            st.state.drafted = st.state.drafted + #draft
            st.state.accepted = st.state.accepted + accepted
            st.drafter.stats.drafted = st.drafter.stats.drafted + #draft
            st.drafter.stats.accepted = st.drafter.stats.accepted + accepted
            st.out:extend(committed)
            st.state.emitted = #st.out
            if #committed > 0 then st.drafter:observe(st.state, committed) end
            if stop then st.stopped = true end
            if not stop and #committed > 0 and #st.out < st.max then
                st.carry = committed[#committed]
                still[#still + 1] = st
            end
        end
        active = still
    end
end

-- The drafter serve mode uses: the artifact's draft_reference, else the
-- corpus ids; with neither, a clear error. Returns the drafter and the label
-- printed after "KV rows".
function speculative.for_serving(artifact_path, corpus, m)
    local _, info = require("cartridge.cart").load(artifact_path, m)
    local ref, source = info.draft_reference, "embedded corpus"
    if not ref then
        if not corpus then
            error("MissingDraftReference: --spec-serve drafts from the corpus, but " .. artifact_path ..
                " has no draft_reference (train with --draft-ref) and no --corpus was given", 0)
        end
        ref, source = corpus.ids, "--corpus"
    end
    local d = speculative.new(ref)
    print(("draft automaton over %d %s tokens built in %.0f ms"):format(#ref, source, d.build_ms))
    return d, ", corpus-drafted"
end

return speculative
