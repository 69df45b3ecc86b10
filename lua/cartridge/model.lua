-- cartridge.model: a GGUF transformer, its KV caches and its forward pass.
--
--   local model = require("cartridge.model")
--   local m = model.load("model.gguf", { widen = false })
--   local kv = m:new_kv(512)                       -- f16 cache of 512 rows ("f32" as 2nd arg)
--   local logits = m:forward(kv, { 1, 403, 407 })  -- float* of the last token's logits
--   local next_id = m:argmax(logits)
--   m:forward(kv, { next_id })                     -- decode one more
--   kv:free(); m:free()
--
-- Ids in Lua lists are token ids as the model knows them (0-based), stored in
-- 1-based Lua lists. Logits come back as a float* into a buffer the model
-- reuses: copy what you need before the next forward call.

local core = require("cartridge.core")
local gguf = require("cartridge.gguf")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local model = {}

local Model = {}
Model.__index = Model

local KV = {}
KV.__index = KV

-- The architecture's name as the engine spells it (cart_arch_name, engine/model.h).
local function arch_name(arch)
    local name = C.cart_arch_name(arch)
    return name ~= nil and ffi.string(name) or tostring(arch)
end

local function config_table(c)
    return {
        arch = arch_name(c.arch),
        n_layer = c.n_layer,
        n_embd = c.n_embd,
        n_ff = c.n_ff,
        n_head = c.n_head,
        n_head_kv = c.n_head_kv,
        head_dim = c.head_dim,
        n_rot = c.n_rot,
        n_vocab = c.n_vocab,
        n_ctx_train = c.n_ctx_train,
        rope_neox = c.rope_neox ~= 0,
        qk_norm = c.qk_norm ~= 0,
        tied_output = c.tied_output ~= 0,
        rms_eps = c.rms_eps,
        rope_theta = c.rope_theta,
        -- gemma4 (0 / false otherwise)
        n_swa = c.n_swa,
        n_expert = c.n_expert,
        n_expert_used = c.n_expert_used,
        n_ff_exp = c.n_ff_exp,
        n_embd_per_layer = c.n_embd_per_layer,
        uniform_kv = c.uniform_kv ~= 0,
        final_softcap = c.final_softcap,
        embd_scale = c.embd_scale,
    }
end

-- Every layer's own geometry: a list (layer 0 first) of { n_head, n_head_kv,
-- head_dim, n_rot, n_ff, window (0: full attention), moe, rope_theta,
-- attn_scale }. gemma4's sliding and full layers differ.
local function layer_tables(handle, n_layer)
    local out, g = {}, ffi.new("cart_layer_config")
    for l = 0, n_layer - 1 do
        core.check(C.cart_model_layer(handle, l, g), "model.load")
        out[l + 1] = { n_head = g.n_head, n_head_kv = g.n_head_kv, head_dim = g.head_dim, n_rot = g.n_rot,
            n_ff = g.n_ff, window = g.window, moe = g.moe ~= 0, rope_theta = g.rope_theta, attn_scale = g.attn_scale }
    end
    return out
end

-- Loads a model. opts.widen = true keeps f32 copies of all matrices;
-- opts.no_repack = true multiplies block-type matrices from the file's rows
-- (the same bits, slower) instead of the copies repacked at load.
function model.load(path, opts)
    opts = opts or {}
    local o = ffi.new("cart_model_options")
    o.widen_f32 = opts.widen and 1 or 0
    o.no_repack = opts.no_repack and 1 or 0
    local handle = core.new("cart_model", C.cart_model_load, C.cart_model_free, "model.load", path, o)
    local self = setmetatable({
        handle = handle,
        path = path,
        config = config_table(C.cart_model_get_config(handle)),
        weight_bytes = core.int(C.cart_model_weight_bytes(handle)),
        widened_bytes = core.int(C.cart_model_widened_bytes(handle)),
        packed_bytes = core.int(C.cart_model_packed_bytes(handle)),
        repack_seconds = C.cart_model_repack_seconds(handle),
    }, Model)
    self.n_vocab = self.config.n_vocab
    self.layers = layer_tables(handle, self.config.n_layer)
    self.file = gguf.borrow(C.cart_model_gguf(handle), self, path)
    return self
end

-- The line recipes print first: "model: PATH (4 layers, hidden 256,
-- kv_heads 2, head_dim 64)", or with the architecture and each layer's
-- geometry and window when they differ.
function Model:describe()
    return ("model: %s (%s)"):format(self.path, self:geometry_text())
end

-- The model's layers, hidden size and KV geometry as describe() shows them.
function Model:geometry_text()
    local c = self.config
    if c.uniform_kv then
        return ("%d layers, hidden %d, kv_heads %d, head_dim %d"):format(c.n_layer, c.n_embd, c.n_head_kv, c.head_dim)
    end
    local kinds = {}
    for i, g in ipairs(self.layers) do
        kinds[i] = ("%dx%d %s"):format(g.n_head_kv, g.head_dim, g.window > 0 and ("window " .. g.window) or "full")
    end
    return ("%s, %d layers, hidden %d; KV heads x head_dim per layer: %s"):format(c.arch, c.n_layer, c.n_embd,
        table.concat(kinds, ", "))
end

-- A hash of every weight byte, and of the config and tensor table, as 16
-- hex digits (cart_model_content_hash: one parallel read of the weights),
-- and the seconds it took. Computed once per loaded model (the weights are
-- a read-only mapping); later calls return it at once, with 0 seconds.
function Model:content_hash()
    if self._content_hash then return self._content_hash, 0 end
    local v = ffi.new("uint64_t[1]")
    local t0 = C.cart_now_seconds()
    core.check(C.cart_model_content_hash(self.handle, v), "model:content_hash")
    self._content_hash = core.hex64(v[0])
    return self._content_hash, C.cart_now_seconds() - t0
end

function Model:free()
    if self.file then self.file:close() end
    core.free(self, C.cart_model_free)
end

-- The model's tokenizer (loaded on first use).
function Model:tokenizer()
    if not self._tokenizer then
        self._tokenizer = require("cartridge.tokenizer").load(self.file)
    end
    return self._tokenizer
end

-- A new empty KV cache: capacity rows, dtype "f16" (default) or "f32".
-- The bytes `rows` KV rows take in a cache of dtype ("f16" or "f32"), K and
-- V over every layer: the one figure every recipe prints for KV memory.
function Model:kv_bytes(rows, dtype)
    local per_row = 0
    for _, g in ipairs(self.layers) do per_row = per_row + 2 * g.n_head_kv * g.head_dim end
    return rows * per_row * (dtype == "f32" and 4 or 2)
end

function Model:new_kv(capacity, dtype)
    local id = (dtype or "f16") == "f32" and C.CART_F32 or C.CART_F16
    if dtype and dtype ~= "f16" and dtype ~= "f32" then
        error("model:new_kv: cache dtype must be f16 or f32, not " .. tostring(dtype), 0)
    end
    return setmetatable({ handle = core.new("cart_kv", C.cart_model_new_kv, C.cart_kv_free, "model:new_kv", self.handle, capacity, id), model = self }, KV)
end

function KV:len() return core.int(C.cart_kv_len(self.handle)) end
function KV:capacity() return core.int(C.cart_kv_capacity(self.handle)) end
function KV:bytes() return core.int(C.cart_kv_bytes(self.handle)) end

function KV:truncate(len)
    core.check(C.cart_kv_truncate(self.handle, len), "kv:truncate")
end

function KV:set_len(len)
    core.check(C.cart_kv_set_len(self.handle, len), "kv:set_len")
end

-- The raw row storage of one layer (which: 0 = K, 1 = V) as a uint8_t*:
-- row r at r * kv:row_bytes(layer), in the cache dtype. Borrowed; lives with kv.
function KV:raw_rows(layer, which)
    return ffi.cast("uint8_t *", C.cart_kv_rows(self.handle, layer, which))
end

-- Bytes of one row of layer `layer`'s K (or V): kv_heads * head_dim * 2
-- (f16) or 4. Layers may differ (gemma4); layer defaults to 0.
function KV:row_bytes(layer)
    local h = self.handle
    layer = layer or 0
    return C.cart_kv_layer_heads(h, layer) * C.cart_kv_layer_head_dim(h, layer)
        * (C.cart_kv_dtype(h) == C.CART_F32 and 4 or 2)
end

-- One layer's heads and head_dim.
function KV:layer_geometry(layer)
    return C.cart_kv_layer_heads(self.handle, layer), C.cart_kv_layer_head_dim(self.handle, layer)
end

function KV:dtype_name() return C.cart_kv_dtype(self.handle) == C.CART_F32 and "f32" or "f16" end

function KV:free()
    core.free(self, C.cart_kv_free)
end

-- Copies the first n rows of `src` into this cache (len becomes n).
function KV:copy_from(src, n)
    core.check(C.cart_kv_copy(self.handle, src.handle, n or src:len()), "kv:copy_from")
end

local function ensure(self, field, ctype, n)
    local cap = self[field .. "_cap"] or 0
    if cap < n then
        self[field] = ffi.new(ctype, n)
        self[field .. "_cap"] = n
    end
    return self[field]
end

-- Runs one stream's tokens (a Lua list of ids, a cartridge.ids sequence, or a
-- cdata int32_t* with n).
-- logits: "last" (default), "all", "none", or a list of 0-based indices into
-- the tokens. Returns a float* to [rows, n_vocab] logits (nil for "none").
function Model:forward(kv, ids, logits, n)
    return self:forward_batch({ kv }, { ids }, logits, n and { n } or nil)
end

-- Runs several streams in one weight pass. kvs: list of caches; ids: list of
-- id lists (one per stream, possibly empty); logits: as for forward, applied
-- to every stream ("last" gives one row per non-empty stream, in stream
-- order). Returns the float* of the logit rows and the number of rows.
-- With hidden = true the rows are final hidden states ([rows, n_embd],
-- after the output norm) instead of logits.
function Model:forward_batch(kvs, ids, logits, counts, hidden)
    local B = #kvs
    local total = 0
    local n_tokens = ensure(self, "_counts", "int64_t[?]", B)
    for b = 1, B do
        local n = counts and counts[b] or #ids[b] -- # of a cartridge.ids sequence is its length
        n_tokens[b - 1] = n
        total = total + n
    end
    local tokens = ensure(self, "_tokens", "int32_t[?]", math.max(total, 1))
    local at = 0
    for b = 1, B do
        local list, n = ids[b], tonumber(n_tokens[b - 1])
        if ids_mod.is(list) then
            ffi.copy(tokens + at, list.data, n * 4)
        elseif type(list) == "cdata" then
            ffi.copy(tokens + at, list, n * 4)
        else
            for i = 1, n do tokens[at + i - 1] = list[i] end
        end
        at = at + n
    end
    local mode = logits or "last"
    local rows = ensure(self, "_rows", "int64_t[?]", math.max(total, 1))
    local n_rows = 0
    if mode == "all" then
        for i = 0, total - 1 do rows[i] = i end
        n_rows = total
    elseif mode == "last" then
        at = 0
        for b = 0, B - 1 do
            at = at + tonumber(n_tokens[b])
            if n_tokens[b] > 0 then
                rows[n_rows] = at - 1
                n_rows = n_rows + 1
            end
        end
    elseif type(mode) == "table" then
        for j, r in ipairs(mode) do rows[j - 1] = r end
        n_rows = #mode
    elseif mode ~= "none" then
        error("model:forward: logits must be 'last', 'all', 'none' or a list of rows", 0)
    end
    local handles = ensure(self, "_kvs", "cart_kv *[?]", B)
    for b = 1, B do handles[b - 1] = kvs[b].handle end
    if hidden then
        local out = n_rows > 0 and ensure(self, "_hidden", "float[?]", n_rows * self.config.n_embd) or nil
        core.check(C.cart_model_forward_hidden(self.handle, handles, B, tokens, n_tokens, rows, n_rows, out),
            "model:forward")
        return out, n_rows
    end
    local out = n_rows > 0 and ensure(self, "_logits", "float[?]", n_rows * self.n_vocab) or nil
    core.check(C.cart_model_forward(self.handle, handles, B, tokens, n_tokens, rows, n_rows, out),
        "model:forward")
    self._logits_rows = n_rows
    return out, n_rows
end

-- Argmax of one row of logits (ties to the lowest id).
function Model:argmax(logits, row)
    row = row or 0
    if logits == self._logits and (row < 0 or row >= (self._logits_rows or 0)) then
        -- e.g. m:argmax(m:forward(...)), which passes forward's row count as the row
        error(("model:argmax: row %d of the last forward's %d logit rows"):format(row, self._logits_rows or 0), 2)
    end
    return C.cart_argmax(logits + row * self.n_vocab, self.n_vocab)
end

model.Model = Model
model.KV = KV
return model
