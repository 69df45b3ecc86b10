-- cartridge.webui's routes in process (the browser drives them end to end
-- in browser_spec): the metrics a run's file holds, the QA scoring rule,
-- the 501 of a route whose flag is off, and the page's file names.

local helper = require("helper")
local json = require("cartridge").json
local server = require("cartridge.server")
local webui = require("cartridge.webui")

local function srv_with(web)
    return { web = web, util = server.util, m = { kv_bytes = function(_, rows) return rows * 4 end }, kv_dtype = "f16" }
end

local function call(srv, route, query, body)
    local ok, out = pcall(webui.handle, srv, { route = route, query = query }, body)
    if ok then return 200, json.decode(out) end
    assert(server.is_request_error(out), tostring(out))
    return out.status, out.message
end

describe("cartridge.webui", function()
    local tmp
    setup(function() tmp = helper.tmpdir() end)
    teardown(function() helper.rmdir(tmp) end)

    it("gives a run's complete metrics lines from a line on, skipping what no JSON text can hold", function()
        local path = tmp .. "/run.metrics.jsonl"
        helper.write_file(path, '{"event":"start","settings":{"steps":3}}\n{"step":1,"steps":3,"loss":1e999}\n'
            .. 'not json\n{"step":2,"steps":3,"loss":0.5}\n{"step":3,"st')
        local srv = srv_with({ training = { { name = "my run", path = path } } })
        local status, r = call(srv, "/v1/training", "run=my%20run&since=0")
        assert.are.equal(200, status)
        local run = r.runs[1]
        assert.are.same({ 4, 2, 2 }, { run.lines_total, run.bad_lines, #run.lines })
        assert.are.equal(0.5, run.lines[2].loss)
        assert.are.equal("finished", run.state)
        status, r = call(srv, "/v1/training", "run=my+run&since=3")
        assert.are.same({ 1, 0.5 }, { #r.runs[1].lines, r.runs[1].lines[1].loss })
        -- while the run trains, its .partial file is the one read
        local stem = tmp .. "/live"
        helper.write_file(stem .. ".metrics.jsonl.partial", '{"step":1,"steps":9,"loss":2}\n')
        srv = srv_with({ training = { { name = "live", path = stem .. ".safetensors" } } })
        status, r = call(srv, "/v1/training")
        assert.are.same({ "running", 2 }, { r.runs[1].state, r.runs[1].lines[1].loss })
        status, r = call(srv, "/v1/training", "run=nope")
        assert.are.equal(404, status)
        assert.matches("no training run named", r)
    end)

    it("scores replies as report.lua does and refuses bad ones by field", function()
        local srv = srv_with({ training = {}, qa = { { question = "Where?", answer = "Longri", others = { "Tarn" } } } })
        local status, r = call(srv, "/v1/qa/score", nil, { replies = { { index = 0, reply = "Hosshe lives in Longri." } } })
        assert.are.same({ 200, true }, { status, r.results[1].right })
        status, r = call(srv, "/v1/qa/score", nil, { replies = { { index = 0, reply = "Longri or Tarn" } } })
        assert.is_false(r.results[1].right)
        for _, bad in ipairs({ { index = 1, reply = "x" }, { index = 0.5, reply = "x" }, { index = 0 }, "x" }) do
            status, r = call(srv, "/v1/qa/score", nil, { replies = { bad } })
            assert.are.equal(400, status)
            assert.matches("replies%[0%] must be", r)
        end
    end)

    it("answers 501 naming the flag when a view's data was not given", function()
        local srv = srv_with({ training = {} })
        for route, flag in pairs({ ["/v1/corpus"] = "--corpus", ["/v1/qa"] = "--qa", ["/v1/training"] = "--training",
            ["/v1/fleet"] = "--fleet" }) do
            local status, msg = call(srv, route, nil, route == "/v1/qa/score" and {} or nil)
            assert.are.equal(501, status)
            assert.truthy(msg:find(flag, 1, true), msg)
        end
    end)

    it("refuses bad view flags at start, naming the file or flag", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge is not built") end
        helper.write_file(tmp .. "/cut.jsonl", '{"question": "Where does Hos')
        helper.write_file(tmp .. "/empty.md", "")
        local cases = {
            { { "--qa", tmp .. "/nope.jsonl" }, "qa: cannot open" },
            { { "--qa", tmp .. "/cut.jsonl" }, "line 1 is not" },
            { { "--corpus", tmp .. "/empty.md" }, "has no text" },
            { { "--qa-max-tokens", "0" }, "must be at least 1" },
            { { "--open", "--no-webui" }, "which --no-webui turns off" },
        }
        for _, case in ipairs(cases) do
            local rc, _, err = helper.cartridge("run", "recipes/serve.lua", "--model", helper.root .. "/models/reader.gguf",
                "--port", "0", unpack(case[1]))
            assert.are.equal(1, rc, err)
            assert.truthy(err:find(case[2], 1, true), err)
        end
    end)

    it("serves only the page's own files", function()
        assert.are.same({ "/", "index.html" }, { webui.route_of("/") })
        assert.are.same({ "/web/{file}", "app.js" }, { webui.route_of("/web/app.js") })
        for _, p in ipairs({ "/web/../README.md", "/web/.hidden", "/web/a/b.js", "/web/%2e%2e.js" }) do
            assert.is_nil(webui.route_of(p), p)
        end
        local status, ctype = webui.static("app.js")
        assert.are.same({ 200, "text/javascript; charset=utf-8" }, { status, ctype })
        assert.are.equal(404, (webui.static("missing.js")))
        assert.are.equal(404, (webui.static("README.md")))
    end)
end)
