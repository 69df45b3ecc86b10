-- cartridge.proc: child processes without a shell (engine/proc.h). A
-- program and its arguments as a list, never one command string, so nothing
-- needs quoting and nothing is interpreted.
--
--   local proc = require("cartridge.proc")
--   local status = proc.run({ "node", "bench_llama.mjs", path }, { cwd = dir, stdout = dir .. "/out" })
--   local status, text = proc.capture({ exe, "run", recipe, "--case", "x" })   -- its stdout as text
--   local pid = proc.spawn({ exe, "run", "recipes/serve.lua" }, { stdout = log, stderr = log })
--   proc.terminate(pid); proc.wait(pid, 5)
--
-- opts: stdin, stdout, stderr (file paths; absent: this process's streams;
-- stdout == stderr: one file for both), cwd, env (a map of variables set for
-- the child).

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local proc = {}

local function options(opts)
    opts = opts or {}
    local o = ffi.new("cart_proc_options")
    local keep = {}
    o.stdin_path, o.stdout_path, o.stderr_path, o.cwd = opts.stdin, opts.stdout, opts.stderr, opts.cwd
    if opts.env then
        local names = {}
        for k in pairs(opts.env) do names[#names + 1] = k end
        table.sort(names)
        local env = ffi.new("const char *[?]", #names + 1)
        for i, k in ipairs(names) do
            keep[i] = k .. "=" .. tostring(opts.env[k])
            env[i - 1] = keep[i]
        end
        o.env, keep.env = env, env
    end
    return o, keep
end

-- Starts argv (a list of strings); returns its process id.
function proc.spawn(argv, opts)
    local args = ffi.new("const char *[?]", #argv + 1)
    local strings = {}
    for i, a in ipairs(argv) do
        strings[i] = tostring(a)
        args[i - 1] = strings[i]
    end
    local o, keep = options(opts)
    local pid = ffi.new("int64_t[1]")
    core.check(C.cart_proc_spawn(pid, args, o), "proc.spawn")
    local _ = { strings, keep }
    return tonumber(pid[0])
end

-- Waits for pid; returns its exit status (128 + signal when one ended it),
-- or nil when it still runs after `timeout` seconds (default: no limit).
function proc.wait(pid, timeout)
    local status = ffi.new("int32_t[1]")
    local rc = C.cart_proc_wait(pid, timeout or -1, status)
    if rc == C.CART_E_STATE then return nil end
    core.check(rc, "proc.wait")
    return status[0]
end

-- Runs argv to its end; returns its exit status.
function proc.run(argv, opts)
    return proc.wait(proc.spawn(argv, opts))
end

-- Runs argv to its end with its standard output (opts.merge: and its
-- standard error) into a temporary file; returns the exit status and the
-- text.
function proc.capture(argv, opts)
    local path = os.tmpname()
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    o.stdout, o.merge = path, nil
    if opts and opts.merge then o.stderr = path end
    local ok, status = pcall(proc.run, argv, o)
    local f = io.open(path, "rb")
    local text = f and f:read("*a") or ""
    if f then f:close() end
    os.remove(path)
    if not ok then error(status, 0) end
    return status, text
end

function proc.terminate(pid) core.check(C.cart_proc_terminate(pid), "proc.terminate") end
function proc.kill(pid) core.check(C.cart_proc_kill(pid), "proc.kill") end
function proc.alive(pid) return C.cart_proc_alive(pid) ~= 0 end

-- Whether a program is on PATH (or, with a slash, that file is executable).
function proc.exists(program) return C.cart_proc_exists(program) ~= 0 end

return proc
