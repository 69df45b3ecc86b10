-- Cartridges from and to PyTorch's .pt files (cartridge.torchpt, the import
-- and export recipes): the files PyTorch wrote (tests/fixtures/torch) read
-- exactly, the head layout and positions checked against a float64 RoPE of
-- Hugging Face's kind, round trips, refusals, and real PyTorch reading what
-- we write (pending where no Python has torch).
local helper = require("helper")
local cartridge = require("cartridge")
local torchpt = require("cartridge.torchpt")
local randmodel = require("cartridge.randmodel")
local safetensors = require("cartridge.safetensors")
local ffi = require("ffi")

local FIX = helper.root .. "/tests/fixtures/torch/"

local tmp, models = nil, {}
local function model(preset)
    if not models[preset] then
        local path = tmp .. "/" .. preset .. ".gguf"
        randmodel.write({ out = path, preset = preset, dtype = "f32", quiet = true })
        models[preset] = cartridge.model.load(path)
    end
    return models[preset], tmp .. "/" .. preset .. ".gguf"
end

local function import(file, m, opts)
    local pt = torchpt.open(file)
    local c = torchpt.to_cartridge(torchpt.read_cache(pt), m, opts)
    pt:close()
    return c
end

-- The expected tensor "<name>.<list>.<layer>" as a Lua array of floats.
local expected = nil
local function want(name, list, layer)
    local t = expected:tensor(("%s.%s.%d"):format(name, list, layer))
    local f = ffi.cast("const float *", t.data)
    local out = {}
    for i = 0, t.nbytes / 4 - 1 do out[i + 1] = f[i] end
    return out, t.shape
end

-- A Python that imports torch, or nil.
local function torch_python()
    for _, py in ipairs({ "python3", "/usr/bin/python3" }) do
        if helper.run(py .. " -c 'import torch' 2>/dev/null") == 0 then return py end
    end
end

describe("cartridges in torch.save files", function()
    setup(function()
        tmp = helper.tmpdir()
        expected = safetensors.open(FIX .. "expected.safetensors")
    end)
    teardown(function()
        expected:close()
        helper.rmdir(tmp)
    end)

    it("imports the reference trainer's files row for row, frozen rows first; llama keys reordered", function()
        for _, preset in ipairs({ "qwen3-tiny", "llama-tiny" }) do
            local m = model(preset)
            for _, f in ipairs({ { "ref-fixed-bf16", "fixed", 1, 5 }, { "ref-frozen-f32", "frozen", 2, 6 },
                { "ref-frozen-f16", "half", 1, 3 } }) do
                local c = import(FIX .. f[1] .. ".pt", m)
                assert.are.equal(f[3] + f[4], c.p)
                assert.are.equal(f[3], c.frozen)
                local maxdiff, checked = 0, 0
                for l = 0, 1 do
                    local perm = torchpt.head_permutation(m, l)
                    for which, list in ipairs({ "keys", "values" }) do
                        local rows = c:rows(l, which - 1)
                        for part, first in pairs({ trainable = f[3], frozen = 0 }) do
                            local values, shape = want(f[2], (part == "frozen" and f[2] == "fixed" and "fixed" or part)
                                .. "_" .. list, l)
                            local h, t, d = shape[2], shape[3], shape[4]
                            for head = 0, h - 1 do
                                for tok = 0, t - 1 do
                                    for j = 0, d - 1 do
                                        local jj = (list == "keys" and perm) and perm[j] or j
                                        local got = rows[((first + tok) * h + head) * d + jj]
                                        maxdiff = math.max(maxdiff, math.abs(got - values[(head * t + tok) * d + j + 1]))
                                        checked = checked + 1
                                    end
                                end
                            end
                        end
                    end
                end
                print(("  %s on %s: %d values, max |difference| %g (tolerance 0)"):format(f[1], preset, checked, maxdiff))
                assert.are.equal(0, maxdiff)
                assert.are.equal(c.p * 2 * 2 * 16 * 2, checked)
                -- exported in the file's dtype, every tensor is back as PyTorch saved it
                local dtype = f[1]:match("%-(%w+)$")
                torchpt.write_reference(c, m, tmp .. "/back.pt", { dtype = dtype })
                local pt = torchpt.open(tmp .. "/back.pt")
                local back, worst = torchpt.read_cache(pt), 0
                for l = 0, 1 do
                    for _, list in ipairs({ "keys", "values" }) do
                        for part, key in pairs({ trainable = list, frozen = "frozen_" .. list }) do
                            local name = (part == "frozen" and f[2] == "fixed" and "fixed" or part) .. "_" .. list
                            local values = want(f[2], name, l)
                            local got = torchpt.read_f32(back[key][l + 1])
                            for i = 1, #values do worst = math.max(worst, math.abs(got[i - 1] - values[i])) end
                        end
                    end
                end
                pt:close()
                assert.are.equal(0, worst)
            end
        end
    end)

    -- Float64 RoPE as Hugging Face applies it (pairs (i, i + d/2)) and as
    -- GGML's normal mode does (pairs (2i, 2i + 1)), both at position pos.
    local function rope(x, pos, d, base, neox)
        local out = {}
        for i = 0, d / 2 - 1 do
            local theta = pos * base ^ (-2 * i / d)
            local a, b = neox and i or 2 * i, neox and i + d / 2 or 2 * i + 1
            out[a] = x[a] * math.cos(theta) - x[b] * math.sin(theta)
            out[b] = x[a] * math.sin(theta) + x[b] * math.cos(theta)
        end
        return out
    end

    it("gives each query the reference's attention scores: Hugging Face's layout and positions, float64", function()
        for _, preset in ipairs({ "llama-tiny", "qwen3-tiny" }) do
            local m = model(preset)
            local c = cartridge.cart.from_text(m, "Tokens of a small document, as a cartridge.")
            local out = tmp .. "/scores.pt"
            torchpt.write_reference(c, m, out, { dtype = "f32" })
            local pt = torchpt.open(out)
            local cache = torchpt.read_cache(pt)
            local d, base, p = m.layers[1].head_dim, m.config.rope_theta, c.p
            local rows, hf = c:rows(0, 0), torchpt.read_f32(cache.keys[1])
            local perm = torchpt.head_permutation(m, 0)
            local worst, n = 0, 0
            for t = 0, 3 do
                local q = {}
                for j = 0, d - 1 do q[j] = math.sin(7 * j + t) end -- a query in the file's (HF) layout
                local q_gguf = {}
                for j = 0, d - 1 do q_gguf[perm and perm[j] or j] = q[j] end
                local pos = p + t -- both put the queries after the rows
                local rq_hf, rq_gguf = rope(q, pos, d, base, true), rope(q_gguf, pos, d, base, m.config.rope_neox)
                for row = c.frozen, p - 1 do
                    local s_ref, s_ours = 0, 0
                    for j = 0, d - 1 do
                        s_ref = s_ref + rq_hf[j] * hf[(row - c.frozen) * d + j] -- head 0 of [1, h, t, d]
                        s_ours = s_ours + rq_gguf[j] * rows[row * c.row + j]
                    end
                    worst, n = math.max(worst, math.abs(s_ref - s_ours) / (1 + math.abs(s_ref))), n + 1
                end
            end
            pt:close()
            print(("  %s: %d query-row scores, max relative |reference - engine| %.2g (tolerance 1e-9)"):format(preset,
                n, worst))
            assert.is_true(worst <= 1e-9)
        end
    end)

    it("--rope-shift turns the keys so a query that many positions later scores the same", function()
        local m = model("qwen3-tiny")
        local plain = import(FIX .. "ref-frozen-f32.pt", m)
        local shifted = import(FIX .. "ref-frozen-f32.pt", m, { rope_shift = 5 })
        local d, base = m.layers[1].head_dim, m.config.rope_theta
        local q = {}
        for j = 0, d - 1 do q[j] = math.cos(3 * j) end
        local a, b = rope(q, 20, d, base, true), rope(q, 25, d, base, true)
        local worst = 0
        for row = 0, plain.p - 1 do
            local s1, s2 = 0, 0
            for j = 0, d - 1 do
                s1 = s1 + a[j] * plain:rows(1, 0)[row * plain.row + j]
                s2 = s2 + b[j] * shifted:rows(1, 0)[row * plain.row + j]
            end
            worst = math.max(worst, math.abs(s1 - s2) / (1 + math.abs(s1)))
        end
        print(("  shift 5: max relative score difference %.2g (tolerance 1e-5, f32 rotation)"):format(worst))
        assert.is_true(worst <= 1e-5)
        assert.are_not.equal(plain:rows(1, 0)[1], shifted:rows(1, 0)[1])
    end)

    it("exports and imports back the same rows (exact in f32, within bf16's rounding in bf16)", function()
        for _, preset in ipairs({ "llama-tiny", "qwen3-tiny" }) do
            local m = model(preset)
            local c = cartridge.cart.from_text(m, "Another document for the round trip.", 2)
            for dtype, tol in pairs({ f32 = 0, bf16 = 2 ^ -8, f16 = 2 ^ -11 }) do
                torchpt.write_reference(c, m, tmp .. "/rt.pt", { dtype = dtype })
                local back = import(tmp .. "/rt.pt", m)
                local worst = 0
                for l = 0, c.n_layer - 1 do
                    for w = 0, 1 do
                        local x, y = c:rows(l, w), back:rows(l, w)
                        for i = 0, c.p * c.row - 1 do
                            worst = math.max(worst, math.abs(x[i] - y[i]) / math.max(math.abs(x[i]), 1e-3))
                        end
                    end
                end
                print(("  %s %s: max relative difference %.3g (tolerance %.3g)"):format(preset, dtype, worst, tol))
                assert.is_true(worst <= tol)
                assert.are.equal(c.frozen, back.frozen)
            end
        end
    end)

    it("runs the recipes: import, load, export for Tokasaurus, import the folder; refuses with the reason", function()
        local m, path = model("qwen3-tiny")
        local out = tmp .. "/imported.safetensors"
        local rc, stdout, stderr = helper.cartridge("run", "recipes/import_cartridge.lua", FIX .. "ref-fixed-bf16.pt",
            "--model", path, "--out", out)
        assert.are.equal(0, rc, stderr)
        assert.truthy(stdout:find("1 frozen + 5 trainable rows, bf16", 1, true), stdout)
        assert.truthy(stdout:find("p = 6 (1 frozen)", 1, true), stdout)
        assert.are.equal(6, cartridge.cart.load(out, m).p)
        rc, stdout, stderr = helper.cartridge("run", "recipes/ask.lua", "--model", path, "--load", out, "--ask",
            "What is in the rows?", "--max-a", "4") -- served as any artifact
        assert.are.equal(0, rc, stderr)
        assert.truthy(stdout:find("[cartridge, 6 KV rows]", 1, true), stdout)
        rc, stdout, stderr = helper.cartridge("run", "recipes/export_cartridge.lua", out, "--model", path, "--format",
            "tokasaurus", "--out", tmp .. "/cartridges", "--id", "org/my-docs")
        assert.are.equal(0, rc, stderr)
        local yaml = helper.read_file(tmp .. "/cartridges/org-my-docs/config.yaml")
        assert.truthy(yaml:find("max_tokens: 6", 1, true), yaml)
        rc, stdout, stderr = helper.cartridge("run", "recipes/import_cartridge.lua", tmp .. "/cartridges/org-my-docs",
            "--model", path, "--out", tmp .. "/back.safetensors") -- a folder: its cartridge.pt
        assert.are.equal(0, rc, stderr)
        local back, first = cartridge.cart.load(tmp .. "/back.safetensors", m), cartridge.cart.load(out, m)
        assert.are.equal(6, back.p)
        assert.are.equal(first:rows(1, 1)[7], back:rows(1, 1)[7]) -- bf16 rows survive bf16 export exactly
        -- refusals: each names the problem, exits 1, writes nothing
        local cases = {
            { FIX .. "runs-a-command.pt", "posix.system" },
            { FIX .. "legacy.pt", "legacy format" },
            { FIX .. "int-rows.pt", "'trainable_keys'[0] holds i64 values" },
            { FIX .. "expected.safetensors", "not a torch.save file" },
            { tmp, "is not a file" },
        }
        for _, case in ipairs(cases) do
            rc, stdout, stderr = helper.cartridge("run", "recipes/import_cartridge.lua", case[1], "--model", path,
                "--out", tmp .. "/refused.safetensors")
            assert.are.equal(1, rc, stdout)
            assert.truthy(stderr:find(case[2], 1, true), stderr)
        end
        local other = model("llama-tiny") -- same geometry, other model: rows fit, so it imports
        assert.are.equal(6, import(FIX .. "ref-fixed-bf16.pt", other).p)
        rc, stdout, stderr = helper.cartridge("run", "recipes/import_cartridge.lua", FIX .. "ref-fixed-bf16.pt", "--out",
            tmp .. "/refused.safetensors") -- the demo model: 2 KV heads of 64
        assert.are.equal(1, rc, stdout)
        assert.truthy(stderr:find("was trained for another model", 1, true), stderr)
        assert.is_nil(io.open(tmp .. "/refused.safetensors", "rb"))
        print("  imported, loaded, exported for Tokasaurus and read back; 6 bad files refused by name")
    end)

    it("a PyTorch forward of the reference's kind behind the imported rows gives the engine's logits", function()
        local py = torch_python()
        if not py then return pending("no Python with torch here (Debian: apt-get install python3-torch)") end
        local ids = { 5, 17, 42, 99, 3 }
        for _, preset in ipairs({ "llama-tiny", "qwen3-tiny" }) do
            local m = model(preset)
            local weights = {}
            for _, t in ipairs(m.file:tensors()) do
                weights[#weights + 1] = { name = t.name, dtype = "F32", shape = t.shape, data = t.data }
            end
            safetensors.write(tmp .. "/weights.safetensors", weights, {})
            local g = m.layers[1]
            helper.write_file(tmp .. "/config.json", require("cartridge.json").encode({ arch = m.config.arch,
                n_layer = m.config.n_layer, n_head = g.n_head, n_head_kv = g.n_head_kv, head_dim = g.head_dim,
                eps = m.config.rms_eps, theta = m.config.rope_theta, neox = m.config.rope_neox }))
            local file = FIX .. "ref-frozen-f32.pt"
            local c = import(file, m)
            local kv = m:new_kv(c.p + #ids, "f32")
            c:append_to(kv)
            local logits = m:forward(kv, ids, "last")
            local rc, stdout, stderr = helper.run(("%s %s %s %s %s %s"):format(py,
                helper.q(helper.root .. "/tests/lua/torch_prefix_forward.py"), helper.q(tmp .. "/weights.safetensors"),
                helper.q(tmp .. "/config.json"), helper.q(file), table.concat(ids, ",")))
            assert.are.equal(0, rc, stderr)
            local ref = require("cartridge.json").decode(stdout)
            assert.are.equal(m.n_vocab, #ref)
            local worst, scale = 0, 0
            for i = 1, #ref do
                worst = math.max(worst, math.abs(ref[i] - logits[i - 1]))
                scale = math.max(scale, math.abs(ref[i]))
            end
            print(("  %s: %d logits behind %d imported rows, max |PyTorch float64 - engine| %.3g (logits up to %.3g; "
                .. "tolerance 1e-4)"):format(preset, #ref, c.p, worst, scale))
            assert.is_true(worst <= 1e-4)
        end
    end)

    it("PyTorch reads what we write (weights_only=True) and we read what it saves back", function()
        local py = torch_python()
        if not py then return pending("no Python with torch here (Debian: apt-get install python3-torch)") end
        local m = model("llama-tiny")
        local c = cartridge.cart.from_text(m, "Rows for PyTorch to read.", 1)
        local ours, theirs = tmp .. "/ours.pt", tmp .. "/theirs.pt"
        torchpt.write_reference(c, m, ours, { dtype = "f32" })
        -- torch loads ours safely, then saves it as the reference trainer does (nn.ParameterList)
        local script = ("import torch, torch.nn as nn\n"
            .. "d = torch.load(%q, weights_only=True)\n"
            .. "assert d['fixed_keys'] is d['frozen_keys']\n"
            .. "out = {k: nn.ParameterList([nn.Parameter(t) for t in d[k]]) for k in "
            .. "('trainable_keys', 'trainable_values', 'frozen_keys', 'frozen_values')}\n"
            .. "torch.save(out, %q)\n"
            .. "print(torch.__version__, sum(float(t.double().sum()) for t in d['trainable_keys']))\n"):format(ours, theirs)
        helper.write_file(tmp .. "/roundtrip.py", script)
        local rc, stdout, stderr = helper.run(py .. " " .. helper.q(tmp .. "/roundtrip.py"))
        assert.are.equal(0, rc, stderr)
        local back = import(theirs, m)
        local sum, worst = 0, 0
        for l = 0, c.n_layer - 1 do
            for w = 0, 1 do
                for i = 0, c.p * c.row - 1 do
                    worst = math.max(worst, math.abs(c:rows(l, w)[i] - back:rows(l, w)[i]))
                end
            end
        end
        for l = 0, c.n_layer - 1 do
            local perm_rows = c:rows(l, 0)
            for i = c.frozen * c.row, c.p * c.row - 1 do sum = sum + perm_rows[i] end
        end
        local torch_version, torch_sum = stdout:match("(%S+) (%S+)")
        print(("  torch %s: sum of trainable keys %.9g (ours %.9g); rows back through torch.save: max diff %g "
            .. "(tolerance 0)"):format(torch_version, tonumber(torch_sum), sum, worst))
        assert.is_true(math.abs(tonumber(torch_sum) - sum) <= 1e-9 * (1 + math.abs(sum)))
        assert.are.equal(0, worst)
    end)
end)
