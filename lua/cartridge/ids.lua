-- cartridge.ids: token-id sequences held in C memory, as int32 the engine
-- reads without a copy.
--
--   local ids = require("cartridge.ids")
--   local s = ids.new()                  -- empty (ids.new(n) reserves room for n)
--   s:push(42); s:extend({ 1, 2, 3 })    -- a Lua list, another sequence, or (ptr, n)
--   #s, s:get(0), s.data[0]              -- length; 0-based reads; the int32_t *
--   local t = s:sub(1, 2)                -- a copy of 2 ids from index 1
--   s:truncate(1); s:list()              -- a Lua list of the ids
--   local ptr, n = ids.view(x)           -- any id sequence as int32_t *, count
--
-- The engine's functions that take ids (model forward, tokenizer decode,
-- cartridge capture, the trainer, the drafter) accept a sequence directly.
-- Lua lists are still accepted everywhere; they are copied into scratch
-- memory at the call.

local core = require("cartridge.core")
local ffi = core.ffi

local ids = {}

ffi.cdef([[
typedef struct cartridge_lua_ids { int32_t *data; int64_t n; int64_t cap; } cartridge_lua_ids;
]])
pcall(ffi.cdef, "void *realloc(void *, size_t); void free(void *);")
local libc = ffi.C

local Ids = {}
Ids.__index = Ids

local function reserve(self, n)
    if n <= self.cap then return end
    local cap = math.max(16, tonumber(self.cap))
    while cap < n do cap = cap * 2 end
    local p = libc.realloc(self.data, cap * 4)
    if p == nil then error(("ids: out of memory for %d token ids"):format(cap), 0) end
    self.data = ffi.cast("int32_t *", p)
    self.cap = cap
end

local ctype = ffi.metatype("cartridge_lua_ids", {
    __index = Ids,
    __len = function(self) return tonumber(self.n) end,
    __gc = function(self)
        if self.data ~= nil then libc.free(self.data) end
        self.data, self.n, self.cap = nil, 0, 0
    end,
    __tostring = function(self) return ("ids(%d)"):format(tonumber(self.n)) end,
})
ids.ctype = ctype

function ids.is(x) return ffi.istype(ctype, x) end

-- An empty sequence with room for `reserve_n` ids.
function ids.new(reserve_n)
    local self = ctype()
    if reserve_n and reserve_n > 0 then reserve(self, reserve_n) end
    return self
end

-- A new sequence holding a copy of src (a Lua list, a sequence, or ptr with n).
function ids.from(src, n)
    local self = ids.new()
    self:extend(src, n)
    return self
end

local scratch, scratch_cap = nil, 0

-- Any id sequence as (int32_t *, count). A Lua list is copied into scratch
-- memory that the next view() reuses: pass the pointer to C right away.
function ids.view(x, n)
    if ffi.istype(ctype, x) then return x.data, tonumber(x.n) end
    if type(x) == "table" then
        n = #x
        if n > scratch_cap then
            scratch_cap = math.max(n, 2 * scratch_cap, 64)
            scratch = ffi.new("int32_t[?]", scratch_cap)
        end
        for i = 1, n do scratch[i - 1] = x[i] end
        return scratch, n
    end
    if type(x) == "cdata" then
        if n == nil then error("ids.view: an int32_t pointer needs its count", 2) end
        return x, n
    end
    error("ids: expected token ids (a Lua list or a cartridge.ids sequence), got " .. type(x), 2)
end

function Ids:push(id)
    local n = tonumber(self.n)
    if n >= self.cap then reserve(self, n + 1) end
    self.data[n] = id
    self.n = n + 1
end

-- Appends src: a Lua list, another sequence, or an int32_t * with its count.
function Ids:extend(src, n)
    if type(src) == "table" then
        local at = tonumber(self.n)
        reserve(self, at + #src)
        for i = 1, #src do self.data[at + i - 1] = src[i] end
        self.n = at + #src
        return self
    end
    local ptr, count = ids.view(src, n)
    local at = tonumber(self.n)
    reserve(self, at + count)
    if count > 0 then ffi.copy(self.data + at, ptr, count * 4) end
    self.n = at + count
    return self
end

-- Room for `more` ids past the end: returns the int32_t * where they go. The
-- caller writes them and calls grow(count).
function Ids:tail(more)
    reserve(self, tonumber(self.n) + more)
    return self.data + self.n
end

function Ids:grow(count)
    if self.n + count > self.cap then error("ids:grow past the reserved room", 2) end
    self.n = self.n + count
end

-- Id i (0-based).
function Ids:get(i)
    if i < 0 or i >= self.n then
        error(("ids:get(%d) of a sequence of %d"):format(i, tonumber(self.n)), 2)
    end
    return self.data[i]
end

function Ids:last() return self.n > 0 and self.data[self.n - 1] or nil end

-- A copy of `count` ids from index `from` (0-based).
function Ids:sub(from, count)
    if from < 0 or count < 0 or from + count > self.n then
        error(("ids:sub(%d, %d) of a sequence of %d"):format(from, count, tonumber(self.n)), 2)
    end
    return ids.from(self.data + from, count)
end

function Ids:truncate(n)
    if n < 0 or n > self.n then
        error(("ids:truncate(%d) of a sequence of %d"):format(n, tonumber(self.n)), 2)
    end
    self.n = n
end

-- The ids as a Lua list.
function Ids:list()
    local out = {}
    for i = 0, tonumber(self.n) - 1 do out[i + 1] = self.data[i] end
    return out
end

-- Whether two sequences (or a sequence and a Lua list) hold the same ids.
function ids.equal(a, b)
    local pa, na = ids.view(a)
    if type(b) == "table" then
        if na ~= #b then return false end
        for i = 1, na do if pa[i - 1] ~= b[i] then return false end end
        return true
    end
    local pb, nb = ids.view(b)
    return na == nb and (na == 0 or ffi.C.memcmp(pa, pb, na * 4) == 0)
end
pcall(ffi.cdef, "int memcmp(const void *, const void *, size_t);")

return ids
