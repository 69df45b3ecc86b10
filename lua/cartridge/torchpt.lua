-- cartridge.torchpt: cartridges in PyTorch's torch.save files, the reference
-- trainer's (HazyResearch/cartridges: cache-step{N}.pt, cache_last.pt) and
-- Tokasaurus' (cartridges/<id>/cartridge.pt beside config.yaml).
--
--   local pt = torchpt.open("cache_last.pt")       -- never runs the file's code
--   local cache = torchpt.read_cache(pt)           -- the lists of tensors, checked
--   local c = torchpt.to_cartridge(cache, m)       -- a cartridge for model m
--   torchpt.write_reference(c, m, "out.pt", { dtype = "bf16" })
--   torchpt.write_tokasaurus(c, m, "cartridges", "my-docs", {})
--
-- The file's layout: a dict whose lists trainable_keys, trainable_values and
-- frozen_keys, frozen_values (older files: fixed_keys, fixed_values) hold
-- one tensor per layer, [1, kv_heads, tokens, head_dim], keys after RoPE;
-- the frozen rows come first. A list is an nn.ParameterList (as the
-- reference saves it: its _parameters '0', '1', ...) or a plain list.
--
-- Positions: the reference trainer and Tokasaurus both put a cartridge's
-- rows at positions 0..p-1 and start the queries after them at p, as this
-- engine does, so rows carry over unrotated. `rope_shift` (import) turns
-- the keys by that many positions for a file trained with its queries
-- elsewhere (for queries that started at 0: rope_shift = p).
--
-- Head layout: Hugging Face's RoPE rotates the pairs (i, i + d/2) of a head.
-- GGUF files of llama-architecture models carry the q/k weights permuted so
-- that GGML rotates the pairs (2i, 2i + 1) instead (llama.cpp's converter);
-- for those models the keys' head dims are permuted on the way in and back
-- on the way out. Qwen3 and gemma rotate (i, i + d/2) in both: no change.

local core = require("cartridge.core")
local cart = require("cartridge.cart")
local fs = require("cartridge.fs")
local ffi = core.ffi
local C = core.C

local torchpt = {}

local KIND = { [0] = "None", "bool", "int", "float", "str", "bytes", "tuple", "list", "dict", "tensor", "object",
    "global", "storage" }

local Archive = {}
Archive.__index = Archive

-- Opens and checks a .pt file (torchpt.h says what it accepts).
function torchpt.open(path)
    local handle = core.new("cart_pt", C.cart_pt_open, C.cart_pt_close, "torch file", path)
    return setmetatable({ handle = handle, path = path, archive = ffi.string(C.cart_pt_archive(handle)),
        root = C.cart_pt_root(handle) }, Archive)
end

function Archive:close() core.free(self, C.cart_pt_close) end

function torchpt.kind(v) return KIND[C.cart_pk_kind_of(v)] or "?" end

-- A TENSOR value as { shape = {...}, dtype = "bf16", numel, value }.
local function tensor_info(v)
    local t = ffi.new("cart_pt_tensor")
    core.check(C.cart_pk_tensor(v, t), "torch file")
    local shape = {}
    for d = 0, t.ndim - 1 do shape[d + 1] = tonumber(t.shape[d]) end
    return { shape = shape, dtype = ffi.string(C.cart_dtype_name(t.dtype)), numel = tonumber(t.numel), value = v }
end

-- The tensor's elements as f32, row-major (a new float array).
function torchpt.read_f32(info)
    local buf = ffi.new("float[?]", math.max(info.numel, 1))
    core.check(C.cart_pt_tensor_f32(info.value, buf, info.numel), "torch file")
    return buf
end

local FLOATS = { f32 = true, bf16 = true, f16 = true, f64 = true }

-- The tensors of a list value: a list or tuple, or an nn.ParameterList's
-- _parameters in the order of their keys '0', '1', ...
local function tensor_list(v, what)
    local kind = torchpt.kind(v)
    if kind == "object" then
        local params = C.cart_pk_get(C.cart_pk_state(v), "_parameters")
        if params == nil or torchpt.kind(params) ~= "dict" then
            error(("%s is a %s without _parameters"):format(what, ffi.string(C.cart_pk_class(v))), 0)
        end
        local out = {}
        for i = 0, tonumber(C.cart_pk_len(params)) - 1 do
            local item = C.cart_pk_get(params, tostring(i))
            if item == nil then error(("%s has no parameter '%d' of %d"):format(what, i, C.cart_pk_len(params)), 0) end
            out[i + 1] = item
        end
        v = out
    elseif kind == "list" or kind == "tuple" then
        local out = {}
        for i = 0, tonumber(C.cart_pk_len(v)) - 1 do out[i + 1] = C.cart_pk_item(v, i) end
        v = out
    else
        error(("%s is a %s, not a list of tensors"):format(what, kind), 0)
    end
    for i, item in ipairs(v) do
        if torchpt.kind(item) ~= "tensor" then
            error(("%s[%d] is a %s, not a tensor"):format(what, i - 1, torchpt.kind(item)), 0)
        end
        v[i] = tensor_info(item)
        if not FLOATS[v[i].dtype] then
            error(("%s[%d] holds %s values; a cartridge's rows are floating point (f32, bf16, f16 or f64)"):format(what,
                i - 1, v[i].dtype), 0)
        end
    end
    return v
end

-- The frozen lists' key prefix: "frozen" (the reference since August 2025),
-- "fixed" (before), or nil when the file has neither (no frozen rows).
local function frozen_prefix(root)
    if C.cart_pk_get(root, "frozen_keys") ~= nil then return "frozen" end
    if C.cart_pk_get(root, "fixed_keys") ~= nil then return "fixed" end
    return nil
end

-- Every layer's tensors of one list have the shape [1, heads, tokens, dim]
-- with one token count; returns it.
local function check_shapes(list, what)
    local tokens
    for l, t in ipairs(list) do
        local s = t.shape
        if #s ~= 4 or s[1] ~= 1 then
            error(("%s[%d] has shape [%s]; a cartridge's tensors are [1, kv_heads, tokens, head_dim]"):format(what,
                l - 1, table.concat(s, ", ")), 0)
        end
        tokens = tokens or s[3]
        if s[3] ~= tokens then
            error(("%s[%d] holds %d tokens where layer 0 holds %d"):format(what, l - 1, s[3], tokens), 0)
        end
    end
    return tokens or 0
end

-- The cartridge lists of an open archive, checked against each other:
-- { keys, values, frozen_keys, frozen_values (lists of tensor infos),
-- n_layer, trainable, frozen (token counts), frozen_name }.
function torchpt.read_cache(pt)
    local root, who = pt.root, pt.path
    if torchpt.kind(root) ~= "dict" then
        error(("%s holds a %s, not the dict of a cartridge (trainable_keys, trainable_values, frozen_keys, "
            .. "frozen_values)"):format(who, torchpt.kind(root)), 0)
    end
    local function list(key, required)
        local v = C.cart_pk_get(root, key)
        if v == nil then
            if required then error(("%s has no '%s': not a cartridge saved by the reference trainer"):format(who, key), 0) end
            return {}
        end
        return tensor_list(v, ("%s: '%s'"):format(who, key))
    end
    local prefix = frozen_prefix(root)
    local c = { keys = list("trainable_keys", true), values = list("trainable_values", true), frozen_name = prefix }
    c.frozen_keys = prefix and list(prefix .. "_keys", true) or {}
    c.frozen_values = prefix and list(prefix .. "_values", true) or {}
    c.n_layer = #c.keys
    for _, name in ipairs({ "values", "frozen_keys", "frozen_values" }) do
        local n = #c[name]
        if n ~= c.n_layer and not (name:match("^frozen") and n == 0) then
            error(("%s: %d tensors in %s but %d in trainable_keys (one per layer)"):format(who, n, name, c.n_layer), 0)
        end
    end
    if #c.frozen_keys ~= #c.frozen_values then error(who .. ": the frozen keys and values differ in count", 0) end
    c.trainable = check_shapes(c.keys, who .. ": trainable_keys")
    c.frozen = check_shapes(c.frozen_keys, who .. ": frozen_keys")
    if check_shapes(c.values, who .. ": trainable_values") ~= c.trainable or
        check_shapes(c.frozen_values, who .. ": frozen_values") ~= c.frozen then
        error(who .. ": the keys and values hold different token counts", 0)
    end
    if c.n_layer == 0 or c.trainable == 0 then error(who .. ": no trainable rows", 0) end
    return c
end

-- GGUF head index of each Hugging Face head index, for a model whose RoPE
-- rotates (2i, 2i + 1) (llama.cpp's converter permutes llama's q/k this way):
-- hf index a * d/2 + b sits at gguf index 2b + a. nil: no permutation.
local function head_permutation(m, l)
    local g = m.layers[l + 1]
    if m.config.rope_neox then return nil end
    if g.n_rot ~= g.head_dim then
        error(("layer %d rotates %d of its %d head dims in GGML's pair order; such a model has no Hugging Face "
            .. "layout this import knows"):format(l, g.n_rot, g.head_dim), 0)
    end
    local perm, half = {}, g.head_dim / 2
    for a = 0, 1 do
        for b = 0, half - 1 do perm[a * half + b] = 2 * b + a end
    end
    return perm
end

torchpt.head_permutation = head_permutation

-- Copies a [1, h, t, d] tensor into rows row0 .. row0 + t - 1 of dst
-- ([p, h, d] floats), the head dims through perm when given.
local function scatter(info, dst, row0, perm)
    local src = torchpt.read_f32(info)
    local h, t, d = info.shape[2], info.shape[3], info.shape[4]
    for head = 0, h - 1 do
        for tok = 0, t - 1 do
            local s, o = src + (head * t + tok) * d, dst + ((row0 + tok) * h + head) * d
            if perm then
                for j = 0, d - 1 do o[perm[j]] = s[j] end
            else
                ffi.copy(o, s, d * 4)
            end
        end
    end
end

-- What in one layer's tensors differs from the cartridge's geometry g.
local function check_layer(cache, l, g, who)
    for _, name in ipairs({ "keys", "values", "frozen_keys", "frozen_values" }) do
        local t = cache[name][l + 1]
        if t and (t.shape[2] ~= g.kv_heads or t.shape[4] ~= g.head_dim) then
            error(("%s: layer %d's %s are %d KV heads x %d dims, but the model's layer %d has %d x %d: the file "
                .. "was trained for another model"):format(who, l, name, t.shape[2], t.shape[4], l, g.kv_heads,
                g.head_dim), 0)
        end
    end
end

-- A cartridge for model m from torchpt.read_cache's lists: frozen rows
-- first, as sinks. opts: rope_shift (positions to turn the keys by, default
-- 0), who (for messages).
function torchpt.to_cartridge(cache, m, opts)
    opts = opts or {}
    local who = opts.who or "torch file"
    if cache.n_layer ~= m.config.n_layer then
        error(("%s: %d layers of rows, but the model has %d: the file was trained for another model"):format(who,
            cache.n_layer, m.config.n_layer), 0)
    end
    local p = cache.frozen + cache.trainable
    local c = cart.new(m, p, cache.frozen)
    for l = 0, c.n_layer - 1 do
        check_layer(cache, l, c.layers[l + 1], who)
        local perm = head_permutation(m, l)
        local k, v = c:rows(l, 0), c:rows(l, 1)
        if cache.frozen > 0 then
            scatter(cache.frozen_keys[l + 1], k, 0, perm)
            scatter(cache.frozen_values[l + 1], v, 0, nil)
        end
        scatter(cache.keys[l + 1], k, cache.frozen, perm)
        scatter(cache.values[l + 1], v, cache.frozen, nil)
        if (opts.rope_shift or 0) ~= 0 then
            core.check(C.cart_model_rope_shift(m.handle, l, k, p, c.layers[l + 1].row, opts.rope_shift), who)
        end
    end
    core.check(C.cart_cartridge_check_finite(c.handle, 0), who)
    return c
end

local DTYPES = { f32 = C.CART_F32, f16 = C.CART_F16, bf16 = C.CART_BF16 }
local ELEM = { f32 = 4, f16 = 2, bf16 = 2 }

-- One layer's rows first .. first + n - 1 as a [1, h, n, d] tensor of dtype
-- (cart_pt_out_tensor), the head dims back through perm; keep holds the buffers.
local function gather(c, l, which, first, n, perm, dtype, keep)
    local g = c.layers[l + 1]
    local h, d = g.kv_heads, g.head_dim
    local f = ffi.new("float[?]", math.max(h * n * d, 1))
    local rows = c:rows(l, which)
    for head = 0, h - 1 do
        for tok = 0, n - 1 do
            local s, o = rows + ((first + tok) * h + head) * d, f + (head * n + tok) * d
            if perm then
                for j = 0, d - 1 do o[j] = s[perm[j]] end
            else
                ffi.copy(o, s, d * 4)
            end
        end
    end
    local out = ffi.new("uint8_t[?]", math.max(h * n * d * ELEM[dtype], 1))
    core.check(C.cart_from_f32(out, DTYPES[dtype], f, h * n * d), "torch writer")
    keep[#keep + 1] = out
    local t = ffi.new("cart_pt_out_tensor")
    t.dtype, t.ndim, t.data = DTYPES[dtype], 4, out
    t.shape[0], t.shape[1], t.shape[2], t.shape[3] = 1, h, n, d
    return t
end

-- The four lists of cartridge c as cart_pt_out_list entries. empty_frozen:
-- with no frozen rows, one [1, h, 0, d] tensor per layer (Tokasaurus wants
-- the lists) rather than empty lists (the reference writes those).
local function out_lists(c, m, dtype, aliases, empty_frozen, keep)
    if not DTYPES[dtype] then error("torch writer: --dtype must be f32, f16 or bf16, not " .. tostring(dtype), 0) end
    local specs = {
        { "trainable_keys", 0, c.frozen, c.p - c.frozen }, { "trainable_values", 1, c.frozen, c.p - c.frozen },
        { "frozen_keys", 0, 0, c.frozen, aliases and "fixed_keys" }, { "frozen_values", 1, 0, c.frozen, aliases and "fixed_values" },
    }
    local lists = ffi.new("cart_pt_out_list[?]", #specs)
    for i, s in ipairs(specs) do
        local n_tensors = (s[4] > 0 or empty_frozen) and c.n_layer or 0
        local tensors = ffi.new("cart_pt_out_tensor[?]", math.max(n_tensors, 1))
        for l = 0, n_tensors - 1 do
            tensors[l] = gather(c, l, s[2], s[3], s[4], s[2] == 0 and head_permutation(m, l) or nil, dtype, keep)
        end
        local key, alias = ffi.new("char[?]", #s[1] + 1, s[1]), s[5] and ffi.new("char[?]", #s[5] + 1, s[5])
        for _, buffer in ipairs({ tensors, key, alias }) do keep[#keep + 1] = buffer end
        lists[i - 1].key, lists[i - 1].alias, lists[i - 1].tensors, lists[i - 1].n = key, alias or nil, tensors, n_tensors
    end
    return lists, #specs
end

-- Writes cartridge c as the reference trainer's .pt: frozen_keys and
-- frozen_values, with fixed_keys and fixed_values naming the same lists for
-- its code from before August 2025; plain lists of tensors, so that
-- torch.load(path, weights_only=True) reads it too. opts.dtype: bf16
-- (default, the trainer's), f16 or f32.
function torchpt.write_reference(c, m, path, opts)
    opts = opts or {}
    local keep = {}
    local lists, n = out_lists(c, m, opts.dtype or "bf16", true, false, keep)
    local archive = (path:match("([^/]+)$") or "archive"):gsub("%.[^.]*$", "")
    if archive == "" then archive = "archive" end
    core.check(C.cart_pt_write_lists(path, archive, lists, n), "torch writer: " .. path)
    return path
end

-- Tokasaurus' folder name for a cartridge id (its sanitize_cartridge_id).
function torchpt.tokasaurus_dir_name(id)
    return (id:gsub("[/\\]", "-"):gsub("[:|*?<>\"']", "_"):gsub("%.%.+", "_"))
end

-- Writes <dir>/<id>/cartridge.pt and config.yaml as Tokasaurus' cartridge
-- branch reads them (source "local"). Returns the cartridge's folder.
function torchpt.write_tokasaurus(c, m, dir, id, opts)
    opts = opts or {}
    local folder = dir .. "/" .. torchpt.tokasaurus_dir_name(id)
    fs.mkdirs(folder)
    local keep = {}
    local lists, n = out_lists(c, m, opts.dtype or "bf16", false, true, keep)
    core.check(C.cart_pt_write_lists(folder .. "/cartridge.pt", "cartridge", lists, n), "torch writer: " .. folder)
    local name = tostring(m.file:get("general.name") or m.path)
    fs.write_atomic(folder .. "/config.yaml", table.concat({
        "# A cartridge exported by cartridge's recipes/export_cartridge.lua for Tokasaurus.",
        "kv_cache_initializer:",
        ("  max_tokens: %d"):format(c.p),
        "model:",
        ("  pretrained_model_name_or_path: %s"):format(require("cartridge.json").encode(name)),
        "",
    }, "\n"))
    return folder
end

return torchpt
