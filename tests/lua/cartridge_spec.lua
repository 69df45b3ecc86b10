-- The cartridge from Lua: the artifact, the gate recipe, the corpus, Adam state.

local cartridge = require("cartridge")
local helper = require("helper")
local ffi = cartridge.ffi
local cart = cartridge.cart

local tmp, model_path, other_path
setup(function()
    tmp = helper.tmpdir()
    model_path = tmp .. "/q.gguf"
    other_path = tmp .. "/q-other.gguf"
    local rm = require("cartridge.randmodel")
    rm.write({ out = model_path, preset = "qwen3-tiny", dtype = "f32", quiet = true })
    rm.write({ out = other_path, preset = "qwen3-tiny", dtype = "f32", seed = 2, quiet = true })
end)
teardown(function() helper.rmdir(tmp) end)

local function logits_behind(m, c, ids)
    local kv = m:new_kv(c.p + #ids, "f32")
    c:append_to(kv)
    local out = ffi.new("float[?]", #ids * m.n_vocab)
    ffi.copy(out, m:forward(kv, ids, "all"), #ids * m.n_vocab * 4)
    kv:free()
    return out
end

describe("the cartridge artifact", function()
    it("saves and loads to identical logits, with its geometry and metadata", function()
        local m = cartridge.model.load(model_path)
        local c = cart.new(m, 12, 1)
        c:capture(m, { 256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100 })
        c:rows(1, 0)[5 * c.row + 3] = 0.25 -- as if trained
        local path = tmp .. "/sub/dir/c.safetensors"
        os.execute("mkdir -p " .. tmp .. "/sub/dir")
        c:save(path, m, { training = { steps = 3, lr = 2e-3 }, draft_reference = { 5, 6, 7 } })
        local d, info = cart.load(path, m)
        assert.are.equal(12, d.p)
        assert.are.equal(1, d.frozen)
        assert.are.equal(m.config.n_layer, d.n_layer)
        assert.are.same({ 5, 6, 7 }, info.draft_reference:list())
        assert.are.equal(3, info.training.steps)
        assert.are.equal("qwen3", info.metadata["cartridge.architecture"])
        local a, b = logits_behind(m, c, { 1, 2, 3 }), logits_behind(m, d, { 1, 2, 3 })
        local worst = 0
        for i = 0, 3 * m.n_vocab - 1 do worst = math.max(worst, math.abs(a[i] - b[i])) end
        print(("  save -> load: max |dlogit| %g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
        -- any safetensors reader sees the documented tensors
        local f = cartridge.safetensors.open(path)
        assert.are.same({ 11, m.config.n_head_kv, m.config.head_dim }, f:tensor("layers.0.k").shape)
        assert.are.same({ 1, m.config.n_head_kv, m.config.head_dim }, f:tensor("layers.1.v_sink").shape)
        assert.are.equal("I64", f:tensor("draft_reference").dtype_name)
        f:close()
        m:free()
    end)

    it("refuses a model it was not trained on, naming both", function()
        local m = cartridge.model.load(model_path)
        local c = cart.new(m, 4, 1)
        c:capture(m, { 1, 2, 3, 4 })
        local path = tmp .. "/fp.safetensors"
        c:save(path, m)
        local other = cartridge.model.load(other_path)
        local ok, err = pcall(cart.load, path, other)
        assert.is_false(ok)
        assert.truthy(err:find("fingerprint", 1, true) and err:find(other_path, 1, true), err)
        local small = tmp .. "/small.gguf"
        require("cartridge.randmodel").write({ out = small, preset = "qwen3-tiny", layers = 1, dtype = "f32", quiet = true })
        local s = cartridge.model.load(small)
        ok, err = pcall(cart.load, path, s)
        assert.is_false(ok)
        assert.truthy(err:find("2 layers", 1, true) and err:find("1 x", 1, true), err)
        m:free(); other:free(); s:free()
    end)

    -- a copy of a cartridge file with its metadata changed by edit(meta)
    local function with_metadata(path, out, edit)
        local f = cartridge.safetensors.open(path)
        local tensors, meta = {}, {}
        for _, t in ipairs(f:tensors()) do
            tensors[#tensors + 1] = { name = t.name, dtype = t.dtype_name, shape = t.shape, data = t.data }
        end
        for k, v in pairs(f.metadata) do meta[k] = v end
        edit(meta)
        cartridge.safetensors.write(out, tensors, meta, { checksum = true })
        f:close()
        return out
    end

    -- loads with cart.allow_foreign set to foreign; returns ok, err and
    -- what went to stderr
    local function load_as(path, m, foreign)
        local said = {}
        local stderr = io.stderr
        io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do said[#said + 1] = s end end }
        cart.allow_foreign = foreign
        local ok, c = pcall(cart.load, path, m)
        cart.allow_foreign = false
        io.stderr = stderr
        if ok then c:free() end
        return ok, c, table.concat(said)
    end

    it("refuses a model whose weights differ only where the fingerprint does not look (every byte is hashed)",
        function()
        -- reader.gguf with the middle of every attn_v zeroed: the sampled
        -- fingerprint (4 KiB at each end of each tensor) is unchanged
        local original = "models/reader.gguf"
        local file = cartridge.gguf.open(original)
        local bytes = helper.read_file(original)
        local pieces, at, zeroed = {}, 0, 0
        for _, t in ipairs(file:tensors()) do
            if t.name:find("attn_v.weight", 1, true) then
                assert.is_true(t.nbytes > 3 * 4096, t.name)
                local from, to = file.data_offset + t.offset + 4096, file.data_offset + t.offset + t.nbytes - 4096
                pieces[#pieces + 1] = bytes:sub(at + 1, from) .. string.rep("\0", to - from)
                at, zeroed = to, zeroed + 1
            end
        end
        file:close()
        assert.is_true(zeroed > 0)
        pieces[#pieces + 1] = bytes:sub(at + 1)
        local copy = tmp .. "/reader-zeroed.gguf"
        helper.write_file(copy, table.concat(pieces))
        local m, z = cartridge.model.load(original), cartridge.model.load(copy)
        assert.are.equal(cart.fingerprint(m), cart.fingerprint(z))
        assert.are_not.equal(m:content_hash(), z:content_hash())
        local c = cart.new(m, 4, 1)
        c:capture(m, { 1, 2, 3, 4 })
        local path = c:save(tmp .. "/reader.safetensors", m)
        c:free()
        local ok, err = load_as(path, z, false)
        print("  zeroed attn_v: " .. tostring(err))
        assert.is_false(ok)
        assert.truthy(err:find("content hash " .. m:content_hash(), 1, true) and err:find(copy, 1, true)
            and err:find("--foreign-cartridge", 1, true), err)
        local said
        ok, err, said = load_as(path, z, true)
        assert.is_true(ok, err)
        assert.truthy(said:find("warning", 1, true) and said:find(z:content_hash(), 1, true), said)
        assert.is_true((load_as(path, m, false)))
        m:free(); z:free()
    end)

    it("requires its format, geometry and model identity in the metadata, and checks each", function()
        local m = cartridge.model.load(model_path)
        local c = cart.new(m, 4, 1)
        c:capture(m, { 1, 2, 3, 4 })
        local path = c:save(tmp .. "/meta.safetensors", m)
        c:free()
        assert.are.equal("cartridge-v2", cartridge.safetensors.open(path).metadata["cartridge.format"])
        local cases = {
            { "no fingerprint", function(t) t["cartridge.model_fingerprint"] = nil end, "no model fingerprint" },
            { "no content hash", function(t) t["cartridge.model_content_hash"] = nil end,
                "no cartridge.model_content_hash" },
            { "no format", function(t) t["cartridge.format"] = nil end, "no cartridge.format" },
            { "a false format", function(t) t["cartridge.format"] = "cartridge-v9" end, "'cartridge-v9'" },
            { "a false architecture", function(t) t["cartridge.architecture"] = "llama" end, "llama model" },
            { "a false n_layer", function(t) t["cartridge.n_layer"] = "7" end, "cartridge.n_layer '7'" },
            { "a false p", function(t) t["cartridge.p"] = "41" end, "cartridge.p '41' where its tensors have 4" },
            { "no frozen", function(t) t["cartridge.frozen"] = nil end, "cartridge.frozen nothing" },
            { "a false head_dim", function(t) t["cartridge.head_dim"] = "3" end, "cartridge.head_dim '3'" },
        }
        for i, case in ipairs(cases) do
            local bad = with_metadata(path, ("%s/meta-%d.safetensors"):format(tmp, i), case[2])
            local ok, err = load_as(bad, m, false)
            print(("  %s: %s"):format(case[1], tostring(err)))
            assert.is_false(ok, case[1])
            assert.truthy(err:find(case[3], 1, true) and err:find("--foreign-cartridge", 1, true), err)
            local said
            ok, err, said = load_as(bad, m, true)
            assert.is_true(ok, err)
            assert.truthy(said:find("warning: ", 1, true) and said:find(case[3], 1, true), said)
        end
        -- the recipes take the flag: ask.lua refuses the file, then answers from it
        local bad = ("%s/meta-%d.safetensors"):format(tmp, 1)
        local rc, out, err = helper.cartridge("run", "recipes/ask.lua", "--model", model_path, "--load", bad,
            "--ask", "hello", "--max-a", "2", "--threads", "1")
        assert.are_not.equal(0, rc, out)
        assert.truthy(err:find("no model fingerprint", 1, true), err)
        rc, out, err = helper.cartridge("run", "recipes/ask.lua", "--model", model_path, "--load", bad,
            "--ask", "hello", "--max-a", "2", "--threads", "1", "--foreign-cartridge")
        assert.are.equal(0, rc, err)
        assert.truthy(err:find("warning: its metadata names no model fingerprint", 1, true), err)
        assert.truthy(out:find("cartridge loaded from", 1, true), out)
        -- a v1 file (before the content hash) loads, saying what it cannot check
        local v1 = with_metadata(path, tmp .. "/meta-v1.safetensors", function(t)
            t["cartridge.format"], t["cartridge.model_content_hash"] = "cartridge-v1", nil
        end)
        local ok, err, said = load_as(v1, m, false)
        assert.is_true(ok, err)
        assert.truthy(said:find("cartridge-v1 file records only a sampled fingerprint", 1, true), said)
        m:free()
    end)

    it("refuses files that are not cartridges or have stray tensors", function()
        local data = ffi.new("float[32]")
        cartridge.safetensors.write(tmp .. "/x.safetensors", { { name = "weights", dtype = "F32", shape = { 32 }, data = data } })
        local ok, err = pcall(cart.load, tmp .. "/x.safetensors")
        assert.is_false(ok)
        assert.truthy(err:find("not a cartridge artifact", 1, true), err)
        cartridge.safetensors.write(tmp .. "/y.safetensors", {
            { name = "layers.0.k", dtype = "F32", shape = { 2, 2, 4 }, data = data },
            { name = "layers.0.v", dtype = "F32", shape = { 2, 2, 4 }, data = data },
            { name = "extra", dtype = "F32", shape = { 4 }, data = data },
        })
        ok, err = pcall(cart.load, tmp .. "/y.safetensors")
        assert.is_false(ok)
        assert.truthy(err:find("unexpected tensor 'extra'", 1, true), err)
        cartridge.safetensors.write(tmp .. "/z.safetensors", {
            { name = "layers.0.k", dtype = "F32", shape = { 2, 2, 4 }, data = data },
            { name = "layers.0.v", dtype = "F32", shape = { 3, 2, 4 }, data = data },
        })
        ok, err = pcall(cart.load, tmp .. "/z.safetensors")
        assert.is_false(ok)
        assert.truthy(err:find("'layers.0.v' has shape [3, 2, 4], expected [2, 2, 4]", 1, true), err)
    end)
end)

describe("Adam state", function()
    it("saves and restores moments and step count", function()
        local m = cartridge.model.load(model_path)
        local c = cart.new(m, 4, 1)
        c:init_random(1, 0.5)
        local t = cartridge.trainer.new(m)
        local segs = { { 1, 2, 3, 4, 5 } }
        local targets = { { 2, 7, -0.5 }, { 3, 9, -1.0 }, { 4, 11, -0.2 } }
        local opt = cartridge.adam.new(c, { lr = 1e-2 })
        for _ = 1, 3 do
            c:zero_grad()
            t:distill(c, segs, targets, { backward = true })
            opt:step()
        end
        opt:save(tmp .. "/adam.safetensors")
        local opt2 = cartridge.adam.new(c, { lr = 1e-2 })
        opt2:load(tmp .. "/adam.safetensors")
        assert.are.equal(3, opt2:steps())
        local n = c:trainable_count()
        local a = cartridge.C.cart_adam_moment(opt.handle, 1)
        local b = cartridge.C.cart_adam_moment(opt2.handle, 1)
        for i = 0, n - 1 do assert.are.equal(a[i], b[i]) end
        m:free()
    end)
end)

describe("recipes/equiv.lua", function()
    local function equiv(...)
        if not helper.exists(helper.bin) then return nil end
        return helper.cartridge("run", "recipes/equiv.lua", ...)
    end

    -- the ISA levels this machine has, by name
    local function isa_levels()
        local levels = {}
        for isa = 0, cartridge.C.CART_ISA_COUNT - 1 do
            if cartridge.C.cart_isa_supported(isa) == 1 then
                levels[#levels + 1] = cartridge.ffi.string(cartridge.C.cart_isa_name(isa))
            end
        end
        return levels
    end

    -- the gate at one level on --p 128 --suffix-max 64: asserts it is bitwise
    -- and prints its line
    local function gate_at(isa, path, kv, label)
        local args = { "run", "recipes/equiv.lua", "--model", path, "--corpus", "README.md", "--p", "128",
            "--suffix-max", "64", "--kv", kv }
        for i, a in ipairs(args) do args[i] = helper.q(a) end
        local rc, out, err = helper.run("CART_ISA=" .. isa .. " " .. helper.q(helper.bin) .. " "
            .. table.concat(args, " ") .. " </dev/null")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("max |dlogit| 0.000000, mean 0.0000000, greedy agreement 64/64", 1, true),
            label .. ": " .. out)
        print(("  %s: %s"):format(label, out:match("max |dlogit|[^\n]*")))
    end

    it("passes bitwise on stories260K with f32 and f16 caches", function()
        local path, why = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why) end
        for _, kv in ipairs({ "f32", "f16" }) do
            local rc, out, err = equiv("--model", path, "--corpus", "README.md", "--p", "256", "--suffix-max", "128", "--kv", kv)
            if not rc then return pending("build/cartridge not built") end
            assert.are.equal(0, rc, err)
            assert.truthy(out:find("max |dlogit| 0.000000, mean 0.0000000, greedy agreement 128/128", 1, true), out)
            assert.truthy(out:find("PASS: untrained corpus-init cartridge is behaviorally identical", 1, true), out)
        end
    end)

    it("passes on the reference Qwen3 models", function()
        for _, name in ipairs({ "qwen3-tiny-f32.gguf", "qwen3-tiny-f16.gguf", "qwen3-tiny-realvocab-f16.gguf" }) do
            local path, why = helper.fixture("reference/" .. name)
            if not path then return pending(why) end
            local rc, out, err = equiv("--model", path, "--corpus", "README.md", "--p", "256", "--suffix-max", "128")
            if not rc then return pending("build/cartridge not built") end
            assert.are.equal(0, rc, err)
            assert.truthy(out:find("greedy agreement 128/128", 1, true), out)
        end
    end)

    it("passes bitwise at every ISA level this machine has", function()
        -- the demo-sized model: head_dim 64, so attention runs the level's kernels too
        local levels = isa_levels()
        local path = tmp .. "/demo.gguf"
        require("cartridge.randmodel").write({ out = path, preset = "default", dtype = "f16", quiet = true })
        for _, isa in ipairs(levels) do
            for _, kv in ipairs({ "f32", "f16" }) do
                if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
                gate_at(isa, path, kv, isa .. ", " .. kv .. " KV")
            end
        end
    end)

    it("passes bitwise on quantized models (integer products) at every ISA level", function()
        -- the build's qwen3 `default` preset in block types (models/quant):
        -- the activations are quantized per row, so a row's bits do not
        -- depend on the batch, and the gate holds at f32 and f16 KV
        local levels = isa_levels()
        for _, dtype in ipairs({ "q4_K", "q8_0", "q6_K" }) do
            local path = helper.root .. "/models/quant/default-" .. dtype .. ".gguf"
            if not helper.exists(path) then return pending(path .. " not found (the build writes it)") end
            if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
            -- every level for q4_K, the best one for the others
            for _, isa in ipairs(dtype == "q4_K" and levels or { levels[#levels] }) do
                for _, kv in ipairs({ "f32", "f16" }) do gate_at(isa, path, kv, dtype .. ", " .. isa .. ", " .. kv .. " KV") end
            end
        end
    end)

    it("says CorpusTooShort with the count and the fix", function()
        helper.write_file(tmp .. "/tiny.txt", "hello there")
        local rc, _, err = equiv("--model", model_path, "--corpus", tmp .. "/tiny.txt", "--p", "256")
        if not rc then return pending("build/cartridge not built") end
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("CorpusTooShort", 1, true) and err:find("lower --p", 1, true), err)
    end)
end)

describe("the corpus", function()
    it("takes a directory's top-level .md files in order, with document headers", function()
        os.execute("mkdir -p " .. tmp .. "/docs/sub")
        helper.write_file(tmp .. "/docs/b.md", "second")
        helper.write_file(tmp .. "/docs/a.md", "first")
        helper.write_file(tmp .. "/docs/notes.txt", "ignored")
        helper.write_file(tmp .. "/docs/sub/c.md", "ignored too")
        local m = cartridge.model.load(model_path)
        local c = cartridge.corpus.load({ tmp .. "/docs" }, m:tokenizer())
        assert.are.equal(2, #c.files)
        assert.are.equal(tmp .. "/docs/a.md", c.files[1].path)
        assert.are.equal("\n\n# Document: " .. tmp .. "/docs/a.md\n\nfirst\n\n# Document: " .. tmp .. "/docs/b.md\n\nsecond", c.text)
        assert.are.equal(tmp .. "/docs/b.md", c:file_of(c.n_tokens - 1))
        m:free()
    end)

    it("names the file and byte offset of invalid UTF-8, and refuses oversized files", function()
        helper.write_file(tmp .. "/bad.txt", "good text \xff\xfe and more")
        local m = cartridge.model.load(model_path)
        local ok, err = pcall(cartridge.corpus.load, { tmp .. "/bad.txt" }, m:tokenizer())
        assert.is_false(ok)
        assert.truthy(err:find("bad.txt is not valid UTF-8: byte offset 10", 1, true), err)
        local saved = cartridge.corpus.MAX_FILE_BYTES
        cartridge.corpus.MAX_FILE_BYTES = 8
        ok, err = pcall(cartridge.corpus.load, { tmp .. "/docs/a.md", tmp .. "/bad.txt" }, m:tokenizer())
        cartridge.corpus.MAX_FILE_BYTES = saved
        assert.is_false(ok)
        assert.truthy(err:find("above the limit", 1, true), err)
        ok, err = pcall(cartridge.corpus.load, { tmp .. "/missing.md" }, m:tokenizer())
        assert.is_false(ok)
        assert.truthy(err:find("missing.md", 1, true), err)
        m:free()
    end)
end)
