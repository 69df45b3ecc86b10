-- KV compaction from Lua (cartridge.compact, selfstudy --init evict|compact)
-- and the evaluation recipes that put it beside the cartridge
-- (compare.lua, eval_facts.lua), at small shapes on the committed reader.

local cartridge = require("cartridge")
local helper = require("helper")
local facts = require("cartridge.facts")
local protocol = require("cartridge.protocol")

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

local reader = helper.root .. "/models/reader.gguf"
local function need_reader()
    if not helper.exists(reader) then return pending("models/reader.gguf is not in this checkout") end
    if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
    return true
end

-- The reader and a spec document (seed 3001: neither tuning nor report).
local function setup_doc()
    local m = cartridge.model.load(reader)
    local tok, T = m:tokenizer(), require("cartridge.chat").for_model(m)
    local d = facts.document(protocol.SPEC.first, 40)
    local text = "\n\n# Document: spec/doc.md\n\n" .. d.text
    local _, all = require("cartridge.selfstudy").init_ids(tok, T, d.text, 16)
    return m, tok, T, d, text, all
end

describe("cartridge.compact", function()
    it("keeps the sink and the most-attended rows, and attention matching fits the outputs better", function()
        if need_reader() ~= true then return end
        local compact = require("cartridge.compact")
        local m, tok, T, d, _, all = setup_doc()
        local p = protocol.p_of(#all)
        local ref = compact.reread_ids(tok, T, d.text)
        local ev, am = cartridge.cart.new(m, p, 1), cartridge.cart.new(m, p, 1)
        local ie = compact.fill(m, ev, all, ref, "evict")
        local ia = compact.fill(m, am, all, ref, "match")
        print(("  n %d, p %d: output error on re-reading, evicted %.3f, matched %.3f (%.2f s)"):format(#all, p,
            ie.error, ia.error, ia.seconds))
        assert.is_true(ia.error < ie.error and ie.error > 0)
        -- both keep the same keys; row 0 is the sink (BOS) moved by p - n
        -- positions, the same in both
        local row = ev.row
        for l = 0, ev.n_layer - 1 do
            local ke, ka = ev:rows(l, 0), am:rows(l, 0)
            for i = 0, p * row - 1 do assert.are.equal(ke[i], ka[i]) end
        end
        local full = cartridge.cart.new(m, #all, 1)
        full:capture(m, all)
        local k0 = {}
        for i = 0, row - 1 do k0[i] = full:rows(0, 0)[i] end
        assert.are_not.equal(k0[0], ev:rows(0, 0)[0]) -- moved along RoPE
        for i = 0, row - 1 do assert.are.equal(full:rows(0, 1)[i], ev:rows(0, 1)[i]) end -- its value kept as it was
        assert.has_error(function() compact.fill(m, cartridge.cart.new(m, #all, 1), all, ref, "evict") end)
        assert.has_error(function() compact.fill(m, ev, all, ref, "nope") end)
        for _, c in ipairs({ ev, am, full }) do c:free() end
        m:free()
    end)

    it("selfstudy.lua --init compact starts from attention matching", function()
        if need_reader() ~= true then return end
        local dir = "out/spec-compact"
        local rc, _, err = helper.cartridge("run", "recipes/make_facts.lua", "--seed", tostring(protocol.SPEC.first), "--out", dir)
        assert.are.equal(0, rc, err)
        local out
        rc, out, err = helper.cartridge("run", "recipes/selfstudy.lua", "--model", reader, "--corpus", dir .. "/doc.md",
            "--p", "48", "--steps", "1", "--accum", "2", "--chunk-min", "64", "--chunk-max", "96", "--max-q", "8",
            "--max-a", "8", "--init", "compact", "--save", tmp .. "/c.safetensors")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("initialized by attention matching from the %d+ rows of the corpus in context %(its "
            .. "%d+ tokens in a system message%): p = 48"), out)
    end)
end)

describe("compare.lua and eval_facts.lua", function()
    it("compare.lua prints every method at each p and writes the plot", function()
        if need_reader() ~= true then return end
        local dir = "out/spec-compare"
        local rc, _, err = helper.cartridge("run", "recipes/make_facts.lua", "--seed", tostring(protocol.SPEC.first), "--facts",
            "12", "--out", dir)
        assert.are.equal(0, rc, err)
        local out
        rc, out, err = helper.cartridge("run", "recipes/compare.lua", "--model", reader, "--corpus", dir .. "/doc.md",
            "--qa", dir .. "/qa.jsonl", "--fractions", "4", "--conversations", "4", "--compact-conversations", "4",
            "--png", tmp .. "/cmp.png", "--json")
        assert.are.equal(0, rc, err)
        print(out:gsub("\n%[.*$", ""))
        for _, method in ipairs({ "bare", "ICL", "opening", "spread", "evict", "compact", "selfstudy",
            "selfstudy%+compact" }) do
            assert.truthy(out:find("\n" .. method .. "%s+%d+%s+[%d.]+ %a+%s+[%d.-]+%s+%d+/12%s+%d+/24"), method .. "\n" .. out)
        end
        assert.truthy(out:find("\nICL%s+%d+%s+[%d.]+ %a+%s+%-%s+12/12"), out)
        local png = helper.read_file(tmp .. "/cmp.png")
        assert.are.equal("\137PNG", png:sub(1, 4))
        rc, _, err = helper.cartridge("run", "recipes/compare.lua", "--model", reader, "--corpus", dir .. "/doc.md",
            "--qa", dir .. "/qa.jsonl", "--methods", "opening,magic")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("magic is not one of", 1, true), err)
    end)

    it("eval_facts.lua summarizes bare, ICL and the cartridge over documents per phrasing set", function()
        if need_reader() ~= true then return end
        local rc, out, err = helper.cartridge("run", "recipes/eval_facts.lua", "--model", reader, "--docs", "3001-3002",
            "--facts", "8", "--conversations", "4", "--json")
        assert.are.equal(0, rc, err)
        print(out:gsub("\n{.*$", ""))
        assert.truthy(out:find("\ndoc 3001: n %d+, p %d+"), out)
        assert.truthy(out:find("\ndoc 3002: n %d+, p %d+"), out)
        for _, arm in ipairs({ "bare", "ICL", "cartridge" }) do
            for _, set in ipairs({ "first", "held%-out" }) do
                assert.truthy(out:find("\n" .. arm .. "%s+" .. set .. "%s+[%d.]+%%"), arm .. " " .. set .. "\n" .. out)
            end
        end
        rc, _, err = helper.cartridge("run", "recipes/eval_facts.lua", "--docs", "9-3")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--docs is report, tuning or FIRST-LAST", 1, true), err)
    end)
end)
