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
--   util.kvspill_cartridge(m)     the cartridge fuzz_kvspill serves (and
--                                 make_seeds.lua spills against)
--   util.memfile()                an in-memory file with a path
--                                 (/proc/self/fd/N) for loaders that take paths
--   util.same(a, b)               deep equality of decoded JSON values
--   util.reader(s)                a cursor over the input's bytes
--   util.check_json(text)         json.decode's contract on any bytes (see
--                                 fuzz_json.lua); the decoded value or nil

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

function util.kvspill_cartridge(m)
    local c = require("cartridge.cart").new(m, 3, 1)
    c:init_random(1, 0.5)
    return c
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

-- Whether v holds an infinite number (json.lua decodes numbers beyond the
-- double range as +-inf, keeping their text; json.encode refuses them).
local function has_infinity(v, depth)
    if type(v) == "number" then return v == math.huge or v == -math.huge end
    if type(v) ~= "table" or depth > 300 then return false end
    for _, x in pairs(v) do
        if has_infinity(x, depth + 1) then return true end
    end
    return false
end

-- json.decode on any bytes: a refusal is "json: <what> at byte N" with N in
-- the input (or just past it), and anything that is not UTF-8 is refused;
-- an accepted value encodes (unless it holds an infinity, which encode
-- refuses as documented) into UTF-8 that decodes back to the same value and
-- encodes again to the same text. Returns the value, or nil when refused.
function util.check_json(text)
    local json = require("cartridge.json")
    local C = require("cartridge.core").C
    local ok, v = pcall(json.decode, text)
    if not ok then
        util.expect_rejection(v, { "json: " }, "json.decode")
        local at = tonumber(tostring(v):match(" at byte (%d+)$"))
        if not at or at < 1 or at > #text + 1 then util.finding("json.decode: no byte position in range: %s", v) end
        return nil
    end
    if v == nil then util.finding("json.decode returned nil") end
    if C.cart_utf8_invalid_offset(text, #text) >= 0 then
        util.finding("json.decode accepted %d bytes that are not UTF-8", #text)
    end
    local ok2, out = pcall(json.encode, v)
    if not ok2 then
        if has_infinity(v, 0) and type(out) == "string" and out:find("^json.encode: cannot encode %-?inf") then
            return v -- documented: infinities decode but do not encode
        end
        util.finding("json.encode of a decoded value failed: %s", describe(out))
    end
    if C.cart_utf8_invalid_offset(out, #out) >= 0 then util.finding("json.encode wrote bytes that are not UTF-8") end
    local ok3, again = pcall(json.decode, out)
    if not ok3 then util.finding("json.decode of json.encode's output %q failed: %s", out, tostring(again)) end
    if not util.same(v, again) then util.finding("json round trip changed the value: %s", out) end
    local out2 = json.encode(again)
    if out2 ~= out then util.finding("json encoding is not stable: %s then %s", out, out2) end
    return v
end

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
