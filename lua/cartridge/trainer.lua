-- cartridge.trainer: the distillation loss through a frozen model into a
-- cartridge's rows, and the packed teacher pass.
--
--   local trainer = require("cartridge.trainer")
--   local t = trainer.new(m, { recompute = false })
--   local loss = t:distill(c, segments, targets, { backward = true })
--   local logits = t:logits(nil, segments, rows)       -- the packed teacher pass (no prefix)
--   local tg = trainer.targets()                       -- targets held in C
--   tg:append_topk(pos, logits, m.n_vocab, 20, 0.99)  -- one row's teacher entries at pos
--
-- segments: a list of token-id sequences (cartridge.ids or Lua lists) packed
-- into one pass (each at positions p, p+1, ... behind the cartridge, seeing
-- the prefix and itself only).
-- targets: a trainer.targets() list held in C, or a Lua list of { position,
-- token, logprob }; position is the index of the predicted token in the
-- concatenation of the segments (0-based).
-- distill options: mean (true: average over entries; false: sum), scale (1),
-- backward (false). Gradients are added into the cartridge's buffers.

local core = require("cartridge.core")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local trainer = {}

local Trainer = {}
Trainer.__index = Trainer

function trainer.new(m, opts)
    opts = opts or {}
    local o = ffi.new("cart_trainer_options")
    o.recompute = opts.recompute and 1 or 0
    return setmetatable({ handle = core.new("cart_trainer", C.cart_trainer_new, C.cart_trainer_free, "trainer.new", m.handle, o), model = m }, Trainer)
end

function Trainer:free()
    core.free(self, C.cart_trainer_free)
end

-- Attaches a parameter set (cartridge.params; nil detaches): backward passes
-- then also add the weights' gradients, and distill takes c = nil.
function Trainer:set_params(p)
    core.check(C.cart_trainer_set_params(self.handle, p and p.handle or nil), "trainer:set_params")
    self.params = p
end

function Trainer:peak_bytes()
    return tonumber(C.cart_trainer_peak_bytes(self.handle))
end

-- Segments (Lua lists or cartridge.ids sequences) into one int32 buffer.
local function pack(segments)
    local n_seg, total = #segments, 0
    for _, s in ipairs(segments) do total = total + #s end
    local tokens = ffi.new("int32_t[?]", math.max(total, 1))
    local lens = ffi.new("int64_t[?]", math.max(n_seg, 1))
    local at = 0
    for i, s in ipairs(segments) do
        local ptr, n = ids_mod.view(s)
        lens[i - 1] = n
        if n > 0 then ffi.copy(tokens + at, ptr, n * 4) end
        at = at + n
    end
    return tokens, total, lens, n_seg
end
trainer.pack = pack

-- A list of distillation targets held in C (engine/targets.h
-- cart_target_list): the decode appends each scored row's top-k entries, a
-- packed step appends whole lists at an offset, and distill reads it in place.
local Targets = {}
Targets.__index = Targets

function trainer.targets()
    return setmetatable({ handle = core.new("cart_target_list", C.cart_target_list_new, C.cart_target_list_free,
        "trainer.targets") }, Targets)
end

function Targets:count() return tonumber(C.cart_target_list_count(self.handle)) end

-- Appends one row's teacher entries (top-k, cut at `mass`) at `position`;
-- returns how many.
local got = ffi.new("int32_t[1]")
function Targets:append_topk(position, logits, n_vocab, k, mass)
    core.check(C.cart_target_list_append_topk(self.handle, position, logits, n_vocab, k, mass or 0.99, got),
        "targets:append_topk")
    return got[0]
end

-- Language-model targets: for i in [from, to) (0-based indices into the
-- sequence `ids`), the entry (offset + i, ids[i], logprob 0), i >= 1.
function Targets:append_labels(ids, from, to, offset)
    local ptr, n = ids_mod.view(ids)
    core.check(C.cart_target_list_append_labels(self.handle, ptr, n, from, to, offset or 0), "targets:append_labels")
end

function Targets:push(position, token, logprob)
    core.check(C.cart_target_list_push(self.handle, position, token, logprob), "targets:push")
end

-- Appends every entry of another list, positions shifted by offset.
function Targets:append(other, offset)
    core.check(C.cart_target_list_append(self.handle, other.handle, offset or 0), "targets:append")
end

function Targets:truncate(n) core.check(C.cart_target_list_truncate(self.handle, n), "targets:truncate") end

-- Entry i (0-based): position, token, logprob.
local e_pos, e_tok, e_lp = ffi.new("int64_t[1]"), ffi.new("int32_t[1]"), ffi.new("float[1]")
function Targets:get(i)
    core.check(C.cart_target_list_get(self.handle, i, e_pos, e_tok, e_lp), "targets:get")
    return tonumber(e_pos[0]), e_tok[0], e_lp[0]
end

-- The entries as a Lua list of { position, token, logprob }.
function Targets:list()
    local out = {}
    for i = 0, self:count() - 1 do out[i + 1] = { self:get(i) } end
    return out
end

function Targets:free() core.free(self, C.cart_target_list_free) end

-- The cart_distill_targets view distill reads: a C list in place, or a Lua
-- list of { position, token, logprob } packed into C arrays.
function trainer.pack_targets(targets)
    if getmetatable(targets) == Targets then
        local tg = ffi.new("cart_distill_targets")
        C.cart_target_list_view(targets.handle, tg)
        return { tg = tg, keep = targets }
    end
    local n = #targets
    local pos = ffi.new("int64_t[?]", math.max(n, 1))
    local tok = ffi.new("int32_t[?]", math.max(n, 1))
    local lp = ffi.new("float[?]", math.max(n, 1))
    for i, e in ipairs(targets) do
        pos[i - 1], tok[i - 1], lp[i - 1] = e[1], e[2], e[3]
    end
    local tg = ffi.new("cart_distill_targets")
    tg.position, tg.token, tg.logprob, tg.n = pos, tok, lp, n
    return { tg = tg, keep = { pos, tok, lp } }
end

function Trainer:distill(c, segments, targets, opts)
    opts = opts or {}
    local tokens, n, lens, n_seg = pack(segments)
    local packed = targets.tg and targets or trainer.pack_targets(targets)
    local loss = ffi.new("double[1]")
    core.check(C.cart_trainer_distill(self.handle, c and c.handle or nil, tokens, n, lens, n_seg, packed.tg,
        opts.mean == false and 0 or 1, opts.scale or 1.0, opts.backward and 1 or 0, loss), "trainer:distill")
    return loss[0]
end

-- Logits of the packed segments (behind c, or without a prefix when c is
-- nil) at the listed rows (0-based indices into the packed tokens). Returns a
-- float* [#rows, n_vocab] that the caller owns (a cdata array).
function Trainer:logits(c, segments, rows)
    local tokens, n, lens, n_seg = pack(segments)
    local nr = #rows
    local r = ffi.new("int64_t[?]", math.max(nr, 1))
    for i = 1, nr do r[i - 1] = rows[i] end
    local out = ffi.new("float[?]", math.max(nr, 1) * self.model.n_vocab)
    core.check(C.cart_trainer_logits(self.handle, c and c.handle or nil, tokens, n, lens, n_seg, r, nr, out),
        "trainer:logits")
    return out
end

-- Teacher targets from one row of logits: a list of { token, logprob }.
local ids_buf, lp_buf, n_buf = nil, nil, ffi.new("int32_t[1]")
function trainer.topk(logits, n_vocab, k, mass)
    if not ids_buf or ffi.sizeof(ids_buf) < k * 4 then
        ids_buf, lp_buf = ffi.new("int32_t[?]", k), ffi.new("float[?]", k)
    end
    core.check(C.cart_topk_targets(ids_buf, lp_buf, n_buf, logits, n_vocab, k, mass or 0.99), "trainer.topk")
    local out = {}
    for i = 0, n_buf[0] - 1 do out[i + 1] = { ids_buf[i], lp_buf[i] } end
    return out
end

return trainer
