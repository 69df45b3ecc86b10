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
    -- The third result is the prompt's token ids (what the sampler's
    -- penalties were given).
    local function serve(body, script, path)
        local h = fake_http()
        local srv = server_mod.new({ model = m, model_name = "m", http = h, parallel = 1, ctx = 1024 })
        local ids = tok:encode(script, { special = true, add_special = false })
        ids[#ids + 1] = tok:encode("<|im_end|>", { special = true, add_special = false })[1]
        local real_new = sampler_mod.new
        local prompt
        sampler_mod.new = function()
            local k = 0
            return { sample = function() k = k + 1; return ids[math.min(k, #ids)] end, accept = function() end,
                accept_prompt = function(_, p) prompt = p end, free = function() end }
        end
        -- ordered: decoded tool definitions reach the server with their keys in the order they were written
        h:add(1, path or "/v1/chat/completions", type(body) == "string" and body or json.encode(body, { ordered = true }))
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
        return h.answers[1].status, h.answers[1].body, prompt
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
        -- a forced call cut by max_tokens or a stop sequence: its finish reason, no broken call as content
        for _, cut in ipairs({ { max_tokens = 4 }, { max_tokens = 100, stop = "Li" } }) do
            local req = { messages = question, tools = tools, max_tokens = cut.max_tokens, stop = cut.stop,
                tool_choice = "required" }
            _, body = serve(req, '{"name": "get_weather", "arguments": {"city": "Lima"}}')
            choice = json.decode(body).choices[1]
            assert.are.equal(cut.stop and "stop" or "length", choice.finish_reason, body)
            assert.are.equal("", choice.message.content, body)
            assert.is_nil(choice.message.tool_calls, body)
        end
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
            { { tools = json.array({}), tool_choice = "required" }, "tool_choice", "tool_choice needs tools; tools is empty" },
            { { tools = { tools[1], tools[1] } }, "tools", "tools[1].function.name \"get_weather\" repeats tools[0]'s" },
            { { tools = { { type = "function", ["function"] = { name = "f", strict = true, parameters = { type = "object",
                properties = { x = { type = "string", format = "email" } } } } } }, tool_choice = "auto" }, "tools",
                "tools[0]: strict: true, and tools[0].function.parameters cannot be enforced" },
            { { stop = "" }, "stop", "stop must be a non-empty string" },
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

    -- Anthropic's Messages API: tools as {"name", "description", "input_schema"}, calls as tool_use blocks
    local anthropic = json.decode('[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":'
        .. '"object","properties":{"city":{"type":"string"}},"required":["city"]}}]')

    -- The events of an Anthropic stream, in order: { name, data }.
    local function events(body)
        local out = {}
        for name, data in body:gmatch("event: ([%w_]+)\ndata: ([^\n]+)") do
            local e = json.decode(data)
            assert.are.equal(name, e.type)
            out[#out + 1] = { name = name, e = e }
        end
        return out
    end

    it("answers Messages requests with tool_use blocks and stop_reason tool_use, plain and streamed", function()
        local q = { messages = question, tools = anthropic, max_tokens = 200 }
        local status, body = serve(q, "Checking.\n" .. CALL, "/v1/messages")
        assert.are.equal(200, status, body)
        local r = json.decode(body)
        assert.are.equal("tool_use", r.stop_reason)
        assert.are.equal(2, #r.content)
        assert.are.same({ type = "text", text = "Checking." }, r.content[1])
        local use = r.content[2]
        assert.are.equal("tool_use", use.type)
        assert.truthy(use.id:find("^toolu_"), use.id)
        assert.are.equal("get_weather", use.name)
        assert.are.same({ city = "Paris" }, use.input)
        -- calls only: tool_use blocks alone; two calls, or one with disable_parallel_tool_use
        local two = CALL .. "\n" .. CALL:gsub("Paris", "Rome")
        r = json.decode(select(2, serve(q, two, "/v1/messages")))
        assert.are.equal(2, #r.content)
        assert.are.same({ "tool_use", "tool_use" }, { r.content[1].type, r.content[2].type })
        assert.are.same({ city = "Rome" }, r.content[2].input)
        assert.are_not.equal(r.content[1].id, r.content[2].id)
        r = json.decode(select(2, serve({ messages = question, tools = anthropic, max_tokens = 200,
            tool_choice = { type = "auto", disable_parallel_tool_use = true } }, two, "/v1/messages")))
        assert.are.equal(1, #r.content)
        -- no well-formed call: a text reply, end_turn
        r = json.decode(select(2, serve(q, "It is sunny.", "/v1/messages")))
        assert.are.same({ { type = "text", text = "It is sunny." } }, r.content)
        assert.are.equal("end_turn", r.stop_reason)
        -- streamed: the text block, closed before the tool_use block, whose input comes as input_json_delta
        q.stream = true
        status, body = serve(q, "Checking.\n" .. CALL, "/v1/messages")
        assert.are.equal(200, status)
        local names, text, json_text, stop = {}, "", "", nil
        for _, ev in ipairs(events(body)) do
            local e = ev.e
            if names[#names] ~= ev.name then names[#names + 1] = ev.name end
            if ev.name == "content_block_start" then
                assert.are.equal(e.index == 0 and "text" or "tool_use", e.content_block.type)
                if e.index == 1 then
                    assert.are.equal("get_weather", e.content_block.name)
                    assert.truthy(e.content_block.id:find("^toolu_"))
                    assert.are.same(json.object(), e.content_block.input)
                end
            elseif ev.name == "content_block_delta" then
                if e.index == 0 then text = text .. e.delta.text
                else
                    assert.are.equal("input_json_delta", e.delta.type)
                    json_text = json_text .. e.delta.partial_json
                end
            elseif ev.name == "message_delta" then
                stop = e.delta.stop_reason
            end
        end
        assert.are.same({ "message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop" }, names)
        assert.are.equal("Checking.", (text:gsub("%s+$", "")))
        assert.are.same({ city = "Paris" }, json.decode(json_text))
        assert.are.equal("tool_use", stop)
        -- streamed, calls only: the tool_use block is block 0
        status, body = serve(q, CALL, "/v1/messages")
        local evs = events(body)
        assert.are.equal("content_block_start", evs[3].name)
        assert.are.equal(0, evs[3].e.index)
        assert.are.equal("tool_use", evs[3].e.content_block.type)
    end)

    it("renders Anthropic tools, tool_use and tool_result blocks through chat's template path", function()
        local chat_tools = { json.decode(WEATHER) }
        local chat_history = { question[1], { role = "assistant", content = "Let me look.", tool_calls = { { id = "c1",
            type = "function", ["function"] = { name = "get_weather", arguments = '{"city":"Paris"}' } } } },
            { role = "tool", tool_call_id = "c1", content = "18 C" } }
        local history = { question[1], { role = "assistant", content = { { type = "text", text = "Let me look." },
            { type = "tool_use", id = "toolu_1", name = "get_weather", input = { city = "Paris" } } } },
            { role = "user", content = { { type = "tool_result", tool_use_id = "toolu_1", content = "18 C" } } } }
        local _, _, want = serve({ messages = chat_history, tools = chat_tools, max_tokens = 20 }, "x")
        local status, body, got = serve({ messages = history, tools = anthropic, max_tokens = 20 }, "It is 18 C.",
            "/v1/messages")
        assert.are.equal(200, status, body)
        assert.are.same(want, got)
        print(("  a Messages tool conversation renders to the same %d prompt tokens as chat's"):format(#got))
        -- a result given as text blocks, and an error result, shown with "Error: "
        history[3].content[1].content = { { type = "text", text = "18 " }, { type = "text", text = "C" } }
        assert.are.same(want, select(3, serve({ messages = history, tools = anthropic, max_tokens = 20 }, "x",
            "/v1/messages")))
        history[3].content[1].is_error = true
        chat_history[3].content = "Error: 18 C"
        _, _, want = serve({ messages = chat_history, tools = chat_tools, max_tokens = 20 }, "x")
        assert.are.same(want, select(3, serve({ messages = history, tools = anthropic, max_tokens = 20 }, "x",
            "/v1/messages")))
        -- text after the results: a user turn after them
        history[3].content[2] = { type = "text", text = "Thanks." }
        chat_history[4] = { role = "user", content = "Thanks." }
        _, _, want = serve({ messages = chat_history, tools = chat_tools, max_tokens = 20 }, "x")
        assert.are.same(want, select(3, serve({ messages = history, tools = anthropic, max_tokens = 20 }, "x",
            "/v1/messages")))
        -- tool_choice tool and any: the reply starts with the call, as chat's named and required choices
        for _, pair in ipairs({ { { type = "tool", name = "get_weather" }, { type = "function",
            ["function"] = { name = "get_weather" } } }, { { type = "any" }, "required" } }) do
            _, _, want = serve({ messages = question, tools = chat_tools, max_tokens = 100, tool_choice = pair[2] },
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}')
            local st, b, p = serve({ messages = question, tools = anthropic, max_tokens = 100, tool_choice = pair[1] },
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "/v1/messages")
            assert.are.equal(200, st, b)
            assert.are.same(want, p)
            local r = json.decode(b)
            assert.are.equal("tool_use", r.stop_reason)
            assert.are.same({ city = "Oslo" }, r.content[1].input)
        end
        -- tool_choice none: the tools are not shown, as on chat
        _, _, want = serve({ messages = question, max_tokens = 20 }, "x")
        assert.are.same(want, select(3, serve({ messages = question, tools = anthropic, max_tokens = 20,
            tool_choice = { type = "none" } }, "x", "/v1/messages")))
    end)

    it("refuses malformed Messages tools and tool blocks with a 400 in Anthropic's shape", function()
        local use = { role = "assistant", content = { { type = "tool_use", id = "t1", name = "get_weather",
            input = { city = "X" } } } }
        local cases = {
            { { tools = 5 }, "tools must be an array; got 5" },
            { { tools = { { name = "get_weather" } } }, "tools[0].input_schema must be a JSON Schema object" },
            { { tools = { { type = "web_search_20250305", name = "web_search" } } },
                'tools[0]: tools of type "web_search_20250305" are not supported' },
            { { tools = { { name = "bad name", input_schema = {} } } }, "tools[0].name must be 1 to 64" },
            { { tools = { { name = "f", input_schema = {}, description = 3 } } }, "tools[0].description must be a string" },
            { { tools = anthropic, tool_choice = "any" }, "tool_choice must be {\"type\": \"auto\"}" },
            { { tools = anthropic, tool_choice = { type = "tool" } }, 'tool_choice {"type": "tool"} needs the name' },
            { { tools = anthropic, tool_choice = { type = "tool", name = "nope" } }, "not among the tools" },
            { { tool_choice = { type = "any" } }, "tool_choice needs tools" },
            { { tools = anthropic, tool_choice = { type = "auto", disable_parallel_tool_use = "yes" } },
                "tool_choice.disable_parallel_tool_use must be a boolean" },
            { { messages = { question[1], use, { role = "user", content = { { type = "tool_result",
                tool_use_id = "t9", content = "r" } } } } }, "tool_use_id must name a tool_use block" },
            { { messages = { { role = "user", content = { { type = "tool_use", id = "t1", name = "f", input = {} } } } } },
                'parts of type "tool_use" are not supported by this server in user turns' },
            { { messages = { question[1], use } }, "it can hold text only, not tool_use blocks" },
            { { messages = { question[1], { role = "assistant", content = "Sure" } }, tools = anthropic,
                tool_choice = { type = "any" } }, "cannot go with tool_choice" },
            { { messages = { question[1], { role = "assistant", content = { { type = "tool_use", id = "t1",
                name = "f", input = "x" } } }, question[1] } }, "content[0].input must be an object" },
        }
        for _, c in ipairs(cases) do
            local body = c[1]
            body.messages = body.messages or question
            body.max_tokens = 4
            local status, resp = serve(body, "x", "/v1/messages")
            assert.are.equal(400, status, resp)
            local e = json.decode(resp)
            assert.are.equal("error", e.type, resp)
            assert.are.equal("invalid_request_error", e.error.type, resp)
            assert.truthy(e.error.message:find(c[2], 1, true), resp)
        end
    end)
end)
