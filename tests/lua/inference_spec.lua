-- The engine's inference seen from Lua: against the independent reference
-- forward (tests/reference), against llama.cpp's fixtures, and the recipes
-- users run (generate, make_model, export_gguf).

local cartridge = require("cartridge")
local helper = require("helper")
local ffi = cartridge.ffi

local ref = helper.reference()

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

-- Engine logits for every position vs the reference's, as max |diff| / max |ref|.
local function compare_with_reference(path, ids)
    local m = cartridge.model.load(path)
    local kv = m:new_kv(#ids + 1, "f32")
    local logits = m:forward(kv, ids, "all")
    local r = ref.load(path):logits(ids)
    local worst, scale = 0, 0
    for i = 1, #ids do
        for v = 0, m.n_vocab - 1 do
            local a, b = logits[(i - 1) * m.n_vocab + v], r[i][v]
            worst = math.max(worst, math.abs(a - b))
            scale = math.max(scale, math.abs(b))
        end
    end
    kv:free()
    m:free()
    return worst / scale, worst
end

describe("the forward pass", function()
    for _, case in ipairs({
        { "qwen3", { preset = "qwen3-tiny", dtype = "f32", tied = true } },
        { "qwen3 untied", { preset = "qwen3-tiny", dtype = "f32", tied = false, seed = 3 } },
        { "llama", { preset = "llama-tiny", dtype = "f32", tied = false, seed = 5 } },
    }) do
        it("agrees with the independent reference at f32 on a generated " .. case[1] .. " model", function()
            local path = tmp .. "/ref-" .. case[1]:gsub(" ", "-") .. ".gguf"
            case[2].out, case[2].quiet = path, true
            require("cartridge.randmodel").write(case[2])
            local rel, abs = compare_with_reference(path, { 256, 72, 101, 108, 108, 111, 33, 10, 259, 3, 200 })
            print(("  %s: max |dlogit| %.3g, relative %.3g (tolerance 1e-4 relative)"):format(case[1], abs, rel))
            assert.is_true(rel <= 1e-4)
        end)
    end

    it("agrees with the independent reference on stories260K", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local rel, abs = compare_with_reference(path, { 1, 403, 407, 261, 378, 432, 383, 286 })
        print(("  stories260K: max |dlogit| %.3g, relative %.3g (tolerance 1e-4 relative)"):format(abs, rel))
        assert.is_true(rel <= 1e-4)
    end)
end)

describe("the tokenizer and chat template", function()
    it("renders the reference Qwen3 chat prompt to llama.cpp's 28 ids", function()
        local path, why = helper.fixture("reference/qwen3-tiny-realvocab-f16.gguf")
        if not path then return pending(why) end
        local m = cartridge.model.load(path)
        local chat = cartridge.chat
        local text = chat.render(chat.for_model(m), {
            { role = "system", content = "You are a helpful assistant." },
            { role = "user", content = "What is a cartridge?" },
        })
        local ids = m:tokenizer():encode(text, { special = true, add_special = true })
        assert.are.same({ 151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872,
            198, 3838, 374, 264, 50862, 30, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271 }, ids)
        m:free()
    end)

    it("picks plain text for a model without a template", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local m = cartridge.model.load(path)
        assert.are.equal("plain", cartridge.chat.for_model(m).name)
        assert.are.equal("A\n\nB\n\n", cartridge.chat.render("plain", { { role = "system", content = "A" },
            { role = "user", content = "B" } }))
        m:free()
    end)
end)

describe("generate", function()
    local function run_generate(...)
        if not helper.exists(helper.bin) then return nil end
        return helper.cartridge("run", "recipes/generate.lua", ...)
    end

    it("continues 'Once upon a time' on stories260K token for token as llama.cpp does", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local rc, out, err = run_generate("--model", path, "--prompt", "Once upon a time", "--n", "48", "--json", "--kv", "f32")
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        local r = cartridge.json.decode(out)
        local f = io.open(helper.shared .. "/reference/stories260K.greedy.json")
        local fixture = cartridge.json.decode(f:read("*a"))
        f:close()
        assert.are.same(fixture.prompts[1].prompt_token_ids, r.prompt_ids)
        assert.are.same(fixture.prompts[1].generated_token_ids, r.ids)
        assert.are.equal(fixture.prompts[1].generated_text, r.text)
        assert.is_true(r.timings.prompt_tok_s > 0 and r.timings.decode_tok_s > 0)
    end)

    it("reproduces a sampled run with the same seed and stops at a stop string", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        local args = { "--model", path, "--prompt", "Once upon a time", "--n", "40", "--json", "--temp", "0.9",
            "--top-p", "0.95", "--top-k", "40", "--seed", "7" }
        local rc1, out1 = run_generate(unpack(args))
        if not rc1 then return pending("build/cartridge not built") end
        local _, out2 = run_generate(unpack(args))
        local a, b = cartridge.json.decode(out1), cartridge.json.decode(out2)
        assert.are.same(a.ids, b.ids)
        args[#args] = "8"
        local _, out3 = run_generate(unpack(args))
        assert.are_not.same(a.ids, cartridge.json.decode(out3).ids)
        local _, out4 = run_generate("--model", path, "--prompt", "Once upon a time", "--n", "48", "--json", "--stop", "Lily")
        local s = cartridge.json.decode(out4)
        assert.are.equal("stop", s.finish)
        assert.are.equal(", there was a little girl named ", s.text)
    end)

    it("refuses a prompt longer than the model's context", function()
        local path = tmp .. "/short-ctx.gguf"
        require("cartridge.randmodel").write({ out = path, preset = "qwen3-tiny", dtype = "f32", ctx = 16, quiet = true })
        local rc, _, err = run_generate("--model", path, "--prompt", ("word "):rep(20), "--n", "4")
        if not rc then return pending("build/cartridge not built") end
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("exceed the model's context of 16", 1, true), err)
    end)
end)

describe("make_model and export_gguf", function()
    it("write the same bytes for the same seed and differ for another", function()
        local rm = require("cartridge.randmodel")
        rm.write({ out = tmp .. "/a.gguf", preset = "qwen3-tiny", dtype = "q8_0", seed = 3, quiet = true })
        rm.write({ out = tmp .. "/b.gguf", preset = "qwen3-tiny", dtype = "q8_0", seed = 3, quiet = true })
        rm.write({ out = tmp .. "/c.gguf", preset = "qwen3-tiny", dtype = "q8_0", seed = 4, quiet = true })
        assert.are.equal(helper.read_file(tmp .. "/a.gguf"), helper.read_file(tmp .. "/b.gguf"))
        assert.are_not.equal(helper.read_file(tmp .. "/a.gguf"), helper.read_file(tmp .. "/c.gguf"))
        local m = cartridge.model.load(tmp .. "/a.gguf")
        assert.are.equal("qwen3", m.config.arch)
        assert.are.equal(8, m.file:tensor("blk.0.attn_q.weight").dtype)
        m:free()
    end)

    it("transcodes f32 matrices to f16 and keeps norms, metadata and logits close", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local src = tmp .. "/src32.gguf"
        require("cartridge.randmodel").write({ out = src, preset = "qwen3-tiny", dtype = "f32", quiet = true })
        local rc, out, err = helper.cartridge("run", "recipes/export_gguf.lua", "--from-gguf", src,
            "--out", tmp .. "/out16.gguf", "--dtype", "f16")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("to f16", 1, true), out)
        assert.is_nil(err:find("\r", 1, true), "carriage returns on a stderr that is not a terminal")
        local g = cartridge.gguf.open(tmp .. "/out16.gguf")
        assert.are.equal(1, g:get("general.file_type"))
        assert.are.equal("f16", g:tensor("blk.0.ffn_up.weight").dtype_name)
        assert.are.equal("f32", g:tensor("blk.0.attn_norm.weight").dtype_name)
        assert.are.equal(g:get("qwen3.rope.freq_base"), 1e6)
        g:close()
        local a = cartridge.model.load(src)
        local b = cartridge.model.load(tmp .. "/out16.gguf")
        local ka, kb = a:new_kv(8, "f32"), b:new_kv(8, "f32")
        local la = ffi.new("float[?]", a.n_vocab)
        ffi.copy(la, a:forward(ka, { 1, 2, 3 }), a.n_vocab * 4)
        local lb = b:forward(kb, { 1, 2, 3 })
        local worst = 0
        for i = 0, a.n_vocab - 1 do worst = math.max(worst, math.abs(la[i] - lb[i])) end
        print(("  f32 vs f16 transcode: max |dlogit| %.3g (tolerance 5e-2)"):format(worst))
        assert.is_true(worst < 5e-2)
    end)

    it("refuses quantized sources and writing over the input", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local q = tmp .. "/q.gguf"
        require("cartridge.randmodel").write({ out = q, preset = "qwen3-tiny", dtype = "q8_0", quiet = true })
        local rc, _, err = helper.cartridge("run", "recipes/export_gguf.lua", "--from-gguf", q, "--out", tmp .. "/x.gguf")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("q8_0-quantized", 1, true), err)
        rc, _, err = helper.cartridge("run", "recipes/export_gguf.lua", "--from-gguf", q, "--out", q)
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("is the input file", 1, true), err)
    end)
end)
