-- Tool calls: the chatml (Qwen3, hermes-style) tool format in chat.render,
-- parsing a model's <tool_call> blocks (cartridge.toolcall), and the
-- server's chat completions with tools, non-streamed and streamed. The
-- server cases run in this process over a fake HTTP layer, on the embedded
-- default model, with a scripted sampler that emits a given text token by
-- token -- so they check the server's handling of a model's calls without
-- needing a model that makes them.

local cartridge = require("cartridge")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local toolcall = require("cartridge.toolcall")
local helper = require("helper")

local WEATHER = '{"type":"function","function":{"name":"get_weather","description":"Weather of a city",'
    .. '"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}'

describe("chat.render with tools (chatml, as Qwen3's template writes them)", function()
    it("puts the tools in the system message, after the system prompt", function()
        local tool = json.encode(json.decode(WEATHER), { python = true })
        local text = chat.render("chatml", { { role = "system", content = "Be terse." },
            { role = "user", content = "Weather in Paris?" } }, { tools = { tool } })
        assert.are.equal("<|im_start|>system\nBe terse.\n\n# Tools\n\nYou may call one or more functions to assist "
            .. "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
            .. '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", '
            .. '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
            .. "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            .. '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            .. "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            .. "<|im_start|>assistant\n<think>\n\n</think>\n\n", text)
    end)

    it("writes past calls and groups consecutive tool results in one user turn", function()
        local text = chat.render("chatml", {
            { role = "user", content = "Paris and Rome?" },
            { role = "assistant", content = "", tool_calls = { { name = "get_weather", arguments = '{"city":"Paris"}' },
                { name = "get_weather", arguments = '{"city":"Rome"}' } } },
            { role = "tool", content = "18 C" },
            { role = "tool", content = "24 C" },
        }, { tools = { "{}" } })
        local tail = text:match("<|im_end|>\n(<|im_start|>user\nParis.*)$")
        assert.are.equal("<|im_start|>user\nParis and Rome?<|im_end|>\n<|im_start|>assistant\n"
            .. '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>\n'
            .. '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Rome"}}\n</tool_call><|im_end|>\n'
            .. "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n24 C\n</tool_response>"
            .. "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", tail)
        -- content before a call is separated from it by a newline
        text = chat.render("chatml", { { role = "user", content = "q" }, { role = "assistant", content = "Let me check.",
            tool_calls = { { name = "f", arguments = "{}" } } }, { role = "tool", content = "ok" } })
        assert.truthy(text:find('Let me check.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>', 1,
            true), text)
    end)

    it("refuses tools on a template without a tool format", function()
        assert.has_error(function()
            chat.render("plain", { { role = "user", content = "q" } }, { tools = { "{}" } })
        end, "chat.render: the plain template has no tool-call format; tools need a Qwen-style (chatml) template")
    end)
end)

describe("toolcall.parse", function()
    local T = chat.templates.chatml
    it("finds every call, with the content before them", function()
        local content, calls = toolcall.parse('Sure.\n<tool_call>\n{"name": "a", "arguments": {"x": 1, "b": [2]}}\n'
            .. '</tool_call>\n<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>\n', T)
        assert.are.equal("Sure.", content)
        assert.are.same({ { name = "a", arguments = '{"x":1,"b":[2]}' }, { name = "b", arguments = '{"y": 2}' } }, calls)
        content, calls = toolcall.parse('<tool_call>{"name": "c"}</tool_call>', T)
        assert.is_nil(content)
        assert.are.same({ { name = "c", arguments = "{}" } }, calls)
    end)

    it("leaves text that is not a well-formed call turn as content", function()
        for _, text in ipairs({
            "no calls at all",
            '<tool_call>\n{"name": "a", "arguments": {}}', -- not closed
            '<tool_call>\n{"name": "a", "arguments": {}\n</tool_call>', -- bad JSON
            '<tool_call>\n{"arguments": {}}\n</tool_call>', -- no name
            '<tool_call>\n{"name": "a", "arguments": 5}\n</tool_call>', -- arguments not an object
            '<tool_call>\n{"name": "a", "arguments": "[1]"}\n</tool_call>',
            '<tool_call>\n{"name": "a"}\n</tool_call> and then more text',
            '<tool_call>\n{"name": "a", "arguments": {"x": 1e999}}\n</tool_call>', -- no JSON text holds it
        }) do
            local content, calls = toolcall.parse(text, T)
            assert.is_nil(calls, text)
            assert.are.equal(text, content)
        end
    end)

    it("holds back, while streaming, the text from a call's opening tag (or what may become one)", function()
        assert.are.equal(5, toolcall.visible("Sure.", T))
        assert.are.equal(6, toolcall.visible("Sure.\n<tool_", T))
        assert.are.equal(6, toolcall.visible('Sure.\n<tool_call>\n{"name"', T))
        assert.are.equal(4, toolcall.visible("a < <", T))
        assert.are.equal(3, toolcall.visible("abc", chat.templates.plain))
    end)
end)

-- ---------------------------------------------------------------------------

describe("the server's chat completions with tools", function()
    local server_mod = require("cartridge.server")
    local sampler_mod = require("cartridge.sampler")
    local m, tok

    setup(function()
        m = cartridge.model.load(helper.root .. "/models/default.gguf")
        tok = m:tokenizer()
    end)
    teardown(function() if m then m:free() end end)

    local fake_http = helper.fake_http

    -- Serves one request whose model output is `script` (then end of turn);
    -- returns the status and the body.
    local function serve(body, script, path)
        local h = fake_http()
        local srv = server_mod.new({ model = m, model_name = "m", http = h, parallel = 1, ctx = 1024 })
        local ids = tok:encode(script, { special = true, add_special = false })
        ids[#ids + 1] = tok:encode("<|im_end|>", { special = true, add_special = false })[1]
        local real_new = sampler_mod.new
        sampler_mod.new = function()
            local k = 0
            return { sample = function() k = k + 1; return ids[math.min(k, #ids)] end, accept = function() end,
                accept_prompt = function() end, free = function() end }
        end
        h:add(1, path or "/v1/chat/completions", type(body) == "string" and body or json.encode(body))
        local ok, err = pcall(function()
            srv:on_event({ kind = "request", id = 1 })
            for _ = 1, 400 do
                if not h.open[1] then break end
                srv:turn()
            end
        end)
        sampler_mod.new = real_new
        srv:free()
        assert(ok, err)
        assert(not h.open[1], "the request did not finish")
        return h.answers[1].status, h.answers[1].body
    end

    local tools = { json.decode(WEATHER) }
    local question = { { role = "user", content = "Weather in Paris?" } }
    local CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    it("turns the model's call into tool_calls with finish_reason tool_calls", function()
        local status, body = serve({ messages = question, tools = tools, max_tokens = 100 }, CALL)
        assert.are.equal(200, status, body)
        local choice = json.decode(body).choices[1]
        assert.are.equal("tool_calls", choice.finish_reason)
        assert.are.equal(json.null, choice.message.content)
        assert.are.equal(1, #choice.message.tool_calls)
        local call = choice.message.tool_calls[1]
        assert.are.equal("function", call.type)
        assert.truthy(call.id:find("^call_"), call.id)
        assert.are.equal("get_weather", call["function"].name)
        assert.are.equal('{"city":"Paris"}', call["function"].arguments)
    end)

    it("keeps the content before the calls, and only the first call without parallel_tool_calls", function()
        local script = "Checking.\n" .. CALL .. "\n" .. CALL:gsub("Paris", "Rome")
        local _, body = serve({ messages = question, tools = tools, max_tokens = 200 }, script)
        local msg = json.decode(body).choices[1].message
        assert.are.equal("Checking.", msg.content)
        assert.are.equal(2, #msg.tool_calls)
        assert.are.equal('{"city":"Rome"}', msg.tool_calls[2]["function"].arguments)
        _, body = serve({ messages = question, tools = tools, max_tokens = 200, parallel_tool_calls = false }, script)
        assert.are.equal(1, #json.decode(body).choices[1].message.tool_calls)
    end)

    it("streams the content, then the calls as a tool_calls delta, then finish_reason tool_calls", function()
        local status, body = serve({ messages = question, tools = tools, max_tokens = 200, stream = true },
            "Checking.\n" .. CALL)
        assert.are.equal(200, status)
        local content, calls, finish = "", {}, nil
        for line in body:gmatch("data: ([^\n]+)") do
            if line ~= "[DONE]" then
                local d = json.decode(line).choices[1]
                if d.delta.content then content = content .. d.delta.content end
                for _, c in ipairs(d.delta.tool_calls or {}) do calls[#calls + 1] = c end
                if d.finish_reason ~= json.null then finish = d.finish_reason end
            end
        end
        assert.are.equal("Checking.", content:gsub("%s+$", ""))
        assert.is_nil(content:find("<tool", 1, true), content)
        assert.are.equal(1, #calls)
        assert.are.equal("get_weather", calls[1]["function"].name)
        assert.are.equal(0, calls[1].index)
        assert.are.equal("tool_calls", finish)
    end)

    it("answers with plain content when the model writes no well-formed call", function()
        local _, body = serve({ messages = question, tools = tools, max_tokens = 100 }, "It is sunny.")
        local choice = json.decode(body).choices[1]
        assert.are.equal("stop", choice.finish_reason)
        assert.are.equal("It is sunny.", choice.message.content)
        assert.is_nil(choice.message.tool_calls)
        _, body = serve({ messages = question, tools = tools, max_tokens = 100 }, '<tool_call>\n{"name": oops')
        assert.are.equal('<tool_call>\n{"name": oops', json.decode(body).choices[1].message.content)
    end)

    it("starts the reply with the call for tool_choice required or a named function", function()
        -- the reply is made to start with the call's tag; the model writes the call object (held to the tool's
        -- schema: tests/lua/structured_spec.lua), and the server closes the tag when the object is complete
        local _, body = serve({ messages = question, tools = tools, max_tokens = 100,
            tool_choice = { type = "function", ["function"] = { name = "get_weather" } } },
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}')
        local choice = json.decode(body).choices[1]
        assert.are.equal("tool_calls", choice.finish_reason)
        assert.are.equal("get_weather", choice.message.tool_calls[1]["function"].name)
        assert.are.equal('{"city":"Oslo"}', choice.message.tool_calls[1]["function"].arguments)
        _, body = serve({ messages = question, tools = tools, max_tokens = 100, tool_choice = "required" },
            '{"name": "get_weather", "arguments": {"city": "Lima"}}')
        assert.are.equal('{"city":"Lima"}', json.decode(body).choices[1].message.tool_calls[1]["function"].arguments)
        -- none: the tools are not shown and nothing is parsed
        _, body = serve({ messages = question, tools = tools, max_tokens = 100, tool_choice = "none" }, CALL)
        assert.are.equal(CALL, json.decode(body).choices[1].message.content)
    end)

    it("takes a conversation with past calls and tool results", function()
        local status, body = serve({ tools = tools, max_tokens = 20, messages = { question[1],
            { role = "assistant", content = json.null, tool_calls = { { id = "call_1", type = "function",
                ["function"] = { name = "get_weather", arguments = '{"city":"Paris"}' } } } },
            { role = "tool", tool_call_id = "call_1", content = "18 C and sunny" } } }, "It is 18 C.")
        assert.are.equal(200, status, body)
        assert.are.equal("It is 18 C.", json.decode(body).choices[1].message.content)
    end)

    it("refuses malformed tools and tool choices with a 400 that names them", function()
        local cases = {
            { { tools = 5 }, "tools", "tools must be an array" },
            { { tools = { { type = "function" } } }, "tools", "tools[0] must be" },
            { { tools = { { type = "function", ["function"] = { name = "bad name!" } } } }, "tools", "function.name" },
            { { tools = { { type = "function", ["function"] = { name = "f", parameters = 3 } } } }, "tools",
                "JSON Schema object" },
            { { tools = tools, tool_choice = "sometimes" }, "tool_choice", "tool_choice must be" },
            { { tools = tools, tool_choice = { type = "function", ["function"] = { name = "nope" } } }, "tool_choice",
                "not among the tools" },
            { { tool_choice = "required" }, "tool_choice", "tool_choice needs tools" },
            { { tools = tools, parallel_tool_calls = "no" }, "parallel_tool_calls",
                'parallel_tool_calls must be a boolean; got "no"' },
            { { parallel_tool_calls = 0 }, "parallel_tool_calls", "parallel_tool_calls must be a boolean; got 0" },
            { { messages = { question[1], { role = "assistant", tool_calls = { { type = "function",
                ["function"] = { name = "f", arguments = { x = 1 } } } } }, { role = "tool", content = "r" } } },
                "messages", "arguments must be a string" },
        }
        -- a number no JSON text can hold (the request's 1e999 reads as infinity)
        cases[#cases + 1] = { '{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function",'
            .. '"function":{"name":"f","parameters":{"maximum":1e999}}}]}', "tools",
            "tools[0] cannot be written into the prompt: cannot encode inf" }
        for _, c in ipairs(cases) do
            local body = c[1]
            if type(body) == "table" then
                body.messages = body.messages or question
                body.max_tokens = 4
            end
            local status, resp = serve(body, "x")
            assert.are.equal(400, status, resp)
            local e = json.decode(resp).error
            assert.are.equal(c[2], e.param, resp)
            assert.truthy(e.message:find(c[3], 1, true), resp)
        end
    end)

    -- the Responses API: tools in its flat shape, calls as function_call output items
    local flat = { { type = "function", name = "get_weather", description = "Weather of a city", strict = true,
        parameters = { type = "object", properties = { city = { type = "string" } } } } }

    it("answers Responses requests with function_call items, plain and streamed", function()
        local status, body = serve({ input = "Weather in Paris?", tools = flat, max_output_tokens = 100 },
            "Checking.\n" .. CALL, "/v1/responses")
        assert.are.equal(200, status, body)
        local r = json.decode(body)
        assert.are.equal("completed", r.status)
        assert.are.equal(2, #r.output)
        assert.are.equal("message", r.output[1].type)
        assert.are.equal("Checking.", r.output[1].content[1].text)
        local fc = r.output[2]
        assert.are.equal("function_call", fc.type)
        assert.are.equal("get_weather", fc.name)
        assert.are.equal('{"city":"Paris"}', fc.arguments)
        assert.truthy(fc.call_id:find("^call_"), fc.call_id)
        -- a reply that is calls only has no message item
        _, body = serve({ input = "Weather in Paris?", tools = flat, max_output_tokens = 100 }, CALL, "/v1/responses")
        r = json.decode(body)
        assert.are.equal(1, #r.output)
        assert.are.equal("function_call", r.output[1].type)
        -- streamed: no message item, the call's item with its arguments, then response.completed
        status, body = serve({ input = "Weather in Paris?", tools = flat, max_output_tokens = 100, stream = true }, CALL,
            "/v1/responses")
        local names, args, final = {}, nil, nil
        for name, data in body:gmatch("event: ([%w_.]+)\ndata: ([^\n]+)") do
            names[#names + 1] = name
            local e = json.decode(data)
            if name == "response.function_call_arguments.done" then args = e.arguments end
            if name == "response.completed" then final = e.response end
        end
        assert.are.same({ "response.created", "response.in_progress", "response.output_item.added",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed" }, names)
        assert.are.equal('{"city":"Paris"}', args)
        assert.are.equal("function_call", final.output[1].type)
    end)

    it("takes function_call and function_call_output items back in a Responses input", function()
        local status, body = serve({ tools = flat, max_output_tokens = 20, input = {
            { role = "user", content = "Weather in Paris?" },
            { type = "function_call", call_id = "call_1", name = "get_weather", arguments = '{"city":"Paris"}' },
            { type = "function_call_output", call_id = "call_1", output = "18 C" } } }, "It is 18 C.", "/v1/responses")
        assert.are.equal(200, status, body)
        local r = json.decode(body)
        assert.are.equal("It is 18 C.", r.output[1].content[1].text)
        -- a named tool_choice in the flat shape; a bad one is a 400
        _, body = serve({ input = "Weather?", tools = flat, max_output_tokens = 100,
            tool_choice = { type = "function", name = "get_weather" } }, '{"name": "get_weather", "arguments": {"city": '
            .. '"Oslo"}}', "/v1/responses")
        assert.are.equal('{"city":"Oslo"}', json.decode(body).output[1].arguments, body)
        status, body = serve({ input = "Weather?", tools = flat, tool_choice = { type = "function", name = "nope" } }, "x",
            "/v1/responses")
        assert.are.equal(400, status)
        assert.truthy(json.decode(body).error.message:find("not among the tools", 1, true), body)
    end)
end)
