-- recipes/serve.lua over real HTTP on loopback: curl and the official openai
-- npm client as clients, every bad-input case, cache reuse, concurrency,
-- disconnects and clean shutdown.

local helper = require("helper")
local cartridge = require("cartridge")
local json = cartridge.json

local tmp, model, cart_a, cart_b
local servers = {}

local function have(cmd)
    return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == 0 or
        os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == true
end

-- Starts serve.lua with extra args; returns { port, log, pid }.
local function start(...)
    local log = tmp .. "/serve" .. (#servers + 1) .. ".log"
    local args = { helper.q(helper.bin), "run", "recipes/serve.lua", helper.q(model), "--port", "0" }
    for _, a in ipairs({ ... }) do args[#args + 1] = helper.q(a) end
    local p = io.popen(table.concat(args, " ") .. " >" .. log .. " 2>&1 & echo $!")
    local pid = tonumber(p:read("*l"))
    p:close()
    local port
    for _ = 1, 100 do
        local text = helper.exists(log) and helper.read_file(log) or ""
        port = text:match("on http://127%.0%.0%.1:(%d+)")
        if port then break end
        os.execute("sleep 0.05")
    end
    assert(port, "the server did not start: " .. (helper.exists(log) and helper.read_file(log) or ""))
    local s = { port = tonumber(port), log = log, pid = pid }
    servers[#servers + 1] = s
    return s
end

local function stop(s)
    os.execute("kill -TERM " .. s.pid .. " 2>/dev/null")
    for _ = 1, 100 do
        if os.execute("kill -0 " .. s.pid .. " 2>/dev/null") ~= 0 and
            os.execute("kill -0 " .. s.pid .. " 2>/dev/null") ~= true then return end
        os.execute("sleep 0.05")
    end
end

-- curl: returns status, body.
local function curl(s, method, path, body, headers)
    local args = { "curl", "-s", "-o", tmp .. "/body", "-w", "'%{http_code}'", "-X", method }
    for _, h in ipairs(headers or {}) do args[#args + 1] = "-H " .. helper.q(h) end
    if body then
        helper.write_file(tmp .. "/req", body)
        args[#args + 1] = "-H 'Content-Type: application/json' --data-binary @" .. tmp .. "/req"
    end
    args[#args + 1] = helper.q(("http://127.0.0.1:%d%s"):format(s.port, path))
    local rc, out = helper.run(table.concat(args, " "))
    assert.are.equal(0, rc)
    return tonumber(out), helper.read_file(tmp .. "/body")
end

local function chat_body(t)
    return json.encode(t)
end

setup(function()
    tmp = helper.tmpdir()
    model = helper.fixture("models/stories260K.gguf")
    if not model or not helper.exists(helper.bin) or not have("curl") then return end
    local m = cartridge.model.load(model)
    local tok = m:tokenizer()
    for i, text in ipairs({ "Lily and Tom played with a red ball in the park.", "The little dog ran to the big tree." }) do
        local ids = tok:encode(text, { add_special = true })
        local c = cartridge.cart.new(m, #ids, 1)
        c:capture(m, ids)
        local path = tmp .. "/c" .. i .. ".safetensors"
        c:save(path, m)
        if i == 1 then cart_a = path else cart_b = path end
    end
    m:free()
end)

teardown(function()
    for _, s in ipairs(servers) do stop(s) end
    helper.rmdir(tmp)
end)

local function ready()
    if not model then return false, "../shared/models/stories260K.gguf absent" end
    if not helper.exists(helper.bin) then return false, "build/cartridge not built" end
    if not have("curl") then return false, "curl is not installed (scripts/setup.sh installs it)" end
    return true
end

describe("serve.lua", function()
    local s
    local function server()
        if not s then s = start("--cartridge", "a=" .. cart_a, "--cartridge", "b=" .. cart_b, "--parallel", "2") end
        return s
    end

    it("answers chat completions, streamed and not, with usage", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local status, body = curl(server(), "POST", "/v1/chat/completions", chat_body({
            model = "a", messages = { { role = "user", content = "Lily" } }, max_tokens = 12, temperature = 0 }))
        assert.are.equal(200, status, body)
        local r = json.decode(body)
        assert.are.equal("chat.completion", r.object)
        assert.are.equal("a", r.model)
        assert.are.equal("length", r.choices[1].finish_reason)
        assert.are.equal(12, r.usage.completion_tokens)
        assert.are.equal(r.usage.prompt_tokens + 12, r.usage.total_tokens)
        assert.truthy(#r.choices[1].message.content > 0)
        -- streamed: the same text in chunks, a finish chunk, usage, [DONE]
        status, body = curl(server(), "POST", "/v1/chat/completions", chat_body({
            model = "a", messages = { { role = "user", content = "Lily" } }, max_tokens = 12, temperature = 0,
            stream = true, stream_options = { include_usage = true } }))
        assert.are.equal(200, status)
        local text, finish, usage, done = "", nil, nil, false
        for line in body:gmatch("data: ([^\n]+)") do
            if line == "[DONE]" then done = true
            else
                local c = json.decode(line)
                if c.usage then usage = c.usage end
                for _, ch in ipairs(c.choices) do
                    text = text .. (ch.delta.content or "")
                    if ch.finish_reason ~= json.null then finish = ch.finish_reason end
                end
            end
        end
        assert.is_true(done)
        assert.are.equal(r.choices[1].message.content, text)
        assert.are.equal("length", finish)
        assert.are.equal(12, usage.completion_tokens)
    end)

    it("reuses the cached prefix on a follow-up turn and picks cartridges by model", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local first = { model = "b", messages = { { role = "user", content = "Tom went to the park" } }, max_tokens = 8,
            temperature = 0 }
        local _, body = curl(server(), "POST", "/v1/chat/completions", chat_body(first))
        local r1 = json.decode(body)
        local follow = { model = "b", temperature = 0, max_tokens = 8, messages = {
            { role = "user", content = "Tom went to the park" },
            { role = "assistant", content = r1.choices[1].message.content },
            { role = "user", content = "and then?" } } }
        local _, body2 = curl(server(), "POST", "/v1/chat/completions", chat_body(follow))
        local r2 = json.decode(body2)
        print(("  follow-up: %d prompt tokens, %d cached"):format(r2.usage.prompt_tokens,
            r2.usage.prompt_tokens_details.cached_tokens))
        assert.is_true(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens)
        -- the other cartridge and the bare model give other answers to one question
        local q = { messages = { { role = "user", content = "One day" } }, max_tokens = 10, temperature = 0 }
        local answers = {}
        for _, name in ipairs({ "a", "b", "llama" }) do
            q.model = name
            local st, b = curl(server(), "POST", "/v1/chat/completions", chat_body(q))
            assert.are.equal(200, st, b)
            answers[name] = json.decode(b).choices[1].message.content
        end
        assert.is_true(answers.a ~= answers.b or answers.a ~= answers.llama)
        local st, models = curl(server(), "GET", "/v1/models")
        assert.are.equal(200, st)
        local ids = {}
        for _, m in ipairs(json.decode(models).data) do ids[#ids + 1] = m.id end
        assert.are.same({ "llama", "a", "b" }, ids)
    end)

    it("gives the same greedy answer as ask.lua", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local rc, out, err = helper.cartridge("run", "recipes/ask.lua", "--model", model, "--load", cart_a,
            "--ask", "Lily", "--max-a", "24")
        assert.are.equal(0, rc, err)
        local ask_text = out:match("%[cartridge, %d+ KV rows%] [^\n]*\n(.-)\n%[bare model")
        local _, body = curl(server(), "POST", "/v1/chat/completions", chat_body({
            model = "a", messages = { { role = "user", content = "Lily" } }, max_tokens = 24, temperature = 0 }))
        local text = json.decode(body).choices[1].message.content
        assert.are.equal(ask_text, (text:gsub("^%s+", ""):gsub("%s+$", "")))
    end)

    it("answers text completions", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local status, body = curl(server(), "POST", "/v1/completions", chat_body({
            prompt = "Once upon a time", max_tokens = 10, temperature = 0 }))
        assert.are.equal(200, status, body)
        local r = json.decode(body)
        assert.are.equal("text_completion", r.object)
        assert.are.equal(", there was a little girl named Lily", r.choices[1].text)
    end)

    it("turns every kind of bad input into an OpenAI error and keeps serving", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local msgs = { { role = "user", content = "hi" } }
        local cases = {
            { "POST", "/v1/chat/completions", "{bad json", 400, "not valid JSON" },
            { "POST", "/v1/chat/completions", "[1, 2]", 400, "JSON object" },
            { "POST", "/v1/chat/completions", chat_body({ model = "a" }), 400, "messages must be" },
            { "POST", "/v1/chat/completions", chat_body({ messages = { { role = "robot", content = "x" } } }), 400, "role" },
            { "POST", "/v1/chat/completions", chat_body({ messages = { { role = "user", content = 5 } } }), 400, "content" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, max_tokens = "ten" }), 400, "max_tokens" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, max_tokens = 100000 }), 400, "limit" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, temperature = 9 }), 400, "temperature" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, n = 2 }), 400, "n = 1" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, stop = { 1 } }), 400, "stop" },
            { "POST", "/v1/chat/completions", chat_body({ messages = msgs, model = "zzz" }), 404, "does not exist" },
            { "POST", "/v1/chat/completions", chat_body({ messages = { { role = "user", content = ("word "):rep(3000) } } }),
                400, "context" },
            { "POST", "/v1/completions", chat_body({ prompt = 7 }), 400, "prompt must be a string" },
            { "GET", "/v1/chat/completions", nil, 405, "does not accept GET" },
            { "POST", "/v2/anything", "{}", 404, "Unknown endpoint" },
        }
        for _, c in ipairs(cases) do
            local status, body = curl(server(), c[1], c[2], c[3])
            assert.are.equal(c[4], status, c[2] .. " " .. tostring(c[3]) .. " -> " .. body)
            local e = json.decode(body).error
            assert.truthy(e and e.message:find(c[5], 1, true), body)
        end
        -- invalid UTF-8 in a message
        local status, body = curl(server(), "POST", "/v1/chat/completions",
            '{"messages":[{"role":"user","content":"bad \xff byte"}]}')
        assert.are.equal(400, status, body)
        -- an oversized body, refused by the HTTP layer
        local big = '{"messages":[{"role":"user","content":"' .. ("x"):rep(1100000) .. '"}]}'
        status = curl(server(), "POST", "/v1/chat/completions", big)
        assert.are.equal(413, status)
        status, body = curl(server(), "GET", "/health")
        assert.are.equal(200, status)
        assert.are.equal('{"status":"ok"}', body)
    end)

    it("works with the official openai npm client", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        if not helper.exists(helper.root .. "/tests/node/node_modules/openai/package.json") or not have("node") then
            return pending("the openai npm package is not installed: npm install --prefix tests/node (scripts/setup.sh does it)")
        end
        local rc, out, err = helper.run(("CARTRIDGE_URL=http://127.0.0.1:%d/v1 CARTRIDGE_MODEL=a node %s/tests/node/openai_client.mjs")
            :format(server().port, helper.root))
        assert.are.equal(0, rc, err)
        local r = json.decode(out:match("(%b{})%s*$"))
        assert.are.equal("length", r.finish)
        assert.are.equal(r.text, r.streamed)
        assert.are.equal("length", r.stream_finish)
        assert.are.equal(16, r.stream_usage.completion_tokens)
        assert.are.same({ "llama", "a", "b" }, r.models)
        assert.are.equal(404, r.not_found)
        print(("  openai client: %q, %d stream chunks"):format(r.text, r.chunks))
    end)

    it("requires the API key when one is set", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local k = start("--api-key", "sekrit", "--cartridge", "a=" .. cart_a)
        local body = chat_body({ messages = { { role = "user", content = "hi" } }, max_tokens = 2 })
        local status, resp = curl(k, "POST", "/v1/chat/completions", body)
        assert.are.equal(401, status)
        assert.truthy(resp:find("invalid_api_key", 1, true), resp)
        status = curl(k, "POST", "/v1/chat/completions", body, { "Authorization: Bearer wrong" })
        assert.are.equal(401, status)
        status = curl(k, "GET", "/v1/models", nil, { "Authorization: Bearer wrong" })
        assert.are.equal(401, status)
        status = curl(k, "POST", "/v1/chat/completions", body, { "Authorization: Bearer sekrit" })
        assert.are.equal(200, status)
        stop(k)
    end)

    it("decodes concurrent requests together, answers 429 when the queue is full, and stops cleanly", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local q = start("--parallel", "2", "--queue", "1")
        local req = tmp .. "/long.json"
        helper.write_file(req, chat_body({ messages = { { role = "user", content = "Once" } }, max_tokens = 400,
            temperature = 0.8, seed = 1 }))
        local cmds = {}
        for i = 1, 6 do
            cmds[#cmds + 1] = ("curl -s -o %s/out%d -w '%%{http_code}' -H 'Content-Type: application/json' --data-binary @%s "
                .. "http://127.0.0.1:%d/v1/chat/completions > %s/code%d &"):format(tmp, i, req, q.port, tmp, i)
        end
        os.execute(table.concat(cmds, " ") .. " wait")
        local codes = {}
        for i = 1, 6 do codes[#codes + 1] = helper.read_file(tmp .. "/code" .. i) end
        table.sort(codes)
        print("  6 concurrent requests, 2 slots, queue 1: " .. table.concat(codes, " "))
        local n200, n429 = 0, 0
        for _, c in ipairs(codes) do
            if c == "200" then n200 = n200 + 1 elseif c == "429" then n429 = n429 + 1 end
        end
        assert.is_true(n200 >= 3 and n429 >= 1 and n200 + n429 == 6)
        -- a client that leaves mid-stream stops its generation
        os.execute(("curl -s -m 0.3 -H 'Content-Type: application/json' --data-binary %s http://127.0.0.1:%d/v1/chat/completions >/dev/null 2>&1")
            :format(helper.q(chat_body({ messages = { { role = "user", content = "Once" } }, max_tokens = 3000, stream = true })), q.port))
        os.execute("sleep 0.3")
        assert.truthy(helper.read_file(q.log):find("client went away", 1, true), helper.read_file(q.log))
        stop(q)
        local log = helper.read_file(q.log)
        assert.truthy(log:find("signal received: shutting down", 1, true) and log:find("serve: stopped", 1, true), log)
    end)
end)
