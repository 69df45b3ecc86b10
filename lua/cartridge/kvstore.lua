-- cartridge.kvstore: the server's disk tier of KV caches (recipes/serve.lua
-- --kv-cache-dir DIR --kv-cache-max SIZE).
--
-- When the server is about to drop the conversation an idle slot holds (the
-- slot is taken for another conversation, or the server stops), the rows of
-- that conversation spill to a file in DIR. A later request whose prompt
-- starts with a spilled conversation's tokens -- in this process or after a
-- restart -- adopts the file: its rows go into a slot behind the cartridge's
-- rows, and only the rest of the prompt is prefilled.
--
--   local store = kvstore.open({ dir = "kv", max_bytes = 2 * 2^30, model = m, kv = "f16",
--       cartridges = { docs = c }, model_name = "qwen3", log = print, warn = print })
--   local entry, n = store:match(cart, prompt)   -- the file sharing the longest prefix with prompt
--   store:adopt(entry, kv, cart, n)              -- its first n tokens' rows into kv; false if the file is bad
--   store:spill(cart, tokens, kv)                -- kv's rows p .. p + #tokens - 1 to a file
--
-- A spill file (docs/formats.md) is a safetensors file written, checked and
-- read by the engine (engine/kvspill.h): the conversation's tokens and each
-- layer's K and V rows in the cache dtype, with __metadata__ naming the model
-- by a hash of its whole tensor data, the cartridge by a hash of its rows,
-- and a checksum of every tensor's bytes; written atomically (temporary
-- file, fsync, rename). This module keeps the directory. Opening DIR reads
-- each file's header and tokens; adopting one checks everything again plus
-- the checksum of all its bytes. A damaged file
-- (truncated, a flipped byte, not a spill file) is removed with a log line;
-- a file for another model, cartridge or cache dtype is left in place (it
-- may belong to another server sharing DIR) and skipped with a log line.
-- Every "kv-*.safetensors" file counts against max_bytes; the least recently
-- used (written or adopted: the file's modification time, so the order
-- survives restarts) go first.

local core = require("cartridge.core")
local fs = require("cartridge.fs")
local ffi = core.ffi
local C = core.C

local kvstore = {}
-- A file is adopted only when it gives at least this many more tokens than
-- the best slot in memory: fewer are cheaper to prefill than to read.
kvstore.MIN_GAIN = 16

local NAME = "^kv%-%x+%.safetensors$"
local TEMP = "^(kv%-%x+%.safetensors)%.tmp%.%d+%.%d+$"

local checksum_buf = ffi.new("char[22]")

-- cs64 of n bytes at ptr (engine/safetensors.h), as "cs64:<16 hex>".
local function cs64(ptr, n)
    C.cart_st_checksum(ptr, n, checksum_buf)
    return ffi.string(checksum_buf)
end

-- A hash of a model that changes whenever any weight byte does: the
-- checksum of every tensor's data, with the engine's fingerprint of the
-- configuration and tensor table. One pass over the weights (about as long
-- as reading them from the page cache).
function kvstore.model_hash(m)
    local parts = { "fingerprint " .. require("cartridge.cart").fingerprint(m) }
    for _, t in ipairs(m.file:tensors()) do
        parts[#parts + 1] = t.name .. " " .. cs64(t.data, t.nbytes)
    end
    local text = table.concat(parts, "\n")
    return cs64(text, #text)
end

-- A hash of a cartridge's rows (and geometry); "none" for the bare model.
function kvstore.cartridge_hash(c)
    if not c then return "none" end
    local parts = { ("p %d frozen %d layers %d heads %d dims %d"):format(c.p, c.frozen, c.n_layer, c.kv_heads,
        c.head_dim) }
    if not c.uniform then parts[#parts + 1] = "per layer " .. c:geometry_text() end
    for l = 0, c.n_layer - 1 do
        for which = 0, 1 do parts[#parts + 1] = cs64(c:rows(l, which), c.p * c.layers[l + 1].row * 4) end
    end
    local text = table.concat(parts, "\n")
    return cs64(text, #text)
end

-- Bytes from "2G", "512M", "1.5G", "64K", "1T" (binary units: K = 1024) or
-- a plain byte count; nil and a message when the text is none of these.
function kvstore.parse_size(text)
    local num, unit = tostring(text):match("^%s*(%d+%.?%d*)%s*([KkMmGgTt]?)[iI]?[Bb]?%s*$")
    local scale = { [""] = 1, k = 2 ^ 10, m = 2 ^ 20, g = 2 ^ 30, t = 2 ^ 40 }
    if not num then
        return nil, ("'%s' is not a size: write bytes or a number with K, M, G or T (e.g. 2G)"):format(tostring(text))
    end
    local bytes = math.floor(tonumber(num) * scale[unit:lower()])
    if bytes < 1 then return nil, ("'%s' is not a size above 0"):format(tostring(text)) end
    return bytes
end

local function common_prefix(a, b)
    local n = 0
    while n < #a and n < #b and a[n + 1] == b[n + 1] do n = n + 1 end
    return n
end
kvstore.common_prefix = common_prefix

local function mib(bytes) return ("%.1f MiB"):format(bytes / 2 ^ 20) end

local Store = {}
Store.__index = Store

-- opts: dir (created if missing), max_bytes, model (cartridge.model), kv
-- ("f16" or "f32", the slots' cache dtype), cartridges ({ name = Cart }),
-- model_name, log (routine lines) and warn (skipped files, failed writes);
-- both function(line) or nil; model_hash (kvstore.model_hash(model), computed
-- when absent); exclusive (take dir/.lock, so that no other process uses
-- the directory while this store is open: its bound holds only for one
-- user). Raises when dir cannot be made, listed or (exclusive) locked.
function kvstore.open(opts)
    local self = setmetatable({}, Store)
    self.dir = opts.dir
    if opts.exclusive then
        fs.mkdirs(self.dir)
        local fd, why = fs.lock(self.dir .. "/.lock")
        if not fd then
            error(("kv-cache: %s is in use (%s): another server has this --kv-cache-dir, and --kv-cache-max holds "
                .. "for one user only; give each server its own directory"):format(self.dir, why), 0)
        end
        self.lock_fd = fd
    end
    self.max_bytes = opts.max_bytes
    self.m = opts.model
    self.dtype = opts.kv or "f16"
    self.model_name = opts.model_name or "model"
    self.log = opts.log or function() end
    self.warn = opts.warn or self.log
    self.cfg = self.m.config
    -- each layer's row: { heads, dims, bytes } (gemma4's layers differ)
    self.rows = {}
    for l, g in ipairs(self.m.layers) do
        self.rows[l - 1] = { heads = g.n_head_kv, dims = g.head_dim,
            bytes = g.n_head_kv * g.head_dim * (self.dtype == "f32" and 4 or 2) }
    end
    self.entries = {} -- every kv-*.safetensors file in dir: { path, name, bytes, used, usable, tokens, cart_hash, p }
    self.clock = 0    -- used order: a larger number is more recent
    self.stats = { hits = 0, hit_tokens = 0, misses = 0, spills = 0, spill_bytes = 0, evictions = 0, skipped = 0 }
    local t0 = C.cart_now_seconds()
    self.model_hash = opts.model_hash or kvstore.model_hash(self.m)
    -- served cartridges by hash (the bare model is "none")
    self.hash_of, self.cart_of = {}, { none = { cart = false, name = self.model_name } }
    for name, c in pairs(opts.cartridges or {}) do
        local h = kvstore.cartridge_hash(c)
        self.hash_of[c] = h
        self.cart_of[h] = { cart = c, name = name }
    end
    fs.mkdirs(self.dir)
    self:scan()
    local usable, n = 0, 0
    for _, e in ipairs(self.entries) do
        n = n + 1
        if e.usable then usable = usable + 1 end
    end
    self.log(("kv-cache: %s holds %d spill file%s (%s), %d for this model and its cartridges; bound %s; "
        .. "model hash %s in %.2f s"):format(self.dir, n, n == 1 and "" or "s", mib(self:total()), usable,
        mib(self.max_bytes), self.model_hash, C.cart_now_seconds() - t0))
    self:evict(0)
    return self
end

function Store:hash(c) return c and self.hash_of[c] or "none" end

function Store:total()
    local sum = 0
    for _, e in ipairs(self.entries) do sum = sum + e.bytes end
    return sum
end

function Store:tick()
    self.clock = self.clock + 1
    return self.clock
end

local CACHE_DTYPE = { f16 = C.CART_F16, f32 = C.CART_F32 }

-- Opens a spill file and checks it against this server's model, its hash
-- and the cache dtype (cart_kvspill_open): the handle (closed when
-- collected), or nil, kind, why: kind "damaged" (not a valid spill file) or
-- "foreign" (valid, but for another model, cache dtype or format version).
function Store:open_file(path)
    local out = ffi.new("cart_kvspill *[1]")
    local rc = C.cart_kvspill_open(out, path, self.m.handle, self.model_hash, CACHE_DTYPE[self.dtype])
    if rc ~= 0 then
        local why = core.last_error()
        if why:sub(1, #path + 2) == path .. ": " then why = why:sub(#path + 3) end
        return nil, rc == C.CART_E_UNSUPPORTED and "foreign" or "damaged", why
    end
    return ffi.gc(out[0], C.cart_kvspill_close)
end

local function meta(f, key)
    local v = C.cart_kvspill_meta(f, key)
    return v ~= nil and ffi.string(v) or nil
end

-- Describes an open spill file for this server: { cart_hash, cart_name, p,
-- n, tokens }, or nil, "foreign", why when it holds a cartridge this server
-- does not serve, or nil, "damaged", why when its cartridge has another row count.
function Store:describe(f)
    local cart_hash = meta(f, "kvspill.cartridge_hash")
    local served = self.cart_of[cart_hash]
    if not served then
        return nil, "foreign", ("for cartridge '%s' (rows hash %s), which this server does not serve with those rows")
            :format(tostring(meta(f, "kvspill.cartridge")), tostring(cart_hash))
    end
    local p = served.cart and served.cart.p or 0
    if C.cart_kvspill_p(f) ~= p then
        return nil, "damaged", ("kvspill.cartridge_p is %s, but the cartridge has %d rows"):format(
            meta(f, "kvspill.cartridge_p"), p)
    end
    local n, ids = tonumber(C.cart_kvspill_n(f)), C.cart_kvspill_tokens(f)
    local tokens = {}
    for i = 0, n - 1 do tokens[i + 1] = ids[i] end
    return { cart_hash = cart_hash, cart_name = served.name, p = p, n = n, tokens = tokens }
end

-- Opens path and describes it (see open_file and describe); the file is
-- closed again.
function Store:inspect(path)
    local f, kind, why = self:open_file(path)
    if not f then return nil, kind, why end
    local d
    d, kind, why = self:describe(f)
    C.cart_kvspill_close(ffi.gc(f, nil))
    return d, kind, why
end

-- Skips a file that cannot be used: one log line; a damaged one is removed.
function Store:skip(path, kind, why)
    self.stats.skipped = self.stats.skipped + 1
    if kind == "damaged" then
        local removed = os.remove(path)
        self.warn(("kv-cache: skipped %s: %s; %s"):format(path, why, removed and "removed it" or "could not remove it"))
        return removed
    end
    self.warn(("kv-cache: skipped %s: %s; left in place"):format(path, why))
    return false
end

-- Reads every spill file's header in dir (and removes temporary files that
-- dead processes left).
function Store:scan()
    local found = {}
    for _, name in ipairs(fs.list(self.dir)) do
        local path = self.dir .. "/" .. name
        local base = name:match(TEMP)
        if base then
            fs.sweep_temps(self.dir .. "/" .. base, self.warn)
        elseif name:find(NAME) then
            local kind, bytes = fs.kind(path)
            if kind == "file" then
                local d, why_kind, why = self:inspect(path)
                local e = { path = path, name = name, bytes = bytes, mtime = fs.mtime_ns(path) or 0, usable = d ~= nil }
                if d then
                    e.tokens, e.cart_hash, e.p = d.tokens, d.cart_hash, d.p
                    found[#found + 1] = e
                elseif not self:skip(path, why_kind, why) then
                    found[#found + 1] = e -- left in place: it counts against the bound
                end
            end
        end
    end
    table.sort(found, function(a, b)
        if a.mtime ~= b.mtime then return a.mtime < b.mtime end
        return a.name < b.name
    end)
    for _, e in ipairs(found) do
        e.used = self:tick()
        self.entries[#self.entries + 1] = e
    end
end

function Store:forget(entry)
    for i, e in ipairs(self.entries) do
        if e == entry then return table.remove(self.entries, i) end
    end
end

-- Removes least recently used files until `need` more bytes fit within the
-- bound; never `protect`. Returns whether they fit.
function Store:evict(need, protect)
    local order = {}
    for _, e in ipairs(self.entries) do
        if e ~= protect then order[#order + 1] = e end
    end
    table.sort(order, function(a, b) return a.used < b.used end)
    local total = self:total()
    for _, e in ipairs(order) do
        if total + need <= self.max_bytes then break end
        os.remove(e.path)
        self:forget(e)
        total = total - e.bytes
        self.stats.evictions = self.stats.evictions + 1
        self.log(("kv-cache: evicted %s (%s, least recently used) to stay within %s"):format(e.name, mib(e.bytes),
            mib(self.max_bytes)))
    end
    return total + need <= self.max_bytes
end

-- Removes least recently used files (never `protect`) until the disk that
-- holds the directory has `need` bytes free, since a full disk would fail
-- every later spill; raises, naming the free space, when even an empty
-- tier would not make room.
function Store:make_room(need, protect)
    local free = fs.free_bytes(self.dir)
    if free >= need then return end
    local order = {}
    for _, e in ipairs(self.entries) do
        if e ~= protect then order[#order + 1] = e end
    end
    table.sort(order, function(a, b) return a.used < b.used end)
    for _, e in ipairs(order) do
        os.remove(e.path)
        self:forget(e)
        self.stats.evictions = self.stats.evictions + 1
        free = fs.free_bytes(self.dir)
        self.log(("kv-cache: evicted %s (%s, least recently used) to make room on a full disk (%s free)"):format(
            e.name, mib(e.bytes), mib(free)))
        if free >= need then return end
    end
    error(("the disk holding %s has %s free, and the file needs %s (other files fill it)"):format(self.dir, mib(free),
        mib(need)), 0)
end

-- Lets the directory go (exclusive stores); the files stay.
function Store:close()
    fs.unlock(self.lock_fd)
    self.lock_fd = nil
end

-- The usable file for cartridge c (nil: the bare model) that shares the
-- longest token prefix with prompt, and that length; nil, 0 when none.
function Store:match(c, prompt)
    local h = self:hash(c)
    local best, best_n = nil, 0
    for _, e in ipairs(self.entries) do
        if e.usable and e.cart_hash == h then
            local n = common_prefix(e.tokens, prompt)
            if n > best_n or (n == best_n and best and n > 0 and e.used > best.used) then best, best_n = e, n end
        end
    end
    return best, best_n
end

-- Copies the rows of the first n tokens of the spill file at path into kv,
-- which holds exactly cartridge c's rows (len p), and sets its len to p + n;
-- with tokens, the file's must still start with their first n. Everything
-- is checked first, the checksum of all its bytes included. Returns the
-- file's description (describe); raises { kind, why } (kind "damaged",
-- "foreign" or "internal") and leaves kv as it was.
function Store:load_rows(path, kv, c, n, tokens)
    local f, kind, why = self:open_file(path)
    if not f then error({ kind = kind, why = why }, 0) end
    local ok, err = pcall(function()
        local d, dkind, dwhy = self:describe(f)
        if not d then error({ kind = dkind, why = dwhy }, 0) end
        if C.cart_kvspill_verify(f) ~= 0 then
            local msg = core.last_error()
            error({ kind = "damaged", why = msg:sub(1, #path + 2) == path .. ": " and msg:sub(#path + 3) or msg }, 0)
        end
        if d.cart_hash ~= self:hash(c) or n > d.n or tokens and common_prefix(d.tokens, tokens) < n then
            error({ kind = "damaged", why = "its tokens changed since the directory was read" }, 0)
        end
        if C.cart_kvspill_load(f, kv.handle, n) ~= 0 then
            error({ kind = "internal", why = core.last_error() }, 0)
        end
        return d
    end)
    C.cart_kvspill_close(ffi.gc(f, nil))
    if not ok then error(err, 0) end
    return err
end

-- Copies the rows of entry's first n tokens into kv, which holds exactly
-- the cartridge's rows (len p), and sets its len to p + n. Everything is
-- checked again first, the checksum of all its bytes included. Returns
-- true; or false after a log line (the file is skipped, and removed when
-- damaged), kv's len left at p.
function Store:adopt(entry, kv, c, n)
    local t0 = C.cart_now_seconds()
    local p = c and c.p or 0
    local ok, err = pcall(self.load_rows, self, entry.path, kv, c, n, entry.tokens)
    if not ok then
        if type(err) ~= "table" then err = { kind = "damaged", why = tostring(err) } end -- an unexpected error
        if err.kind == "internal" then
            self.warn(("kv-cache: could not adopt %s: %s"):format(entry.path, err.why))
        else
            self:forget(entry)
            if not self:skip(entry.path, err.kind, err.why) and err.kind == "foreign" then
                entry.usable = false
                self.entries[#self.entries + 1] = entry
            end
        end
        if kv:len() > p then kv:truncate(p) end
        return false
    end
    entry.used = self:tick()
    pcall(fs.touch, entry.path)
    self.stats.hits = self.stats.hits + 1
    self.stats.hit_tokens = self.stats.hit_tokens + n
    self.log(("kv-cache: adopted %d of %d tokens from %s in %.1f ms"):format(n, #entry.tokens, entry.name,
        (C.cart_now_seconds() - t0) * 1000))
    return true
end

function Store:note_miss()
    self.stats.misses = self.stats.misses + 1
end

local function token_array(tokens)
    local ids = ffi.new("int32_t[?]", math.max(#tokens, 1))
    for i = 1, #tokens do ids[i - 1] = tokens[i] end
    return ids
end

-- Writes a spill file at path holding kv's rows p .. p + #tokens - 1
-- (tokens: the ids they hold, after cartridge c's p rows), atomically;
-- raises when kv does not hold them or the write fails.
function Store:write_file(path, c, tokens, kv)
    local h = self:hash(c)
    local served = self.cart_of[h]
    local owner = ffi.new("cart_kvspill_owner", { model = self.model_name, model_hash = self.model_hash,
        cartridge = served and served.name or "?", cartridge_hash = h, p = c and c.p or 0 })
    core.check(C.cart_kvspill_write(path, kv.handle, token_array(tokens), #tokens, owner), "kvstore")
end

-- Writes kv's rows p .. p + #tokens - 1 (tokens: the ids they hold, after
-- cartridge c's p rows) to a spill file, unless a file already holds them
-- (then it becomes the most recently used). Files whose tokens are a prefix
-- of these are removed (this one covers them); least recently used files
-- make room, never `protect`. Never raises: a failed write is a log line.
-- Returns true when a file was written.
function Store:spill(c, tokens, kv, protect)
    local n = #tokens
    if n == 0 then return false end
    local h = self:hash(c)
    for _, e in ipairs(self.entries) do
        if e.usable and e.cart_hash == h and #e.tokens >= n and common_prefix(e.tokens, tokens) == n then
            e.used = self:tick()
            pcall(fs.touch, e.path)
            return false
        end
    end
    local t0 = C.cart_now_seconds()
    local p = c and c.p or 0
    local data_bytes = n * 4
    for l = 0, self.cfg.n_layer - 1 do data_bytes = data_bytes + 2 * n * self.rows[l].bytes end
    if data_bytes > self.max_bytes then
        self.warn(("kv-cache: not spilled: a conversation of %d tokens needs %s, above --kv-cache-max %s"):format(n,
            mib(data_bytes), mib(self.max_bytes)))
        return false
    end
    local ok, err = pcall(function()
        local ids = token_array(tokens)
        local key = h .. " " .. ffi.string(ids, n * 4)
        local name = "kv-" .. cs64(key, #key):sub(6) .. ".safetensors"
        local path = self.dir .. "/" .. name
        local served = self.cart_of[h]
        self:evict(data_bytes + 4096, protect) -- the header is a few hundred bytes
        self:make_room(data_bytes + 4096, protect)
        self:write_file(path, c, tokens, kv)
        local _, bytes = fs.kind(path)
        local copy = {}
        for i = 1, n do copy[i] = tokens[i] end
        -- this file covers those whose tokens are a prefix of its own (and
        -- replaces one of the same name)
        for i = #self.entries, 1, -1 do
            local e = self.entries[i]
            if e.name == name or (e ~= protect and e.usable and e.cart_hash == h and #e.tokens <= n
                    and common_prefix(e.tokens, tokens) == #e.tokens) then
                table.remove(self.entries, i)
                if e.name ~= name then os.remove(e.path) end
            end
        end
        local entry = { path = path, name = name, bytes = bytes, used = self:tick(), usable = true, tokens = copy,
            cart_hash = h, p = p }
        self.entries[#self.entries + 1] = entry
        self:evict(0, entry)
        self.stats.spills = self.stats.spills + 1
        self.stats.spill_bytes = self.stats.spill_bytes + bytes
        self.log(("kv-cache: spilled %d tokens of '%s' (%s) to %s in %.1f ms"):format(n, served and served.name or "?",
            mib(bytes), name, (C.cart_now_seconds() - t0) * 1000))
    end)
    if not ok then
        self.warn(("kv-cache: could not spill %d tokens to %s: %s"):format(n, self.dir, tostring(err)))
        return false
    end
    return true
end

-- Files and bytes in the directory (spill files only).
function Store:usage()
    return #self.entries, self:total()
end

return kvstore
