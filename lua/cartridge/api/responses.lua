-- cartridge.api.responses: OpenAI's Responses API, POST /v1/responses.
-- instructions and input items (messages, function calls and their
-- outputs) go through the model's chat template; the reply is a response
-- object of output items, streamed as numbered response.* events. The
-- server stores no responses (previous_response_id and store are refused).
-- The interface every dialect has is described in cartridge.api.

local core = require("cartridge.core")
local json = require("cartridge.json")
local template = require("cartridge.chat")
local logprobs = require("cartridge.logprobs")
local request = require("cartridge.api.request")
local tools_mod = require("cartridge.api.tools")
local format = require("cartridge.api.format")
local C = core.C

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local integer_field, number_field, boolean_field = request.integer_field, request.number_field, request.boolean_field
local with_documents = request.with_documents

local responses = { route = "/v1/responses", kind = "responses", id_prefix = "resp_", what = "input" }

responses.known = request.fields("model input instructions max_output_tokens temperature top_p stream metadata text "
    .. "tools tool_choice parallel_tool_calls previous_response_id include top_logprobs user store")

local TEXT_PARTS = { input_text = true, output_text = true, text = true }

-- A Responses request's metadata, as OpenAI's API takes it: an object of at
-- most 16 pairs, keys of at most 64 characters, string values of at most 512
-- (json.object() when absent or null). It is only echoed back.
local function metadata_field(body)
    local md = body.metadata
    if md == nil or md == json.null then return json.object() end
    if json.kind(md) ~= "object" then
        reject(400, "metadata must be an object of string values; got " .. shown(md, body, "metadata"), "metadata")
    end
    local n = 0
    for k, v in pairs(md) do
        n = n + 1
        if type(v) ~= "string" then
            reject(400, ("metadata[%s] must be a string; got %s"):format(shown(k), shown(v, md, k)), "metadata")
        end
        local chars = C.cart_utf8_invalid_offset(k, #k) < 0 and select(2, k:gsub("[^\128-\191]", ""))
        if not chars or chars > 64 then
            reject(400, ("metadata key %s must be valid UTF-8 of at most 64 characters"):format(shown(k)), "metadata")
        end
        check_utf8(v, "metadata[" .. shown(k) .. "]")
        if select(2, v:gsub("[^\128-\191]", "")) > 512 then
            reject(400, ("metadata[%s] must be at most 512 characters; got %d bytes"):format(shown(k), #v), "metadata")
        end
    end
    if n > 16 then reject(400, ("metadata holds at most 16 pairs; got %d"):format(n), "metadata") end
    return md
end

function responses.options(srv, body)
    local o = {}
    o.max_tokens = integer_field(body, "max_output_tokens", 1, srv.max_tokens_limit, srv.default_max_tokens,
        " (this server's limit is " .. srv.max_tokens_limit .. ")")
    local d = srv.sampling
    o.temperature = number_field(body, "temperature", 0, 2, d.temperature)
    o.top_p = number_field(body, "top_p", 0, 1, d.top_p)
    if o.top_p == 0 then o.top_p = 1e-6 end
    o.top_k, o.min_p, o.seed = d.top_k, d.min_p, d.seed
    o.frequency_penalty, o.presence_penalty, o.repeat_penalty, o.repeat_last_n = 0, 0, d.repeat_penalty, 64
    o.stop = {}
    o.stream = boolean_field(body, "stream")
    o.echo_tool_choice = (type(body.tool_choice) == "string" or json.kind(body.tool_choice) == "object")
        and body.tool_choice or "auto"
    o.echo = { instructions = type(body.instructions) == "string" and body.instructions or json.null,
        max_output_tokens = body.max_output_tokens ~= nil and o.max_tokens or json.null,
        temperature = o.temperature, top_p = o.top_p, metadata = metadata_field(body) }
    return o
end

-- text.format: the reply's structured output, echoed in the response.
function responses.format(srv, body, o)
    local t, f = body.text, nil
    if t ~= nil and t ~= json.null then
        if json.kind(t) ~= "object" then
            reject(400, 'text must be an object such as {"format": {"type": "json_schema", ...}}; got ' ..
                shown(t, body, "text"), "text")
        end
        f = format.read(srv, t.format, "text.format", "text", true)
    end
    o.echo.text = { format = f and f.echo or { type = "text" } }
    return f
end

-- The prompt of a Responses request: instructions as the system message,
-- then the input (a string: one user turn; or message items).
function responses.prompt(srv, body)
    local prev = body.previous_response_id
    if prev ~= nil and prev ~= json.null then
        reject(400, "previous_response_id is not supported: this server stores no responses; send the whole "
            .. "conversation in input", "previous_response_id")
    end
    local list = {}
    if body.instructions ~= nil and body.instructions ~= json.null then
        if type(body.instructions) ~= "string" then
            reject(400, "instructions must be a string; got " .. shown(body.instructions, body, "instructions"),
                "instructions")
        end
        check_utf8(body.instructions, "instructions")
        list[1] = { role = "system", content = body.instructions }
    end
    local input = body.input
    if type(input) == "string" then
        check_utf8(input, "input")
        list[#list + 1] = { role = "user", content = input }
    elseif json.kind(input) == "array" and #input > 0 then
        if #input > srv.max_messages then
            reject(400, ("%d input items is above this server's limit of %d"):format(#input, srv.max_messages), "input")
        end
        for i, item in ipairs(input) do
            local where = ("input[%d]"):format(i - 1)
            if json.kind(item) ~= "object" then reject(400, where .. " must be an object; got " .. shown(item, input, i), "input") end
            if item.type == "function_call" then
                if type(item.name) ~= "string" or not item.name:find(tools_mod.NAME) or type(item.arguments) ~= "string" then
                    reject(400, where .. ' must be {"type": "function_call", "call_id", "name", "arguments": a string of '
                        .. "JSON}", "input")
                end
                check_utf8(item.arguments, where .. ".arguments")
                local last = list[#list]
                if not (last and last.role == "assistant" and last.tool_calls) then
                    last = { role = "assistant", content = "", tool_calls = {} }
                    list[#list + 1] = last
                end
                last.tool_calls[#last.tool_calls + 1] = { name = item.name, arguments = item.arguments }
                goto next_item
            elseif item.type == "function_call_output" then
                if type(item.output) ~= "string" then
                    reject(400, where .. ".output must be a string; got " .. shown(item.output, item, "output"), "input")
                end
                check_utf8(item.output, where .. ".output")
                list[#list + 1] = { role = "tool", content = item.output }
                goto next_item
            elseif item.type ~= nil and item.type ~= "message" then
                reject(400, ("%s: items of type %s are not supported by this server (messages, function_call and "
                    .. "function_call_output only)"):format(where, shown(item.type, item, "type")), "input")
            end
            local role = item.role
            if role ~= "user" and role ~= "assistant" and role ~= "system" and role ~= "developer" then
                reject(400, ("%s.role must be user, assistant, system or developer; got %s")
                    :format(where, shown(role, item, "role")), "input")
            end
            local text = request.content_parts(item.content, where .. ".content", "input", TEXT_PARTS, "input_text parts")
            check_utf8(text, where .. ".content")
            list[#list + 1] = { role = role == "developer" and "system" or role, content = text }
            ::next_item::
        end
        if list[#list].role == "assistant" then reject(400, "the last input item must not be the assistant's", "input") end
    else
        reject(400, "input must be a string or a non-empty array of message items; got " .. shown(input, body, "input"),
            "input")
    end
    local tools = tools_mod.read(srv, body, true)
    local ok, text, spans = pcall(template.render, srv.template, list, { tools = tools and tools.list, plain = true })
    if not ok then reject(400, (tostring(text):gsub("^chat%.render: ", "")), "input") end
    return { text = text .. (tools and tools.prefill or ""), tools = tools, list = list, plain = spans }
end

-- A Responses API response object in its current state.
local function response_object(srv, job, status)
    local item = { type = "message", id = "msg_" .. job.completion_id:sub(6), status = status == "in_progress"
        and "in_progress" or "completed", role = "assistant", content = json.array() }
    local output = json.array()
    local calls = nil
    if status ~= "in_progress" then
        local content
        calls, content = tools_mod.calls(srv, job)
        local text = calls and (content or "") or job.text
        item.content = json.array({ { type = "output_text", text = text, annotations = json.array(),
            logprobs = job.opts.lp.on and logprobs.chat(srv.tok, job.lps, 1, #job.lps) or json.array() } })
        if not calls or content then output[1] = item end
        for _, c in ipairs(calls or {}) do
            output[#output + 1] = { type = "function_call", id = "fc_" .. c.id:sub(6), call_id = c.id, name = c["function"].name,
                arguments = c["function"].arguments, status = "completed" }
        end
    end
    local obj = { id = job.completion_id, object = "response", created_at = job.created, status = status,
        model = job.name, output = output, parallel_tool_calls = false, tool_choice = "none", tools = json.array(),
        error = json.null, incomplete_details = status == "incomplete" and { reason = "max_output_tokens" } or json.null,
        usage = status == "in_progress" and json.null or { input_tokens = #job.prompt,
            input_tokens_details = { cached_tokens = job.cached }, output_tokens = #job.out_ids,
            output_tokens_details = { reasoning_tokens = 0 }, total_tokens = #job.prompt + #job.out_ids } }
    for k, v in pairs(job.opts.echo) do obj[k] = v end
    if job.tools then obj.tool_choice, obj.parallel_tool_calls = job.opts.echo_tool_choice, job.tools.parallel end
    return with_documents(job, obj), item, calls and output or nil
end

-- One Responses stream event, numbered.
local function response_event(srv, job, name, obj)
    obj.type = name
    obj.sequence_number = job.sequence or 0
    job.sequence = obj.sequence_number + 1
    request.event(srv, job, name, obj)
end

-- Opens a streamed response's message item (once), before its first text.
local function open_item(srv, job)
    if job.item_open then return end
    job.item_open = true
    local _, item = response_object(srv, job, "in_progress")
    response_event(srv, job, "response.output_item.added", { output_index = 0, item = item })
    response_event(srv, job, "response.content_part.added", { item_id = item.id, output_index = 0,
        content_index = 0, part = { type = "output_text", text = "", annotations = json.array() } })
end

function responses.delta(srv, job, delta)
    if not (delta.content and delta.content ~= "") then return end -- calls are sent by finish
    local i, j = request.new_logprobs(job)
    open_item(srv, job)
    response_event(srv, job, "response.output_text.delta", { item_id = "msg_" .. job.completion_id:sub(6),
        output_index = 0, content_index = 0, delta = delta.content,
        logprobs = i and logprobs.chat(srv.tok, job.lps, i, j) or json.array() })
end

function responses.start(srv, job)
    local obj = response_object(srv, job, "in_progress")
    response_event(srv, job, "response.created", { response = obj })
    response_event(srv, job, "response.in_progress", { response = obj })
    -- with tools, the message item opens at its first text (a reply may be calls only)
    if not job.tools then open_item(srv, job) end
end

-- A streamed reply's function calls, each an output item of its own.
local function call_events(srv, job, with_calls)
    for index, out in ipairs(with_calls) do
        if out.type == "function_call" then
            local added = { type = "function_call", id = out.id, call_id = out.call_id, name = out.name,
                arguments = "", status = "in_progress" }
            response_event(srv, job, "response.output_item.added", { output_index = index - 1, item = added })
            response_event(srv, job, "response.function_call_arguments.delta", { item_id = out.id,
                output_index = index - 1, delta = out.arguments })
            response_event(srv, job, "response.function_call_arguments.done", { item_id = out.id,
                output_index = index - 1, arguments = out.arguments })
            response_event(srv, job, "response.output_item.done", { output_index = index - 1, item = out })
        end
    end
end

function responses.finish(srv, job)
    local status = job.finish == "length" and "incomplete" or "completed"
    local obj, item, with_calls = response_object(srv, job, status)
    if with_calls then status = "completed"; obj.status, obj.incomplete_details = status, json.null end
    if not job.opts.stream then
        obj.output_text = job.text
        return srv.http:respond(job.id, 200, "application/json", json.encode(obj))
    end
    local part = item.content[1]
    if not with_calls and not job.item_open then open_item(srv, job) end
    if job.item_open then
        response_event(srv, job, "response.output_text.done", { item_id = item.id, output_index = 0,
            content_index = 0, text = part.text, logprobs = part.logprobs })
        response_event(srv, job, "response.content_part.done", { item_id = item.id, output_index = 0,
            content_index = 0, part = part })
        response_event(srv, job, "response.output_item.done", { output_index = 0, item = item })
    end
    call_events(srv, job, with_calls or {})
    response_event(srv, job, status == "completed" and "response.completed" or "response.incomplete",
        { response = obj })
    srv.http:stream_end(job.id)
end

responses.error_body = request.openai_error

-- An internal error after the stream began: Responses' error event.
function responses.stream_error(srv, job, message)
    response_event(srv, job, "error", { code = "server_error", message = message, param = json.null })
end

return responses
