-- The fleet: composition of cartridges, the composed gate, fleet training
-- (manifest, budget manager, eviction), the retrieval index, and serving.

local cartridge = require("cartridge")
local helper = require("helper")
local ffi = cartridge.ffi
local cart = cartridge.cart

local tmp, model_path, small_path
setup(function()
    tmp = helper.tmpdir()
    model_path = tmp .. "/q.gguf"
    small_path = tmp .. "/q1.gguf"
    local rm = require("cartridge.randmodel")
    rm.write({ out = model_path, preset = "qwen3-tiny", dtype = "f32", quiet = true })
    rm.write({ out = small_path, preset = "qwen3-tiny", layers = 1, dtype = "f32", quiet = true })
end)
teardown(function() helper.rmdir(tmp) end)

local function recipe(name, ...)
    if not helper.exists(helper.bin) then return nil end
    return helper.cartridge("run", "recipes/" .. name, ...)
end

-- Logits of ids behind what `fill(kv)` writes into an empty f32 cache of rows + #ids.
local function logits_after(m, rows, fill, ids)
    local kv = m:new_kv(rows + #ids, "f32")
    fill(kv)
    local out = ffi.new("float[?]", #ids * m.n_vocab)
    ffi.copy(out, m:forward(kv, ids, "all"), #ids * m.n_vocab * 4)
    kv:free()
    return out
end

describe("composition", function()
    it("puts the parts' rows in order, each with its positions, and tokens after the sum", function()
        local m = cartridge.model.load(model_path)
        local ids = { 256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10 }
        local whole = cart.new(m, 10, 1)
        whole:capture(m, { unpack(ids, 1, 10) })
        local a, b = cart.new(m, 3, 1), cart.new(m, 7, 1)
        a:copy_rows(0, whole, 0, 3)
        b:copy_rows(0, whole, 3, 7)
        local ab = cart.compose({ a, b })
        assert.are.equal(10, ab.p)
        local tail = { unpack(ids, 11) }
        local ref = logits_after(m, 10, function(kv) whole:append_to(kv) end, tail)
        local got = logits_after(m, 10, function(kv) ab:append_to(kv) end, tail)
        local parts = logits_after(m, 10, function(kv) a:append_to(kv); b:append_to(kv) end, tail)
        local worst = 0
        for i = 0, #tail * m.n_vocab - 1 do
            worst = math.max(worst, math.abs(ref[i] - got[i]), math.abs(ref[i] - parts[i]))
        end
        print(("  split capture composed again vs the whole: max |dlogit| %g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
        -- two independent cartridges each keep positions 0..p-1: the second
        -- part's rows are its own capture, not re-rotated
        local x, y = cart.from_text(m, "first document"), cart.from_text(m, "second one")
        local xy = cart.compose({ x, y })
        local row = x.row
        for l = 0, m.config.n_layer - 1 do
            assert.are.equal(0, ffi.C.memcmp(xy:rows(l, 0) + x.p * row, y:rows(l, 0), y.p * row * 4))
        end
        xy:free(); ab:free(); a:free(); b:free(); whole:free(); x:free(); y:free()
        m:free()
    end)

    it("trains through a composed prefix into every part's rows", function()
        local m = cartridge.model.load(model_path)
        local a, b = cart.new(m, 5, 1), cart.new(m, 4, 1)
        a:init_random(3, 0.5)
        b:init_random(4, 0.5)
        local ab = cart.compose({ a, b })
        local t = cartridge.trainer.new(m)
        ab:zero_grad(); a:zero_grad(); b:zero_grad()
        t:distill(ab, { { 1, 2, 3, 4, 5, 6 } }, { { 2, 7, -0.5 }, { 3, 9, -1.0 }, { 5, 11, -0.2 } },
            { backward = true })
        ab:compose_grad()
        for _, c in ipairs({ a, b }) do
            local sink, rows = 0, 0
            for l = 0, c.n_layer - 1 do
                for which = 0, 1 do
                    local g = c:grad(l, which)
                    for i = 0, c.row - 1 do sink = math.max(sink, math.abs(g[i])) end
                    for i = c.row, c.p * c.row - 1 do rows = math.max(rows, math.abs(g[i])) end
                end
            end
            print(("  part of p = %d: max |grad| %.3g over its rows, %g over its sink"):format(c.p, rows, sink))
            assert.are.equal(0, sink)
            assert.truthy(rows > 1e-5)
        end
        t:free(); ab:free(); a:free(); b:free()
        m:free()
    end)

    it("refuses cartridges of another geometry, naming both files", function()
        local m, s = cartridge.model.load(model_path), cartridge.model.load(small_path)
        local pa, pb = tmp .. "/geo-a.safetensors", tmp .. "/geo-b.safetensors"
        cart.from_text(m, "one"):save(pa, m)
        cart.from_text(s, "two"):save(pb, s)
        local a, b = cart.load(pa, m), cart.load(pb, s)
        local ok, err = pcall(cart.compose, { a, b })
        assert.is_false(ok)
        assert.truthy(err:find(pb, 1, true) and err:find(pa, 1, true) and err:find("1 layers", 1, true), err)
        m:free(); s:free()
    end)
end)

describe("recipes/equiv.lua --compose", function()
    it("scores bitwise like the real prefill on stories260K, f32 and f16", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        for _, kv in ipairs({ "f32", "f16" }) do
            local rc, out, err = recipe("equiv.lua", "--model", path, "--corpus", "README.md", "--p", "128",
                "--suffix-max", "64", "--kv", kv, "--compose")
            if not rc then return pending("build/cartridge not built") end
            assert.are.equal(0, rc, err)
            assert.truthy(out:find("A = rows 0..127, B = rows 128..255 (positions kept), 256 rows composed", 1, true),
                out)
            assert.truthy(out:find("max |dlogit| 0.000000, mean 0.0000000, greedy agreement 64/64", 1, true), out)
            assert.truthy(out:find("PASS: the composition of the two parts", 1, true), out)
        end
    end)

    it("scores bitwise on the small qwen3 models, the reference ones and a generated one", function()
        local models = { model_path }
        for _, name in ipairs({ "qwen3-tiny-f32.gguf", "qwen3-tiny-f16.gguf", "qwen3-tiny-realvocab-f16.gguf" }) do
            local path = helper.fixture("reference/" .. name)
            if path then models[#models + 1] = path end
        end
        for _, path in ipairs(models) do
            local rc, out, err = recipe("equiv.lua", "--model", path, "--corpus", "README.md", "--p", "96",
                "--suffix-max", "48", "--compose", "--kv", "f16")
            if not rc then return pending("build/cartridge not built") end
            assert.are.equal(0, rc, err)
            assert.truthy(out:find("max |dlogit| 0.000000, mean 0.0000000, greedy agreement 48/48", 1, true),
                path .. ": " .. out)
        end
    end)

    it("asks for 2p + 2 tokens and says so", function()
        helper.write_file(tmp .. "/short.txt", ("word "):rep(20)) -- 100 tokens: enough for p = 60 alone, not twice
        local rc, _, err = recipe("equiv.lua", "--model", model_path, "--corpus", tmp .. "/short.txt", "--p", "60",
            "--compose")
        if not rc then return pending("build/cartridge not built") end
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("CorpusTooShort", 1, true) and err:find("with --compose", 1, true), err)
    end)
end)
