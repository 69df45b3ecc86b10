-- recipes/report.lua on stories260K: the story corpus, the three arms, and
-- the notes that explain an empty column or a capped ICL context.

local helper = require("helper")
local cartridge = require("cartridge")

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

describe("report.lua", function()
    it("scores bare, cartridge and ICL arms and says why a column is empty or the context capped", function()
        local model = helper.fixture("models/stories260K.gguf")
        if not model then return pending("../shared/models/stories260K.gguf absent") end
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local dir = tmp .. "/stories"
        local rc, out, err = helper.cartridge("run", "recipes/report.lua", "--model", model, "--make-stories", dir,
            "--stories", "8", "--story-tokens", "120")
        assert.are.equal(0, rc, err)
        local m = cartridge.model.load(model)
        local c = cartridge.cart.from_text(m, "Once upon a time there was a little girl named Lily.")
        c:save(tmp .. "/c.safetensors", m)
        c:free()
        local n_ctx = m.config.n_ctx_train
        m:free()
        rc, out, err = helper.cartridge("run", "recipes/report.lua", "--model", model, "--heldout", dir .. "/heldout.json",
            "--corpus", dir .. "/corpus.md", "--corpus", dir .. "/corpus.md", "--corpus", dir .. "/corpus.md",
            "--corpus", dir .. "/corpus.md", "--load", tmp .. "/c.safetensors", "--icl-max", "100000")
        assert.are.equal(0, rc, err)
        print(out)
        assert.truthy(out:find("bare model", 1, true) and out:find("ICL (corpus in context", 1, true), out)
        -- four copies of the corpus are more than the model's context: the ICL arm is capped, and says so
        assert.truthy(out:find(("fit the model's %d%%-token context"):format(n_ctx)), out)
        -- the gap column is either a percentage or n/a with the reason printed
        local gap = out:match("cartridge c%.safetensors[^\n]- (%S+)\n")
        assert.truthy(gap, out)
        if gap == "n/a" then
            assert.truthy(out:find("gap recovered is undefined", 1, true), out)
        else
            assert.truthy(gap:match("^%-?%d+%%$"), gap)
        end
    end)

    it("prints the same ICL rows and KV bytes as ask.lua and selfstudy.lua, in aligned columns", function()
        local reader = helper.root .. "/models/reader.gguf"
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local dir = tmp .. "/facts"
        local rc, out, err = helper.cartridge("run", "recipes/make_facts.lua", "--seed", "3001", "--facts", "8",
            "--out", dir)
        assert.are.equal(0, rc, err)
        local m = cartridge.model.load(reader)
        local c = cartridge.cart.from_text(m, "Here are some facts about people.")
        local path = tmp .. "/a-cartridge-with-a-long-enough-name.safetensors" -- longer than the name column
        c:save(path, m)
        local p, bytes = c.p, cartridge.fmt.bytes(m:kv_bytes(c.p, "f16"))
        c:free()
        m:free()
        local _, asked = helper.cartridge("run", "recipes/ask.lua", "--model", reader, "--load", path, "--ask",
            "Who is it?", "--max-a", "4", "--corpus", dir .. "/doc.md")
        rc, out, err = helper.cartridge("run", "recipes/report.lua", "--model", reader, "--qa", dir .. "/qa.jsonl",
            "--corpus", dir .. "/doc.md", "--load", path)
        assert.are.equal(0, rc, err)
        print(asked .. out)
        local icl_asked = tonumber(asked:match("%[ICL, (%d+) KV rows"))
        local icl_report = tonumber(out:match("\nICL %(corpus in context%) +(%d+) "))
        assert.are.equal(icl_report, icl_asked)
        assert.truthy(out:find("a%-cartridge%-with%-a%-long%-enough%-name%.safetensors %(p=" .. p .. ", %S+ steps%) +"
            .. p .. " +" .. bytes:gsub("%p", "%%%0")), out)
        -- every row's KV rows column ends where its header does
        local header = out:match("\n(arm +KV rows[^\n]*)")
        local at = header:find("KV rows", 1, true) + #"KV rows" - 1
        local n = 0
        for line in out:gmatch("[^\n]+") do
            if line:match("^bare model ") or line:match("^cartridge ") or line:match("^ICL ") then
                assert.truthy(line:sub(at, at):match("%d"), line)
                assert.are.equal(" ", line:sub(at + 1, at + 1), line)
                n = n + 1
            end
        end
        assert.are.equal(3, n)
        print(("  ICL %d rows in both; the cartridge's %s as report.lua prints it; columns aligned"):format(icl_asked,
            bytes))
    end)
end)
