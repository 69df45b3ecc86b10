-- The web page (web/, served at / by recipes/serve.lua) in a real browser:
-- headless Chromium from Debian, driven by playwright-core from npm
-- (tests/browser/ui.mjs), against a server with a cartridge trained here, the
-- corpus, its questions and a self-study run that starts while the page
-- watches; and a fleet. Pending without Chromium, node or playwright-core
-- (scripts/setup.sh installs the npm package; .ci/run installs chromium).

local helper = require("helper")
local json = require("cartridge").json

local function chromium()
    local given = os.getenv("CHROMIUM")
    if given and helper.exists(given) then return given end
    for _, p in ipairs({ "/usr/bin/chromium", "/usr/bin/chromium-browser" }) do
        if helper.exists(p) then return p end
    end
    return nil
end

local function missing()
    if not chromium() then return "no Chromium (apt-get install chromium; or set CHROMIUM)" end
    if not helper.have("node") then return "no node" end
    if not helper.exists(helper.root .. "/tests/node/node_modules/playwright-core/package.json") then
        return "playwright-core is not installed: npm install --prefix tests/node (scripts/setup.sh does it)"
    end
    if not helper.exists(helper.bin) then return "build/cartridge is not built" end
    return nil
end

local function recipe(...)
    local rc, out, err = helper.cartridge("run", ...)
    assert(rc == 0, ("%s failed: %s%s"):format((...), out, err))
    return out
end

describe("the web page in headless Chromium", function()
    local why = missing()
    local tmp, servers, saw, report, metrics_loss, known
    local reader = helper.root .. "/models/reader.gguf"

    setup(function()
        if why then return end
        tmp = helper.tmpdir()
        servers = helper.servers(tmp)
        local f = tmp .. "/facts"
        recipe("recipes/make_facts.lua", "--seed", "3005", "--facts", "12", "--out", f)
        local train = { "--model", reader, "--corpus", f .. "/doc.md", "--p", "45", "--lr", "0.2", "--accum", "2",
            "--chunk-min", "80", "--chunk-max", "160", "--max-q", "32", "--max-a", "32", "--seeds", "focus" }
        recipe("recipes/selfstudy.lua", helper.args(train, { "--steps", "60", "--save", f .. "/cartridge.safetensors" }))
        report = recipe("recipes/report.lua", "--model", reader, "--qa", f .. "/qa.jsonl", "--corpus", f .. "/doc.md",
            "--load", f .. "/cartridge.safetensors", "--json")
        -- a question the cartridge answers right, for the chat and compare views
        for _, a in ipairs(json.decode(report:match("\n(%[.*%])%s*$"))[2].sets.first.answers) do
            if a.right and not known then known = a end
        end
        assert(known, "the cartridge trained here answers none of the first phrasings: " .. report)
        -- a fleet of two documents
        os.execute("mkdir -p " .. helper.q(tmp .. "/docs"))
        for _, seed in ipairs({ "3006", "3007" }) do
            recipe("recipes/make_facts.lua", "--seed", seed, "--facts", "8", "--out", tmp .. "/f" .. seed)
            helper.write_file(tmp .. "/docs/doc" .. seed .. ".md", helper.read_file(tmp .. "/f" .. seed .. "/doc.md"))
        end
        recipe("recipes/fleet.lua", "--model", reader, "--corpus", tmp .. "/docs", "--fleet", tmp .. "/fleet",
            "--rounds", "1", "--p", "16", "--accum", "2", "--chunk-min", "24", "--chunk-max", "48", "--max-q", "8",
            "--max-a", "12", "--embed-chunk", "64")

        local s = servers:start(reader, "--cartridge", "facts=" .. f .. "/cartridge.safetensors", "--corpus",
            f .. "/doc.md", "--qa", f .. "/qa.jsonl", "--training", "live=" .. tmp .. "/live.safetensors",
            "--ctx", "1024", "--quiet")
        local fs_ = servers:start(reader, "--fleet", "docs=" .. tmp .. "/fleet", "--budget", "2", "--quiet")
        local live = { helper.bin, "run", "recipes/selfstudy.lua" }
        for _, a in ipairs({ helper.args(train, { "--steps", "600", "--save", tmp .. "/live.safetensors" }) }) do
            live[#live + 1] = a
        end
        os.execute("mkdir -p " .. helper.q(helper.root .. "/build/browser"))
        local cmd = ("cd %s && CARTRIDGE_URL=http://127.0.0.1:%d CARTRIDGE_FLEET_URL=http://127.0.0.1:%d CHROMIUM=%s "
            .. "OUT_DIR=%s TRAIN_CMD=%s QUESTION=%s node tests/browser/ui.mjs"):format(helper.q(helper.root), s.port,
            fs_.port, helper.q(chromium()), helper.q(helper.root .. "/build/browser"), helper.q(json.encode(live)),
            helper.q(known.question))
        local rc, out, err = helper.run(cmd)
        local ok, v = pcall(json.decode, out:match("[^\n]*$") ~= "" and out:match("[^\n]*$") or out)
        saw = ok and v or { failed = ("ui.mjs printed no JSON (exit %s): %s %s"):format(tostring(rc), out, err) }
        if rc ~= 0 and not saw.failed then saw.failed = ("ui.mjs exit %s: %s"):format(tostring(rc), err) end
        -- the live run's metrics (absent when the run did not finish: saw.failed says why)
        local metrics = helper.exists(tmp .. "/live.metrics.jsonl") and helper.read_file(tmp .. "/live.metrics.jsonl") or ""
        for line in metrics:gmatch("[^\n]+") do
            local l = json.decode(line)
            if l.step then metrics_loss = l.loss end
        end
    end)
    teardown(function()
        if servers then servers:stop_all() end
        if tmp then helper.rmdir(tmp) end
    end)

    local function check()
        if why then return pending(why) end
        assert(not saw.failed, saw.failed)
        assert.are.same({}, saw.errors)
        return true
    end

    it("streams a chat reply with its cached tokens and KV rows, and reuses the first turn's tokens", function()
        if not check() then return end
        assert.truthy(saw.chat.reply:find(known.expected, 1, true), saw.chat.reply)
        assert.matches("45 KV rows in front", saw.chat.stats)
        assert.matches("cartridge: 45 KV rows", saw.chat.info)
        local cached = tonumber(saw.chat.second_stats:match("(%d+) cached"))
        assert.is_true(cached > 0, saw.chat.second_stats)
    end)

    it("stops a reply with the stop button and the server frees the slot", function()
        if not check() then return end
        print(("stop: %d busy before, freed in %d ms, %d characters shown"):format(saw.stop.busy_before,
            saw.stop.freed_ms, saw.stop.chars))
        assert.are.equal(1, saw.stop.busy_before)
        assert.matches("stopped", saw.stop.stats)
        assert.are.equal(0, saw.stop.after.slots_processing)
        assert.are.equal(0, saw.stop.slots_processing)
    end)

    it("renders model output that holds markup as text", function()
        if not check() then return end
        assert.are.equal(saw.escape.expected, saw.escape.reply)
        assert.are.equal(json.null, saw.escape.pwned)
        assert.are.same({ 0, 0 }, { saw.escape.scripts, saw.escape.imgs })
        assert.are.equal(1, saw.escape.strong) -- Markdown still applies to the escaped text
    end)

    it("shows the server's error text for an unknown model and an oversized prompt", function()
        if not check() then return end
        assert.matches("^404: The model \"no%-such%-cartridge\" does not exist", saw.unknown)
        assert.matches("^400: ", saw.oversized)
        assert.matches("1024", saw.oversized)
    end)

    it("compares three answers and scores the questions as report.lua --qa does", function()
        if not check() then return end
        assert.are.same({ "bare", "cartridge", "icl" }, { saw.compare[1].key, saw.compare[2].key, saw.compare[3].key })
        for _, a in ipairs(saw.compare) do assert.matches("KV rows in front", a.stats) end
        local rows = json.decode(report:match("\n(%[.*%])%s*$"))
        assert.are.equal(#rows, #saw.qa)
        for i, r in ipairs(rows) do
            local page = saw.qa[i]
            assert.are.equal(r.kv_rows, page.rows, r.arm)
            for set, v in pairs(r.sets) do
                assert.are.same({ v.right, v.total }, page.sets[set], r.arm .. " " .. set)
            end
            print(("%-45s page %s"):format(r.arm, json.encode(page.sets)))
        end
        assert.is_true(saw.qa_details > 1)
    end)

    it("follows a self-study run to its end, and its last loss is the metrics file's", function()
        if not check() then return end
        local t = saw.training
        print("training view states: " .. table.concat(t.states, " -> "))
        assert.are.equal(0, t.exit, t.stderr)
        assert.are.equal("running", t.states[#t.states - 1])
        assert.are.equal("finished", t.states[#t.states])
        assert.are.equal(600, t.step)
        assert.are.equal(metrics_loss, t.loss)
        assert.is_true(t.paths >= 2)
    end)

    it("lists a fleet's documents, asks through retrieval, and says when there is no fleet", function()
        if not check() then return end
        assert.are.same({ "doc3006.md", "doc3007.md" }, saw.fleet.docs)
        assert.matches("composed: doc300[67]%.md", saw.fleet.stats)
        assert.matches("yes", table.concat(saw.fleet.mapped, " "))
        assert.matches("no fleet", saw.fleet.off)
    end)
end)
