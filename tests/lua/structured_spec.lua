-- Structured output: cartridge.grammar from Lua, generate.run and
-- recipes/generate.lua with a schema, the server's response_format,
-- text.format and forced tool calls (in process, with the real sampler on
-- the embedded random-weight model), and over real HTTP on loopback: the
-- official openai client's parse helpers, 50 random-seeded completions per
-- schema case validated by ajv, and bad input (tests/node/structured.mjs).

local cartridge = require("cartridge")
local grammar = require("cartridge.grammar")
local generate = require("cartridge.generate")
local json = require("cartridge.json")
local helper = require("helper")

local MODEL = helper.root .. "/models/default.gguf"

-- The embedded model is too small to share between threads: on a busy
-- two-core machine a second thread makes each token wait for it (26 ms
-- against 0.4 ms per token, measured), so everything here runs on one.
setup(function() cartridge.set_threads(1) end)
teardown(function() cartridge.set_threads(0) end)

-- The schema cases: every supported feature. Every string has maxLength
-- and every array maxItems (the random-weight model almost never closes a
-- free string: a quote is one of some 200 allowed bytes), so that a
-- document always ends within the grammar's bound -- except "tree", whose
-- recursion is unbounded: the random model may keep nesting, and a
-- document cut by max_tokens is checked to be a prefix of a valid one.
local CASES = {
    { name = "person", schema = [[{"type":"object","properties":{"name":{"type":"string","minLength":1,"maxLength":12},
        "age":{"type":"integer","minimum":0,"maximum":150},"height":{"type":"number","exclusiveMinimum":0,"maximum":2.5},
        "member":{"type":"boolean"},"note":{"type":"null"},"nick":{"type":"string","maxLength":4}},
        "required":["name","age","height","member","note"],"additionalProperties":false}]] },
    { name = "lists", schema = [[{"type":"object","properties":{"colors":{"type":"array","items":{"enum":["red","green",
        "blue",7,null]},"minItems":1,"maxItems":3},"grid":{"type":"array","items":{"type":"array","items":{"type":"integer",
        "minimum":-9,"maximum":9},"maxItems":2},"maxItems":2},"version":{"const":"v1"},"extra":{"type":"object",
        "additionalProperties":false}},"required":["colors","grid","version"],"additionalProperties":false}]] },
    { name = "choices", schema = [[{"anyOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number",
        "minimum":0,"maximum":100}},"required":["kind","r"],"additionalProperties":false},{"type":"object","properties":{
        "kind":{"const":"label"},"text":{"type":["string","null"],"maxLength":6}},"required":["kind","text"],
        "additionalProperties":false},{"type":"array","items":{"type":"boolean"},"maxItems":2}]}]] },
    { name = "numbers", schema = [[{"type":"array","items":{"anyOf":[{"type":"integer","minimum":-1000,
        "exclusiveMaximum":-10},{"type":"number","minimum":-2.5,"maximum":2.5},{"type":"number"}]},"minItems":2,
        "maxItems":4}]] },
    { name = "strings", schema = [[{"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":3},
        "b":{"type":"string","maxLength":8},"c":{"enum":["x\"y","\\","é"]}},"required":["a","b","c"],
        "additionalProperties":false}]] },
    { name = "refs", schema = [[{"$defs":{"point":{"type":"object","properties":{"x":{"type":"integer"},"y":{"$ref":
        "#/$defs/coord"}},"required":["x","y"],"additionalProperties":false},"coord":{"type":"number","minimum":-1,
        "maximum":1}},"type":"object","properties":{"from":{"$ref":"#/$defs/point"},"to":{"$ref":"#/$defs/point"}},
        "required":["from","to"],"additionalProperties":false}]] },
    { name = "tree", unbounded = true, schema = [[{"$defs":{"node":{"type":"object","properties":{"value":{"type":
        "integer","minimum":0,"maximum":99},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
        "required":["value"],"additionalProperties":false}},"$ref":"#/$defs/node"}]] },
}

local TOOLS = json.decode([[
[{"type":"function","function":{"name":"get_weather","description":"The weather of a city","strict":true,
  "parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]}},
  "required":["city","unit"],"additionalProperties":false}}},
 {"type":"function","function":{"name":"add","description":"Adds two integers","parameters":{"type":"object",
  "properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}}}]
]])

local function have(cmd)
    return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == 0 or
        os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == true
end

describe("cartridge.grammar", function()
    it("compiles schemas, says how long their documents can be, and refuses bad ones with a JSON pointer", function()
        local g = grammar.schema(CASES[1].schema)
        assert.is_true(g:max_bytes() > 100)
        assert.is_nil(grammar.schema(CASES[7].schema):max_bytes()) -- the tree recurses
        assert.is_nil(grammar.json_object():max_bytes())
        -- a decoded table keeps its properties' order
        local t = json.decode('{"type":"object","properties":{"z":{"type":"null"},"a":{"type":"null"}},"required":["z","a"]}')
        local m = grammar.matcher(grammar.schema(t), grammar.vocab(cartridge.model.load(MODEL):tokenizer()))
        assert.is_true(m:try('{"z":null,"a":null}'))
        assert.is_false(m:try('{"a":null,"z":null}'))
        assert.has_error(function() grammar.schema('{"type":"string","pattern":"a"}') end,
            "grammar.schema: schema: #: the keyword 'pattern' is not supported by structured output (supported: type, "
            .. "properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, "
            .. "maximum, exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, $ref, $defs)")
        assert.has_no.errors(function() grammar.schema('{"type":"string","pattern":"a"}', { lenient = true }) end)
        local ok, err = pcall(grammar.schema, { type = "integer", minimum = 1 / 0 })
        assert.is_false(ok)
        assert.truthy(err:find("grammar.schema: cannot encode inf", 1, true), err)
    end)

    it("masks, accepts and ends a document token by token", function()
        local m = cartridge.model.load(MODEL)
        local tok = m:tokenizer()
        local v = grammar.vocab(tok, m.n_vocab)
        assert.are.equal(v, grammar.vocab(tok, m.n_vocab)) -- built once per tokenizer
        local mt = grammar.matcher(grammar.schema('{"enum":["yes","no"]}'), v)
        local mask, n = mt:mask()
        assert.are.equal(1, n) -- only the opening quote
        local quote = tok:encode('"')[1]
        assert.are.equal(1, bit.band(bit.rshift(mask[math.floor(quote / 32)], quote % 32), 1))
        mt:accept_text('"n')
        assert.has_error(function() mt:accept(tok:encode("x")[1]) end)
        mt:accept(tok:encode("o")[1])
        mt:accept(quote)
        assert.is_true(mt:done())
        assert.is_true(mt:can_end())
        assert.are.equal(4, mt:bytes())
        m:free()
    end)
end)

describe("generate.run with a grammar", function()
    it("writes documents of the schema, greedy and sampled, and stops when they are complete", function()
        local m = cartridge.model.load(MODEL)
        local tok = m:tokenizer()
        local g = grammar.schema(CASES[1].schema)
        local prompt = tok:encode("Hello")
        for seed = 0, 8 do
            local r = generate.run({ model = m, tokenizer = tok, prompt_ids = prompt, max_tokens = g:max_bytes() + 1,
                grammar = g, sampling = { temperature = seed == 0 and 0 or 1, seed = seed } })
            assert.are.equal("stop", r.finish)
            local doc = json.decode(r.text)
            assert.are.equal("string", type(doc.name))
            assert.truthy(doc.age >= 0 and doc.age <= 150 and doc.age == math.floor(doc.age), r.text)
            assert.truthy(doc.height > 0 and doc.height <= 2.5, r.text)
            assert.are.equal("boolean", type(doc.member))
            assert.are.equal(json.null, doc.note)
        end
        m:free()
    end)
end)

describe("the CLI recipes with --json-schema", function()
    local tmp
    setup(function() tmp = helper.tmpdir() end)
    teardown(function() helper.rmdir(tmp) end)

    it("prints a document of the schema, and refuses a missing or invalid schema file", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        helper.write_file(tmp .. "/s.json", CASES[2].schema)
        local rc, out, err = helper.cartridge("run", "recipes/generate.lua", "--model", MODEL, "--prompt", "Hi",
            "--json-schema", tmp .. "/s.json", "--temp", "1", "--seed", "4", "--n", "2000", "--json", "--threads", "1")
        assert.are.equal(0, rc, err)
        local r = json.decode(out)
        assert.are.equal("stop", r.finish)
        local doc = json.decode(r.text)
        assert.are.equal("v1", doc.version)
        assert.truthy(#doc.colors >= 1 and #doc.colors <= 3, r.text)
        rc, _, err = helper.cartridge("run", "recipes/generate.lua", "--model", MODEL, "--json-schema", tmp .. "/none.json")
        assert.are.equal(1, rc)
        assert.truthy(err:find("--json-schema: cannot read the schema file: " .. tmp .. "/none.json", 1, true), err)
        helper.write_file(tmp .. "/bad.json", '{"type":"object","properties":{"x":{"type":"string","format":"email"}}}')
        rc, _, err = helper.cartridge("run", "recipes/generate.lua", "--model", MODEL, "--json-schema", tmp .. "/bad.json")
        assert.are.equal(1, rc)
        assert.truthy(err:find("--json-schema " .. tmp .. "/bad.json: schema: #/properties/x: the keyword 'format'", 1,
            true), err)
        helper.write_file(tmp .. "/broken.json", '{"type": ')
        rc, _, err = helper.cartridge("run", "recipes/generate.lua", "--model", MODEL, "--json-schema", tmp .. "/broken.json")
        assert.are.equal(1, rc)
        assert.truthy(err:find("not valid JSON", 1, true), err)
    end)

    it("makes ask.lua answer behind a cartridge, bare and in context with documents of the schema", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local m = cartridge.model.load(MODEL)
        cartridge.cart.from_text(m, "Lily and Tom played with a red ball."):save(tmp .. "/c.safetensors", m)
        m:free()
        helper.write_file(tmp .. "/corpus.txt", "Lily and Tom played with a red ball.")
        helper.write_file(tmp .. "/a.json", '{"type":"object","properties":{"answer":{"enum":["yes","no"]},'
            .. '"who":{"type":"string","maxLength":5}},"required":["answer","who"],"additionalProperties":false}')
        local rc, out, err = helper.cartridge("run", "recipes/ask.lua", "--model", MODEL, "--load", tmp .. "/c.safetensors",
            "--ask", "Who played?", "--corpus", tmp .. "/corpus.txt", "--json-schema", tmp .. "/a.json", "--threads", "1",
            "--max-a", "400")
        assert.are.equal(0, rc, err)
        -- each answer runs from its "[...]" header line to the next (a document may span lines)
        local sections = {}
        for line in out:gmatch("[^\n]+") do
            if line:find("^%[") then sections[#sections + 1] = {}
            elseif #sections > 0 then table.insert(sections[#sections], line) end
        end
        local answers = 0
        for _, lines in ipairs(sections) do
            local doc = json.decode(table.concat(lines, "\n"))
            assert.truthy(doc.answer == "yes" or doc.answer == "no", table.concat(lines, "\n"))
            answers = answers + 1
        end
        assert.are.equal(3, answers, out)
        rc, _, err = helper.cartridge("run", "recipes/ask.lua", "--model", MODEL, "--load", tmp .. "/c.safetensors",
            "--ask", "Who?", "--json-schema", tmp .. "/a.json", "--spec-serve")
        assert.are.equal(1, rc)
        assert.truthy(err:find("--json-schema and --spec-serve cannot go together", 1, true), err)
    end)
end)

-- ---------------------------------------------------------------------------
-- The server in this process (a fake HTTP layer), the real sampler

describe("the server's structured output", function()
    local server_mod = require("cartridge.server")
    local m

    setup(function() m = cartridge.model.load(MODEL) end)
    teardown(function() if m then m:free() end end)

    -- Serves requests (bodies) on one server; returns their { status, body }.
    local function serve(bodies, path)
        local h = helper.fake_http()
        local srv = server_mod.new({ model = m, model_name = "m", http = h, parallel = 2, ctx = 4096 })
        for i, b in ipairs(bodies) do
            h:add(i, path or "/v1/chat/completions", json.encode(b))
            srv:on_event({ kind = "request", id = i })
        end
        for _ = 1, 20000 do
            local open = false
            for i = 1, #bodies do open = open or h.open[i] end
            if not open then break end
            srv:turn()
        end
        srv:free()
        local out = {}
        for i = 1, #bodies do out[i] = h.answers[i] end
        return out
    end

    local question = { { role = "user", content = "A shape, as JSON" } }

    -- The text and finish reason of a chat or text completion, streamed or not.
    local function answer_text(body, streamed)
        if not streamed then
            local ch = json.decode(body).choices[1]
            return ch.message and ch.message.content or ch.text, ch.finish_reason
        end
        local text, finish = "", nil
        for line in body:gmatch("data: ([^\n]+)") do
            if line ~= "[DONE]" then
                local ch = json.decode(line).choices[1]
                text = text .. (ch.delta and ch.delta.content or ch.text or "")
                if ch.finish_reason ~= json.null then finish = ch.finish_reason end
            end
        end
        return text, finish
    end

    -- A document of CASES[3] ("choices"): a short array or a shape object.
    local function check_shape(text)
        local doc = json.decode(text)
        if json.kind(doc) == "array" then
            assert.truthy(#doc <= 2, text)
        else
            assert.truthy(doc.kind == "circle" or doc.kind == "label", text)
        end
    end

    it("holds chat completions to a json_schema response_format, streamed and not", function()
        local c = CASES[3]
        local g = grammar.schema(c.schema)
        local bodies = {}
        for seed = 1, 6 do
            bodies[seed] = { messages = question, temperature = 1, seed = seed, max_tokens = g:max_bytes() + 1,
                stream = seed > 3, response_format = { type = "json_schema", json_schema = { name = "shape",
                    strict = true, schema = json.decode(c.schema) } } }
        end
        for i, a in ipairs(serve(bodies)) do
            assert.are.equal(200, a.status, a.body)
            local text, finish = answer_text(a.body, i > 3)
            assert.are.equal("stop", finish)
            check_shape(text)
        end
    end)

    it("holds text completions to a response_format too, as llama-server does", function()
        local c = CASES[3]
        local g = grammar.schema(c.schema)
        local bodies = {}
        for seed = 1, 6 do
            bodies[seed] = { prompt = "A shape, as JSON:", temperature = 1, seed = seed, max_tokens = g:max_bytes() + 1,
                stream = seed > 3, response_format = seed == 6 and { type = "json_object" } or { type = "json_schema",
                    json_schema = { name = "shape", strict = true, schema = json.decode(c.schema) } } }
        end
        for i, a in ipairs(serve(bodies, "/v1/completions")) do
            assert.are.equal(200, a.status, a.body)
            local text, finish = answer_text(a.body, i > 3)
            if i == 6 then
                -- json_object: a finished document is an object, a cut one the prefix of one
                assert.is_true(grammar.matcher(grammar.json_object(), grammar.vocab(m:tokenizer(), m.n_vocab)):try(text),
                    text)
            else
                assert.are.equal("stop", finish)
                check_shape(text)
            end
        end
        -- a bad format is a 400 on this route as well
        local a = serve({ { prompt = "x", max_tokens = 4, response_format = { type = "yaml" } } }, "/v1/completions")
        assert.are.equal(400, a[1].status, a[1].body)
        assert.are.equal("response_format", json.decode(a[1].body).error.param)
    end)

    it("holds Responses to text.format and echoes the format", function()
        local a = serve({ { input = "A list", temperature = 1, max_output_tokens = 400, text = { format = {
            type = "json_schema", name = "bools", schema = { type = "array", items = { type = "boolean" }, maxItems = 3 } } } },
            { input = "Anything", max_output_tokens = 8, text = { format = { type = "text" } } } }, "/v1/responses")
        assert.are.equal(200, a[1].status, a[1].body)
        local r = json.decode(a[1].body)
        assert.are.equal("completed", r.status)
        assert.are.equal("array", json.kind(json.decode(r.output_text)))
        assert.are.equal("json_schema", r.text.format.type)
        assert.are.equal("bools", r.text.format.name)
        assert.are.equal("text", json.decode(a[2].body).text.format.type)
    end)

    it("holds a forced tool call's arguments to the tool's parameters", function()
        local bodies = {}
        for seed = 1, 6 do
            bodies[seed] = { messages = question, tools = TOOLS, temperature = 1, seed = seed, max_tokens = 600,
                tool_choice = seed % 2 == 0 and "required" or { type = "function", ["function"] = { name = "get_weather" } } }
        end
        for i, a in ipairs(serve(bodies)) do
            assert.are.equal(200, a.status, a.body)
            local ch = json.decode(a.body).choices[1]
            assert.are.equal("tool_calls", ch.finish_reason, a.body)
            local call = ch.message.tool_calls[1]
            local args = json.decode(call["function"].arguments)
            if i % 2 == 1 then assert.are.equal("get_weather", call["function"].name) end
            if call["function"].name == "get_weather" then
                assert.truthy(type(args.city) == "string" and (args.unit == "c" or args.unit == "f"), a.body)
            else
                assert.truthy(args.a == math.floor(args.a) and args.b == math.floor(args.b), a.body)
            end
        end
    end)

    it("refuses wrong types and invalid schemas with a 400 naming the field", function()
        local cases = {
            { { response_format = "json" }, "response_format", "response_format must be an object" },
            { { response_format = { type = "yaml" } }, "response_format", 'response_format.type must be "text"' },
            { { response_format = { type = "json_schema", json_schema = { name = "x" } } }, "response_format",
                "response_format.json_schema.schema must be a JSON Schema object" },
            { { response_format = { type = "json_schema", json_schema = { name = "x", strict = true,
                schema = { type = "object", properties = { n = { type = "integer", multipleOf = 2 } } } } } },
                "response_format", "response_format.json_schema.schema: #/properties/n: the keyword 'multipleOf'" },
        }
        local bodies = {}
        for i, c in ipairs(cases) do
            bodies[i] = c[1]
            bodies[i].messages, bodies[i].max_tokens = question, 4
        end
        for i, a in ipairs(serve(bodies)) do
            assert.are.equal(400, a.status, a.body)
            local e = json.decode(a.body).error
            assert.are.equal(cases[i][2], e.param)
            assert.truthy(e.message:find(cases[i][3], 1, true), e.message)
        end
        -- strict false: the unsupported keyword is ignored
        local a = serve({ { messages = question, max_tokens = 200, response_format = { type = "json_schema", json_schema = {
            name = "x", schema = { type = "integer", multipleOf = 2, minimum = 0, maximum = 9 } } } } })
        assert.are.equal(200, a[1].status, a[1].body)
        local n = json.decode(json.decode(a[1].body).choices[1].message.content)
        assert.truthy(n >= 0 and n <= 9, a[1].body)
    end)
end)

-- ---------------------------------------------------------------------------
-- Over real HTTP, with the official client and ajv

describe("serve.lua structured output over HTTP", function()
    local tmp, s
    setup(function() tmp = helper.tmpdir() end)
    teardown(function()
        if s then os.execute("kill -TERM " .. s.pid .. " 2>/dev/null") end
        helper.rmdir(tmp)
    end)

    -- serve.lua on the embedded model, started once; returns the model's name
    local function server()
        if s then return s.name end
        local log = tmp .. "/serve.log"
        local p = io.popen(("%s run recipes/serve.lua %s --port 0 --parallel 4 --threads 1 --quiet >%s 2>&1 & echo $!")
            :format(helper.q(helper.bin), helper.q(MODEL), log))
        s = { pid = tonumber(p:read("*l")) }
        p:close()
        for _ = 1, 100 do
            local text = helper.exists(log) and helper.read_file(log) or ""
            s.name, s.port = text:match("serving (%S+) .- on http://127%.0%.0%.1:(%d+)")
            if s.port then break end
            os.execute("sleep 0.05")
        end
        assert(s.port, "the server did not start: " .. helper.read_file(log))
        return s.name
    end

    -- why the node clients cannot run, or nil
    local function no_clients()
        if not helper.exists(helper.bin) then return "build/cartridge not built" end
        if not have("node") or not helper.exists(helper.root .. "/tests/node/node_modules/ajv/package.json")
            or not helper.exists(helper.root .. "/tests/node/node_modules/openai/package.json") then
            return "the openai and ajv npm packages are not installed: npm install --prefix tests/node "
                .. "(scripts/setup.sh does it)"
        end
    end

    -- Runs tests/node/<script> against the server (base URL + base, the
    -- clients' different conventions); returns the JSON line it printed last.
    local function run_client(script, base)
        local name = server()
        local rc, out, err = helper.run(("CARTRIDGE_URL=http://127.0.0.1:%s%s CARTRIDGE_MODEL=%s node %s"):format(s.port,
            base, helper.q(name), helper.q(helper.root .. "/tests/node/" .. script)))
        assert.are.equal(0, rc, err)
        return json.decode(out:match("([^\n]+)%s*$"))
    end

    it("runs a tool-using conversation with the official openai client: a forced call, streamed, the result "
        .. "sent back, the SDK's runTools loop, and Responses function_call items", function()
        local why = no_clients()
        if why then return pending(why) end
        local r = run_client("openai_tools.mjs", "/v1")
        -- 1. the call as the client sees it, its arguments valid under the tool's parameters
        assert.are.equal("tool_calls", r.plain.finish)
        assert.are.equal(json.null, r.plain.content)
        assert.are.equal(1, r.plain.calls)
        assert.are.equal("function", r.plain.type)
        assert.are.equal("get_weather", r.plain.name)
        assert.truthy(r.plain.id:find("^call_"), r.plain.id)
        assert.is_nil(r.plain.check.error, r.plain.check.error)
        -- 2. streamed and assembled by the SDK: the same call
        assert.are.equal("tool_calls", r.streamed.finish)
        assert.are.equal(r.plain.arguments, r.streamed.arguments)
        assert.truthy(r.streamed.argument_deltas >= 1)
        assert.are.same({ "get_weather" }, r.streamed.done_events)
        -- 3. the result went back in the template: a longer prompt, a plain answer
        assert.are.equal("string", r.follow_up.content_type)
        assert.truthy(r.follow_up.prompt_tokens > r.follow_up.first_prompt_tokens, json.encode(r.follow_up))
        -- 4. runTools called the JavaScript function with valid arguments
        assert.are.equal(1, r.run_tools.called)
        assert.is_true(r.run_tools.args_valid)
        -- 5. Responses
        assert.are.equal("completed", r.responses.status)
        assert.are.equal("function_call", r.responses.item_type)
        assert.are.equal("get_weather", r.responses.name)
        assert.is_nil(r.responses.check.error, r.responses.check.error)
        assert.are.same({ "message" }, r.responses.follow_up_types)
        print(("  openai client tools: call %s(%s), streamed the same; result sent back (%d -> %d prompt tokens), "
            .. "runTools called the function once; Responses function_call %s"):format(r.plain.name, r.plain.arguments,
            r.follow_up.first_prompt_tokens, r.follow_up.prompt_tokens, r.responses.name))
    end)

    it("runs a tool-using conversation with the official Anthropic client: a forced tool_use, streamed, the "
        .. "tool_result sent back, tool_choice any, and a server tool refused", function()
        local why = no_clients()
        if why then return pending(why) end
        if not helper.exists(helper.root .. "/tests/node/node_modules/@anthropic-ai/sdk/package.json") then
            return pending("the @anthropic-ai/sdk npm package is not installed: npm install --prefix tests/node")
        end
        local r = run_client("anthropic_tools.mjs", "")
        -- 1. the forced call: a tool_use block alone, its input valid under the input_schema (ajv)
        assert.are.equal("tool_use", r.plain.stop_reason)
        assert.are.same({ "tool_use" }, r.plain.types)
        assert.are.equal("get_weather", r.plain.name)
        assert.truthy(r.plain.id:find("^toolu_"), r.plain.id)
        assert.is_nil(r.plain.check.error, r.plain.check.error)
        -- 2. streamed and assembled by the SDK from input_json_delta: the same call
        assert.are.equal("tool_use", r.streamed.stop_reason)
        assert.are.same({ "tool_use" }, r.streamed.types)
        assert.are.same(r.plain.input, r.streamed.input)
        assert.truthy(r.streamed.json_deltas >= 1)
        -- 3. the result went back in the template: a longer prompt
        assert.truthy(r.follow_up.input_tokens > r.plain.input_tokens, json.encode(r.follow_up))
        assert.truthy(r.follow_up.stop_reason == "max_tokens" or r.follow_up.stop_reason == "end_turn"
            or r.follow_up.stop_reason == "tool_use", r.follow_up.stop_reason)
        -- 4. any: a call to the one tool
        assert.are.same({ stop_reason = "tool_use", name = "get_weather" }, r.any)
        -- 5. a server tool: Anthropic's error shape, naming it
        assert.are.equal(400, r.server_tool.status)
        assert.are.equal("invalid_request_error", r.server_tool.type)
        assert.truthy(r.server_tool.message:find('tools of type "web_search_20250305" are not supported', 1, true),
            r.server_tool.message)
        print(("  anthropic client tools: tool_use get_weather(%s), streamed the same; tool_result sent back (%d -> %d "
            .. "prompt tokens)"):format(json.encode(r.plain.input), r.plain.input_tokens, r.follow_up.input_tokens))
    end)

    it("passes the openai client's parse helpers, 50 random completions per schema case under ajv, and bad input",
        function()
            local why = no_clients()
            if why then return pending(why) end
            local cases = {}
            for i, c in ipairs(CASES) do
                local bound = grammar.schema(c.schema):max_bytes()
                -- a bounded schema's document ends within its bound; the tree is given room
                cases[i] = { name = c.name, schema = json.decode(c.schema), max_tokens = bound and bound + 1 or 1500 }
            end
            helper.write_file(tmp .. "/cases.json", json.encode({ runs = 50, parallel = 4, cases = cases, tools = TOOLS,
                tool_max_tokens = 800, object_runs = 10, object_max_tokens = 300 }, { ordered = true }))
            local name = server()
            local rc, out, err = helper.run(("CARTRIDGE_URL=http://127.0.0.1:%s/v1 CARTRIDGE_MODEL=%s CARTRIDGE_CASES=%s "
                .. "node %s"):format(s.port, helper.q(name), helper.q(tmp .. "/cases.json"),
                helper.q(helper.root .. "/tests/node/structured.mjs")))
            assert.are.equal(0, rc, err)
            local r = json.decode(out:match("([^\n]+)%s*$"))
            -- the client's parse helpers
            assert.are.equal("stop", r.parse.chat.finish)
            assert.is_true(r.parse.chat.valid)
            assert.are.equal("completed", r.parse.responses.status)
            assert.is_true(r.parse.responses.valid)
            assert.are.equal("json_schema", r.parse.responses.format)
            -- every random completion of a bounded schema is a complete, valid document
            local vocab_m = cartridge.model.load(MODEL)
            local v = grammar.vocab(vocab_m:tokenizer(), vocab_m.n_vocab)
            for i, c in ipairs(r.cases) do
                print(("  %-8s %2d/%d finished and valid under ajv, at most %d tokens, %.1f s"):format(c.name, c.valid,
                    c.runs, c.max_tokens_used, c.seconds))
                assert.are.equal(CASES[i].name, c.name)
                assert.are.equal(50, c.runs)
                assert.are.same({}, c.errors)
                assert.are.equal(c.stopped, c.valid)
                if CASES[i].unbounded then
                    -- deterministic (seeded, the same bits on every ISA level): most trees close
                    assert.truthy(c.stopped >= 40, c.stopped)
                    local g = grammar.schema(CASES[i].schema)
                    for _, text in ipairs(c.cut) do assert.is_true(grammar.matcher(g, v):try(text), text) end
                else
                    assert.are.equal(50, c.stopped)
                end
            end
            print(("  tools    %d/%d forced calls with arguments valid under ajv (tools %s)"):format(r.tools.valid,
                r.tools.runs, table.concat(r.tools.names, ", ")))
            assert.are.same({}, r.tools.errors)
            assert.are.equal(50, r.tools.valid)
            assert.are.same({ "tool_calls" }, r.tools.finish)
            -- json_object: finished ones are objects; the rest are prefixes of one
            local o = r.json_object
            print(("  json_object: %d runs, %d finished within 300 tokens, all valid: %s"):format(o.runs, o.stopped,
                tostring(o.valid == o.stopped)))
            assert.are.same({}, o.errors)
            for _, text in ipairs(o.texts) do
                local mt = grammar.matcher(grammar.json_object(), v)
                assert.is_true(mt:try(text), text)
            end
            vocab_m:free()
            -- bad input: a 400 naming the field each time, and the server kept serving
            for _, b in ipairs(r.bad) do
                assert.are.equal(400, b.status, b.message)
                assert.are.equal(b.want_param, b.param, b.message)
                assert.is_true(b.mentions, b.message)
                assert.are.equal(200, b.health)
            end
            assert.are.equal("stop", r.after_bad.finish)
            assert.are.equal("number", type(json.decode(r.after_bad.content).a))
        end)
end)
