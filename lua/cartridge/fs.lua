-- cartridge.fs: what a path is, and the sweep of temporary files that dead
-- processes left beside an artifact (engine/fs.h).
--
--   fs.kind("notes.md")            --> "file", 1234   ("dir", "other", "missing")
--   fs.sweep_temps("out/c.safetensors")   -- prints one line when it removed any

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

return fs
