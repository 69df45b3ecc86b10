-- fuzz_util.lua: what the Lua fuzz targets (and make_seeds.lua) share.
--
--   util.finding(fmt, ...)        raise a finding (the harness aborts)
--   util.known_finding(tag, fmt, ...)
--                                 the same for a finding already reported in
--                                 code this harness does not own; skipped
--                                 (counted) when $CART_FUZZ_KNOWN lists the
--                                 tag (comma-separated), so that a long run
--                                 can go on past it
--   util.expect_rejection(err, prefixes, what)
--                                 a caught error must be a string starting
--                                 with one of the prefixes, else a finding
--   util.model_path()             the small random-weight qwen3 the targets
--                                 load, generated once into $TMPDIR
--   util.memfile()                an in-memory file with a path
--                                 (/proc/self/fd/N) for loaders that take paths
--   util.same(a, b)               deep equality of decoded JSON values
--   util.reader(s)                a cursor over the input's bytes

local ffi = require("ffi")

local util = {}

function util.finding(fmt, ...)
    error("FINDING: " .. fmt:format(...), 0)
end

local known = {}
for tag in (os.getenv("CART_FUZZ_KNOWN") or ""):gmatch("[^,%s]+") do known[tag] = 0 end
util.known = known

function util.known_finding(tag, fmt, ...)
    if known[tag] then
        known[tag] = known[tag] + 1
        return
    end
    error(("FINDING [%s]: %s (CART_FUZZ_KNOWN=%s skips it)"):format(tag, fmt:format(...), tag), 0)
end

local function describe(v)
    if type(v) == "table" then
        local parts = {}
        for k, x in pairs(v) do parts[#parts + 1] = tostring(k) .. "=" .. tostring(x) end
        table.sort(parts)
        return "a table {" .. table.concat(parts, ", ") .. "}"
    end
    return ("a %s (%s)"):format(type(v), tostring(v))
end
util.describe = describe

function util.expect_rejection(err, prefixes, what)
    if type(err) ~= "string" then
        util.finding("%s raised %s, not a string message", what, describe(err))
    end
    for _, p in ipairs(prefixes) do
        if err:sub(1, #p) == p and #err > #p then return end
    end
    util.finding("%s raised an unexpected error: %s", what, err)
end

-- The model every Lua target loads: deterministic bytes, so that seeds
-- saved against it (make_seeds.lua) match its fingerprint.
util.MODEL_OPTS = { preset = "qwen3-tiny", layers = 2, embd = 32, ff = 64, heads = 2, kv_heads = 1,
    head_dim = 16, ctx = 512, dtype = "f32", seed = 7, name = "fuzz-model", quiet = true }
util.MODEL_VERSION = 1

function util.model_path()
    local dir = os.getenv("TMPDIR")
    if not dir or dir == "" then dir = "/tmp" end
    local path = ("%s/cartridge-fuzz-model-v%d.gguf"):format(dir, util.MODEL_VERSION)
    local f = io.open(path, "rb")
    if f then
        f:close()
        return path
    end
    local opts = {}
    for k, v in pairs(util.MODEL_OPTS) do opts[k] = v end
    opts.out = path
    require("cartridge.randmodel").write(opts) -- atomic: temporary file, then rename
    return path
end

ffi.cdef [[
int memfd_create(const char *name, unsigned int flags);
int ftruncate(int fd, int64_t length);
int64_t pwrite(int fd, const void *buf, size_t count, int64_t offset);
int close(int fd);
]]

local MemFile = {}
MemFile.__index = MemFile

function util.memfile()
    local fd = ffi.C.memfd_create("cartridge-fuzz", 1) -- MFD_CLOEXEC
    if fd < 0 then error("memfd_create failed", 0) end
    return setmetatable({ fd = fd, path = "/proc/self/fd/" .. fd }, MemFile)
end

-- Replaces the file's contents with s.
function MemFile:set(s)
    if ffi.C.ftruncate(self.fd, 0) ~= 0 then error("ftruncate failed", 0) end
    if #s > 0 and ffi.C.pwrite(self.fd, s, #s, 0) ~= #s then error("pwrite failed", 0) end
end

-- Deep equality of two decoded JSON values (json.null compares as itself).
local function same(a, b, depth)
    if a == b then return true end
    if type(a) ~= "table" or type(b) ~= "table" or depth > 300 then return false end
    for k, v in pairs(a) do
        if not same(v, b[k], depth + 1) then return false end
    end
    for k in pairs(b) do
        if a[k] == nil then return false end
    end
    return true
end
function util.same(a, b) return same(a, b, 0) end

-- A cursor over s: byte() gives the next byte (0 past the end), take(n) the
-- next n bytes, upto(c) the bytes before the next c (skipping it), rest().
local Reader = {}
Reader.__index = Reader

function util.reader(s) return setmetatable({ s = s, pos = 1 }, Reader) end

function Reader:done() return self.pos > #self.s end

function Reader:byte()
    local b = self.s:byte(self.pos) or 0
    self.pos = self.pos + 1
    return b
end

function Reader:upto(c)
    local at = self.s:find(c, self.pos, true)
    local piece
    if at then
        piece = self.s:sub(self.pos, at - 1)
        self.pos = at + #c
    else
        piece = self.s:sub(self.pos)
        self.pos = #self.s + 1
    end
    return piece
end

function Reader:rest()
    local piece = self.s:sub(self.pos)
    self.pos = #self.s + 1
    return piece
end

return util
