-- helper.lua: what the Lua specs share: paths, the shared fixtures, running
-- the host binary, temporary directories.

local helper = {}

local core = require("cartridge.core")

helper.root = core.root
helper.shared = os.getenv("CARTRIDGE_SHARED") or (helper.root .. "/../shared")
helper.bin = os.getenv("CARTRIDGE_BIN") or (helper.root .. "/build/cartridge")

local exists = require("cartridge.defaults").exists
helper.exists = exists

-- The path of a shared fixture, or nil (and a printed skip reason) when
-- ../shared is not there.
function helper.fixture(relative)
    local path = helper.shared .. "/" .. relative
    if exists(path) then return path end
    return nil, ("skipped: %s not found (the ../shared fixtures are absent)"):format(path)
end

-- The independent float64 reference (tests/reference/forward.lua).
function helper.reference()
    if not package.path:find("tests/?.lua", 1, true) then
        package.path = helper.root .. "/tests/?.lua;" .. package.path
    end
    return require("reference.forward")
end

-- Runs a shell command; returns exit code, stdout, stderr.
function helper.run(cmd)
    local out_path, err_path = os.tmpname(), os.tmpname()
    local ok, how, code = os.execute(("%s >%s 2>%s"):format(cmd, out_path, err_path))
    -- LuaJIT's os.execute returns the raw wait status (exit code * 256).
    local rc
    if type(ok) == "number" then rc = ok >= 256 and math.floor(ok / 256) or ok
    else rc = code or (ok and 0 or 1) end
    local function slurp(p)
        local f = io.open(p, "rb")
        local s = f:read("*a")
        f:close()
        os.remove(p)
        return s
    end
    return rc, slurp(out_path), slurp(err_path)
end

-- Single-quotes a string for the shell.
function helper.q(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs the cartridge host with a shell-quoted argument list.
function helper.cartridge(...)
    local args = {}
    for i, a in ipairs({ ... }) do args[i] = helper.q(a) end
    return helper.run(helper.q(helper.bin) .. " " .. table.concat(args, " ") .. " </dev/null")
end

-- A fresh temporary directory (removed by helper.rmdir).
function helper.tmpdir()
    local p = io.popen("mktemp -d /tmp/cartridge-spec.XXXXXX")
    local dir = p:read("*l")
    p:close()
    return dir
end

function helper.rmdir(dir)
    if dir and dir:match("^/tmp/cartridge%-spec%.") then os.execute("rm -rf " .. helper.q(dir)) end
end

function helper.write_file(path, bytes)
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
end

function helper.read_file(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

return helper
