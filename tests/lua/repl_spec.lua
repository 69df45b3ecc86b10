-- repl_spec.lua: cartridge.repl driven by scripted lines instead of a terminal.

local repl = require("cartridge.repl")
local ffi = require("ffi")

-- Runs the REPL over `lines`; returns everything it wrote, the prompts it
-- asked with, and the environment it returned. opts may add run options.
local function drive(lines, opts)
    opts = opts or {}
    local out, prompts = {}, {}
    local i = 0
    local env = repl.run({
        read_line = function(prompt)
            prompts[#prompts + 1] = prompt
            i = i + 1
            local line = lines[i]
            if type(line) == "function" then
                return line()
            end
            return line
        end,
        write = function(s)
            out[#out + 1] = s
        end,
        banner = opts.banner or false,
        env = opts.env,
        load_engine = opts.load_engine or function()
            return { version = "9.9.9-test" }
        end,
    })
    return table.concat(out), prompts, env
end

describe("cartridge.repl", function()
    it("prints the value of =expr", function()
        local out = drive({ "=1+2" })
        assert.are.equal("3\n", out)
    end)

    it("prints every value of =expr separated by tabs", function()
        local out = drive({ "=1, 'two', nil" })
        assert.are.equal('1\t"two"\tnil\n', out)
    end)

    it("prints the values of a bare expression", function()
        local out = drive({ "2 * 21", "'a' .. 'b'" })
        assert.are.equal('42\n"ab"\n', out)
    end)

    it("prints nothing for a statement", function()
        local out = drive({ "local y = 1", "print_nothing = true" })
        assert.are.equal("", out)
    end)

    it("prints the values a statement chunk returns", function()
        local out = drive({ "do local v = 5 end return 7" })
        assert.are.equal("7\n", out)
    end)

    it("keeps reading a multi-line function definition and then calls it", function()
        local out, prompts = drive({ "function sq(x)", "  local y = x * x", "  return y", "end", "=sq(7)" })
        assert.are.equal("49\n", out)
        assert.are.same({ "> ", ">> ", ">> ", ">> ", "> ", "> " }, prompts)
    end)

    it("keeps reading a table constructor that spans lines", function()
        local out = drive({ "{ 1, 2,", "3 }" })
        assert.are.equal("{ 1, 2, 3 }\n", out)
    end)

    it("keeps reading =expr that spans lines", function()
        local out = drive({ "=1 +", "2" })
        assert.are.equal("3\n", out)
    end)

    it("prints an error and keeps going", function()
        local out = drive({ "error('boom', 0)", "=1" })
        assert.are.equal("boom\n1\n", out)
    end)

    it("prints a runtime error with its position", function()
        local out = drive({ "local t = nil; t.x = 1", "=2" })
        assert.matches("^stdin:1: attempt to index", out)
        assert.matches("\n2\n$", out)
    end)

    it("prints a syntax error and keeps going", function()
        local out = drive({ "x = = 1", "=2" })
        assert.matches("^stdin:1: unexpected symbol near '='\n2\n$", out)
    end)

    it("shows a non-string error object readably", function()
        local out = drive({ "error({ code = 3 })" })
        assert.are.equal("error object: { code = 3 }\n", out)
    end)

    it("keeps assignments across lines without touching _G", function()
        local out, _, env = drive({ "answer_for_spec = 41", "=answer_for_spec + 1" })
        assert.are.equal("42\n", out)
        assert.are.equal(41, env.answer_for_spec)
        assert.is_nil(rawget(_G, "answer_for_spec"))
    end)

    it("reads globals through _G", function()
        local out = drive({ "=type(string.format)" })
        assert.are.equal('"function"\n', out)
    end)

    it("binds the engine as cartridge in its environment", function()
        local out, _, env = drive({ "=cartridge.version" })
        assert.are.equal('"9.9.9-test"\n', out)
        assert.is_nil(rawget(_G, "cartridge"))
        assert.are.equal("9.9.9-test", env.cartridge.version)
    end)

    it("warns in one line when the engine does not load and still starts", function()
        local out = drive({ "=cartridge", "=1" }, {
            load_engine = function()
                error("module 'cartridge' not found:\n\tno field package.preload['cartridge']", 0)
            end,
        })
        assert.are.equal("warning: the engine did not load, `cartridge` is nil: "
            .. "module 'cartridge' not found:\nnil\n1\n", out)
    end)

    it("uses the environment it is given", function()
        local env = repl.new_env(nil)
        env.preset = 5
        local out, _, returned = drive({ "=preset" }, { env = env })
        assert.are.equal("5\n", out)
        assert.are.equal(env, returned)
    end)

    it("prints a banner with the version and the hint", function()
        local out = drive({}, { banner = true })
        assert.matches("^cartridge 9%.9%.9%-test %(LuaJIT [^)]+%)  =expr prints; Ctrl%-D exits\n$", out)
    end)

    it("reports an unfinished chunk when input ends", function()
        local out = drive({ "function f(" })
        assert.matches("'<eof>'\n$", out)
    end)

    it("drops the unfinished lines after an interrupt and keeps reading", function()
        local out, prompts = drive({
            "function f(",
            function()
                error("interrupted", 0)
            end,
            "=3",
        })
        assert.are.equal("\n3\n", out)
        assert.are.same({ "> ", ">> ", "> ", "> " }, prompts)
    end)

    it("skips blank lines", function()
        local out, prompts = drive({ "", "   ", "=1" })
        assert.are.equal("1\n", out)
        assert.are.same({ "> ", "> ", "> ", "> " }, prompts)
    end)
end)

describe("repl.format", function()
    it("quotes strings and escapes control characters", function()
        assert.are.equal('"a\\nb\\t\\"c\\"\\000"', repl.format('a\nb\t"c"\0'))
    end)

    it("shows integers without a decimal point and other numbers as tostring does", function()
        assert.are.equal("3", repl.format(3))
        assert.are.equal("0.5", repl.format(0.5))
        assert.are.equal("-2", repl.format(-2.0))
        assert.are.equal("inf", repl.format(math.huge))
    end)

    it("shows tables with the array part first and sorted keys", function()
        assert.are.equal('{ 10, 20, [99] = 0, a = 1, b = "x", ["not an ident"] = true }',
            repl.format({ 10, 20, b = "x", a = 1, ["not an ident"] = true, [99] = 0 }))
    end)

    it("sorts numeric keys before string keys", function()
        assert.are.equal('{ [5] = "five", [7] = "seven", z = 1 }', repl.format({ z = 1, [7] = "seven", [5] = "five" }))
    end)

    it("shows two levels of nesting and elides deeper tables", function()
        assert.are.equal("{ a = { b = {...} } }", repl.format({ a = { b = { c = 1 } } }))
    end)

    it("caps the entries shown per table", function()
        local t = {}
        for i = 1, 25 do
            t[i] = i
        end
        local s = repl.format(t)
        assert.matches("20,%s+%.%.%.%(5 more%)", s)
        assert.is_nil(s:find("21"))
    end)

    it("breaks a long top-level table into one entry per line", function()
        local s = repl.format({ alpha = string.rep("a", 40), beta = string.rep("b", 40) })
        assert.are.equal('{\n    alpha = "' .. string.rep("a", 40) .. '",\n    beta = "' .. string.rep("b", 40) .. '"\n}', s)
    end)

    it("marks cycles instead of recursing", function()
        local t = {}
        t.self = t
        assert.are.equal("{ self = <cycle> }", repl.format(t))
    end)

    it("shows cdata through tostring", function()
        local v = ffi.new("int[2]")
        assert.are.equal(tostring(v), repl.format(v))
        assert.are.equal("7LL", repl.format(ffi.new("int64_t", 7)))
    end)

    it("uses a table's __tostring when it has one", function()
        local t = setmetatable({}, { __tostring = function() return "<thing>" end })
        assert.are.equal("<thing>", repl.format(t))
    end)
end)

describe("repl completion and help", function()
    local env = repl.new_env(require("cartridge"))

    it("completes globals, lazily loaded modules, fields and methods from live values", function()
        assert.are.same({ "cartridge.model" }, repl.complete(env, "cartridge.mode"))
        assert.are.same({ "cartridge.model.load" }, repl.complete(env, "cartridge.model.lo"))
        assert.truthy(table.concat(repl.complete(env, "pri"), " "):find("print", 1, true))
        assert.truthy(table.concat(repl.complete(env, "whi"), " "):find("while", 1, true)) -- a keyword
        env.s = "text"
        assert.are.same({ "s:upper" }, repl.complete(env, "s:up"))
        env.obj = setmetatable({ n = 1 }, { __index = { go = function() end, size = 3 } })
        assert.are.same({ "obj:go" }, repl.complete(env, "obj:"))            -- methods only after ':'
        assert.are.same({ "obj.go", "obj.n", "obj.size" }, repl.complete(env, "obj."))
        assert.are.same({}, repl.complete(env, "nothing.here"))
        assert.are.same({}, repl.complete(env, "obj.n.deeper"))
    end)

    it("help(x) shows the comment above a function, and a module's opening comment and fields", function()
        local text = repl.help_text(require("cartridge").cart.load)
        assert.truthy(text:find("function cart.load(path, m)", 1, true), text)
        assert.truthy(text:find("Loads a cartridge artifact", 1, true), text)
        text = repl.help_text(require("cartridge.fs"))
        assert.truthy(text:find("cartridge.fs:", 1, true), text)
        assert.truthy(text:find("fields: ", 1, true) and text:find("mkdirs", 1, true), text)
        assert.truthy(repl.help_text(print):find("built-in", 1, true))
        assert.are.equal("a number: 3", repl.help_text(3))
    end)
end)

describe("the REPL in a terminal (script(1) gives it a pty)", function()
    it("stops a runaway loop at Ctrl-C and goes on, saves history after every line, prints output before errors",
        function()
        local helper = require("helper")
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        if os.execute("command -v script >/dev/null 2>&1") ~= 0 then
            return pending("script(1) (util-linux) is not installed")
        end
        local dir = helper.tmpdir()
        local hist = dir .. "/history"
        -- keystrokes with pauses: the loop runs a second before Ctrl-C (\003); the history is copied while
        -- the session still runs; Ctrl-D (\004) ends it
        local keys = ("(sleep 0.5; printf 'x = 0\\n'; sleep 0.3; printf 'while true do x = x + 1 end\\n'; sleep 1; "
            .. "printf '\\003'; sleep 0.5; printf '=x > 0\\n'; sleep 0.3; cp %s %s/mid; "
            .. "printf 'io.write(\"before\") error(\"boom\")\\n'; sleep 0.5; printf '\\004')"):format(helper.q(hist),
            helper.q(dir))
        -- script(1) runs its command through $SHELL -c; `exec` keeps a shell that does not exec by itself
        -- (dash, where SHELL is unset) from sitting in the foreground group, where Ctrl-C would kill it
        local rc, out = helper.run(("%s | CARTRIDGE_HISTORY=%s timeout 30 script -qfec %s /dev/null"):format(keys,
            helper.q(hist), helper.q("exec " .. helper.q(helper.bin))))
        local mid = helper.read_file(dir .. "/mid") or ""
        helper.rmdir(dir)
        assert.are.equal(0, rc, out) -- 124: the loop never stopped
        assert.truthy(out:find("interrupted", 1, true), out)
        assert.truthy(out:find("=x > 0\r?\ntrue"), out) -- the session went on, with its globals
        assert.truthy(out:find("beforestdin:1: boom", 1, true), out) -- buffered output first
        assert.truthy(mid:find("while\\040true", 1, true), mid) -- on disk before the session ended
        print("  a runaway loop stopped by Ctrl-C, the session kept; the history on disk while it ran")
    end)
end)
