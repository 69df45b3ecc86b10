-- cartridge.core: the FFI binding to libcartridge.
--
-- The declarations come from the engine's public C headers themselves:
-- engine/cartridge.h is read at load time, its quoted #includes are followed
-- in order, comments and preprocessor lines are dropped (an `#ifdef
-- __cplusplus` block is skipped whole) and the rest goes to ffi.cdef. The
-- headers are written for this (fixed-width types, explicit enum values, no
-- macros), so nothing here is a hand-kept copy that could drift; the abi spec
-- checks every struct's size against the C compiler's.
--
-- The library: inside the `cartridge` host the engine is linked into the
-- executable and its symbols are in ffi.C. Under plain luajit (busted, a
-- user's script) it is loaded from $CARTRIDGE_LIB, else <root>/build/, else
-- the system's library path.

local ffi = require("ffi")

local core = {}

local function dirname(path)
    return path:match("^(.*)/[^/]*$") or "."
end

-- The project root: the host tells us; otherwise two levels above this file
-- (lua/cartridge/core.lua).
local function find_root()
    local host = package.loaded["cartridge.host"]
    if type(host) == "table" and host.home then return host.home end
    local env = os.getenv("CARTRIDGE_HOME")
    if env and env ~= "" then return env end
    local source = debug.getinfo(1, "S").source
    if source:sub(1, 1) == "@" then
        return dirname(dirname(dirname(source:sub(2))))
    end
    return "."
end

local function read_file(path)
    local f, err = io.open(path, "rb")
    if not f then return nil, err end
    local text = f:read("*a")
    f:close()
    return text
end

-- The declarations of `path` and the headers it includes with quotes, each
-- header once, in include order.
local function collect_declarations(path, seen, out)
    if seen[path] then return end
    seen[path] = true
    local text, err = read_file(path)
    if not text then
        error("cartridge: cannot read the engine header " .. path .. " (" .. tostring(err) ..
            "); set CARTRIDGE_HOME to the directory that holds engine/", 0)
    end
    text = text:gsub("/%*.-%*/", ""):gsub("//[^\n]*", "")
    local dir = dirname(path)
    local skipping = {} -- stack of booleans, one per open #if
    for line in (text .. "\n"):gmatch("([^\n]*)\n") do
        local directive = line:match("^%s*#%s*(%a+)")
        if directive then
            if directive == "ifdef" or directive == "ifndef" or directive == "if" then
                local cplusplus = line:match("__cplusplus") ~= nil and directive == "ifdef"
                skipping[#skipping + 1] = cplusplus
            elseif directive == "endif" then
                skipping[#skipping] = nil
            elseif directive == "include" and not skipping[#skipping] then
                local name = line:match('^%s*#%s*include%s+"([^"]+)"')
                if name then collect_declarations(dir .. "/" .. name, seen, out) end
            end
        elseif not skipping[#skipping] and line:find("%S") then
            out[#out + 1] = line
        end
    end
end

core.root = find_root()
core.header = core.root .. "/engine/cartridge.h"

local declarations = {}
collect_declarations(core.header, {}, declarations)
core.cdef = table.concat(declarations, "\n")
ffi.cdef(core.cdef)

local function in_process()
    local ok = pcall(function() return ffi.C.cart_version end)
    return ok
end

local function load_library()
    if in_process() then return ffi.C, "(linked into the host)" end
    local candidates = {}
    local env = os.getenv("CARTRIDGE_LIB")
    if env and env ~= "" then candidates[#candidates + 1] = env end
    candidates[#candidates + 1] = core.root .. "/build/libcartridge.so"
    candidates[#candidates + 1] = "cartridge"
    local errors = {}
    for _, path in ipairs(candidates) do
        local ok, lib = pcall(ffi.load, path)
        if ok then return lib, path end
        errors[#errors + 1] = "  " .. path .. ": " .. tostring(lib)
    end
    error("cartridge: cannot load libcartridge; build it (cmake -S . -B build && cmake --build " ..
        "build) or set CARTRIDGE_LIB to its path. Tried:\n" .. table.concat(errors, "\n"), 0)
end

core.C, core.library = load_library()
local C = core.C

-- The engine's last error message on this thread.
-- A new engine object: calls ctor(out, ...) with out a `ctype *[1]`
-- ("cart_adam"), raises "what: <the engine's message>" on failure, and returns
-- the pointer with dtor attached as its finalizer.
function core.new(ctype, ctor, dtor, what, ...)
    local out = ffi.new(ctype .. " *[1]")
    core.check(ctor(out, ...), what)
    return ffi.gc(out[0], dtor)
end

-- Frees obj[field or "handle"] now, with its finalizer detached, and clears
-- the field; a second call does nothing.
function core.free(obj, dtor, field)
    field = field or "handle"
    local h = obj[field]
    if h ~= nil then
        dtor(ffi.gc(h, nil))
        obj[field] = nil
    end
end

function core.last_error()
    return ffi.string(C.cart_last_error())
end

-- Raises a Lua error for a failed engine call: "<what>: <engine message>".
-- Returns nothing when rc is CART_OK.
function core.check(rc, what)
    if rc ~= 0 then
        local message = core.last_error()
        if message == "" then message = ffi.string(C.cart_status_name(rc)) end
        error(what .. ": " .. message, 0)
    end
end

-- Converts a cart_str to a Lua string.
function core.str(s)
    if s.data == nil then return "" end
    return ffi.string(s.data, s.len)
end

-- Turns a 64-bit integer cdata into a Lua number when it is exactly
-- representable (|x| <= 2^53), else leaves it as cdata.
function core.int(x)
    local n = tonumber(x)
    if n and n >= -9007199254740992 and n <= 9007199254740992 then return n end
    return x
end

-- A uint64_t as 16 lowercase hex digits (a Lua number would lose bits).
function core.hex64(v)
    return ("%08x%08x"):format(tonumber(bit.rshift(v, 32)), tonumber(bit.band(v, 0xffffffffULL)))
end

core.ffi = ffi
return core
