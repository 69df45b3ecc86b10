-- cartridge.compact: a cartridge built in seconds, without training, by
-- compacting the model's own cache of the corpus (engine/compact.h).
--
--   local compact = require("cartridge.compact")
--   local c = cart.new(m, p, 1)
--   local info = compact.fill(m, c, all_ids, ref_ids, "match")   -- or "evict"
--
-- all_ids: the whole corpus as the cartridge's context (the system block
-- selfstudy.init_ids returns as its second value), n tokens, n > p.
-- ref_ids: the tokens whose queries stand for the questions to come, run
-- right after it; compact.reread_ids gives the ones the recipes use: the
-- model reading the corpus again, as a user turn after the system block
-- (the "repeat" queries of attention matching). Every query head of a KV
-- head's group counts.
--
-- Per layer and KV head, the first c.frozen rows are kept (the sink) and
-- then the rows the reference queries attend to most:
--   "evict": with their own values (SnapKV/H2O-style eviction);
--   "match": with values fitted by least squares so that the queries'
--            attention outputs over the p rows match those over all n
--            (attention matching, Zweiger et al.).
-- Each KV head keeps its own rows. The kept keys are then moved along RoPE
-- by p - n positions, as if the corpus had ended at row p: a question at
-- position p + t sees each kept key at the distance the reference query at
-- n + t saw it (cart_model_rope_shift).
--
-- Returns { seconds, error = mean relative output error over heads }.

local core = require("cartridge.core")
local ffi, C = core.ffi, core.C
local ids_mod = require("cartridge.ids")

local compact = {}
compact.METHODS = { evict = 0, match = 1 }

-- The reference tokens the recipes use: a user turn holding the corpus
-- text again, with the assistant's opener after it.
function compact.reread_ids(tok, template, corpus_text)
    return tok:encode_ids(template.user_open .. corpus_text .. template.close .. template.opener(false),
        { special = true })
end

local function to_buffer(list, extra)
    local n = #list + #extra
    local buf = ffi.new("int32_t[?]", n)
    for i = 1, #list do buf[i - 1] = list[i] end
    for i = 1, #extra do buf[#list + i - 1] = extra[i] end
    return buf, n
end

-- Each layer's queries of the reference tokens (one pass over all_ids ..
-- ref_ids), and the f32 cache holding the corpus's keys and values.
local function queries(m, all_ids, ref_ids)
    local buf, total = to_buffer(all_ids, ref_ids)
    local n, nr = #all_ids, #ref_ids
    local kv = m:new_kv(total, "f32")
    local rows = ffi.new("int64_t[?]", nr)
    for j = 0, nr - 1 do rows[j] = n + j end
    local q = ffi.new("float[?]", tonumber(C.cart_model_query_floats(m.handle, nr)))
    local counts = ffi.new("int64_t[1]", total)
    local kvs = ffi.new("cart_kv*[1]", kv.handle)
    core.check(C.cart_model_forward_queries(m.handle, kvs, 1, buf, counts, rows, nr, q), "compact")
    return q, kv
end

local function list(ids)
    if ids_mod.is(ids) then
        local out = {}
        for i = 1, #ids do out[i] = ids.data[i - 1] end
        return out
    end
    return ids
end

function compact.fill(m, c, all_ids, ref_ids, method, opts)
    opts = opts or {}
    local fit = compact.METHODS[method]
    if not fit then error(("compact: method %s is not evict or match"):format(tostring(method)), 0) end
    all_ids, ref_ids = list(all_ids), list(ref_ids)
    local n, p = #all_ids, c.p
    if n <= p then error(("compact: the corpus is %d tokens, not more than p = %d: capture it whole"):format(n, p), 0) end
    if #ref_ids < 1 then error("compact: no reference tokens", 0) end
    local t0 = C.cart_now_seconds()
    local q, kv = queries(m, all_ids, ref_ids)
    local o = ffi.new("cart_compact_options", { p = p, keep_first = c.frozen, fit_values = fit,
        ridge = opts.ridge or 1e-3 })
    local idx, err, err_sum, heads = ffi.new("int64_t[?]", p), ffi.new("double[1]"), 0, 0
    local q_at = 0
    for l = 0, #m.layers - 1 do
        local g = m.layers[l + 1]
        local D, KV, H = g.head_dim, g.n_head_kv, g.n_head
        local KD, HD, rep = KV * D, H * D, H / KV
        local k, v = ffi.new("float[?]", n * KD), ffi.new("float[?]", n * KD)
        core.check(C.cart_kv_read(kv.handle, l, 0, n, k, v), "compact")
        local ck, cv = c:rows(l, 0), c:rows(l, 1)
        for h = 0, KV - 1 do
            core.check(C.cart_compact_head(q + q_at + h * rep * D, #ref_ids, rep, HD, k + h * D, v + h * D, n, KD, D,
                g.attn_scale, o, idx, cv + h * D, KD, err), "compact")
            for r = 0, p - 1 do ffi.copy(ck + r * KD + h * D, k + tonumber(idx[r]) * KD + h * D, D * 4) end
            err_sum, heads = err_sum + err[0], heads + 1
        end
        if opts.shift ~= false then core.check(C.cart_model_rope_shift(m.handle, l, ck, p, KD, p - n), "compact") end
        q_at = q_at + #ref_ids * HD
    end
    kv:free()
    return { seconds = C.cart_now_seconds() - t0, error = err_sum / heads }
end

return compact
