-- recipes/chat.lua driven through a pipe: commands, bare model names,
-- Ctrl-C (SIGINT) stopping a reply while the session goes on, and
-- --json-schema holding every reply to a schema.

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

    it("talks to cartridges given with --load, and /unload and /load change them", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local reader = helper.root .. "/models/reader.gguf"
        if not helper.exists(reader) then return pending("models/reader.gguf is not in this checkout") end
        -- a cartridge holding a fact document's own rows (untrained): the
        -- reader reads its answer from them
        local cartridge = require("cartridge")
        local d = require("cartridge.facts").document(1003, 4)
        local m = cartridge.model.load(reader)
        local c = cartridge.cart.from_text(m, d.text)
        local path = tmp .. "/doc.safetensors"
        c:save(path, m)
        local rows = c.p
        c:free()
        m:free()
        local f = d.facts[1]
        local rc, out, err = helper.run(chat_cmd(("printf '%s\\n/unload\\n/load %s\\n/load %s/none.safetensors\\n'")
            :format(f.question, path, tmp), ("--model %s --load %s --temp 0 --n 24"):format(helper.q(reader),
            helper.q(path))))
        assert.are.equal(0, rc, err)
        print(("  %s -> %s"):format(f.question, out:match("model> ([^\n(]*)")))
        assert.truthy(err:find(("cartridge doc.safetensors (%d rows): %d KV rows"):format(rows, rows), 1, true), err)
        assert.truthy(require("cartridge.facts").correct(out:match("model> ([^\n(]*)"), f.answer), out)
        assert.truthy(err:find("(no cartridge (the bare model))", 1, true), err)
        assert.truthy(err:find("none.safetensors", 1, true), err) -- a bad file is a message, not an exit
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

    it("makes every reply a document of --json-schema, turn after turn, and refuses a bad schema", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local model = helper.q(helper.root .. "/models/default.gguf")
        local schema, saved = tmp .. "/answer.json", tmp .. "/doc conv.json"
        helper.write_file(schema, '{"type":"object","properties":{"answer":{"enum":["yes","no"]},"count":{"type":'
            .. '"integer","minimum":0,"maximum":9}},"required":["answer","count"],"additionalProperties":false}')
        -- the random-weight model, sampled: only the grammar makes its replies documents
        local rc, out, err = helper.run(chat_cmd(("printf 'Is it raining?\\nAnd now?\\nOnce more\\n/save %s\\n/quit\\n'")
            :format(saved:gsub("'", "'\\''")), ("--model %s --json-schema %s --n 300 --temp 1 --seed 3 --threads 1")
            :format(model, helper.q(schema))))
        assert.are.equal(0, rc, err)
        local conv = json.decode(helper.read_file(saved))
        assert.are.equal(6, #conv.messages, helper.read_file(saved))
        for i = 2, 6, 2 do
            local reply = conv.messages[i]
            assert.are.equal("assistant", reply.role)
            local doc = json.decode(reply.content)
            assert.truthy(doc.answer == "yes" or doc.answer == "no", reply.content)
            assert.truthy(doc.count >= 0 and doc.count <= 9 and doc.count == math.floor(doc.count), reply.content)
            local keys = 0
            for _ in pairs(doc) do keys = keys + 1 end
            assert.are.equal(2, keys, reply.content)
            -- what the terminal showed is the reply
            assert.truthy(out:find(reply.content, 1, true), out)
        end
        print(("  three replies under the schema, the last %q"):format(conv.messages[6].content))
        -- a schema the engine cannot enforce: refused before the model loads, naming the keyword
        helper.write_file(schema, '{"type":"object","properties":{"x":{"type":"string","format":"email"}}}')
        rc, out, err = helper.run(chat_cmd("printf 'Hi\\n'", ("--model %s --json-schema %s"):format(model, helper.q(schema))))
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--json-schema " .. schema .. ": schema: #/properties/x: the keyword 'format'", 1, true), err)
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
