-- recipes/chat.lua driven through a pipe: commands, bare model names, and
-- Ctrl-C (SIGINT) stopping a reply while the session goes on.

local helper = require("helper")
local json = require("cartridge.json")

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

local function chat_cmd(input_script, args)
    return ("(%s) | %s run recipes/chat.lua %s"):format(input_script, helper.q(helper.bin), args)
end

describe("chat.lua", function()
    it("runs /help, /save and refuses unknown commands; a bare model name resolves", function()
        local model = helper.fixture("models/stories260K.gguf")
        if not model then return pending("../shared/models/stories260K.gguf absent") end
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local saved = tmp .. "/a conv.json"
        local rc, out, err = helper.run(chat_cmd(("printf 'Hello\\n/help\\n/bogus\\n//slash\\n/save %s\\n/quit\\n'")
            :format(saved:gsub("'", "'\\''")), "--model stories260K --n 8"))
        assert.are.equal(0, rc, err)
        assert.truthy(err:find("stories260K.gguf (plain template", 1, true), err)
        assert.truthy(err:find("/save FILE", 1, true), err)
        assert.truthy(err:find("unknown command /bogus", 1, true), err)
        local conv = json.decode(helper.read_file(saved))
        assert.are.equal(4, #conv.messages) -- Hello, reply, /slash (sent as text), reply
        assert.are.equal("/slash", conv.messages[3].content)
        rc, _, err = helper.run(chat_cmd("printf ''", "--model no-such-model"))
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("no model named 'no-such-model'", 1, true), err)
    end)

    it("gives a reply what the cache has left and refuses a prompt that leaves no room", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local model = helper.q(helper.root .. "/models/default.gguf")
        local rc, out, err = helper.run(chat_cmd("printf 'Hello\\n'", "--model " .. model .. " --n 100 --ctx 40"))
        assert.are.equal(0, rc, err)
        local room = tonumber(err:match("%(the cache has room for (%d+) more tokens"))
        assert.truthy(room and room < 100, err)
        assert.truthy(out:find("model> ", 1, true), out)
        print(("  --ctx 40: the reply got %d of --n 100 tokens"):format(room))
        local long = string.rep("word ", 60)
        rc, out, err = helper.run(chat_cmd(("printf '%s\\n'"):format(long), "--model " .. model .. " --n 8 --ctx 40"))
        assert.are.equal(0, rc, err)
        assert.truthy(err:find("but the cache has 40; /reset or raise --ctx", 1, true), err)
        assert.falsy(out:find("model> ", 1, true), out)
    end)

    it("stops a reply on Ctrl-C, keeps what was written, and goes on", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local out, errf, saved = tmp .. "/c.out", tmp .. "/c.err", tmp .. "/c.json"
        -- replies of up to 3900 tokens; SIGINT as soon as each starts
        local wait_for = "for i in $(seq 1 250); do [ $(grep -o 'model> ' %s 2>/dev/null | wc -l) -ge %d ] && break; "
            .. "sleep 0.02; done; kill -INT $pid; "
        local script = ("(echo Hello; sleep 1; echo '/save %s'; echo Again; sleep 1; echo /quit) | %s run recipes/chat.lua "
            .. "--model %s --n 3900 --ctx 4096 > %s 2> %s & pid=$!; " .. wait_for:format(out, 1)
            .. wait_for:format(out, 2) .. "wait $pid"):format(saved, helper.q(helper.bin),
            helper.q(helper.root .. "/models/default.gguf"), out, errf)
        local rc = helper.run("sh -c " .. helper.q(script))
        local err = helper.read_file(errf)
        assert.are.equal(0, rc, err)
        assert.truthy(err:find("(stopped; the reply so far stays in the conversation)", 1, true), err)
        local conv = json.decode(helper.read_file(saved))
        assert.are.equal(2, #conv.messages)
        assert.are.equal("assistant", conv.messages[2].role)
        -- the session went on: a second reply after the stop
        local _, replies = helper.read_file(out):gsub("model> ", "")
        assert.are.equal(2, replies)
        print(("  stopped after %d bytes of reply; then a second turn"):format(#conv.messages[2].content))
    end)
end)
