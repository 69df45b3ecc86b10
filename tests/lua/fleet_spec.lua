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

-- ---------------------------------------------------------------------------
-- Fleet training

local fleet = require("cartridge.fleet")

local function stories()
    return helper.fixture("models/stories260K.gguf")
end

-- Three small documents of different lengths (paragraphs of a README kept
-- in tests/fixtures/fleet, so that editing the docs changes no test's data):
-- readme-head.md's by default, or those of `fixture` there.
-- readme-1609e47.md (the README's first 130 lines at commit 1609e47) is
-- data on which two checks once failed: a resumed fleet forgot its
-- residents, and retrieval picks a single document for doc3's question.
local function write_docs(where, fixture)
    os.execute("mkdir -p " .. helper.q(where))
    local readme = helper.read_file("tests/fixtures/fleet/" .. (fixture or "readme-head.md"))
    local lines = {}
    for l in (readme .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
    local spans = { { 1, 40 }, { 41, 100 }, { 101, 130 } }
    for k, s in ipairs(spans) do
        helper.write_file(("%s/doc%d.md"):format(where, k), table.concat(lines, "\n", s[1], s[2]) .. "\n")
    end
    return where
end

local TINY = { "--p", "48", "--accum", "2", "--chunk-min", "24", "--chunk-max", "48", "--max-q", "8", "--max-a",
    "12" }
local function fleet_args(extra) return helper.args(TINY, extra) end

-- A fleet directory's files, name -> bytes.
local function snapshot(dir)
    local out = {}
    for _, name in ipairs(require("cartridge.fs").list(dir)) do
        if name:match("%.safetensors$") or name == "fleet.json" then out[name] = helper.read_file(dir .. "/" .. name) end
    end
    return out
end

-- Trains a small fleet of write_docs' documents (of `fixture`) on
-- stories260K into tmp/<name> with an index of 64-token chunks: dir, the
-- documents' folder and the run's output; nil and why when it cannot run.
local function small_fleet(name, rounds, fixture)
    local model, why = stories()
    if not model then return nil, why end
    if not helper.exists(helper.bin) then return nil, "build/cartridge not built" end
    local where, dir = write_docs(tmp .. "/" .. name .. "-docs", fixture), tmp .. "/" .. name
    local rc, out, err = recipe("fleet.lua", fleet_args({ "--model", model, "--corpus", where, "--fleet", dir,
        "--rounds", tostring(rounds), "--embed-chunk", "64" }))
    assert(rc == 0, err)
    return dir, where, out
end

describe("the fleet manifest", function()
    local m, docs
    setup(function()
        m = cartridge.model.load(model_path)
        local where = write_docs(tmp .. "/mdocs")
        docs = fleet.documents({ where }, m:tokenizer())
    end)
    teardown(function() m:free() end)

    it("round-trips through fleet.json", function()
        local man = fleet.new_manifest(m, docs, { p = 32, frozen = 1, settings = { lr = 2e-3 } })
        man.rounds, man.docs[2].steps, man.docs[2].entered, man.docs[2].resident = 7, 5, 3, true
        local dir = tmp .. "/manifest"
        os.execute("mkdir -p " .. dir)
        fleet.write_manifest(dir, man)
        local back = fleet.read_manifest(dir)
        assert.are.same(man, back)
        assert.are.equal("cartridge-fleet", back.format)
        assert.are.equal("doc-001.adam.safetensors", back.docs[2].opt_file)
        assert.are.equal(#docs, #back.docs)
        assert.are.equal(docs[3].corpus.n_tokens, back.docs[3].tokens)
    end)

    it("refuses a damaged manifest, naming the file and the field", function()
        local dir = tmp .. "/bad-manifest"
        os.execute("mkdir -p " .. dir)
        local good = require("cartridge.json").encode(fleet.new_manifest(m, docs, { p = 32, frozen = 1 }))
        local cases = {
            { good:sub(1, 50), "json: " },
            { good:gsub('"format":"cartridge%-fleet"', '"format":"other"'), 'format is "other"' },
            { good:gsub('"version":1', '"version":9'), "version 9 is not one this build reads" },
            { good:gsub('"doc%-001%.safetensors"', '"../../etc/passwd"'), 'docs[1].cart_file must be "doc-001.safetensors"' },
            { good:gsub('"steps":0', '"steps":-1', 1), "docs[0].steps must be a non-negative integer" },
            { good:gsub('"name":"doc2.md"', '"name":"doc1.md"'), 'docs[1].name "doc1.md" repeats docs[0]' },
            { good:gsub('"p":32', '"p":1.5'), "p must be an integer" },
            { good:gsub('"resident":false', '"resident":"no"', 1), "docs[0].resident must be true or false" },
            { good:gsub('"rows":32', '"rows":33', 1), "docs[0].rows must be an integer in [1, p = 32]" },
            { "[]", "the top level must be an object" },
            -- numbers past a double's range read as infinity, which no manifest written back can hold
            { '{"note":1e999,' .. good:sub(2), "the manifest.note is a number beyond a double's range" },
            { (good:gsub('"resident":false', '"resident":false,"x":[0,-1e999]', 1)),
                "the manifest.docs[0].x[1] is a number beyond a double's range" },
        }
        for _, case in ipairs(cases) do
            helper.write_file(dir .. "/fleet.json", case[1])
            local ok, err = pcall(fleet.read_manifest, dir)
            assert.is_false(ok)
            assert.truthy(err:find(dir .. "/fleet.json", 1, true) and err:find(case[2], 1, true), err)
            assert.truthy(err:find("damaged", 1, true), err)
        end
        local ok, err = pcall(fleet.read_manifest, tmp .. "/nowhere")
        assert.is_false(ok)
        assert.truthy(err:find("is not a fleet directory", 1, true), err)
    end)

    it("names documents by file name and refuses two of one name", function()
        os.execute("mkdir -p " .. tmp .. "/twins/a " .. tmp .. "/twins/b")
        helper.write_file(tmp .. "/twins/a/same.md", "one text")
        helper.write_file(tmp .. "/twins/b/same.md", "another text")
        local ok, err = pcall(fleet.documents, { tmp .. "/twins/a", tmp .. "/twins/b" }, m:tokenizer())
        assert.is_false(ok)
        assert.truthy(err:find("two documents are named same.md", 1, true), err)
        assert.are.same({ "doc1.md", "doc2.md", "doc3.md" }, { docs[1].name, docs[2].name, docs[3].name })
        -- no document header: the document's own ids
        local ids = m:tokenizer():encode_ids(helper.read_file(tmp .. "/mdocs/doc1.md"), { special = true })
        assert.are.equal(#ids, docs[1].corpus.n_tokens)
    end)
end)

describe("the budget manager", function()
    local m, docs
    -- a fleet directory of corpus-init cartridges for the documents
    local function init_fleet(dir, p)
        os.execute("mkdir -p " .. helper.q(dir))
        local man = fleet.new_manifest(m, docs, { p = p, frozen = 1 })
        for i, d in ipairs(docs) do
            man.docs[i].rows = p
            local ids = d.corpus.ids:sub(0, p)
            local c = cart.new(m, p, 1)
            c:capture(m, ids)
            c:save(dir .. "/" .. fleet.cart_file(i), m, { extra_meta = { ["fleet.document"] = d.name, ["fleet.steps"] = 0 } })
            c:free()
        end
        fleet.write_manifest(dir, man)
        return man
    end
    -- a conversation with hand-made targets, as the synthesizer makes them
    local function convo(seed)
        local tg = cartridge.trainer.targets()
        local student = {}
        for j = 1, 8 do student[j] = (seed * 7 + j * 13) % 200 + 1 end
        for j = 2, 8 do tg:push(j - 1, (student[j] + seed) % 200, -0.3) end
        return { student = student, targets = tg, answer_len = 7 }
    end
    setup(function()
        m = cartridge.model.load(model_path)
        docs = fleet.documents({ write_docs(tmp .. "/bdocs") }, m:tokenizer())
    end)
    teardown(function() m:free() end)

    it("evicts and reloads a cartridge bit-identically to keeping it resident", function()
        local mans = { init_fleet(tmp .. "/keep", 16), init_fleet(tmp .. "/move", 16) }
        local mgrs = {}
        for k, dir in ipairs({ tmp .. "/keep", tmp .. "/move" }) do
            mgrs[k] = fleet.manager(m, dir, mans[k], { budget = 3, lr = 1e-2, warmup = 3, rotate_every = 0,
                evict_frac = 0.5 })
            mgrs[k]:restore()
        end
        local tr = cartridge.trainer.new(m)
        for step = 1, 5 do
            for _, mgr in ipairs(mgrs) do
                local plan = { target = 1, parts = step % 2 == 0 and { 3, 1 } or { 1, 2 } }
                fleet.train_round(mgr, tr, plan, { convo(step), convo(step + 10) }, 2)
            end
            if step == 2 or step == 3 then
                -- out to disk and back, keeping its warm-up where it was
                local d = mans[2].docs[1]
                local entered = d.entered
                mgrs[2]:evict(1, true)
                assert.is_nil(mgrs[2].resident[1])
                mgrs[2]:load(1, entered)
            end
        end
        local a, b = mgrs[1].resident[1], mgrs[2].resident[1]
        local same = true
        for l = 0, a.cart.n_layer - 1 do
            for which = 0, 1 do
                same = same and ffi.C.memcmp(a.cart:rows(l, which), b.cart:rows(l, which), a.cart.p * a.cart.row * 4) == 0
            end
        end
        local n = a.cart:trainable_count() * 4
        for which = 0, 1 do
            same = same and ffi.C.memcmp(cartridge.C.cart_adam_moment(a.opt.handle, which),
                cartridge.C.cart_adam_moment(b.opt.handle, which), n) == 0
        end
        assert.is_true(same, "the rows or moments differ after an eviction")
        assert.are.equal(a.opt:steps(), b.opt:steps())
        assert.are.equal(5, mans[2].docs[1].steps)
        assert.are.equal(3, mans[2].docs[2].steps) -- parts of rounds 1, 3, 5
        print(("  doc 1 after 5 steps with two evictions: rows and Adam moments bitwise equal (%d values)")
            :format(a.cart:trainable_count()))
        for _, mgr in ipairs(mgrs) do mgr:free() end
        tr:free()
    end)

    it("warms each part's learning rate up from its entry", function()
        local man = init_fleet(tmp .. "/warm", 16)
        local mgr = fleet.manager(m, tmp .. "/warm", man, { budget = 1, lr = 0.01, warmup = 4, rotate_every = 1,
            evict_frac = 1 })
        mgr:restore()
        assert.are.same({ 1 }, mgr:residents())
        local lrs = {}
        for k = 1, 6 do
            lrs[k] = mgr:lr(1)
            man.docs[1].steps = man.docs[1].steps + 1
        end
        assert.are.same({ 0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01 }, lrs)
        mgr:free()
    end)

    it("rotates out the most-stepped residents and brings in the least-stepped absent ones", function()
        local man = init_fleet(tmp .. "/rot", 16)
        local mgr = fleet.manager(m, tmp .. "/rot", man, { budget = 2, lr = 0.01, warmup = 1, rotate_every = 2,
            evict_frac = 0.5 })
        assert.are.same({ 1, 2 }, mgr:restore())
        man.docs[1].steps, man.docs[2].steps, man.docs[3].steps = 4, 6, 4
        man.rounds = 1
        assert.is_nil(mgr:rotate()) -- not yet
        man.rounds = 2
        local evicted, loaded = mgr:rotate()
        assert.are.same({ 2 }, evicted)
        assert.are.same({ 3 }, loaded)
        assert.are.same({ 1, 3 }, mgr:residents())
        -- the checkpoint on disk: steps in the files and the manifest
        local back = fleet.read_manifest(tmp .. "/rot")
        assert.are.same({ true, false, true }, { back.docs[1].resident, back.docs[2].resident, back.docs[3].resident })
        local _, info = cart.load(tmp .. "/rot/" .. fleet.cart_file(2), m)
        assert.are.equal("6", info.metadata["fleet.steps"])
        -- ties: the lower index leaves first, and the lower index comes in
        man.docs[2].steps = 3
        man.rounds = 4
        evicted, loaded = mgr:rotate()
        assert.are.same({ 1 }, evicted)
        assert.are.same({ 2 }, loaded)
        mgr:free()
    end)

    it("frees its memory without forgetting the residents, so a resumed fleet brings the same ones back", function()
        local dir = tmp .. "/keep-residents"
        local man = init_fleet(dir, 16)
        local mgr = fleet.manager(m, dir, man, { budget = 2, lr = 0.01, warmup = 8, rotate_every = 1,
            evict_frac = 0.5 })
        assert.are.same({ 1, 2 }, mgr:restore())
        man.docs[1].steps, man.docs[2].steps, man.docs[3].steps = 3, 5, 0
        man.rounds = 1
        mgr:rotate() -- doc 2 (most-stepped) leaves, doc 3 comes in at 0 steps
        man.docs[1].steps, man.docs[3].steps = 6, 1 -- two rounds on: now doc 2 has fewer steps than doc 1
        mgr:checkpoint()
        mgr:free()
        -- what recipes/fleet.lua does after training: the index, then the manifest
        fleet.write_manifest(dir, man)
        local back = fleet.read_manifest(dir)
        assert.are.same({ true, false, true }, { back.docs[1].resident, back.docs[2].resident, back.docs[3].resident })
        local again = fleet.manager(m, dir, back, { budget = 2, lr = 0.01, warmup = 8, rotate_every = 1,
            evict_frac = 0.5 })
        again:restore()
        -- by steps alone the least-stepped would come back (3 and 2), and a
        -- fresh entry would restart the warm-up
        assert.are.same({ 1, 3 }, again:residents())
        assert.are.same({ 0, 0 }, { back.docs[1].entered, back.docs[3].entered })
        assert.are.same({ mgr:lr(1), mgr:lr(3) }, { again:lr(1), again:lr(3) })
        again:free()
    end)

    it("plans rounds from (seed, round): targets by tokens, isolated with p_iso, distinct distractors", function()
        local fake = { resident = {} }
        local tokens = { 100, 300, 600, 0 }
        function fake:residents() return { 1, 2, 3, 4 } end
        function fake:doc(i) return { tokens = tokens[i] } end
        local hits, iso, n = { 0, 0, 0, 0 }, 0, 4000
        for round = 1, n do
            local plan = fleet.plan(fake, 42, round, { p_iso = 0.75, distract_max = 2 })
            hits[plan.target] = hits[plan.target] + 1
            if plan.isolated then
                iso = iso + 1
                assert.are.same({ plan.target }, plan.parts)
            else
                assert.truthy(#plan.parts >= 2 and #plan.parts <= 3)
                local seen = {}
                for _, i in ipairs(plan.parts) do
                    assert.is_nil(seen[i])
                    seen[i] = true
                end
                assert.truthy(seen[plan.target])
            end
        end
        print(("  %d plans: targets %d/%d/%d/%d (tokens 100/300/600/0), isolated %.3f"):format(n, hits[1], hits[2],
            hits[3], hits[4], iso / n))
        assert.truthy(math.abs(hits[1] / n - 0.1) < 0.03 and math.abs(hits[3] / n - 0.6) < 0.03)
        assert.truthy(math.abs(iso / n - 0.75) < 0.03)
        -- the same round gives the same plan
        assert.are.same(fleet.plan(fake, 42, 17, { p_iso = 0.5, distract_max = 3 }),
            fleet.plan(fake, 42, 17, { p_iso = 0.5, distract_max = 3 }))
    end)
end)

describe("recipes/fleet.lua training", function()
    -- Trains the documents of `fixture` (write_docs) 4 rounds in one run into
    -- tmp/<name>-whole and 2 + 2 with --resume into tmp/<name>-halves, a
    -- rotation after every round, and checks that both end with the same
    -- bytes. Returns the three runs' outputs, or nil and why.
    local function whole_and_halves(name, fixture)
        local model, why = stories()
        if not model then return nil, why end
        if not helper.exists(helper.bin) then return nil, "build/cartridge not built" end
        local where = write_docs(tmp .. "/" .. name .. "-docs", fixture)
        local common = { "--model", model, "--corpus", where, "--budget", "2", "--rotate-every", "1", "--p-iso", "0.4" }
        local function run(dir, rounds, resume)
            local args = { "--fleet", dir, "--rounds", tostring(rounds) }
            for _, a in ipairs(common) do args[#args + 1] = a end
            if resume then args[#args + 1] = "--resume" end
            local rc, out, err = recipe("fleet.lua", fleet_args(args))
            assert.are.equal(0, rc, err)
            return out
        end
        local whole, halves = tmp .. "/" .. name .. "-whole", tmp .. "/" .. name .. "-halves"
        local outs = { run(whole, 4), run(halves, 2), run(halves, 2, true) }
        assert.truthy(outs[3]:find("fleet resumed from " .. halves .. ": 3 documents, p = 48, 2 rounds so far", 1, true),
            outs[3])
        local a, b = snapshot(whole), snapshot(halves)
        local n = 0
        for file, bytes in pairs(a) do
            assert.truthy(b[file] == bytes, file .. " differs between the whole run and the resumed one")
            n = n + 1
        end
        print(("  %s: 4 rounds vs 2 + 2 resumed (a rotation after every round): %d files byte-identical"):format(
            fixture or "readme-head.md", n))
        assert.are.equal(8, n) -- 3 cartridges, 3 moment files, the manifest, the index
        return outs, whole
    end

    it("trains a fleet, and a resumed fleet ends with the bits of an uninterrupted one", function()
        local outs, whole = whole_and_halves("train")
        if not outs then return pending(whole) end
        local order = { "^model: ", "\ndocuments: 3, %d+ tokens", "\nfleet initialized in ", "\nresident: doc1.md, doc2.md %(budget 2%)",
            "\nheld%-out distill loss %(doc1.md, isolated%) before: %d", "\nround 1/4: target doc %d %(doc%d.md%), [%w %-x]+, distill loss %d",
            "\nrotation after round 1: evicted ", "\nround 4/4: ", "\nfleet: 4 rounds, 8 conversations, ",
            "\nheld%-out distill loss %(doc1.md, isolated%) after: ", "\nsteps per document: %d+/%d+/%d+ %(fleet round 4%)",
            "\nfleet saved to " }
        helper.assert_in_order(outs[1], order)
        assert.truthy(outs[1]:find("co%-loaded x2"), outs[1]) -- p_iso 0.4: some rounds have a distractor
        -- a second start without --resume is refused
        local rc, _, err = recipe("fleet.lua", fleet_args({ "--model", stories(), "--corpus", tmp .. "/train-docs",
            "--fleet", whole, "--rounds", "1" }))
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("already holds a fleet; pass --resume", 1, true), err)
    end)

    it("resumes with the residents of the last rotation, not the least-stepped documents", function()
        -- on this data the rotation after round 2 leaves doc1 and doc3
        -- resident with all three documents at 1 step: a resume that forgot
        -- its residents brought back the least-stepped by index (doc1 and
        -- doc2) with a fresh warm-up, and the cartridges and moments differed
        local outs, why = whole_and_halves("resume", "readme-1609e47.md")
        if not outs then return pending(why) end
        assert.truthy(outs[2]:find("\nrotation after round 2: evicted doc2.md; loaded doc1.md\n", 1, true), outs[2])
        assert.truthy(outs[2]:find("\nsteps per document: 1/1/1 (fleet round 2)\n", 1, true), outs[2])
        assert.truthy(outs[3]:find("\nresident: doc1.md, doc3.md (budget 2)\n", 1, true), outs[3])
    end)

    it("refuses a corrupt cartridge or manifest, and documents that do not match", function()
        local model, why = stories()
        if not model then return pending(why) end
        local where = write_docs(tmp .. "/cdocs")
        local dir = tmp .. "/corrupt"
        local rc, _, err = recipe("fleet.lua", fleet_args({ "--model", model, "--corpus", where, "--fleet", dir,
            "--rounds", "0" }))
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        local function resume(corpus)
            return recipe("fleet.lua", fleet_args({ "--model", model, "--corpus", corpus or where, "--fleet", dir,
                "--rounds", "1", "--resume" }))
        end
        -- a flipped byte in a cartridge's data
        local path = dir .. "/doc-001.safetensors"
        local bytes = helper.read_file(path)
        helper.write_file(path, bytes:sub(1, #bytes - 9) .. string.char((bytes:byte(#bytes - 8) + 1) % 256)
            .. bytes:sub(#bytes - 7))
        rc, _, err = resume()
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("fleet: document doc2.md: cart.load: ", 1, true) and err:find(path, 1, true), err)
        assert.falsy(err:find("traceback", 1, true), err)
        helper.write_file(path, bytes)
        -- a damaged manifest
        local man = helper.read_file(dir .. "/fleet.json")
        helper.write_file(dir .. "/fleet.json", man:sub(1, 30))
        rc, _, err = resume()
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("fleet.json: json: ", 1, true) and err:find("damaged", 1, true), err)
        helper.write_file(dir .. "/fleet.json", man)
        -- other documents
        os.execute("mkdir -p " .. tmp .. "/odocs")
        helper.write_file(tmp .. "/odocs/doc1.md", "text")
        rc, _, err = resume(tmp .. "/odocs")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("holds 3 documents and --corpus gives 1", 1, true), err)
        rc, _, err = resume()
        assert.are.equal(0, rc, err)
    end)
end)

-- ---------------------------------------------------------------------------
-- Retrieval and serving from the CLI

local retrieval = require("cartridge.retrieval")

-- Four documents of different subjects: the openings of docs/*.md as
-- tests/fixtures/fleet keeps them.
local function subject_docs(where)
    os.execute("mkdir -p " .. helper.q(where))
    for _, name in ipairs({ "server", "scale-out", "fuzzing", "formats" }) do
        helper.write_file(where .. "/" .. name .. ".md", helper.read_file("tests/fixtures/fleet/" .. name .. ".md"))
    end
    return where
end

describe("the retrieval index", function()
    local m, docs, index
    setup(function()
        m = cartridge.model.load(helper.root .. "/models/default.gguf")
        docs = fleet.documents({ subject_docs(tmp .. "/subjects") }, m:tokenizer())
        index = retrieval.build(m, docs, 128)
    end)
    teardown(function() m:free() end)

    it("chunks documents, keeping a short tail only when it is the first chunk or 32 tokens long", function()
        assert.are.same({ { 0, 100 }, { 100, 100 }, { 200, 40 } }, retrieval.chunks(240, 100))
        assert.are.same({ { 0, 100 }, { 100, 100 } }, retrieval.chunks(231, 100))
        assert.are.same({ { 0, 20 } }, retrieval.chunks(20, 100))
        local n = 0
        for _, d in ipairs(docs) do n = n + #retrieval.chunks(d.corpus.n_tokens, 128) end
        assert.are.equal(n, index.n)
        -- unit rows, centred: their mean is (nearly) zero
        local worst_norm, mean = 0, 0
        for r = 0, index.n - 1 do
            local s = 0
            for i = 0, index.dim - 1 do s = s + index.rows[r * index.dim + i] ^ 2 end
            worst_norm = math.max(worst_norm, math.abs(math.sqrt(s) - 1))
        end
        for i = 0, index.dim - 1 do
            local c = 0
            for r = 0, index.n - 1 do c = c + index.rows[r * index.dim + i] end
            mean = math.max(mean, math.abs(c / index.n))
        end
        print(("  %d chunks x %d dims: max |norm - 1| %.2g, max |mean| %.3g"):format(index.n, index.dim, worst_norm, mean))
        assert.truthy(worst_norm < 1e-5)
        assert.truthy(mean < 0.2)
    end)

    it("picks the document a question came from", function()
        -- a chunk's own text finds its chunk first
        for i, d in ipairs(docs) do
            local c = retrieval.chunks(d.corpus.n_tokens, 128)[2]
            local text = m:tokenizer():decode(d.corpus.ids:sub(c[1], c[2]), { special = true })
            local hit = index:top_docs(index:query(m, text), 8, 2)[1]
            assert.are.equal(i, hit.doc)
            assert.truthy(hit.score > 0.95, hit.score)
        end
        -- a sentence of a document, as a question quotes it (random weights:
        -- well above the chance of 1 in 4, not always right)
        local right, total = 0, 0
        for i, d in ipairs(docs) do
            local lines = {}
            for l in d.corpus.text:gmatch("[^\n]+") do
                if #l > 60 then lines[#lines + 1] = l:sub(1, 120) end
            end
            for k = 1, #lines, math.max(1, math.floor(#lines / 6)) do
                total = total + 1
                if index:top_docs(index:query(m, lines[k]), 8, 1)[1].doc == i then right = right + 1 end
            end
        end
        print(("  top-1 retrieval of quoted sentences: %d/%d (chance %d/%d)"):format(right, total, total / 4, total))
        assert.truthy(right >= total / 2, right .. "/" .. total)
    end)

    it("ranks chunks by score, ties to the lower chunk, and keeps each document once", function()
        local fake = setmetatable({ n = 5, dim = 2, rows = ffi.new("float[10]", { 1, 0, 0.6, 0.8, 1, 0, 0, 1, 0.6, 0.8 }),
            chunk_doc = { 2, 1, 3, 1, 2 } }, getmetatable(index))
        local q = ffi.new("float[2]", { 0.6, 0.8 })
        local hits = fake:top_docs(q, 8, 3)
        assert.are.same({ 1, 2, 3 }, { hits[1].doc, hits[2].doc, hits[3].doc })
        assert.are.equal(1, hits[1].chunk) -- rows 1 and 4 tie at 1.0: the lower
        assert.are.equal(2, #fake:top_docs(q, 4, 9)) -- the best 4 chunks hold 2 documents
        assert.are.equal(3, #fake:top_docs(q, 5, 9))
        assert.are.equal(1, #fake:top_docs(q, 1, 3))
    end)

    it("saves and loads bit for bit, and refuses a damaged or foreign index", function()
        local path = tmp .. "/index.safetensors"
        index:save(path, m)
        local back = retrieval.load(path, m, #docs)
        assert.are.equal(index.n, back.n)
        assert.are.equal(0, ffi.C.memcmp(index.rows, back.rows, index.n * index.dim * 4))
        assert.are.equal(0, ffi.C.memcmp(index.centroid, back.centroid, index.dim * 4))
        assert.are.same(index.chunk_doc, back.chunk_doc)
        local ok, err = pcall(retrieval.load, path, m, 2)
        assert.is_false(ok)
        assert.truthy(err:find("not a document of the fleet's 2", 1, true) and err:find("rebuild the index", 1, true), err)
        local other = cartridge.model.load(model_path)
        ok, err = pcall(retrieval.load, path, other, #docs)
        assert.is_false(ok)
        assert.truthy(err:find("fingerprint", 1, true), err)
        other:free()
        local bytes = helper.read_file(path)
        helper.write_file(path, bytes:sub(1, #bytes - 5) .. "\255" .. bytes:sub(#bytes - 3))
        ok, err = pcall(retrieval.load, path, m, #docs)
        assert.is_false(ok)
        assert.truthy(err:find(path, 1, true) and err:find("checksum", 1, true), err)
        local nan = ffi.new("float[4]", { 0 / 0, 1, 0, 1 })
        cartridge.safetensors.write(path, {
            { name = "embeddings", dtype = "F32", shape = { 2, 2 }, data = nan },
            { name = "centroid", dtype = "F32", shape = { 2 }, data = nan + 2 },
            { name = "chunk_doc", dtype = "I64", shape = { 2 }, data = ffi.new("int64_t[2]") },
        }, { ["index.format"] = retrieval.FORMAT, ["index.embed_chunk"] = "4" })
        ok, err = pcall(retrieval.load, path, nil, 1)
        assert.is_false(ok)
        assert.truthy(err:find("embeddings row 0 is not finite", 1, true), err)
        cartridge.safetensors.write(path, { { name = "embeddings", dtype = "F32", shape = { 4 }, data = nan } },
            { ["index.format"] = "something else" })
        ok, err = pcall(retrieval.load, path, nil, 1)
        assert.is_false(ok)
        assert.truthy(err:find('index.format is "something else"', 1, true), err)
    end)
end)

describe("mapped cartridges", function()
    it("write the same rows into a cache as loaded ones, alone and stacked", function()
        local m = cartridge.model.load(model_path)
        local pa, pb = tmp .. "/map-a.safetensors", tmp .. "/map-b.safetensors"
        local a, b = cart.from_text(m, "the first text", 2), cart.from_text(m, "and another one")
        a:rows(0, 1)[a.row + 3] = 0.125 -- as if trained
        a:save(pa, m)
        b:save(pb, m)
        local ma, mb = cart.map(pa, m), cart.map(pb, m)
        assert.are.equal(a.p, ma.p)
        assert.are.equal(2, ma.frozen)
        for _, dtype in ipairs({ "f16", "f32" }) do
            local k1, k2 = m:new_kv(64, dtype), m:new_kv(64, dtype)
            local ab = cart.compose({ a, b })
            ab:append_to(k1)
            cart.stack({ ma, mb }):append_to(k2)
            assert.are.equal(a.p + b.p, k2:len())
            for l = 0, m.config.n_layer - 1 do
                for which = 0, 1 do
                    assert.are.equal(0, ffi.C.memcmp(k1:raw_rows(l, which), k2:raw_rows(l, which), k1:len() * k1:row_bytes()))
                end
            end
            k1:free(); k2:free(); ab:free()
        end
        ma:free(); mb:free()
        -- a NaN with a payload (what LuaJIT's interpreter could read as another type) is found
        local mc = m.config
        local n = mc.n_head_kv * mc.head_dim
        local data = ffi.new("float[?]", n)
        ffi.cast("uint32_t *", data)[n - 1] = 0xffffffff
        local tensors = {}
        for l = 0, mc.n_layer - 1 do
            for _, name in ipairs({ "k", "v" }) do
                tensors[#tensors + 1] = { name = ("layers.%d.%s"):format(l, name), dtype = "F32",
                    shape = { 1, mc.n_head_kv, mc.head_dim }, data = data }
            end
        end
        -- with a real cartridge's metadata, for one trainable row
        local f = cartridge.safetensors.open(pb)
        local meta = {}
        for k, v in pairs(f.metadata) do meta[k] = v end
        f:close()
        meta["cartridge.p"], meta["cartridge.frozen"], meta["cartridge.checksum"] = "1", "0", nil
        cartridge.safetensors.write(tmp .. "/nan.safetensors", tensors, meta)
        local ok, err = pcall(cart.map, tmp .. "/nan.safetensors", m)
        assert.is_false(ok)
        assert.truthy(err:find("the data of 'layers.0.k' row 0 holds nan: every value must be finite", 1, true), err)
        -- and a finite value no attention can use (its logits would be NaN)
        data[n - 1] = 3e38
        cartridge.safetensors.write(tmp .. "/huge.safetensors", tensors, meta)
        ok, err = pcall(cart.map, tmp .. "/huge.safetensors", m)
        assert.is_false(ok)
        assert.truthy(err:find("'layers.0.k' row 0 holds 3e+38: every value must lie within +-65504", 1, true), err)
        ok, err = pcall(cart.map, tmp .. "/missing.safetensors", m)
        assert.is_false(ok)
        assert.truthy(err:find("missing.safetensors", 1, true), err)
        m:free()
    end)
end)

describe("recipes/fleet.lua --ask", function()
    it("rebuilds the index with --rounds 0, retrieves, composes and answers beside the bare model", function()
        local dir, where, out = small_fleet("ask", 2)
        if not dir then return pending(where) end
        local model, rc, err = stories()
        assert.truthy(out:find("\nindex: %d+ chunks of up to 64 tokens from 3 documents, 64 dims, built in"), out)
        local man = fleet.read_manifest(dir)
        assert.are.equal(64, man.embed_dim)
        local carts = helper.read_file(dir .. "/doc-000.safetensors")
        rc, out, err = recipe("fleet.lua", fleet_args({ "--model", model, "--corpus", where, "--fleet", dir,
            "--rounds", "0", "--resume", "--embed-chunk", "48" }))
        assert.are.equal(0, rc, err)
        assert.falsy(out:find("\nround ", 1, true), out)
        assert.truthy(out:find("index: %d+ chunks of up to 48 tokens"), out)
        assert.truthy(out:find("steps per document: %d+/%d+/%d+ %(fleet round 2%)"), out)
        assert.are.equal(carts, helper.read_file(dir .. "/doc-000.safetensors"))
        assert.are.equal(48, fleet.read_manifest(dir).embed_chunk)
        -- a question that quotes the second document
        local line = helper.read_file(where .. "/doc2.md"):match("\n([^\n]+)\n")
        rc, out, err = recipe("fleet.lua", "--model", model, "--fleet", dir, "--ask", line, "--max-a", "8",
            "--rag-docs", "2")
        assert.are.equal(0, rc, err)
        helper.assert_in_order(out, { "\nretrieved: doc%d.md %(%-?%d%.%d+%), doc%d.md", "\n%[2 composed cartridge%(s%), %d+ KV rows%] %(",
            "\n%[bare model, no context%]\n" })
        rc, out, err = recipe("fleet.lua", "--model", model, "--fleet", dir, "--ask", line, "--max-a", "8",
            "--oracle", "doc3.md")
        assert.are.equal(0, rc, err)
        local p3 = cart.map(dir .. "/doc-002.safetensors").p
        assert.truthy(out:find(("\noracle: doc3.md\n[1 composed cartridge(s), %d KV rows]"):format(p3), 1, true), out)
        rc, _, err = recipe("fleet.lua", "--model", model, "--fleet", dir, "--ask", line, "--oracle", "nope.md")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--oracle nope.md: no such document in " .. dir .. " (it holds doc1.md, doc2.md, doc3.md)",
            1, true), err)
    end)
end)

-- ---------------------------------------------------------------------------
-- Serving a fleet

local fleetserve = require("cartridge.fleetserve")
local json = cartridge.json

describe("cartridge.fleetserve", function()
    it("maps at most --budget cartridges, waits while they are held, drops the least recently used", function()
        local dir, why = small_fleet("fs-fleet", 0)
        if not dir then return pending(why) end
        local m = cartridge.model.load(stories())
        local ok, e = pcall(fleetserve.open, m, dir, { budget = 1, rag_docs = 2, rag_chunks = 8 })
        assert.is_false(ok)
        assert.truthy(e:find("--budget 1 is below --rag-docs 2", 1, true), e)
        local f = fleetserve.open(m, dir, { budget = 2, rag_docs = 2, rag_chunks = 8 })
        local ab, c, bc = f:prefix({ 1, 2 }), f:prefix({ 3 }), f:prefix({ 2, 3 })
        assert.are.equal(f:prefix({ 1, 2 }), ab) -- one object per list
        assert.is_true(ab:acquire())
        assert.are.equal(2, f.mapped)
        assert.is_false(c:acquire()) -- both places held
        ab:release()
        assert.is_true(c:acquire()) -- drops one: 1 and 2 were used together, the lower goes
        assert.are.equal(2, f.mapped)
        assert.is_nil(f.maps[1])
        assert.truthy(f.maps[2] and f.maps[3])
        assert.is_true(bc:acquire()) -- already mapped: nothing to drop
        assert.are.same({ maps = 3, unmaps = 1 }, { maps = f.stats.maps, unmaps = f.stats.unmaps })
        local kv = m:new_kv(bc.p + 4, "f32")
        bc:append_to(kv)
        assert.are.equal(bc.p, kv:len())
        kv:free()
        c:release(); bc:release()
        -- a document that cannot be mapped: the error names its file, and
        -- nothing is left pinned or mapped by the failed call
        local d3 = fleet.join(dir, f.man.docs[3].cart_file)
        local keep = helper.read_file(d3)
        helper.write_file(d3, keep:sub(1, 100)) -- truncated
        f:unmap(3)
        local before = f.mapped
        ok, e = pcall(f:prefix({ 2, 3 }).acquire, f:prefix({ 2, 3 }))
        assert.is_false(ok)
        print("  " .. e)
        assert.truthy(e:find(f.man.docs[3].cart_file, 1, true), e)
        assert.are.equal(before, f.mapped)
        for i = 1, 3 do assert.are.equal(0, f.pins[i] or 0) end
        helper.write_file(d3, keep)
        assert.is_true(f:prefix({ 2, 3 }):acquire())
        f:prefix({ 2, 3 }):release()
        -- two documents' files swapped: refused by what each file holds
        local d2 = fleet.join(dir, f.man.docs[2].cart_file)
        local two = helper.read_file(d2)
        helper.write_file(d2, keep)
        helper.write_file(d3, two)
        f:unmap(2); f:unmap(3)
        ok, e = pcall(f:prefix({ 2 }).acquire, f:prefix({ 2 }))
        assert.is_false(ok)
        print("  " .. e)
        assert.truthy(e:find("holds document " .. f.man.docs[3].name .. "'s cartridge, and the manifest puts document "
            .. f.man.docs[2].name .. " there", 1, true), e)
        helper.write_file(d2, two)
        helper.write_file(d3, keep)
        -- a conversation keeps its first choice
        local first = f:select({ "Lily went to the park" })
        assert.are.equal(first, f:select({ "Lily went to the park", "and something else entirely" }))
        assert.are.same({ retrievals = 1, sticky_hits = 1 }, { retrievals = f.stats.retrievals,
            sticky_hits = f.stats.sticky_hits })
        f:free()
        m:free()
    end)
end)

describe("serve.lua --fleet", function()
    local servers = helper.servers(tmp)
    teardown(function() servers:stop_all() end)

    -- What the CLI retrieves for a question and answers in 12 tokens behind
    -- them: the documents' names and the answer's text. Retrieval composes
    -- at most --rag-docs (2) documents, fewer when the best chunks hold
    -- fewer, and the count printed must be the documents retrieved.
    local function cli_answer(model, dir, question)
        local rc, out, err = recipe("fleet.lua", "--model", model, "--fleet", dir, "--ask", question, "--max-a", "12")
        assert.are.equal(0, rc, err)
        local docs = {}
        for name in out:match("\nretrieved: ([^\n]+)"):gmatch("(doc%d%.md) %(") do docs[#docs + 1] = name end
        local k, text = out:match("\n%[(%d+) composed cartridge%(s%), %d+ KV rows%] [^\n]*\n(.-)\n%[bare model")
        assert.truthy(k, out)
        assert.are.equal(#docs, tonumber(k), out)
        return docs, text
    end

    -- Starts the server on fleet dir as the model "docs": the server and a
    -- function that posts a body to a path and returns the decoded 200 reply.
    local function serve_fleet(model, dir)
        local s = servers:start(model, "--fleet", "docs=" .. dir, "--budget", "2", "--parallel", "2")
        return s, function(path, t)
            local status, body = servers:curl(s, "POST", path, json.encode(t))
            assert.are.equal(200, status, body)
            return json.decode(body)
        end
    end

    local function answer_text(r) return (r.choices[1].message.content:gsub("^%s+", ""):gsub("%s+$", "")) end

    it("retrieves per conversation, composes, reuses the cache behind the prefix and names the documents", function()
        if not helper.have("curl") then return pending("curl is not installed") end
        local dir, where = small_fleet("served", 1)
        if not dir then return pending(where) end
        local model = stories()
        local question = helper.read_file(where .. "/doc3.md"):match("\n([^\n]+)\n")
        -- what the CLI retrieves and answers
        local cli_docs, cli_text = cli_answer(model, dir, question)
        local s, post = serve_fleet(model, dir)
        local first = { model = "docs", messages = { { role = "user", content = question } }, max_tokens = 12,
            temperature = 0 }
        local r1 = post("/v1/chat/completions", first)
        assert.are.same(cli_docs, r1.documents)
        assert.are.equal(cli_text, answer_text(r1))
        -- the follow-up: the same documents, the cached turn reused behind the composed prefix
        local follow = { model = "docs", temperature = 0, max_tokens = 6, messages = {
            { role = "user", content = question },
            { role = "assistant", content = r1.choices[1].message.content },
            { role = "user", content = "Once upon a time" } } }
        local r2 = post("/v1/chat/completions", follow)
        assert.are.same(cli_docs, r2.documents)
        print(("  follow-up behind %s: %d prompt tokens, %d cached"):format(table.concat(r2.documents, " + "),
            r2.usage.prompt_tokens, r2.usage.prompt_tokens_details.cached_tokens))
        assert.truthy(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens)
        -- streamed, Anthropic and Responses shapes carry the field too
        first.stream = true
        local status, body = servers:curl(s, "POST", "/v1/chat/completions", json.encode(first))
        assert.are.equal(200, status)
        local chunk = json.decode(body:match("^data: ([^\n]+)"))
        assert.are.same(cli_docs, chunk.documents)
        local msg = post("/v1/messages", { model = "docs", max_tokens = 4, messages = { { role = "user", content = question } } })
        assert.are.same(cli_docs, msg.documents)
        local resp = post("/v1/responses", { model = "docs", max_output_tokens = 4, input = question })
        assert.are.same(cli_docs, resp.documents)
        -- the bare model has no such field
        local bare = post("/v1/chat/completions", { model = "llama", messages = { { role = "user", content = question } },
            max_tokens = 2 })
        assert.is_nil(bare.documents)
        -- another conversation, retrieved on its own; the metrics show the budget held
        post("/v1/chat/completions", { model = "docs", max_tokens = 2, messages = { { role = "user",
            content = helper.read_file(where .. "/doc1.md"):match("\n([^\n]+)\n") } } })
        local _, metrics = servers:curl(s, "GET", "/metrics")
        local mapped = tonumber(metrics:match("\ncartridge_fleet_mapped (%d+)"))
        local retrievals = tonumber(metrics:match("\ncartridge_fleet_retrievals_total (%d+)"))
        print(("  metrics: %d mapped (budget 2), %d retrievals, %s sticky hits"):format(mapped, retrievals,
            metrics:match("\ncartridge_fleet_sticky_hits_total (%d+)")))
        assert.truthy(mapped >= 1 and mapped <= 2)
        assert.are.equal(2, retrievals) -- the question's conversation once, the other one once
        local _, models = servers:curl(s, "GET", "/v1/models")
        local listed = json.decode(models).data
        assert.are.equal("docs", listed[2].id)
        assert.are.equal(3, listed[2].fleet.documents)
        servers:stop(s)
        assert.truthy(helper.read_file(s.log):find("chat docs [" .. table.concat(cli_docs, ", ") .. "]", 1, true))
    end)

    it("answers a damaged document, an overlong request and a budget wait without stalling anyone else", function()
        if not helper.have("curl") then return pending("curl is not installed") end
        local dir, where = small_fleet("damaged", 0)
        if not dir then return pending(where) end
        local man = fleet.read_manifest(dir)
        -- every document's cartridge damaged: missing, truncated, a directory
        os.remove(fleet.join(dir, man.docs[1].cart_file))
        local f2 = fleet.join(dir, man.docs[2].cart_file)
        helper.write_file(f2, helper.read_file(f2):sub(1, 200))
        local f3 = fleet.join(dir, man.docs[3].cart_file)
        os.remove(f3)
        require("cartridge.fs").mkdirs(f3)
        local s = servers:start(stories(), "--fleet", "docs=" .. dir, "--budget", "2", "--parallel", "2")
        local function health_now()
            local t = os.clock()
            local status = servers:curl(s, "GET", "/health")
            return status == 200
        end
        local question = helper.read_file(where .. "/doc1.md"):match("\n([^\n]+)\n")
        for _, q in ipairs({ question, "Once upon a time" }) do
            local status, body = servers:curl(s, "POST", "/v1/chat/completions", json.encode({ model = "docs",
                max_tokens = 2, messages = { { role = "user", content = q } } }))
            assert.are.equal(500, status, body)
            assert.truthy(body:find("safetensors", 1, true), body) -- names the document's file
            assert.is_true(health_now())
        end
        -- the bare model still answers, and so does a fleet request of 8,000 words: a 400 at once
        local status, body = servers:curl(s, "POST", "/v1/chat/completions", json.encode({ model = "llama",
            max_tokens = 2, messages = { { role = "user", content = "Once upon a time" } } }))
        assert.are.equal(200, status, body)
        local t0 = require("cartridge").C.cart_now_seconds()
        status, body = servers:curl(s, "POST", "/v1/chat/completions", json.encode({ model = "docs", max_tokens = 2,
            messages = { { role = "user", content = ("word "):rep(8000) } } }))
        local took = require("cartridge").C.cart_now_seconds() - t0
        print(("  an 8,000-word fleet request: %d in %.2f s"):format(status, took))
        assert.are.equal(400, status, body)
        assert.truthy(body:find("context_length_exceeded", 1, true), body)
        assert.truthy(took < 1.0, took)
        assert.is_true(health_now())
        servers:stop(s)
        local log = helper.read_file(s.log)
        assert.truthy(log:find("internal error in request", 1, true), log) -- logged, with its request id
    end)

    it("answers as the CLI does behind one retrieved document as behind two", function()
        -- on this data doc3's question finds only doc2's chunks among its 8
        -- best, so both compose one cartridge (the check above once read
        -- the CLI's answer only after "[2 composed cartridge(s)")
        if not helper.have("curl") then return pending("curl is not installed") end
        local dir, where = small_fleet("served-one", 1, "readme-1609e47.md")
        if not dir then return pending(where) end
        local model = stories()
        local s, post = serve_fleet(model, dir)
        local counts = {}
        for k = 1, 3 do
            local question = helper.read_file(("%s/doc%d.md"):format(where, k)):match("\n([^\n]+)\n")
            local cli_docs, cli_text = cli_answer(model, dir, question)
            local r = post("/v1/chat/completions", { model = "docs", max_tokens = 12, temperature = 0,
                messages = { { role = "user", content = question } } })
            assert.are.same(cli_docs, r.documents)
            assert.are.equal(cli_text, answer_text(r))
            counts[k] = #cli_docs
            if #cli_docs == 1 then
                -- the cached turn is reused behind a single cartridge too
                local r2 = post("/v1/chat/completions", { model = "docs", max_tokens = 4, temperature = 0, messages = {
                    { role = "user", content = question }, { role = "assistant", content = r.choices[1].message.content },
                    { role = "user", content = "Once upon a time" } } })
                assert.are.same(cli_docs, r2.documents)
                assert.truthy(r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens)
            end
        end
        print(("  documents composed for doc1/doc2/doc3's questions: %d/%d/%d, the server's answers the CLI's")
            :format(counts[1], counts[2], counts[3]))
        assert.are.equal(1, counts[3], "doc3's question no longer retrieves one document: this test needs other data")
        servers:stop(s)
    end)

    it("fleet.lua refuses to run as several copies of a launcher (mpirun)", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        for _, var in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE" }) do
            local rc, out, err = helper.run(var .. "=2 " .. helper.q(helper.bin) .. " run recipes/fleet.lua --fleet "
                .. helper.q(tmp .. "/never") .. " --corpus README.md </dev/null")
            assert.are_not.equal(0, rc, out)
            assert.truthy(err:find("a launcher started 2 copies", 1, true), err)
            assert.is_false(helper.exists(tmp .. "/never"))
        end
    end)

    it("refuses a fleet beside --cartridge or --kv-cache-dir, and a budget below --rag-docs", function()
        local model, why = stories()
        if not model then return pending(why) end
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local rc, _, err = helper.cartridge("run", "recipes/serve.lua", model, "--fleet", tmp, "--kv-cache-dir", tmp)
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--fleet serves the fleet alone", 1, true), err)
        rc, _, err = helper.cartridge("run", "recipes/serve.lua", model, "--fleet", tmp .. "/nowhere")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("is not a fleet directory", 1, true), err)
    end)
end)

describe("the fleet's report and benchmark", function()
    it("report_fleet.lua scores five arms on held-out conversations and retrieval's top-1", function()
        local dir, where = small_fleet("report", 2)
        if not dir then return pending(where) end
        local model = stories()
        local mono = tmp .. "/report-mono.safetensors"
        local rc, out, err = recipe("selfstudy.lua", fleet_args({ "--model", model, "--corpus", where, "--p", "144",
            "--steps", "2", "--save", mono }))
        assert.are.equal(0, rc, err)
        rc, out, err = recipe("report_fleet.lua", fleet_args({ "--model", model, "--corpus", where, "--fleet", dir,
            "--mono", mono, "--heldout", "1", "--icl-max", "400", "--json" }))
        assert.are.equal(0, rc, err)
        helper.assert_in_order(out, { "\nfleet: 3 documents, 144 rows in all, monolithic cartridge p = 144",
            "\n3 held%-out conversations %(1 per document%)", "\nbare +%d%.%d+ +%-?%d+%.%d%%",
            "\nmonolithic +%d%.%d+", "\nretrieval +%d%.%d+", "\noracle +%d%.%d+", "\nICL +%d%.%d+ +100%.0%%",
            "\nretrieval top%-1 accuracy: %d/3", "\nfleet %(oracle%) vs monolithic: [%+%-]%d" })
        local report = json.decode(out:match("\n(%b{})\n?$"))
        assert.are.equal(3, #report.conversations)
        for _, c in ipairs(report.conversations) do
            assert.truthy(#c.retrieved >= 1 and #c.retrieved <= 2)
            assert.truthy(c.loss.oracle > 0 and c.loss.ICL > 0)
        end
    end)

    it("bench_fleet.lua times training isolated and co-loaded, the index and serving", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local rc, out, err = recipe("bench_fleet.lua", "--model", helper.root .. "/models/default.gguf", "--rounds", "1",
            "--accum", "1", "--p", "16", "--chunk-min", "16", "--chunk-max", "32", "--max-q", "4", "--max-a", "4",
            "--embed-chunk", "32", "--index-chunks", "2", "--answer", "4")
        assert.are.equal(0, rc, err)
        helper.assert_in_order(out, { "\ninit: 3 cartridges of p = 16", "\ntraining isolated +: %d+%.%d s/conversation",
            "behind 16 rows", "\ntraining co%-loaded x2 *: ", "behind 32 rows", "\ntraining co%-loaded x3 *: ",
            "behind 48 rows", "\nindex: 2 chunks of 32 tokens in", "\nserve bare *: %d+%.%d+ s for 4 tokens",
            "\nserve 1 cartridge *: ", "16 KV rows in front", "\nserve 2 composed *: ", "32 KV rows in front" })
    end)
end)
