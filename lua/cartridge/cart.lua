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
-- the model's name and fingerprint, p, frozen and the training settings (a
-- JSON string). Any safetensors reader opens it; writes are atomic.

local core = require("cartridge.core")
local safetensors = require("cartridge.safetensors")
local json = require("cartridge.json")
local ids_mod = require("cartridge.ids")
local ffi = core.ffi
local C = core.C

local cart = {}
-- v2 adds cartridge.model_content_hash (a hash of every weight byte of the
-- model); v1 files (fingerprint only) still load, with a warning.
cart.FORMAT = "cartridge-v2"
cart.FORMATS = { ["cartridge-v1"] = true, ["cartridge-v2"] = true }

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

-- One field of the geometry for the metadata: a number when every layer
-- shares it, else the layers' values joined by commas.
function Cart:per_layer_text(field)
    local values, same = {}, true
    for l, g in ipairs(self.layers) do
        values[l] = tostring(g[field])
        same = same and values[l] == values[1]
    end
    return same and values[1] or table.concat(values, ",")
end

-- Saves the cartridge atomically. opts: training (a table, stored as JSON),
-- draft_reference (corpus token ids: a cartridge.ids sequence or a Lua list),
-- extra_meta (string map).
function Cart:save(path, m, opts)
    opts = opts or {}
    local tensors, keep = {}, {}
    local trainable = self.p - self.frozen
    for l = 0, self.n_layer - 1 do
        local g = self.layers[l + 1]
        for which, name in ipairs({ "k", "v" }) do
            local rows = self:rows(l, which - 1)
            tensors[#tensors + 1] = { name = ("layers.%d.%s"):format(l, name), dtype = "F32",
                shape = { trainable, g.kv_heads, g.head_dim }, data = rows + self.frozen * g.row }
            if self.frozen > 0 then
                tensors[#tensors + 1] = { name = ("layers.%d.%s_sink"):format(l, name), dtype = "F32",
                    shape = { self.frozen, g.kv_heads, g.head_dim }, data = rows }
            end
        end
    end
    if opts.draft_reference and #opts.draft_reference > 0 then
        local src, n = ids_mod.view(opts.draft_reference)
        local ids = ffi.new("int64_t[?]", n)
        for i = 0, n - 1 do ids[i] = src[i] end
        keep[#keep + 1] = ids
        tensors[#tensors + 1] = { name = "draft_reference", dtype = "I64", shape = { n }, data = ids }
    end
    local meta = {
        ["cartridge.format"] = cart.FORMAT,
        ["cartridge.architecture"] = m.config.arch,
        ["cartridge.n_layer"] = tostring(self.n_layer),
        ["cartridge.kv_heads"] = self:per_layer_text("kv_heads"),
        ["cartridge.head_dim"] = self:per_layer_text("head_dim"),
        ["cartridge.p"] = tostring(self.p),
        ["cartridge.frozen"] = tostring(self.frozen),
        ["cartridge.model_name"] = tostring(m.file:get("general.name") or m.path),
        ["cartridge.model_fingerprint"] = cart.fingerprint(m),
        ["cartridge.model_content_hash"] = (m:content_hash()),
        ["cartridge.training"] = json.encode(opts.training or json.object()),
    }
    for k, v in pairs(opts.extra_meta or {}) do meta[k] = tostring(v) end
    core.check(C.cart_cartridge_check_finite(self.handle, 0), "cartridge save: " .. path)
    safetensors.write(path, tensors, meta, { checksum = true })
    return path
end

-- What in a cartridge's metadata disagrees with its tensors g ({ n_layer,
-- heads, dims, p, frozen }) and, given a model m, with m: a list of
-- sentences, empty when all is well. The format, the geometry and (with m)
-- the architecture and the model's fingerprint are required; a v2 file's
-- content hash (every weight byte) is required and compared too.
function cart.identity_problems(meta, g, m)
    local problems = {}
    local function add(fmt, ...) problems[#problems + 1] = fmt:format(...) end
    local format = meta["cartridge.format"]
    if not cart.FORMATS[format] then
        add(format and ("its metadata has cartridge.format '%s', which this version does not read (it reads "
            .. "cartridge-v1 and cartridge-v2)") or "its metadata has no cartridge.format", tostring(format))
    end
    local function per_layer(values)
        for _, v in ipairs(values) do if v ~= values[1] then return table.concat(values, ",") end end
        return tostring(values[1])
    end
    local geometry = { n_layer = tostring(g.n_layer), p = tostring(g.p), frozen = tostring(g.frozen),
        kv_heads = per_layer(g.heads), head_dim = per_layer(g.dims) }
    for _, key in ipairs({ "n_layer", "kv_heads", "head_dim", "p", "frozen" }) do
        local said = meta["cartridge." .. key]
        if said ~= geometry[key] then
            add("its metadata says cartridge.%s %s where its tensors have %s", key,
                said and ("'" .. said .. "'") or "nothing", geometry[key])
        end
    end
    if not m then return problems end
    local name = tostring(meta["cartridge.model_name"])
    if meta["cartridge.architecture"] ~= m.config.arch then
        add("it was trained on a %s model, and %s is %s", tostring(meta["cartridge.architecture"]), m.path,
            m.config.arch)
    end
    local fp, model_fp = meta["cartridge.model_fingerprint"], cart.fingerprint(m)
    if not fp then
        add("its metadata names no model fingerprint (cartridge.model_fingerprint)")
    elseif fp ~= model_fp then
        add("it was trained on model '%s' (fingerprint %s), and %s has fingerprint %s", name, fp, m.path, model_fp)
    end
    if format == "cartridge-v2" then
        local want = meta["cartridge.model_content_hash"]
        if not want then
            add("its metadata has no cartridge.model_content_hash, which a cartridge-v2 file records")
        elseif fp == model_fp and want ~= m:content_hash() then
            add("it was trained on model '%s' (content hash %s), and the weights of %s hash to %s: the same "
                .. "tensors with other values (a damaged or edited copy)", name, want, m.path, m:content_hash())
        end
    end
    return problems
end

-- Opens a cartridge artifact and checks it: the checksum, exactly the
-- expected tensors, and with a model m its geometry and fingerprint. Returns
-- the open file, the geometry { n_layer, heads, dims (each layer's KV heads
-- and head_dim), kv_heads, head_dim (layer 0's), p, frozen }, the metadata and
-- the draft reference (or nil); raises "<who>: PATH: what".
local function open_checked(path, m, who)
    require("cartridge.fs").sweep_temps(path)
    local f = safetensors.open(path)
    local function fail(what)
        f:close()
        error(who .. ": " .. path .. ": " .. what, 0)
    end
    local ok, verified = pcall(f.verify, f)
    if not ok then
        f:close()
        error(who .. ": " .. verified, 0)
    end
    if not verified then
        io.stderr:write(("cart.load: %s carries no checksum (written by an older version): its bytes are not "
            .. "verified; saving it again adds one\n"):format(path))
    end
    local k0 = f:tensor("layers.0.k")
    if not k0 then fail("no tensor 'layers.0.k': this is not a cartridge artifact") end
    if #k0.shape ~= 3 then fail("'layers.0.k' has rank " .. #k0.shape .. ", expected 3 [rows, kv_heads, head_dim]") end
    local trainable = k0.shape[1]
    local sink0 = f:tensor("layers.0.k_sink")
    local frozen = sink0 and sink0.shape[1] or 0
    local n_layer = 0
    local heads, dims = {}, {}
    while true do
        local k = f:tensor(("layers.%d.k"):format(n_layer))
        if not k then break end
        if #k.shape ~= 3 then
            fail(("'layers.%d.k' has rank %d, expected 3 [rows, kv_heads, head_dim]"):format(n_layer, #k.shape))
        end
        heads[n_layer + 1], dims[n_layer + 1] = k.shape[2], k.shape[3]
        n_layer = n_layer + 1
    end
    local p = trainable + frozen
    -- strict: exactly the expected names, shapes and dtypes (each layer its
    -- own heads and head_dim, every layer the same rows)
    local expected = {}
    for l = 0, n_layer - 1 do
        for _, name in ipairs({ "k", "v" }) do
            expected[("layers.%d.%s"):format(l, name)] = { trainable, heads[l + 1], dims[l + 1] }
            if frozen > 0 then
                expected[("layers.%d.%s_sink"):format(l, name)] = { frozen, heads[l + 1], dims[l + 1] }
            end
        end
    end
    local draft
    for _, t in ipairs(f:tensors()) do
        if t.name == "draft_reference" then
            if t.dtype_name ~= "I64" or #t.shape ~= 1 or t.shape[1] < 1 then
                fail("'draft_reference' must be a non-empty 1-D I64 tensor")
            end
            local p64 = ffi.cast("const int64_t *", t.data)
            draft = ids_mod.new(t.shape[1])
            for i = 0, t.shape[1] - 1 do
                local id = p64[i]
                if id < 0 or id > 0x7fffffff then
                    fail(("'draft_reference' entry %d is %s, not a token id"):format(i, tostring(id):gsub("LL$", "")))
                end
                draft:push(id)
            end
        else
            local want = expected[t.name]
            if not want then fail("unexpected tensor '" .. t.name .. "'") end
            if t.dtype_name ~= "F32" then fail("'" .. t.name .. "' is " .. t.dtype_name .. ", expected F32") end
            if #t.shape ~= 3 or t.shape[1] ~= want[1] or t.shape[2] ~= want[2] or t.shape[3] ~= want[3] then
                fail(("'%s' has shape [%s], expected [%d, %d, %d]"):format(t.name, table.concat(t.shape, ", "),
                    want[1], want[2], want[3]))
            end
            expected[t.name] = nil
        end
    end
    local missing = next(expected)
    if missing then fail("missing tensor '" .. missing .. "'") end
    local meta = f.metadata
    if m then
        local mc = m.config
        if mc.n_layer ~= n_layer then
            fail(("the cartridge is %d layers x %d KV heads x %d dims, the model %s is %d x %d x %d; "
                .. "use the model it was trained with"):format(n_layer, heads[1], dims[1], m.path,
                mc.n_layer, m.layers[1].n_head_kv, m.layers[1].head_dim))
        end
        for l = 1, n_layer do
            local g = m.layers[l]
            if g.n_head_kv ~= heads[l] or g.head_dim ~= dims[l] then
                fail(("the cartridge is %d layers x %d KV heads x %d dims (layer %d), the model %s is %d x %d x %d; "
                    .. "use the model it was trained with"):format(n_layer, heads[l], dims[l], l - 1, m.path,
                    mc.n_layer, g.n_head_kv, g.head_dim))
            end
        end
        if draft then
            for i = 0, #draft - 1 do
                local id = draft:get(i)
                if id >= m.n_vocab then
                    fail(("'draft_reference' entry %d is token %d, beyond the model's vocabulary of %d ids; the file "
                        .. "is damaged or was made for another model"):format(i, id, m.n_vocab))
                end
            end
        end
    end
    local problems = cart.identity_problems(meta, { n_layer = n_layer, heads = heads, dims = dims, p = p,
        frozen = frozen }, m)
    if #problems > 0 then
        local what = table.concat(problems, "; ")
        if not cart.allow_foreign then
            fail(what .. "; the file was made for another model, or damaged or edited: use the model it was "
                .. "trained with (--foreign-cartridge loads it anyway, when its tensors fit the model)")
        end
        io.stderr:write(("%s: %s: warning: %s; loading it anyway (--foreign-cartridge)\n"):format(who, path, what))
    elseif m and meta["cartridge.format"] == "cartridge-v1" then
        io.stderr:write(("%s: %s: warning: a cartridge-v1 file records only a sampled fingerprint of its model, "
            .. "so a model whose weights differ away from each tensor's ends passes the check\n"):format(who, path))
    end
    return f, { n_layer = n_layer, heads = heads, dims = dims, kv_heads = heads[1], head_dim = dims[1], p = p,
        frozen = frozen }, meta, draft
end

-- Loads a cartridge artifact. The geometry comes from the tensors; with a
-- model m, a different geometry or model fingerprint is refused, naming both.
-- Returns the cartridge and a table { metadata, draft_reference (a
-- cartridge.ids sequence or nil), training (decoded table or nil) }.
function cart.load(path, m)
    local f, g, meta, draft = open_checked(path, m, "cart.load")
    local n_layer, heads, dims, p, frozen = g.n_layer, g.heads, g.dims, g.p, g.frozen
    local function fail(what) error("cart.load: " .. path .. ": " .. what, 0) end
    local c = cart.new_geometry(n_layer, g.heads, g.dims, p, frozen)
    for l = 0, n_layer - 1 do
        for which, name in ipairs({ "k", "v" }) do
            local rows = c:rows(l, which - 1)
            local t = f:tensor(("layers.%d.%s"):format(l, name))
            ffi.copy(rows + frozen * c.layers[l + 1].row, t.data, t.nbytes)
            if frozen > 0 then
                local s = f:tensor(("layers.%d.%s_sink"):format(l, name))
                ffi.copy(rows, s.data, s.nbytes)
            end
        end
    end
    f:close()
    local finite = C.cart_cartridge_check_finite(c.handle, 0)
    if finite ~= 0 then
        local why = core.last_error()
        c:free()
        fail(why .. "; the file is damaged or its training diverged")
    end
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
        for _, name in ipairs({ "k", "v", "k_sink", "v_sink" }) do
            local t = f:tensor(("layers.%d.%s"):format(l, name))
            if t then
                local bad = tonumber(C.cart_f32_first_outside(t.data, t.numel, 65504))
                if bad >= 0 then
                    f:close()
                    error(("cart.map: %s: '%s' holds a NaN, an infinity or a value beyond +-65504 (the largest an "
                        .. "f16 KV cache holds) at element %d: every value must be finite and within it; the file "
                        .. "is damaged or its training diverged"):format(path, t.name, bad), 0)
                end
                self[name][l] = ffi.cast("const float *", t.data)
            end
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
    if self.file then self.file:close() end
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
