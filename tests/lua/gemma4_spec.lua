-- gemma4_spec.lua: the gemma4 models the build writes (models/gemma4), their
-- SentencePiece vocabulary and chat template, against the llama.cpp
-- fixtures in tests/fixtures/gemma4 (test_gemma4.c checks the logits), and
-- the one carrying gemma 4's own tokenizer kind against its tokenizer
-- fixture (test_tokenizer.c checks the raw byte cases too).

local helper = require("helper")
local cartridge = require("cartridge")
local json = require("cartridge.json")
local chat = require("cartridge.chat")

local MODELS = helper.root .. "/models/gemma4/"
local FIXTURES = helper.root .. "/tests/fixtures/gemma4/"

local built, fixture = helper.model_fixtures(MODELS, FIXTURES)
local sha256 = helper.sha256

describe("the gemma4 models", function()
    it("are the bytes the llama.cpp fixtures were made from", function()
        for _, preset in ipairs({ "tiny-dense", "tiny-moe" }) do
            for _, dtype in ipairs({ "f32", "f16", "q8_0" }) do
                local name = preset .. "-" .. dtype
                local path = built(name)
                if path then
                    local fx = fixture(name)
                    assert.are.equal(fx.model.sha256, sha256(path),
                        name .. ": make_model.lua changed; run tools/greedy_fixtures.mjs --set gemma4 again")
                end
            end
        end
    end)

    it("tokenize the fixture prompts as llama.cpp does, BOS first", function()
        local path = built("tiny-dense-f32")
        if not path then return end
        helper.assert_tokenizes_like(path, fixture("tiny-dense-f32"))
    end)

    it("declare gemma's turn template, and render it with an empty thought channel", function()
        local path = built("tiny-moe-f32")
        if not path then return end
        local m = cartridge.model.load(path)
        local t = chat.for_model(m)
        assert.are.equal("gemma", t.name)
        local text = chat.render(t, {
            { role = "system", content = "You answer questions about the corpus." },
            { role = "user", content = "What is it?" },
        })
        assert.are.equal("<|turn>system\nYou answer questions about the corpus.<turn|>\n<|turn>user\nWhat is it?"
            .. "<turn|>\n<|turn>model\n<|channel>thought\n<channel|>", text)
        -- the markers are single tokens when special tokens are parsed
        local ids = m:tokenizer():encode_ids("<|turn>model\n<turn|>", { special = true }):list()
        assert.are.same({ 4, 5 }, { ids[1], ids[#ids] })
        assert.are.equal(m.config.arch, "gemma4")
        assert.is_false(m.config.uniform_kv)
        assert.are.equal(32, m.layers[1].window)
        assert.are.equal(0, m.layers[3].window)
        assert.are.equal(32, m.layers[3].head_dim)
        assert.is_true(m.layers[1].moe)
        m:free()
    end)

    it("save and load cartridges whose layers differ, refusing a model of another geometry by layer", function()
        local path = built("tiny-dense-f32")
        if not path then return end
        local cart = require("cartridge.cart")
        local m = cartridge.model.load(path)
        local ids = m:tokenizer():encode_ids("Once upon a time the little dog went to the park with Tom.",
            { add_special = true })
        local c = cart.new(m, #ids, 1)
        c:capture(m, ids)
        assert.is_false(c.uniform)
        assert.are.equal("2x16, 2x16, 1x32, 2x16", c:geometry_text())
        local tmp = os.tmpname()
        c:save(tmp, m)
        local back, info = cart.load(tmp, m)
        assert.are.equal("2,2,1,2", info.metadata["cartridge.kv_heads"])
        assert.are.equal("16,16,32,16", info.metadata["cartridge.head_dim"])
        for l = 0, 3 do
            local n = c.p * c.layers[l + 1].row * 4
            for which = 0, 1 do
                assert.are.equal(cartridge.ffi.string(c:rows(l, which), n), cartridge.ffi.string(back:rows(l, which), n))
            end
        end
        -- served: written into a cache of the model's geometry
        local kv = m:new_kv(c.p + 4)
        back:append_to(kv)
        assert.are.equal(c.p, kv:len())
        local ok, err = pcall(cart.load, tmp, cartridge.model.load(helper.root .. "/models/default.gguf"))
        assert.is_false(ok)
        assert.matches("the cartridge is 4 layers x 2 KV heads x 16 dims (layer 0), the model", err, 1, true)
        local other = built("tiny-moe-f32")
        ok, err = pcall(cart.load, tmp, cartridge.model.load(other))
        assert.is_false(ok)
        assert.matches("fingerprint", err, 1, true)
        os.remove(tmp)
        kv:free()
        back:free()
        c:free()
        m:free()
    end)

    it("pass the equivalence gate bitwise, the envelope printed first", function()
        for _, name in ipairs({ "tiny-dense-f32", "tiny-dense-f16", "tiny-moe-q8_0" }) do
            local path = built(name)
            if not path then goto next_model end
            helper.assert_gate_bitwise(path)
            ::next_model::
        end
    end)

    it("spill a served conversation to the disk tier and adopt its rows back, each layer its own shape", function()
        local path = built("tiny-moe-f32")
        if not path then return end
        local kvstore = require("cartridge.kvstore")
        local m = cartridge.model.load(path)
        local c = cartridge.cart.from_text(m, "Cartridges are trained KV prefixes on gemma4 too.")
        local dir = os.tmpname()
        os.remove(dir)
        local log = {}
        local store = kvstore.open({ dir = dir, max_bytes = 2 ^ 30, model = m, kv = "f16", cartridges = { a = c },
            model_name = "g", model_hash = kvstore.model_hash(m), log = function(l) log[#log + 1] = l end })
        local ids = m:tokenizer():encode("<|turn>user\nWhat do cartridges hold?<turn|>\n<|turn>model\n",
            { special = true })
        local kv = m:new_kv(c.p + 64, "f16")
        c:append_to(kv)
        m:forward(kv, ids)
        assert.is_true(store:spill(c, ids, kv))
        local entry, n = store:match(c, ids)
        assert.are.equal(#ids, n)
        local kv2 = m:new_kv(c.p + 64, "f16")
        c:append_to(kv2)
        assert.is_true(store:adopt(entry, kv2, c, n))
        for l = 0, m.config.n_layer - 1 do
            local rb = kv:row_bytes(l)
            for which = 0, 1 do
                assert.are.equal(cartridge.ffi.string(kv:raw_rows(l, which), (c.p + n) * rb),
                    cartridge.ffi.string(kv2:raw_rows(l, which), (c.p + n) * rb), ("layer %d"):format(l))
            end
        end
        kv:free()
        kv2:free()
        c:free()
        m:free()
        require("helper").rmdir(dir)
    end)

    it("come from make_model --arch gemma4, which refuses the qwen3 flags that mean nothing to it", function()
        local out = os.tmpname()
        local rc, _, err = helper.cartridge("run", helper.root .. "/recipes/make_model.lua", "--arch", "gemma4",
            "--preset", "tiny-moe", "--head-dim", "32", "--out", out)
        assert.are.equal(1, rc)
        assert.matches("--head-dim does not apply to --arch gemma4", err, 1, true)
        rc, _, err = helper.cartridge("run", helper.root .. "/recipes/make_model.lua", "--preset", "tiny-moe",
            "--arch", "llama", "--out", out)
        assert.are.equal(1, rc)
        assert.matches("preset 'tiny-moe' is a gemma4 shape, not llama", err, 1, true)
        rc = helper.cartridge("run", helper.root .. "/recipes/make_model.lua", "--preset", "tiny-moe", "--dtype",
            "q8_0", "--layers", "2", "--out", out)
        assert.are.equal(0, rc)
        local m = cartridge.model.load(out)
        assert.are.equal("gemma4", m.config.arch)
        assert.are.equal(2, m.config.n_layer)
        m:free()
        os.remove(out)
    end)
end)

describe("the gemma4 model with gemma 4's own tokenizer kind", function()
    local NAME = "tiny-dense-gemma4vocab-f32"

    local function tokenize_fixture()
        local f = assert(io.open(FIXTURES .. NAME .. ".tokenize.json", "rb"))
        local d = json.decode(f:read("*a"))
        f:close()
        return d
    end

    it("is the bytes its llama.cpp tokenizer fixture was made from, and reads as gemma4 BPE", function()
        local path = built(NAME)
        if not path then return end
        local fx = tokenize_fixture()
        assert.are.equal(fx.model.sha256, sha256(path),
            NAME .. ": make_model.lua changed; run tools/gemma4_tokenize_fixtures.mjs again")
        assert.are.equal("gemma4", fx.model.tokenizer_model)
        local g = cartridge.gguf.open(path)
        assert.are.equal("gemma4", g:get("tokenizer.ggml.model"))
        assert.is_nil(g:get("tokenizer.ggml.pre")) -- llama.cpp's converter writes none
        assert.are.equal(fx.model.n_merges, #g:get("tokenizer.ggml.merges"))
        g:close()
    end)

    it("tokenizes and detokenizes every string case as llama.cpp does, through the Lua tokenizer", function()
        local path = built(NAME)
        if not path then return end
        local m = cartridge.model.load(path)
        local tok = m:tokenizer()
        assert.are.equal("bpe", tok.kind)
        local fx = tokenize_fixture()
        local n = 0
        for _, c in ipairs(fx.cases) do
            assert.are.same(c.ids, tok:encode(c.text, { special = c.parse_special }), c.text)
            assert.are.equal(c.detok, tok:decode(c.ids))
            assert.are.equal(c.detok_special, tok:decode(c.ids, { special = true }))
            n = n + 1
        end
        print(("  %d string cases of %s.tokenize.json: ids, detok and detok_special identical"):format(n, NAME))
        assert.are.equal(fx.n_cases, n)
        -- BOS first with add_special: gemma4 always adds it
        assert.are.equal(fx.model.bos_id, tok:encode("hi", { add_special = true })[1])
        m:free()
    end)

    it("comes from make_model --tokenizer-model gemma4, which other architectures refuse", function()
        local out = os.tmpname()
        local rc, _, err = helper.cartridge("run", helper.root .. "/recipes/make_model.lua", "--preset", "qwen3-tiny",
            "--tokenizer-model", "gemma4", "--out", out)
        assert.are.equal(1, rc)
        assert.matches("--tokenizer-model applies to --arch gemma4 only", err, 1, true)
        rc, _, err = helper.cartridge("run", helper.root .. "/recipes/make_model.lua", "--arch", "gemma4",
            "--tokenizer-model", "wordpiece", "--out", out)
        assert.are.equal(1, rc)
        assert.matches("wordpiece", err, 1, true)
        os.remove(out)
    end)
end)
