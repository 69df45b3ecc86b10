-- cartridge.trainer: the distillation loss through a frozen model into a
-- cartridge's rows, and the packed teacher pass.
--
--   local trainer = require("cartridge.trainer")
--   local t = trainer.new(m, { recompute = false })
--   local loss = t:distill(c, segments, targets, { backward = true })
--   local logits = t:logits(nil, segments, rows)       -- the packed teacher pass (no prefix)
--
-- segments: a list of token-id lists packed into one pass (each at positions
-- p, p+1, ... behind the cartridge, seeing the prefix and itself only).
-- targets: a list of { position, token, logprob } where position is the index
-- of the predicted token in the concatenation of the segments (0-based).
-- distill options: mean (true: average over entries; false: sum), scale (1),
-- backward (false). Gradients are added into the cartridge's buffers.

local core = require("cartridge.core")
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

function Trainer:peak_bytes()
    return tonumber(C.cart_trainer_peak_bytes(self.handle))
end

local function pack(segments)
    local n_seg, total = #segments, 0
    for _, s in ipairs(segments) do total = total + #s end
    local tokens = ffi.new("int32_t[?]", math.max(total, 1))
    local lens = ffi.new("int64_t[?]", math.max(n_seg, 1))
    local at = 0
    for i, s in ipairs(segments) do
        lens[i - 1] = #s
        for j = 1, #s do tokens[at + j - 1] = s[j] end
        at = at + #s
    end
    return tokens, total, lens, n_seg
end
trainer.pack = pack

-- Packs a targets list into C arrays.
function trainer.pack_targets(targets)
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
    core.check(C.cart_trainer_distill(self.handle, c.handle, tokens, n, lens, n_seg, packed.tg,
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
