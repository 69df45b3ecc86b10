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
end)
