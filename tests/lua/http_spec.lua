-- The HTTP server through its Lua wrapper, driven by curl running in the
-- background while the spec runs the server loop (poll, events, a "model
-- step" between polls), as lua/cartridge/server.lua does. Needs curl.

local http = require("cartridge.http")
local helper = require("helper")
local ffi = require("ffi")

local q = helper.q

local function have_curl()
    local rc = helper.run("command -v curl")
    return rc == 0
end

-- Starts curl in the background with `args` (shell text) against `url`. The
-- body goes to <name>.body, the response head to <name>.head, the status code
-- to <name>.code and curl's exit status to <name>.done when it finishes.
local function curl(dir, name, args, url)
    local base = dir .. "/" .. name
    local job = { body = base .. ".body", head = base .. ".head", code = base .. ".code",
        done = base .. ".done" }
    os.execute(("(curl -s -S --max-time 10 -o %s -D %s -w '%%{http_code}' %s %s >%s 2>%s.err; " ..
        "echo $? >%s.tmp && mv %s.tmp %s) &"):format(q(job.body), q(job.head), args, q(url),
        q(job.code), q(base), q(job.done), q(job.done), q(job.done)))
    return job
end

local function finished(job)
    local f = io.open(job.done, "rb")
    if not f then return false end
    f:close()
    return true
end

-- Runs the server loop until the curl job has finished (10 s at most):
-- on_event(ev) for every event, tick() once per pass.
local function serve_until(srv, job, on_event, tick)
    local deadline = os.time() + 15
    while not finished(job) do
        srv:poll(10)
        for ev in srv:events() do on_event(ev) end
        if tick then tick() end
        assert(os.time() < deadline, "curl did not finish within 15 s")
    end
    -- a few more passes so that the server sees curl's close
    for _ = 1, 5 do
        srv:poll(5)
        for ev in srv:events() do on_event(ev) end
    end
    return {
        exit = tonumber(helper.read_file(job.done):match("%d+")),
        code = tonumber(helper.read_file(job.code):match("%d+")),
        body = helper.read_file(job.body),
        head = helper.read_file(job.head),
    }
end

describe("the HTTP server", function()
    local dir, srv

    before_each(function()
        dir = helper.tmpdir()
    end)

    after_each(function()
        if srv then srv:close() end
        srv = nil
        helper.rmdir(dir)
    end)

    it("echoes a JSON body that curl posts", function()
        if not have_curl() then pending("curl is not installed") return end
        srv = http.listen({ port = 0 })
        local url = ("http://127.0.0.1:%d/v1/echo?x=1"):format(srv:port())
        local job = curl(dir, "echo", "-H 'Content-Type: application/json' -H 'X-Trace: abc' " ..
            "--data-binary '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'", url)
        local seen, again
        local r = serve_until(srv, job, function(ev)
            if ev.kind ~= "request" then return end
            seen = srv:request(ev.id)
            assert.is_true(srv:is_open(ev.id))
            assert.is_true(srv:respond(ev.id, 200, "application/json", seen.body,
                { ["X-Request-Id"] = tostring(ev.id) }))
            again = { srv:respond(ev.id, 200, "text/plain", "twice") }
        end)
        print(("  curl exit %d, status %d, body %s"):format(r.exit, r.code, r.body))
        assert.are.equal(0, r.exit)
        assert.are.equal(200, r.code)
        assert.are.equal('{"messages":[{"role":"user","content":"hi"}]}', r.body)
        assert.truthy(r.head:lower():find("content-type: application/json", 1, true))
        assert.truthy(r.head:find("X-Request-Id: 1", 1, true))
        assert.are.equal("POST", seen.method)
        assert.are.equal("/v1/echo", seen.path)
        assert.are.equal("x=1", seen.query)
        assert.are.equal(11, seen.version)
        assert.are.equal("application/json", seen.header("Content-Type"))
        assert.are.equal("abc", seen:header("x-trace"))
        assert.are.equal("abc", seen.headers["x-trace"])
        assert.is_nil(seen.header("authorization"))
        assert.truthy(seen.remote:match("^127%.0%.0%.1:%d+$"))
        -- a second answer to the same request is refused, not raised
        assert.is_false(again[1])
        assert.truthy(again[2]:find("not in flight", 1, true), again[2])
        assert.is_nil(srv:request(seen.id))
    end)

    it("streams a response over several steps that curl receives whole", function()
        if not have_curl() then pending("curl is not installed") return end
        srv = http.listen({ port = 0 })
        local url = ("http://127.0.0.1:%d/v1/stream"):format(srv:port())
        local job = curl(dir, "stream", "-N", url)
        local id, sent = nil, 0
        local r = serve_until(srv, job, function(ev)
            if ev.kind == "request" then
                id = ev.id
                assert.is_true(srv:stream_begin(id, 200, "text/event-stream",
                    { { "Cache-Control", "no-cache" } }))
            end
        end, function()
            -- one "model step": a token per pass, then the end of the stream
            if not id then return end
            if sent < 5 then
                sent = sent + 1
                assert.is_true(srv:stream_write(id, ("data: {\"token\":%d}\n\n"):format(sent)))
            elseif sent == 5 then
                sent = 6
                srv:stream_write(id, "data: [DONE]\n\n")
                assert.is_true(srv:stream_end(id))
                assert.is_false(srv:is_open(id))
            end
        end)
        local expected = {}
        for i = 1, 5 do expected[i] = ("data: {\"token\":%d}\n\n"):format(i) end
        expected[6] = "data: [DONE]\n\n"
        print(("  status %d, %d bytes in 6 chunks"):format(r.code, #r.body))
        assert.are.equal(0, r.exit)
        assert.are.equal(200, r.code)
        assert.truthy(r.head:lower():find("transfer-encoding: chunked", 1, true))
        assert.truthy(r.head:find("Cache-Control: no-cache", 1, true))
        assert.are.equal(table.concat(expected), r.body)
    end)

    it("answers a body over max_body_bytes with 413 without bothering the application", function()
        if not have_curl() then pending("curl is not installed") return end
        srv = http.listen({ port = 0, max_body_bytes = 1000 })
        local payload = dir .. "/payload.json"
        helper.write_file(payload, '{"prompt":"' .. string.rep("x", 5000) .. '"}')
        local url = ("http://127.0.0.1:%d/v1/completions"):format(srv:port())
        local job = curl(dir, "big", "-H 'Content-Type: application/json' --data-binary @" ..
            q(payload), url)
        local requests = 0
        local r = serve_until(srv, job, function(ev)
            if ev.kind == "request" then requests = requests + 1 end
        end)
        print(("  status %d: %s"):format(r.code, r.body))
        assert.are.equal(413, r.code)
        assert.truthy(r.body:find('"type":"invalid_request_error"', 1, true))
        assert.truthy(r.body:find("over the limit of 1000 bytes", 1, true))
        assert.are.equal(0, requests)
        assert.are.equal(0, srv:connections())
    end)

    it("turns SIGTERM into an event and gives the handler back on close", function()
        srv = http.listen({ port = 0 })
        srv:catch_signals()
        pcall(ffi.cdef, "int raise(int sig);")
        ffi.C.raise(15)
        srv:poll(1000)
        local events = {}
        for ev in srv:events() do events[#events + 1] = ev end
        assert.are.equal(1, #events)
        assert.are.equal("signal", events[1].kind)
        assert.are.equal(15, events[1].signal)
        srv:close()
        srv = nil
    end)

    it("rejects unknown options and bad limits with the field's name", function()
        local ok, err = pcall(http.listen, { prot = 8080 })
        assert.is_false(ok)
        assert.truthy(err:find("unknown option 'prot'", 1, true), err)
        ok, err = pcall(http.listen, { max_connections = 0 })
        assert.is_false(ok)
        assert.truthy(err:find("http.listen: http options: max_connections", 1, true), err)
        local a = http.listen({ port = 0 })
        local port = a:port()
        ok, err = pcall(http.listen, { port = port })
        a:close()
        a:close() -- twice is fine
        assert.is_false(ok)
        assert.truthy(err:find("cannot listen on 127.0.0.1:" .. port, 1, true), err)
    end)
end)
