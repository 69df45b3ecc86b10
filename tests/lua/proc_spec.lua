-- proc_spec.lua: child processes without a shell (engine/proc.h through
-- cartridge.proc): arguments reach the program as they are, streams go to
-- the files asked for, the exit status and the signal that ended a child
-- come back, a wait can time out, and a missing program is an error.

local helper = require("helper")
local proc = require("cartridge.proc")

describe("proc", function()
    local tmp
    before_each(function() tmp = helper.tmpdir() end)
    after_each(function() helper.rmdir(tmp) end)

    it("passes arguments untouched and returns the exit status and the output", function()
        -- quotes, spaces, a dollar and a semicolon: no shell sees them
        local weird = "it's a $HOME; `x` \"y\""
        local status, out = proc.capture({ "printf", "%s|%s", weird, "two words" })
        assert.are.equal(0, status)
        assert.are.equal(weird .. "|two words", out)
        status = proc.run({ "sh", "-c", "exit 7" })
        assert.are.equal(7, status)
    end)

    it("sends the streams to files, one file for both when asked, with the directory and variables given", function()
        local both = tmp .. "/both.log"
        local status = proc.run({ "sh", "-c", "echo out; echo err >&2; pwd; echo $CART_PROC_TEST" },
            { stdout = both, stderr = both, cwd = tmp, env = { CART_PROC_TEST = "set" } })
        assert.are.equal(0, status)
        local text = helper.read_file(both)
        for _, want in ipairs({ "out", "err", tmp, "set" }) do
            assert.truthy(text:find(want, 1, true), text)
        end
        local _, out = proc.capture({ "cat" }, { stdin = both })
        assert.are.equal(text, out)
    end)

    it("waits with a limit, and reports the signal that stopped a child", function()
        local pid = proc.spawn({ "sleep", "30" })
        assert.is_true(proc.alive(pid))
        assert.is_nil(proc.wait(pid, 0.05))
        proc.terminate(pid)
        assert.are.equal(128 + 15, proc.wait(pid, 10))
        assert.is_false(proc.alive(pid))
    end)

    it("refuses a missing program and an unwritable stream by name", function()
        local ok, err = pcall(proc.spawn, { "no-such-program-cartridge" })
        assert.is_false(ok)
        assert.truthy(err:find("no program 'no-such-program-cartridge' on PATH", 1, true), err)
        assert.is_false(proc.exists("no-such-program-cartridge"))
        assert.is_true(proc.exists("sh"))
        ok, err = pcall(proc.run, { "true" }, { stdout = tmp .. "/no/such/dir/out" })
        assert.is_false(ok)
        assert.truthy(err:find("cannot open " .. tmp .. "/no/such/dir/out for the child's standard output", 1, true), err)
        ok, err = pcall(proc.run, { "true" }, { cwd = tmp .. "/missing" })
        assert.is_false(ok)
        assert.truthy(err:find("the working directory " .. tmp .. "/missing is not a directory", 1, true), err)
    end)
end)
