-- forward.lua: an independent, slow, obviously-correct forward pass for the
-- GGUF models the engine runs (architectures "qwen3" and "llama"), in plain
-- LuaJIT and float64 throughout. Tests compare the engine against it; it
-- shares no code with the engine (its GGUF reader is tests/reference/
-- gguf_reader.lua).
--
--   local ref = require("reference.forward")
--   local model = ref.load("/path/model.gguf", { f16_round = true })
--   local logits = model:logits({ 1, 403, 407 })  -- logits[i][id], see below
--
-- Everything is computed one position at a time against a growing K/V cache,
-- which is the same function as one causal pass over the whole sequence.
--
-- Buffers are FFI `double[?]` arrays, 0-based, row-major. Shapes are given
-- in comments as (rows, cols). Layers are numbered 1..n_layer in Lua tables
-- (layer l is the GGUF's blk.(l-1)). Token ids are 0-based, as in the GGUF.
--
-- Prefix ("cartridge") rows: forward() accepts per-layer K/V rows that sit
-- in the cache before the real tokens. Prefix K rows are taken as they are
-- (already RMS-normed where the architecture norms keys, already rotated
-- for their positions 0..p-1); the real tokens then occupy positions
-- p..p+n-1, and every query attends all p prefix rows plus the real tokens
-- up to itself. `capture = true` returns each layer's K/V rows in exactly
-- this layout, so the K/V of a plain forward of tokens[1..p] can be fed back
-- as a prefix.

local ffi = require("ffi")
local gguf = require("reference.gguf_reader")

local round_f16, round_f32 = gguf.round_f16, gguf.round_f32
local sqrt, exp, cos, sin, floor = math.sqrt, math.exp, math.cos, math.sin, math.floor

local M = {}

local darr = ffi.typeof("double[?]")

-- Kernels -------------------------------------------------------------------
-- Outputs first, inputs after, dims last, as in llm.c. All buffers double.

-- out (rows) = W (rows, cols) @ x (cols).
local function matvec_forward(out, w, x, rows, cols)
    for r = 0, rows - 1 do
        local base = r * cols
        local s = 0.0
        for c = 0, cols - 1 do s = s + w[base + c] * x[c] end
        out[r] = s
    end
end

-- out (n) = x (n) / sqrt(mean(x^2) + eps) * weight (n). The vectors start at
-- element offsets xo / oo / wo so one call can norm a single head in place.
local function rmsnorm_forward(out, oo, x, xo, weight, n, eps)
    local ss = 0.0
    for i = 0, n - 1 do ss = ss + x[xo + i] * x[xo + i] end
    local inv = 1.0 / sqrt(ss / n + eps)
    for i = 0, n - 1 do out[oo + i] = x[xo + i] * inv * weight[i] end
end

-- Rotates one head vector x[xo .. xo+head_dim) in place for position pos.
-- Only the first n_rot dims rotate; the rest pass through. Frequency of pair
-- i is base^(-2i/n_rot).
--   neox = true  (qwen3): pairs (i, i + n_rot/2)
--   neox = false (llama.cpp "normal", llama): pairs (2i, 2i+1)
local function rope_forward(x, xo, pos, n_rot, base, neox)
    local half = n_rot / 2
    for i = 0, half - 1 do
        local theta = pos * base ^ (-2 * i / n_rot)
        local c, s = cos(theta), sin(theta)
        local a, b
        if neox then a, b = xo + i, xo + i + half
        else a, b = xo + 2 * i, xo + 2 * i + 1 end
        local x0, x1 = x[a], x[b]
        x[a] = x0 * c - x1 * s
        x[b] = x0 * s + x1 * c
    end
end

-- out (n_head*head_dim) = causal softmax attention of q (n_head*head_dim)
-- over kcache/vcache rows 0..n_ctx-1, each row (n_head_kv*head_dim). Query
-- head h reads kv head floor(h / (n_head / n_head_kv)). att (n_ctx) is
-- scratch.
local function attention_forward(out, att, q, kcache, vcache, n_ctx,
                                 n_head, n_head_kv, head_dim, scale)
    local group = n_head / n_head_kv
    local kv_dim = n_head_kv * head_dim
    for h = 0, n_head - 1 do
        local qo = h * head_dim
        local ko = floor(h / group) * head_dim
        local mx = -math.huge
        for t = 0, n_ctx - 1 do
            local kb = t * kv_dim + ko
            local s = 0.0
            for d = 0, head_dim - 1 do s = s + q[qo + d] * kcache[kb + d] end
            s = s * scale
            att[t] = s
            if s > mx then mx = s end
        end
        local sum = 0.0
        for t = 0, n_ctx - 1 do
            local e = exp(att[t] - mx)
            att[t] = e
            sum = sum + e
        end
        for d = 0, head_dim - 1 do out[qo + d] = 0.0 end
        for t = 0, n_ctx - 1 do
            local wt = att[t] / sum
            local vb = t * kv_dim + ko
            for d = 0, head_dim - 1 do out[qo + d] = out[qo + d] + wt * vcache[vb + d] end
        end
    end
end

-- out (n) = round(x (n)) to the nearest f32 and then f16, as ggml converts
-- the f32 activations before a product with an F16 weight matrix.
local function round_f16_forward(out, x, n)
    for i = 0, n - 1 do out[i] = round_f16(round_f32(x[i])) end
end

M.matvec_forward = matvec_forward
M.rmsnorm_forward = rmsnorm_forward
M.rope_forward = rope_forward
M.attention_forward = attention_forward

-- Loading -------------------------------------------------------------------

local Model = {}
Model.__index = Model

local function need_key(r, key)
    local v = r:get(key)
    if v == nil then
        error(("reference.forward: %s: missing metadata %s"):format(r.path, key), 0)
    end
    return v
end

-- Reads a weight and checks its GGUF shape ne = {cols, rows} (or {n} for a
-- vector). Returns the double array and whether the file stored it as F16.
local function weight(r, name, ne0, ne1)
    local info = r:info(name)
    if not info then
        error(("reference.forward: %s: missing tensor %s"):format(r.path, name), 0)
    end
    local ok = info.ne[1] == ne0 and (ne1 == nil and #info.ne == 1
        or (#info.ne == 2 and info.ne[2] == ne1))
    if not ok then
        error(("reference.forward: %s: tensor %s has ne {%s}, expected {%s}"):format(
            r.path, name, table.concat(info.ne, ", "),
            ne1 and (ne0 .. ", " .. ne1) or tostring(ne0)), 0)
    end
    local data = r:tensor(name)
    return data, info.type == gguf.GGML_F16
end

-- Loads a qwen3 or llama GGUF with F32/F16 weights into float64 arrays.
-- opts.f16_round (default false): before every matrix product with a weight
-- stored as F16, round the input vector to f16 as ggml's CPU backend does
-- (README "Tolerances"); products with F32 weights are left alone.
-- Returns a model; raises "reference.forward: ..." or "gguf_reader: ..." on
-- a file it cannot run.
function M.load(path, opts)
    opts = opts or {}
    local r = gguf.open(path)
    local arch = need_key(r, "general.architecture")
    if arch ~= "qwen3" and arch ~= "llama" then
        error(("reference.forward: %s: architecture %q, expected qwen3 or llama"):format(
            path, tostring(arch)), 0)
    end
    local function hp(key, default)
        local v = r:get(arch .. "." .. key, default)
        if v == nil then need_key(r, arch .. "." .. key) end
        return v
    end

    local m = setmetatable({ path = path, arch = arch, f16_round = opts.f16_round and true or false }, Model)
    m.n_layer = hp("block_count")
    m.n_embd = hp("embedding_length")
    m.n_ff = hp("feed_forward_length")
    m.n_head = hp("attention.head_count")
    m.n_head_kv = hp("attention.head_count_kv", m.n_head)
    -- The eps is stored as f32 in the file; using that exact value is what
    -- llama.cpp does (1e-5 becomes 9.9999997e-6).
    m.eps = hp("attention.layer_norm_rms_epsilon")
    m.rope_base = hp("rope.freq_base", 10000.0)
    m.head_dim = hp("attention.key_length", m.n_embd / m.n_head)
    m.head_dim_v = hp("attention.value_length", m.head_dim)
    m.n_rot = hp("rope.dimension_count", m.head_dim)
    m.neox = arch == "qwen3" -- llama.cpp: LLAMA_ROPE_TYPE_NEOX for qwen3, NORM for llama
    m.qk_norm = arch == "qwen3"
    m.bos_id = r:get("tokenizer.ggml.bos_token_id")
    if m.head_dim_v ~= m.head_dim then
        error(("reference.forward: %s: value_length %d ~= key_length %d is not supported"):format(
            path, m.head_dim_v, m.head_dim), 0)
    end
    if m.n_head % m.n_head_kv ~= 0 or m.n_rot % 2 ~= 0 or m.n_rot > m.head_dim then
        error(("reference.forward: %s: bad head layout (n_head %d, n_head_kv %d, n_rot %d, head_dim %d)"):format(
            path, m.n_head, m.n_head_kv, m.n_rot, m.head_dim), 0)
    end

    local E, D = m.n_embd, m.head_dim
    local q_dim, kv_dim = m.n_head * D, m.n_head_kv * D
    local emb_info = r:info("token_embd.weight")
    if not emb_info then error(("reference.forward: %s: missing tensor token_embd.weight"):format(path), 0) end
    m.n_vocab = emb_info.ne[2]
    m.tok_embd, m.tok_embd_f16 = weight(r, "token_embd.weight", E, m.n_vocab) -- (n_vocab, n_embd)
    m.output_norm = weight(r, "output_norm.weight", E)                         -- (n_embd)
    if r:info("output.weight") then
        m.output, m.output_f16 = weight(r, "output.weight", E, m.n_vocab)      -- (n_vocab, n_embd)
        m.tied = false
    else
        m.output, m.output_f16 = m.tok_embd, m.tok_embd_f16
        m.tied = true
    end

    m.layers = {}
    for l = 1, m.n_layer do
        local p = ("blk.%d."):format(l - 1)
        local L = {}
        L.attn_norm = weight(r, p .. "attn_norm.weight", E)           -- (n_embd)
        L.wq, L.wq_f16 = weight(r, p .. "attn_q.weight", E, q_dim)     -- (q_dim, n_embd)
        L.wk, L.wk_f16 = weight(r, p .. "attn_k.weight", E, kv_dim)    -- (kv_dim, n_embd)
        L.wv, L.wv_f16 = weight(r, p .. "attn_v.weight", E, kv_dim)    -- (kv_dim, n_embd)
        L.wo, L.wo_f16 = weight(r, p .. "attn_output.weight", q_dim, E) -- (n_embd, q_dim)
        if m.qk_norm then
            L.q_norm = weight(r, p .. "attn_q_norm.weight", D)         -- (head_dim)
            L.k_norm = weight(r, p .. "attn_k_norm.weight", D)         -- (head_dim)
        end
        L.ffn_norm = weight(r, p .. "ffn_norm.weight", E)             -- (n_embd)
        L.w_gate, L.w_gate_f16 = weight(r, p .. "ffn_gate.weight", E, m.n_ff) -- (n_ff, n_embd)
        L.w_up, L.w_up_f16 = weight(r, p .. "ffn_up.weight", E, m.n_ff)       -- (n_ff, n_embd)
        L.w_down, L.w_down_f16 = weight(r, p .. "ffn_down.weight", m.n_ff, E) -- (n_embd, n_ff)
        m.layers[l] = L
    end
    r:close()
    return m
end

-- Forward -------------------------------------------------------------------

-- Runs the causal forward pass over `tokens` (a Lua array of 0-based ids).
-- opts (all optional):
--   prefix = { n = p, k = { [l] = double[p * kv_dim] }, v = { ... } }:
--       p cartridge rows per layer, (p, n_head_kv * head_dim) row-major,
--       keys already normed/rotated for positions 0..p-1. The arrays are
--       copied, not modified.
--   logits = "all" (default) | "last" | "none" | { [i] = true, ... }:
--       which token indices (1-based into tokens) get a logits row.
--   capture = true: also return the K/V rows of the real tokens.
--   f16_round = bool: overrides the model's setting for this call.
-- Returns a table:
--   logits[i]  double[n_vocab] for each requested token index i (else nil)
--   k[l], v[l] (capture only) double[n * kv_dim], rows for positions
--              p..p+n-1, in the same layout as prefix.k / prefix.v
--   n_prefix   p
function Model:forward(tokens, opts)
    opts = opts or {}
    local E, D, F = self.n_embd, self.head_dim, self.n_ff
    local H, HKV, V = self.n_head, self.n_head_kv, self.n_vocab
    local q_dim, kv_dim = H * D, HKV * D
    local eps = self.eps
    local n = #tokens
    local prefix = opts.prefix
    local p = prefix and prefix.n or 0
    local n_ctx_max = p + n
    local f16r = self.f16_round
    if opts.f16_round ~= nil then f16r = opts.f16_round end

    local want = opts.logits or "all"
    local function wants(i)
        if want == "all" then return true end
        if want == "last" then return i == n end
        if want == "none" then return false end
        return want[i] == true
    end

    -- K/V cache per layer: (p + n, kv_dim); rows 0..p-1 are the prefix.
    local kcache, vcache = {}, {}
    for l = 1, self.n_layer do
        kcache[l] = darr(n_ctx_max * kv_dim)
        vcache[l] = darr(n_ctx_max * kv_dim)
        if p > 0 then
            local pk, pv = prefix.k and prefix.k[l], prefix.v and prefix.v[l]
            if not pk or not pv then
                error(("reference.forward: prefix.k/v[%d] missing (prefix.n = %d)"):format(l, p), 2)
            end
            ffi.copy(kcache[l], pk, p * kv_dim * 8)
            ffi.copy(vcache[l], pv, p * kv_dim * 8)
        end
    end

    -- Per-position scratch.
    local x = darr(E)            -- residual stream
    local xn = darr(E)           -- normed input of a block
    local xin = darr(math.max(E, q_dim, F)) -- matmul input (xn, or xn rounded to f16)
    local q = darr(q_dim)
    local k = darr(kv_dim)
    local v = darr(kv_dim)
    local att_out = darr(q_dim)
    local att = darr(n_ctx_max)
    local proj = darr(E)
    local gate = darr(F)
    local up = darr(F)
    local hid = darr(F)
    local scale = 1.0 / sqrt(D)

    -- The matmul input: x itself, or a rounded copy when the weight is F16.
    local function input(src, nn, is_f16)
        if f16r and is_f16 then
            round_f16_forward(xin, src, nn)
            return xin
        end
        return src
    end

    local result = { logits = {}, n_prefix = p }
    for i = 1, n do
        local tok = tokens[i]
        if type(tok) ~= "number" or tok < 0 or tok >= V or tok % 1 ~= 0 then
            error(("reference.forward: token %d is %s, expected an id in [0, %d)"):format(
                i, tostring(tok), V), 2)
        end
        local pos = p + i - 1
        ffi.copy(x, self.tok_embd + tok * E, E * 8)

        for l = 1, self.n_layer do
            local L = self.layers[l]
            -- attention
            rmsnorm_forward(xn, 0, x, 0, L.attn_norm, E, eps)
            matvec_forward(q, L.wq, input(xn, E, L.wq_f16), q_dim, E)
            matvec_forward(k, L.wk, input(xn, E, L.wk_f16), kv_dim, E)
            matvec_forward(v, L.wv, input(xn, E, L.wv_f16), kv_dim, E)
            if self.qk_norm then
                for h = 0, H - 1 do rmsnorm_forward(q, h * D, q, h * D, L.q_norm, D, eps) end
                for h = 0, HKV - 1 do rmsnorm_forward(k, h * D, k, h * D, L.k_norm, D, eps) end
            end
            for h = 0, H - 1 do rope_forward(q, h * D, pos, self.n_rot, self.rope_base, self.neox) end
            for h = 0, HKV - 1 do rope_forward(k, h * D, pos, self.n_rot, self.rope_base, self.neox) end
            ffi.copy(kcache[l] + pos * kv_dim, k, kv_dim * 8)
            ffi.copy(vcache[l] + pos * kv_dim, v, kv_dim * 8)
            attention_forward(att_out, att, q, kcache[l], vcache[l], pos + 1, H, HKV, D, scale)
            matvec_forward(proj, L.wo, input(att_out, q_dim, L.wo_f16), E, q_dim)
            for j = 0, E - 1 do x[j] = x[j] + proj[j] end
            -- feed-forward (SwiGLU)
            rmsnorm_forward(xn, 0, x, 0, L.ffn_norm, E, eps)
            matvec_forward(gate, L.w_gate, input(xn, E, L.w_gate_f16), F, E)
            matvec_forward(up, L.w_up, input(xn, E, L.w_up_f16), F, E)
            for j = 0, F - 1 do
                local g = gate[j]
                hid[j] = g / (1.0 + exp(-g)) * up[j]
            end
            matvec_forward(proj, L.w_down, input(hid, F, L.w_down_f16), E, F)
            for j = 0, E - 1 do x[j] = x[j] + proj[j] end
        end

        if wants(i) then
            rmsnorm_forward(xn, 0, x, 0, self.output_norm, E, eps)
            local out = darr(V)
            matvec_forward(out, self.output, input(xn, E, self.output_f16), V, E)
            result.logits[i] = out
        end
    end

    if opts.capture then
        result.k, result.v = {}, {}
        for l = 1, self.n_layer do
            local kk, vv = darr(n * kv_dim), darr(n * kv_dim)
            ffi.copy(kk, kcache[l] + p * kv_dim, n * kv_dim * 8)
            ffi.copy(vv, vcache[l] + p * kv_dim, n * kv_dim * 8)
            result.k[l], result.v[l] = kk, vv
        end
    end
    return result
end

-- Per-position logits of a plain causal forward from position 0:
-- returns a Lua array whose element i is double[n_vocab] (0-based by token
-- id) for tokens[1..i]. opts as for forward().
function Model:logits(tokens, opts)
    return self:forward(tokens, opts).logits
end

-- Size of one K (or V) row of one layer: n_head_kv * head_dim.
function Model:kv_dim()
    return self.n_head_kv * self.head_dim
end

-- Copies a double[n] into a 1-based Lua table (for printing, JSON, tests).
function M.to_table(arr, n)
    local t = {}
    for i = 0, n - 1 do t[i + 1] = arr[i] end
    return t
end

-- Greedy argmax of a double[n] logits row, ties to the lowest id (llama.cpp's
-- greedy sampler scans ids in order with a strict >). Returns id, logit.
function M.argmax(row, n)
    local best, bi = row[0], 0
    for i = 1, n - 1 do
        if row[i] > best then best, bi = row[i], i end
    end
    return bi, best
end

-- log(sum(exp(row))) of a double[n], computed stably.
function M.logsumexp(row, n)
    local mx = -math.huge
    for i = 0, n - 1 do if row[i] > mx then mx = row[i] end end
    local s = 0.0
    for i = 0, n - 1 do s = s + exp(row[i] - mx) end
    return mx + math.log(s)
end

return M
