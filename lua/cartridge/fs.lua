-- cartridge.fs: what a path is, and the sweep of temporary files that dead
-- processes left beside an artifact (engine/fs.h).
--
--   fs.kind("notes.md")            --> "file", 1234   ("dir", "other", "missing")
--   fs.mkdirs("out/run 1")         -- mkdir -p; raises naming the part that failed
--   fs.list("docs")                --> { "engine.md", "formats.md", ... } sorted
--   fs.write_atomic("loss.svg", bytes)
--   fs.same_file(a, b)             --> true when both name one file
--   fs.mtime_ns("a.txt")           --> modification time in ns (nil when missing)
--   fs.touch("a.txt")              -- modification time := now (never creates)
--   fs.parent("out/c.safetensors") --> "out"
--   fs.sweep_temps("out/c.safetensors")   -- prints one line when it removed any
--   fs.check_output("out/c.safetensors")  -- raises unless nothing or a regular file is there
--   fs.free_bytes("out/c.safetensors")    --> bytes still writable there (statvfs)
--   local fd = fs.lock("kv/.lock")         -- nil, "kv/.lock is held by process 123" when taken
--
-- No shell is involved: any path works, spaces and quotes included.

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local fs = {}

local KINDS = {
    [tonumber(C.CART_PATH_MISSING)] = "missing",
    [tonumber(C.CART_PATH_FILE)] = "file",
    [tonumber(C.CART_PATH_DIR)] = "dir",
    [tonumber(C.CART_PATH_OTHER)] = "other",
}

local size = ffi.new("int64_t[1]")

-- "file", "dir", "other" (FIFO, socket, device) or "missing"; and a file's
-- size in bytes. Never opens the path.
function fs.kind(path)
    local k = KINDS[tonumber(C.cart_fs_path_kind(path, size))]
    return k, tonumber(size[0])
end

local names = ffi.new("char[4096]")

-- Removes "<target>.tmp.<pid>.<n>" files of processes that no longer run,
-- and says so in one line on stderr (or through say). Returns the count.
function fs.sweep_temps(target, say)
    local n = tonumber(C.cart_fs_sweep_temps(target, names, 4096))
    if n > 0 then
        local list = ffi.string(names):gsub("\n", ", ")
        local line = ("removed %d stale temporary file%s beside %s (left by a process that died): %s"):format(n,
            n == 1 and "" or "s", target, list)
        if say then say(line) else io.stderr:write(line, "\n") end
    end
    return n
end

function fs.mkdirs(path)
    core.check(C.cart_fs_mkdirs(path), "mkdirs")
end

-- The directory part of a path ("." when there is none).
function fs.parent(path)
    local dir = path:match("^(.*)/[^/]*$")
    if dir == nil then return "." end
    return dir == "" and "/" or dir
end

function fs.same_file(a, b)
    return a == b or C.cart_fs_same_file(a, b) == 1
end

-- A regular file's modification time in nanoseconds since the epoch (a
-- Lua number: exact to the microsecond), or nil when it is missing.
function fs.mtime_ns(path)
    local t = C.cart_fs_mtime_ns(path)
    if t < 0 then return nil end
    return tonumber(t)
end

function fs.touch(path)
    core.check(C.cart_fs_touch(path), "touch")
end

-- Raises, naming what is there and the fix, unless an artifact may be
-- written to path (nothing there, or a regular file): a directory, symbolic
-- link, FIFO, socket or device is never replaced.
function fs.check_output(path)
    core.check(C.cart_fs_check_output(path), "output")
end

-- Bytes still writable on the filesystem of path (a directory, or a file
-- not written yet: its directory's). Raises naming the path when it cannot
-- be examined.
function fs.free_bytes(path)
    local n = tonumber(C.cart_fs_free_bytes(path))
    if n < 0 then error("fs.free_bytes: " .. core.last_error(), 0) end
    return n
end

-- Takes the lock file path for this process (engine/fs.h cart_fs_lock):
-- returns its descriptor, or nil and why (another holder names its
-- process id). fs.unlock(fd) lets it go; the process's end does too.
function fs.lock(path)
    local fd = tonumber(C.cart_fs_lock(path))
    if fd < 0 then return nil, core.last_error() end
    return fd
end

function fs.unlock(fd)
    if fd then C.cart_fs_unlock(fd) end
end

function fs.write_atomic(path, bytes)
    core.check(C.cart_fs_write_atomic(path, bytes, #bytes), "write")
end

-- Removes path and, when it is a directory, everything under it (links
-- are removed, never followed). A missing path is nothing to do. Raises
-- naming the first entry that cannot be removed.
function fs.remove_tree(path)
    local link = C.cart_fs_is_link(path) ~= 0
    local kind = fs.kind(path)
    if kind == "missing" and not link then return end
    if kind == "dir" and not link then
        for _, name in ipairs(fs.list(path)) do fs.remove_tree(path .. "/" .. name) end
    end
    local ok, err = os.remove(path)
    if not ok then error("remove_tree: " .. tostring(err), 0) end
end

-- Sleeps for `seconds` (engine/common.h cart_sleep_seconds).
function fs.sleep(seconds)
    C.cart_sleep_seconds(seconds)
end

-- The entries of dir, sorted bytewise; raises when it cannot be read.
function fs.list(dir)
    local out = ffi.new("cart_fs_listing *[1]")
    core.check(C.cart_fs_list(out, dir), "list")
    local l, names = out[0], {}
    for i = 0, tonumber(C.cart_fs_listing_count(l)) - 1 do names[#names + 1] = ffi.string(C.cart_fs_listing_name(l, i)) end
    C.cart_fs_listing_free(l)
    return names
end

return fs
