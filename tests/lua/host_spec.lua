-- host_spec.lua: the `cartridge` executable (host/main.c), run as a
-- program. Uses $CARTRIDGE_BIN, else build/cartridge under the repository
-- root (busted's working directory); pending when neither exists.

local bin = os.getenv("CARTRIDGE_BIN") or "build/cartridge"

local function exists(path)
    local f = io.open(path, "rb")
    if f then
        f:close()
    end
    return f ~= nil
end

local function slurp(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

local function spit(path, text)
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
end

-- Quotes s for /bin/sh.
local function q(s)
    return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function mkdtemp()
    local p = assert(io.popen("mktemp -d"))
    local dir = p:read("*l")
    p:close()
    return dir
end

-- Runs `cmd` (a shell command line) with `stdin` (a string, default empty) and
-- returns exit status, stdout, stderr. The status comes from the shell itself,
-- because LuaJIT's popen():close() does not report it.
local function sh(cmd, stdin)
    local dir = mkdtemp()
    spit(dir .. "/in", stdin or "")
    os.execute(string.format("(%s) <%s >%s 2>%s; echo $? >%s", cmd, q(dir .. "/in"),
        q(dir .. "/out"), q(dir .. "/err"), q(dir .. "/rc")))
    local rc = tonumber(slurp(dir .. "/rc"):match("%d+"))
    local out, err = slurp(dir .. "/out"), slurp(dir .. "/err")
    os.execute("rm -rf " .. q(dir))
    return rc, out, err
end

-- Runs the executable with the given (unquoted) arguments.
local function cartridge(args, stdin, env_prefix)
    local parts = {}
    for i, a in ipairs(args) do
        parts[i] = q(a)
    end
    return sh((env_prefix or "") .. q(bin) .. " " .. table.concat(parts, " "), stdin)
end

describe("the cartridge executable", function()
    if not exists(bin) then
        pending(string.format("skipped: %s not found; build it (cmake -S . -B build && cmake --build build) "
            .. "or set CARTRIDGE_BIN", bin))
        return
    end

    local tmp
    before_each(function()
        tmp = mkdtemp()
    end)
    after_each(function()
        os.execute("rm -rf " .. q(tmp))
    end)

    it("prints usage with the subcommands, the environment and home for --help and exits 0", function()
        local rc, out = cartridge({ "--help" })
        assert.are.equal(0, rc)
        assert.matches("^usage: cartridge", out)
        for _, needle in ipairs({ "run FILE", "-e CODE", "cartridge -", "--version",
                                  "CARTRIDGE_HOME", "CARTRIDGE_TRACEBACK", "CARTRIDGE_HISTORY", "home now: " }) do
            assert.is_truthy(out:find(needle, 1, true), "--help lacks " .. needle)
        end
    end)

    it("prints its version, LuaJIT's and the kernels' ISA level for --version and exits 0", function()
        local rc, out = cartridge({ "--version" })
        assert.are.equal(0, rc)
        assert.matches("^cartridge %d+%.%d+%.%d+ %(LuaJIT [^;]+; kernels: %a[%w]*, best here: %a[%w]*; [^)]+%)\n$", out)
        -- a forced level is the one in use
        rc, out = cartridge({ "--version" }, nil, "CART_ISA=scalar ")
        assert.are.equal(0, rc)
        assert.truthy(out:find("kernels: scalar,", 1, true), out)
    end)

    it("refuses a CART_ISA it cannot run, naming the levels it can, before running anything", function()
        local rc, out, err = cartridge({ "-e", "print('ran')" }, nil, "CART_ISA=sse9 ")
        assert.are.equal(1, rc)
        assert.are.equal("", out)
        assert.truthy(err:find("CART_ISA=sse9 is not a level", 1, true) and err:find("scalar", 1, true), err)
        -- a real level this build or CPU lacks: x86 builds have no neon, AArch64 builds no avx2
        local _, v = cartridge({ "--version" })
        local absent = v:find("aarch64", 1, true) and "avx2" or "neon"
        rc, out, err = cartridge({ "-e", "print('ran')" }, nil, "CART_ISA=" .. absent .. " ")
        assert.are.equal(1, rc)
        assert.are.equal("", out)
        assert.truthy(err:find("cannot run " .. absent, 1, true) and err:find("use one of scalar", 1, true), err)
    end)

    it("runs a chunk given with -e", function()
        local rc, out, err = cartridge({ "-e", "print(1 + 1)" })
        assert.are.equal(0, rc, err)
        assert.are.equal("2\n", out)
    end)

    it("hands the arguments after -e CODE to the chunk as ... and arg", function()
        local rc, out = cartridge({ "-e", "print(select('#', ...), ...) print(arg[1], arg[2], arg[-1])", "a", "b" })
        assert.are.equal(0, rc)
        assert.are.equal("2\ta\tb\na\tb\t-e\n", out)
    end)

    it("runs a script with its arguments and sets arg as luajit does", function()
        local script = tmp .. "/show.lua"
        spit(script, "print(arg[0]) print(arg[-1]) print(arg[-2]) print(#arg, arg[1], arg[2]) print(...)\n")
        local rc, out, err = cartridge({ "run", script, "x", "--flag" })
        assert.are.equal(0, rc, err)
        assert.are.equal(script .. "\nrun\n" .. bin .. "\n2\tx\t--flag\nx\t--flag\n", out)
    end)

    it("skips a #! line at the top of a script", function()
        local script = tmp .. "/shebang.lua"
        spit(script, "#!/usr/bin/env cartridge\nprint('ran')\n")
        local rc, out = cartridge({ "run", script })
        assert.are.equal(0, rc)
        assert.are.equal("ran\n", out)
    end)

    it("finds a recipe by name under <home>/recipes, with or without .lua", function()
        os.execute("mkdir -p " .. q(tmp .. "/recipes"))
        spit(tmp .. "/recipes/hello.lua", "print('hello', arg[0], ...)\n")
        local env = "CARTRIDGE_HOME=" .. q(tmp) .. " "
        for _, name in ipairs({ "hello", "hello.lua" }) do
            local rc, out, err = cartridge({ "run", name, "world" }, nil, env)
            assert.are.equal(0, rc, err)
            assert.are.equal("hello\t" .. tmp .. "/recipes/hello.lua\tworld\n", out)
        end
    end)

    it("tells Lua where home is through package.path and cartridge.host", function()
        local rc, out = cartridge({ "-e", "local h = package.loaded['cartridge.host'] "
            .. "print(h.home) print(h.version) print(h.executable ~= nil) print(package.path:sub(1, #h.home + 11))" },
            nil, "CARTRIDGE_HOME=" .. q(tmp) .. " ")
        assert.are.equal(0, rc)
        local version = select(2, cartridge({ "--version" })):match("^cartridge (%S+)")
        assert.are.equal(tmp .. "\n" .. version .. "\ntrue\n" .. tmp .. "/lua/?.lua;\n", out)
    end)

    it("exits 1 with a clear message when the script does not exist", function()
        local rc, out, err = cartridge({ "run", "no-such-recipe" })
        assert.are.equal(1, rc)
        assert.are.equal("", out)
        assert.matches("^cartridge: cannot find script 'no%-such%-recipe' "
            .. "%(also looked for .*/recipes/no%-such%-recipe%.lua%)\n$", err)
    end)

    it("prints a level-0 string error as cartridge: <message> without a traceback and exits 1", function()
        local script = tmp .. "/fail.lua"
        spit(script, "io.write('before\\n') error('unknown flag --x (see --help)', 0)\n")
        local rc, out, err = cartridge({ "run", script })
        assert.are.equal(1, rc)
        assert.are.equal("before\n", out)
        assert.are.equal("cartridge: unknown flag --x (see --help)\n", err)
    end)

    it("keeps the position of an error raised with a level", function()
        local script = tmp .. "/oops.lua"
        spit(script, "error('oops')\n")
        local rc, _, err = cartridge({ "run", script })
        assert.are.equal(1, rc)
        assert.are.equal("cartridge: " .. script .. ":1: oops\n", err)
    end)

    it("reports a syntax error in the script and exits 1", function()
        local script = tmp .. "/syntax.lua"
        spit(script, "local = 1\n")
        local rc, _, err = cartridge({ "run", script })
        assert.are.equal(1, rc)
        assert.matches("^cartridge: " .. script:gsub("%p", "%%%0") .. ":1: ", err)
    end)

    it("prints a traceback for an error that is not a string", function()
        local rc, _, err = cartridge({ "-e", "error({})" })
        assert.are.equal(1, rc)
        assert.matches("^cartridge: %(error object is a table value%)\nstack traceback:\n", err)
    end)

    it("prints a traceback for string errors when CARTRIDGE_TRACEBACK=1", function()
        local rc, _, err = cartridge({ "-e", "error('plain', 0)" }, nil, "CARTRIDGE_TRACEBACK=1 ")
        assert.are.equal(1, rc)
        assert.matches("^cartridge: plain\nstack traceback:\n", err)
    end)

    it("lets os.exit set the exit status", function()
        local rc, out = cartridge({ "-e", "io.write('flushed') os.exit(3)" })
        assert.are.equal(3, rc)
        assert.are.equal("flushed", out)
    end)

    it("exits 2 with a usage hint on an unknown option", function()
        local rc, out, err = cartridge({ "--bogus" })
        assert.are.equal(2, rc)
        assert.are.equal("", out)
        assert.matches("unknown option '--bogus'", err, 1, true)
        assert.matches("cartridge --help", err, 1, true)
    end)

    it("exits 2 on an unknown command and suggests run", function()
        local rc, _, err = cartridge({ "inspect" })
        assert.are.equal(2, rc)
        assert.matches("cartridge run inspect", err, 1, true)
    end)

    it("exits 2 when run has no file", function()
        local rc = cartridge({ "run" })
        assert.are.equal(2, rc)
    end)

    it("runs the REPL over a pipe and prints =1+2 as 3", function()
        local rc, out = sh("printf '=1+2\\n' | " .. q(bin))
        assert.are.equal(0, rc)
        assert.are.equal("3\n", out)
    end)

    it("keeps REPL assignments across piped lines and prints errors without stopping", function()
        local rc, out, err = cartridge({}, "x = 20\nerror('bad', 0)\n=x + 1\n")
        assert.are.equal(0, rc)
        assert.are.equal("21\n", out)
        assert.matches("bad\n", err, 1, true)
    end)

    it("runs a chunk read from stdin with -", function()
        local rc, out = cartridge({ "-", "p", "q" }, "print(arg[0], ...)\n")
        assert.are.equal(0, rc)
        assert.are.equal("-\tp\tq\n", out)
    end)

    it("interrupts running Lua code on SIGINT and exits 130", function()
        -- jit.off keeps the loop in the interpreter, where the hook runs; the
        -- deadline ends the loop if the signal is missed, so the test cannot hang.
        local code = "jit.off() io.write('ready\\n') io.stdout:flush() "
            .. "local t = os.clock() while os.clock() - t < 10 do end print('not interrupted')"
        local o, e = q(tmp .. "/o"), q(tmp .. "/e")
        local rc = sh(string.format("%s -e %s >%s 2>%s & p=$!; "
            .. "for i in $(seq 200); do grep -q ready %s && break; sleep 0.05; done; kill -INT $p; wait $p",
            q(bin), q(code), o, e, o))
        local out, err = slurp(tmp .. "/o"), slurp(tmp .. "/e")
        assert.are.equal(130, rc)
        assert.are.equal("ready\n", out)
        assert.are.equal("cartridge: interrupted\n", err)
    end)
end)
