-- fuzz_kvspill.lua: libFuzzer target (through lua_harness.c) for the
-- server's disk tier reading a spill file (cartridge.kvstore: the directory
-- scan, match and adoption), on top of the safetensors reader.
--
-- Each input is the bytes of one spill file, put alone in a directory that a
-- store over the fuzz model then opens; the store serves the bare model and
-- one cartridge ("a", 3 rows, random rows of seed 1, as make_seeds.lua saves
-- its seeds against). Nothing may raise. The file must end up in exactly one
-- state: usable (its tokens in the vocabulary), skipped with one log line
-- that names it (removed when damaged, left when foreign), and a usable file
-- is then matched against a prompt made of its own tokens and adopted into a
-- cache holding the cartridge's rows: adopt returns true with the cache at p
-- + n rows holding the file's rows, or false after a log line naming the
-- file with the cache back at p rows. Seeds come from kvstore:spill itself,
-- so mutations start from files that pass every check.

local util = require("fuzz_util")
local kvstore = require("cartridge.kvstore")
local model = require("cartridge.model")
local safetensors = require("cartridge.safetensors")
local fs = require("cartridge.fs")
local ffi = require("ffi")

local m = model.load(util.model_path())
local c = util.kvspill_cartridge(m)
local model_hash = kvstore.model_hash(m)
ffi.cdef("int memcmp(const void *a, const void *b, size_t n); int getpid(void); int kill(int pid, int sig);")
-- the store reads a whole directory: one per fuzzing process, and those of
-- processes that are gone removed
local base = os.getenv("TMPDIR")
if not base or base == "" then base = "/tmp" end
for _, name in ipairs(fs.list(base)) do
    local pid = tonumber(name:match("^cartridge%-fuzz%-kvspill%-(%d+)$"))
    if pid and ffi.C.kill(pid, 0) ~= 0 and ffi.errno() ~= 1 then -- 1: EPERM, alive
        for _, f in ipairs(fs.list(base .. "/" .. name)) do os.remove(base .. "/" .. name .. "/" .. f) end
        os.remove(base .. "/" .. name)
    end
end
local dir = ("%s/cartridge-fuzz-kvspill-%d"):format(base, ffi.C.getpid())
fs.mkdirs(dir)
local path = dir .. "/kv-00000000000000aa.safetensors"
local kv = m:new_kv(c.p + 4096, "f16")
local bare_kv = m:new_kv(4096, "f16")

local lines = {}
local function log(line)
    if type(line) ~= "string" then util.finding("kvstore logged a %s", type(line)) end
    lines[#lines + 1] = line
end

local function mentions_file()
    for _, l in ipairs(lines) do
        if l:find(path, 1, true) or l:find("kv-00000000000000aa.safetensors", 1, true) then return true end
    end
    return false
end

-- The rows the file holds for its first n tokens equal kv's from p on.
local function same_rows(file_path, target, p, n)
    local f = safetensors.open(file_path)
    local rb = target:row_bytes()
    for l = 0, m.config.n_layer - 1 do
        for which, side in ipairs({ "k", "v" }) do
            local t = f:tensor(("layers.%d.%s"):format(l, side))
            if ffi.C.memcmp(target:raw_rows(l, which - 1) + p * rb, t.data, n * rb) ~= 0 then
                f:close()
                return false
            end
        end
    end
    f:close()
    return true
end

return function(data)
    lines = {}
    os.remove(path)
    local fd = io.open(path, "wb")
    fd:write(data)
    fd:close()
    local ok, store = pcall(kvstore.open, { dir = dir, max_bytes = 2 ^ 30, model = m, kv = "f16",
        cartridges = { a = c }, model_name = "fuzz-model", model_hash = model_hash, log = log })
    if not ok then util.finding("kvstore.open raised: %s", util.describe(store)) end
    local entry = store.entries[1]
    local present = fs.kind(path) == "file"
    if #store.entries > 1 then util.finding("one file gave %d entries", #store.entries) end
    if store.stats.skipped > 0 then
        if store.stats.skipped ~= 1 or not mentions_file() then
            util.finding("skipped %d file(s) without a log line naming it: %s", store.stats.skipped,
                table.concat(lines, " | "))
        end
        if entry and entry.usable then util.finding("a skipped file is usable") end
        if present ~= (entry ~= nil) then util.finding("a skipped file is %s but %s", present and "present" or "gone",
            entry and "listed" or "not listed") end
    elseif not (entry and entry.usable and present) then
        util.finding("the file is neither usable nor skipped")
    end
    if not (entry and entry.usable) then return end
    for _, id in ipairs(entry.tokens) do
        if id < 0 or id >= m.config.n_vocab then util.finding("token %d outside the vocabulary", id) end
    end
    local target_cart = c
    if entry.cart_hash == "none" then target_cart = nil end -- the bare model's file
    local target = target_cart and kv or bare_kv
    local p = target_cart and c.p or 0
    local prompt = {}
    for i, id in ipairs(entry.tokens) do prompt[i] = id end
    prompt[#prompt + 1] = 0
    local e, n = store:match(target_cart, prompt)
    if e ~= entry or n ~= #entry.tokens then util.finding("the file does not match its own tokens (%s)", tostring(n)) end
    if p + n > target:capacity() then return end -- longer than this cache: the server's --ctx refuses such prompts
    target:truncate(0)
    if target_cart then c:append_to(target) end
    lines = {}
    local ok2, adopted = pcall(store.adopt, store, e, target, target_cart, n)
    if not ok2 then util.finding("adopt raised: %s", util.describe(adopted)) end
    if adopted then
        if target:len() ~= p + n then util.finding("adopted %d tokens, cache len %d, p %d", n, target:len(), p) end
        if not same_rows(path, target, p, n) then util.finding("adopted rows differ from the file's") end
    else
        if target:len() ~= p then util.finding("a refused adoption left %d rows, not p = %d", target:len(), p) end
        if not mentions_file() then util.finding("a refused adoption logged nothing naming the file") end
    end
end
