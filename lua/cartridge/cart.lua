-- cartridge.cart: a cartridge (trainable KV prefix) from Lua, and its
-- safetensors artifact.
--
--   local cart = require("cartridge.cart")
--   local c = cart.new(m, 256, 1)          -- model, p, frozen rows
--   c:capture(m, ids)                      -- the model's own K/V of #ids == p tokens (f32 cache)
--   local t = cart.from_text(m, "Some text.")  -- new + capture of the text's tokens
--   c:append_to(kv)                        -- into a cache (serving), len += p
--   c:save("out.safetensors", m, { training = {...}, draft_reference = ids })
--   local d = cart.load("out.safetensors", m)   -- geometry from the header, checked against m
--   local ab = cart.compose({ a, b })      -- a's rows then b's: p = a.p + b.p (each keeps its positions)
--   ab:compose_grad()                      -- after a backward through ab: into a's and b's gradients
--
-- The artifact: per layer i, "layers.<i>.k" and
-- "layers.<i>.v" F32 [p - frozen, kv_heads, head_dim] (the trainable rows),
-- "layers.<i>.k_sink" / ".v_sink" [frozen, kv_heads, head_dim] when frozen >
-- 0, and optionally "draft_reference" I64 [n] (corpus token ids). kv_heads
-- and head_dim are each layer's own (gemma4's sliding and full layers
-- differ). Rows are in
-- KV-cache order (position, kv head, dim), keys post-RoPE at positions
-- 0..p-1. __metadata__ records the format, the architecture and geometry,
-- the model's name, fingerprint and content hash, p, frozen and the
-- training settings (a JSON string). Any safetensors reader opens it; writes
-- are atomic. The format and its checks are the engine's (engine/cart.h).

local core = require("cartridge.core")
local json = require("cartridge.json")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local cart = {}
-- Whether cart.load and cart.map accept a cartridge whose metadata does not
-- name the model it is loaded with (another fingerprint or content hash,
-- another architecture, missing or false geometry metadata): false refuses
-- it, true warns on stderr and loads it when the tensors fit the model.
-- Recipes that load cartridges set it from --foreign-cartridge.
cart.allow_foreign = false
cart.FOREIGN_FLAG = { "foreign-cartridge", type = "boolean",
    help = "load a cartridge whose metadata names another model or lacks its model's identity, with a warning "
        .. "(the tensors must still fit the model)" }

local Cart = {}
Cart.__index = Cart

-- c.layers[l + 1] = { kv_heads, head_dim, row } for layer l; c.kv_heads,
-- c.head_dim and c.row are layer 0's, and c.uniform says whether every
-- layer has them.
local function wrap(handle)
    local self = setmetatable({ handle = handle }, Cart)
    self.p = tonumber(C.cart_cartridge_p(handle))
    self.frozen = tonumber(C.cart_cartridge_frozen(handle))
    self.n_layer = C.cart_cartridge_n_layer(handle)
    self.layers = {}
    self.uniform = true
    for l = 0, self.n_layer - 1 do
        local h, d = C.cart_cartridge_layer_heads(handle, l), C.cart_cartridge_layer_head_dim(handle, l)
        self.layers[l + 1] = { kv_heads = h, head_dim = d, row = h * d }
        if l > 0 and (h ~= self.layers[1].kv_heads or d ~= self.layers[1].head_dim) then self.uniform = false end
    end
    self.kv_heads = self.layers[1].kv_heads
    self.head_dim = self.layers[1].head_dim
    self.row = self.kv_heads * self.head_dim
    return self
end

-- The per-layer geometry as "h x d" text ("2x16, 2x16, 1x32, ..."), or one
-- "h x d" when every layer shares it.
function Cart:geometry_text()
    if self.uniform then return ("%d x %d"):format(self.kv_heads, self.head_dim) end
    local parts = {}
    for l, g in ipairs(self.layers) do parts[l] = ("%dx%d"):format(g.kv_heads, g.head_dim) end
    return table.concat(parts, ", ")
end

-- A zero cartridge of p rows per layer shaped for model m (a cartridge.model).
function cart.new(m, p, frozen)
    return wrap(core.new("cart_cartridge", C.cart_cartridge_new_for, C.cart_cartridge_free, "cart.new", m.handle, p,
        frozen or 1))
end

-- A zero cartridge of explicit geometry: kv_heads and head_dim are numbers
-- (every layer) or lists of n_layer numbers (each layer's).
function cart.new_geometry(n_layer, kv_heads, head_dim, p, frozen)
    if type(kv_heads) == "number" and type(head_dim) == "number" then
        return wrap(core.new("cart_cartridge", C.cart_cartridge_new, C.cart_cartridge_free, "cart.new", n_layer,
            kv_heads, head_dim, p, frozen))
    end
    local h, d = ffi.new("int32_t[?]", n_layer), ffi.new("int32_t[?]", n_layer)
    for l = 1, n_layer do
        h[l - 1] = type(kv_heads) == "number" and kv_heads or kv_heads[l]
        d[l - 1] = type(head_dim) == "number" and head_dim or head_dim[l]
    end
    return wrap(core.new("cart_cartridge", C.cart_cartridge_new_layers, C.cart_cartridge_free, "cart.new", n_layer,
        h, d, p, frozen))
end

function Cart:free()
    core.free(self, C.cart_cartridge_free)
end

-- One layer's rows (which: 0 = K, 1 = V): a float* to [p, kv_heads, head_dim].
function Cart:rows(layer, which) return C.cart_cartridge_rows(self.handle, layer, which) end
function Cart:grad(layer, which) return C.cart_cartridge_grad(self.handle, layer, which) end
function Cart:zero_grad() C.cart_cartridge_zero_grad(self.handle) end
function Cart:trainable_count() return tonumber(C.cart_cartridge_trainable_count(self.handle)) end
-- what cartridge.adam asks of what it optimizes
function Cart:optimizer_size() return self:trainable_count() end
function Cart:adam_step(opt) return C.cart_cartridge_adam_step(self.handle, opt) end

-- Fills the rows with the model's own K/V of ids (#ids == p), computed
-- through a cache of kv_dtype ("f32", the default, or "f16").
function Cart:capture(m, ids, kv_dtype)
    local buf, n = ids_mod.view(ids)
    if kv_dtype and kv_dtype ~= "f16" and kv_dtype ~= "f32" then
        error("cart:capture: the cache dtype must be f16 or f32, not " .. tostring(kv_dtype), 0)
    end
    local dtype = kv_dtype == "f16" and C.CART_F16 or C.CART_F32
    core.check(C.cart_cartridge_capture(self.handle, m.handle, buf, n, dtype), "cartridge capture")
end

-- An untrained cartridge of the model's own K/V rows for a text: the text
-- is encoded (BOS as the model adds it), p is its token count, and `frozen`
-- (default 1) leading rows are sinks.
function cart.from_text(m, text, frozen)
    local ids = m:tokenizer():encode_ids(text, { add_special = true })
    local c = cart.new(m, #ids, frozen or 1)
    c:capture(m, ids)
    return c
end

function Cart:init_random(seed, std)
    C.cart_cartridge_init_random(self.handle, seed or 0, std or 1.0)
end

-- Writes the rows into a KV cache (a cartridge.model KV) after its current rows.
function Cart:append_to(kv)
    core.check(C.cart_cartridge_append_to_kv(self.handle, kv.handle), "cartridge append_to")
end

-- Copies n rows of every layer (K and V) from src's rows src_row.. into
-- this cartridge's rows dst_row.. (0-based; the same geometry).
function Cart:copy_rows(dst_row, src, src_row, n)
    core.check(C.cart_cartridge_copy_rows(self.handle, dst_row, src.handle, src_row, n), "cart:copy_rows")
end

-- What a part is called in an error: its file, or its place in the list.
local function part_name(c, i)
    return c.path or ("part " .. i)
end

-- A composed cartridge (engine/cart.h): the parts' rows one after the other
-- in every layer, each part's sinks first, each part keeping its positions;
-- tokens behind it sit at positions sum(p_i). parts: a list of carts of one
-- geometry; a mismatch is an error naming both files. The result is a new
-- cart (free it when done) whose .parts is the list; after a backward pass
-- through it, :compose_grad() adds its gradient into the parts'.
function cart.compose(parts)
    if #parts == 0 then error("cart.compose: no cartridges to compose", 0) end
    local first = parts[1]
    local arr = ffi.new("const cart_cartridge *[?]", #parts)
    for i, c in ipairs(parts) do
        if c.n_layer ~= first.n_layer or c:geometry_text() ~= first:geometry_text() then
            error(("cart.compose: %s is %d layers of %s (KV heads x dims) and %s is %d layers of %s; only "
                .. "cartridges trained on one model compose"):format(part_name(c, i), c.n_layer, c:geometry_text(),
                part_name(first, 1), first.n_layer, first:geometry_text()), 0)
        end
        arr[i - 1] = c.handle
    end
    local composed = wrap(core.new("cart_cartridge", C.cart_cartridge_compose, C.cart_cartridge_free, "cart.compose",
        arr, #parts))
    composed.parts = parts
    return composed
end

-- Adds a composed cartridge's gradient into its parts' gradients (each
-- part's own sink rows get none).
function Cart:compose_grad()
    local parts = assert(self.parts, "cart:compose_grad: not a composed cartridge")
    local arr = ffi.new("cart_cartridge *[?]", #parts)
    for i, c in ipairs(parts) do arr[i - 1] = c.handle end
    core.check(C.cart_cartridge_compose_grad(self.handle, arr, #parts), "cart:compose_grad")
end

-- Bytes of the K/V rows (f32).
function Cart:bytes()
    local total = 0
    for _, g in ipairs(self.layers) do total = total + 2 * self.p * g.row * 4 end
    return total
end

-- The model's fingerprint as 16 hex digits.
function cart.fingerprint(m)
    return core.hex64(C.cart_model_fingerprint(m.handle))
end

-- Saves the cartridge atomically (cart_cartridge_save, engine/cart.h).
-- opts: training (a table, stored as JSON), draft_reference (corpus token
-- ids: a cartridge.ids sequence or a Lua list), extra_meta (string map).
function Cart:save(path, m, opts)
    opts = opts or {}
    local o = ffi.new("cart_cartridge_save_options")
    local training = json.encode(opts.training or json.object())
    o.training_json = training
    if opts.draft_reference and #opts.draft_reference > 0 then
        o.draft_reference, o.n_draft = ids_mod.view(opts.draft_reference) -- valid until the next view
    end
    local keys, values = {}, {}
    for k, v in pairs(opts.extra_meta or {}) do
        keys[#keys + 1], values[#values + 1] = k, tostring(v)
    end
    -- (ck, cv, keys and values stay referenced until the call: o holds bare pointers)
    local ck, cv = ffi.new("const char *[?]", #keys + 1), ffi.new("const char *[?]", #keys + 1)
    for i = 1, #keys do ck[i - 1], cv[i - 1] = keys[i], values[i] end
    o.meta_keys, o.meta_values, o.n_meta = ck, cv, #keys
    require("cartridge.fs").sweep_temps(path)
    core.check(C.cart_cartridge_save(self.handle, m.handle, path, o), "cartridge save")
    return path
end

-- Opens and checks a cartridge artifact (cart_cartridge_open, engine/cart.h:
-- the checksum, exactly the expected tensors, finite rows within the f16
-- range, and with a model m its geometry, vocabulary and identity). Prints
-- what it let pass on stderr, a line each; raises "<who>: PATH: what".
-- Returns the handle, the geometry { n_layer, heads, dims (each layer's KV
-- heads and head_dim), kv_heads, head_dim (layer 0's), p, frozen }, the
-- metadata table and the draft reference (a cartridge.ids sequence or nil).
local function open_checked(path, m, who)
    local out = ffi.new("cart_cartridge_file *[1]")
    local rc = C.cart_cartridge_open(out, path, m and m.handle or nil,
        cart.allow_foreign and C.CART_CARTRIDGE_FOREIGN or 0)
    if rc ~= 0 then error(who .. ": " .. core.last_error(), 0) end
    local f = ffi.gc(out[0], C.cart_cartridge_file_close)
    io.stderr:write(ffi.string(C.cart_cartridge_file_warnings(f)))
    local g = { n_layer = C.cart_cartridge_file_n_layer(f), heads = {}, dims = {},
        p = tonumber(C.cart_cartridge_file_p(f)), frozen = tonumber(C.cart_cartridge_file_frozen(f)) }
    for l = 0, g.n_layer - 1 do
        g.heads[l + 1] = C.cart_cartridge_file_layer_heads(f, l)
        g.dims[l + 1] = C.cart_cartridge_file_layer_head_dim(f, l)
    end
    g.kv_heads, g.head_dim = g.heads[1], g.dims[1]
    local meta, st = {}, C.cart_cartridge_file_st(f)
    for i = 0, tonumber(C.cart_st_meta_count(st)) - 1 do
        local e = C.cart_st_meta_at(st, i)
        meta[core.str(e.key)] = core.str(e.value)
    end
    local draft
    local ids_out = ffi.new("const int32_t *[1]")
    local n = tonumber(C.cart_cartridge_file_draft(f, ids_out))
    if n > 0 then draft = ids_mod.from(ids_out[0], n) end
    return f, g, meta, draft
end

-- Loads a cartridge artifact. The geometry comes from the tensors; with a
-- model m, a different geometry or model is refused, naming both.
-- Returns the cartridge and a table { metadata, draft_reference (a
-- cartridge.ids sequence or nil), training (decoded table or nil) }.
function cart.load(path, m)
    local f, _, meta, draft = open_checked(path, m, "cart.load")
    local c = wrap(core.new("cart_cartridge", C.cart_cartridge_file_load, C.cart_cartridge_free, "cart.load", f))
    C.cart_cartridge_file_close(ffi.gc(f, nil))
    c.path = path
    local training
    if meta["cartridge.training"] then
        local ok, v = pcall(json.decode, meta["cartridge.training"])
        if ok then training = v end
    end
    return c, { metadata = meta, draft_reference = draft, training = training }
end

-- A cartridge served from its file's mapping, without a copy in memory:
-- the rows stay in the page cache, which the kernel may drop and read again.
-- The same checks as cart.load (and every value finite); append_to writes
-- the same rows into a cache as the loaded cartridge's append_to. Fields:
-- path, p, frozen, n_layer, heads, dims, kv_heads, head_dim, row (layer 0's),
-- metadata; :bytes()
-- (its rows' bytes, f32); :free() unmaps it.
local Mapped = {}
Mapped.__index = Mapped

function cart.map(path, m)
    local f, g, meta = open_checked(path, m, "cart.map")
    local self = setmetatable({ file = f, path = path, metadata = meta, k = {}, v = {}, k_sink = {}, v_sink = {} },
        Mapped)
    for key, value in pairs(g) do self[key] = value end
    self.rows_per_layer = {}
    for l = 1, g.n_layer do self.rows_per_layer[l] = g.heads[l] * g.dims[l] end
    self.row = self.rows_per_layer[1]
    for l = 0, g.n_layer - 1 do
        self.k[l], self.v[l] = C.cart_cartridge_file_rows(f, l, 0, 0), C.cart_cartridge_file_rows(f, l, 1, 0)
        if g.frozen > 0 then
            self.k_sink[l], self.v_sink[l] = C.cart_cartridge_file_rows(f, l, 0, 1), C.cart_cartridge_file_rows(f, l, 1, 1)
        end
    end
    return self
end

function Mapped:append_to(kv)
    local len = kv:len()
    if self.p > kv:capacity() - len then
        error(("cart.map: %s: %d rows after %d do not fit a cache of %d"):format(self.path, self.p, len,
            kv:capacity()), 0)
    end
    for l = 0, self.n_layer - 1 do
        if self.frozen > 0 then
            core.check(C.cart_kv_write(kv.handle, l, len, self.frozen, self.k_sink[l], self.v_sink[l]), "cart.map")
        end
        core.check(C.cart_kv_write(kv.handle, l, len + self.frozen, self.p - self.frozen, self.k[l], self.v[l]),
            "cart.map")
    end
    kv:set_len(len + self.p)
end

function Mapped:bytes()
    local total = 0
    for _, row in ipairs(self.rows_per_layer) do total = total + 2 * self.p * row * 4 end
    return total
end

function Mapped:free()
    if self.file then C.cart_cartridge_file_close(ffi.gc(self.file, nil)) end
    self.file, self.k, self.v, self.k_sink, self.v_sink = nil, {}, {}, {}, {}
end

-- Several cartridges (loaded or mapped) served as one prefix: append_to
-- writes their rows into a cache one after the other, p is the sum. The
-- same rows as cart.compose's, without copying them first.
local Stack = {}
Stack.__index = Stack

function cart.stack(parts)
    local p = 0
    for _, c in ipairs(parts) do p = p + c.p end
    return setmetatable({ parts = parts, p = p }, Stack)
end

function Stack:append_to(kv)
    for _, c in ipairs(self.parts) do c:append_to(kv) end
end

cart.Cart = Cart
return cart
