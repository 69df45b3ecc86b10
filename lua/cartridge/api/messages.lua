-- cartridge.api.messages: Anthropic's Messages API, POST /v1/messages (and
-- its errors in Anthropic's shape, on /v1/messages/count_tokens too).
-- system, tools and content blocks (text, tool_use, tool_result) are turned
-- into the chat template's turns; a final assistant turn is a prefill the
-- reply continues. The reply is a message of content blocks, streamed as
-- message_* and content_block_* events. The interface every dialect has is
-- described in cartridge.api.

local json = require("cartridge.json")
local template = require("cartridge.chat")
local request = require("cartridge.api.request")
local tools_mod = require("cartridge.api.tools")

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local integer_field, number_field, boolean_field = request.integer_field, request.number_field, request.boolean_field
local with_documents, event = request.with_documents, request.event
local TOOL_NAME = tools_mod.NAME

-- object_arguments: a call's arguments are an object in the reply (a call
-- whose arguments no JSON text re-encodes stays text: cartridge.api.tools).
local messages = { route = "/v1/messages", kind = "messages", id_prefix = "msg_", what = "messages",
    object_arguments = true, error_routes = { "/v1/messages/count_tokens" } }

messages.known = request.fields("model messages system max_tokens temperature top_p top_k stop_sequences stream tools "
    .. "tool_choice metadata thinking")
messages.unhonoured = {
    { "thinking", function(v) return type(v) == "table" and v.type ~= nil and v.type ~= "disabled" end },
}

-- Anthropic's error types by HTTP status.
local ERROR_TYPE = { [400] = "invalid_request_error", [401] = "authentication_error", [403] = "permission_error",
    [404] = "not_found_error", [405] = "invalid_request_error", [413] = "request_too_large",
    [429] = "rate_limit_error", [500] = "api_error", [503] = "overloaded_error", [529] = "overloaded_error" }

-- {"type": "error", "error": {"type", "message"}}.
function messages.error_body(status, message)
    return json.encode({ type = "error", error = { type = ERROR_TYPE[status] or "api_error", message = message } })
end

local ANTHROPIC_TEXT = { text = true }

local function blocks_text(content, where)
    return request.content_parts(content, where, where:match("^[%a_]+"), ANTHROPIC_TEXT, "text blocks")
end

local ANTHROPIC_CHOICE = '{"type": "auto"}, {"type": "any"}, {"type": "tool", "name"} or {"type": "none"}'

-- A Messages request's tools, in Anthropic's shapes: tools as {"name",
-- "description", "input_schema"} (type "custom" or none; server tools are
-- refused), tool_choice {"type": "auto" | "any" | "tool" (with "name") |
-- "none", "disable_parallel_tool_use"}. They are turned into chat's shapes,
-- as llama-server converts them ({"type": "function", "function": {"name",
-- "description", "parameters"}}, any = required), and read by cartridge.api.tools:
-- the same template path, forced-call grammar and parsing as chat's.
local function anthropic_tools(srv, body)
    local tools, choice = body.tools, body.tool_choice
    local chat_body = {}
    if choice ~= nil and choice ~= json.null then
        local t = json.kind(choice) == "object" and choice.type
        if t ~= "auto" and t ~= "any" and t ~= "tool" and t ~= "none" then
            reject(400, ("tool_choice must be %s; got %s"):format(ANTHROPIC_CHOICE, shown(choice, body, "tool_choice")),
                "tool_choice")
        end
        if t == "tool" and type(choice.name) ~= "string" then
            reject(400, 'tool_choice {"type": "tool"} needs the name of one of the tools; got ' ..
                shown(choice.name, choice, "name"), "tool_choice")
        end
        local disable = boolean_field(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use")
        chat_body.parallel_tool_calls = not disable
        chat_body.tool_choice = t == "any" and "required" or t == "tool" and { type = "function",
            ["function"] = { name = choice.name } } or t
    end
    if tools ~= nil and tools ~= json.null then
        if json.kind(tools) ~= "array" then
            reject(400, "tools must be an array; got " .. shown(tools, body, "tools"), "tools")
        end
        local converted, extra = json.array(), {}
        for k, tool in ipairs(tools) do
            local where = ("tools[%d]"):format(k - 1)
            if json.kind(tool) ~= "object" then
                reject(400, ('%s must be {"name", "description", "input_schema"}; got %s'):format(where,
                    shown(tool, tools, k)), "tools")
            end
            if tool.type ~= nil and tool.type ~= json.null and tool.type ~= "custom" then
                reject(400, ('%s: tools of type %s are not supported by this server (custom tools only: {"name", '
                    .. '"description", "input_schema"})'):format(where, shown(tool.type, tool, "type")), "tools")
            end
            if type(tool.name) ~= "string" or #tool.name > 64 or not tool.name:find("^[%w_%-]+$") then
                reject(400, ("%s.name must be 1 to 64 letters, digits, _ or -; got %s"):format(where,
                    shown(tool.name, tool, "name")), "tools")
            end
            local d = tool.description
            if d ~= nil and d ~= json.null and type(d) ~= "string" then
                reject(400, ("%s.description must be a string; got %s"):format(where, shown(d, tool, "description")),
                    "tools")
            end
            if json.kind(tool.input_schema) ~= "object" then
                reject(400, ("%s.input_schema must be a JSON Schema object; got %s"):format(where,
                    shown(tool.input_schema, tool, "input_schema")), "tools")
            end
            local strict = boolean_field(tool, "strict", where .. ".strict")
            local ok, schema = pcall(json.encode, tool.input_schema, { ordered = true })
            if not ok then
                reject(400, ("%s.input_schema cannot be written into the prompt: %s"):format(where,
                    (tostring(schema):gsub("^json%.encode: ", ""))), "tools")
            end
            -- decoded from text, so that the template sees the keys in this order
            converted[k] = json.decode('{"type":"function","function":{"name":' .. json.encode(tool.name) ..
                (type(d) == "string" and ',"description":' .. json.encode(d) or "") .. ',"parameters":' .. schema .. "}}")
            extra[k] = { where = where .. ".input_schema", strict = strict }
        end
        chat_body.tools = converted
        return tools_mod.read(srv, chat_body, false, extra)
    end
    return tools_mod.read(srv, chat_body)
end

-- One Messages turn's content blocks: its text, its tool_use blocks as
-- calls (assistant turns) and its tool_result blocks as tool messages (user
-- turns; a result with is_error true is shown to the model prefixed with
-- "Error: "). Appends the turn's messages to list; `uses` holds the ids of
-- the tool_use blocks so far, which results must name.
local function message_blocks(msg, where, list, uses)
    local content = msg.content
    if type(content) == "string" then
        check_utf8(content, where .. ".content")
        list[#list + 1] = { role = msg.role, content = content }
        return
    end
    if json.kind(content) ~= "array" then
        reject(400, ("%s.content must be a string or an array of content blocks; got %s"):format(where,
            shown(content, msg, "content")), "messages")
    end
    local assistant = msg.role == "assistant"
    local wanted = assistant and "text and tool_use blocks" or "text and tool_result blocks"
    local text, calls, results = {}, nil, 0
    for j, block in ipairs(content) do
        local at = ("%s.content[%d]"):format(where, j - 1)
        local t = json.kind(block) == "object" and block.type
        if t == "text" then
            if type(block.text) ~= "string" then
                reject(400, ("%s.text must be a string; got %s"):format(at, shown(block.text, block, "text")), "messages")
            end
            text[#text + 1] = block.text
        elseif t == "tool_use" and assistant then
            if type(block.id) ~= "string" or block.id == "" then
                reject(400, ("%s.id must be a non-empty string; got %s"):format(at, shown(block.id, block, "id")),
                    "messages")
            end
            if type(block.name) ~= "string" or not block.name:find(TOOL_NAME) then
                reject(400, ("%s.name must be a tool's name; got %s"):format(at, shown(block.name, block, "name")),
                    "messages")
            end
            if json.kind(block.input) ~= "object" then
                reject(400, ("%s.input must be an object; got %s"):format(at, shown(block.input, block, "input")),
                    "messages")
            end
            local ok, args = pcall(json.encode, block.input, { ordered = true })
            if not ok then reject(400, ("%s.input cannot be written: %s"):format(at, args), "messages") end
            check_utf8(args, at .. ".input")
            calls = calls or {}
            calls[#calls + 1] = { name = block.name, arguments = args }
            uses[block.id] = true
        elseif t == "tool_result" and not assistant then
            if type(block.tool_use_id) ~= "string" or not uses[block.tool_use_id] then
                reject(400, ("%s.tool_use_id must name a tool_use block of an earlier assistant turn; got %s")
                    :format(at, shown(block.tool_use_id, block, "tool_use_id")), "messages")
            end
            local result = ""
            if block.content ~= nil and block.content ~= json.null then
                result = request.content_parts(block.content, at .. ".content", "messages", ANTHROPIC_TEXT, "text blocks")
            end
            check_utf8(result, at .. ".content")
            if boolean_field(block, "is_error", at .. ".is_error") then result = "Error: " .. result end
            if #text > 0 then -- text before a result stays before it
                list[#list + 1] = { role = "user", content = table.concat(text) }
                text = {}
            end
            list[#list + 1] = { role = "tool", content = result }
            results = results + 1
        else
            local what = type(t) == "string" and ("parts of type " .. shown(t)) or ("parts like " .. shown(block, content, j))
            reject(400, ("%s: %s are not supported by this server in %s turns (%s only)"):format(at, what, msg.role,
                wanted), "messages")
        end
    end
    local joined = table.concat(text)
    check_utf8(joined, where .. ".content")
    if assistant then
        list[#list + 1] = { role = "assistant", content = joined, tool_calls = calls }
    elseif joined ~= "" or results == 0 then
        list[#list + 1] = { role = "user", content = joined }
    end
end

-- The prompt text of a Messages request: system, the tools, then the turns
-- in the model's template. A last assistant turn is a prefill: the reply
-- continues it (and holds only what follows it), as Anthropic's API does.
-- Returns the text, the tools (cartridge.api.tools' table, or nil), the
-- messages and the spans of client text (cartridge.chat.render's).
function messages.render(srv, body)
    local msgs = request.message_list(srv, body)
    local tools = anthropic_tools(srv, body)
    local list = {}
    if body.system ~= nil and body.system ~= json.null then
        local text = blocks_text(body.system, "system")
        check_utf8(text, "system")
        if text ~= "" then list[1] = { role = "system", content = text } end
    end
    local uses = {}
    for i, msg in ipairs(msgs) do
        local where = ("messages[%d]"):format(i - 1)
        if json.kind(msg) ~= "object" then reject(400, where .. " must be an object; got " .. shown(msg, msgs, i), "messages") end
        if msg.role ~= "user" and msg.role ~= "assistant" then
            reject(400, ("%s.role must be user or assistant (the system prompt goes in the top-level system field); "
                .. "got %s"):format(where, shown(msg.role, msg, "role")), "messages")
        end
        message_blocks(msg, where, list, uses)
    end
    local prefill = nil
    if list[#list].role == "assistant" then
        local last = table.remove(list)
        if last.tool_calls then
            reject(400, "messages: the final assistant turn is a prefill the reply continues; it can hold text only, "
                .. "not tool_use blocks (send the tool's result in a user turn)", "messages")
        end
        if tools and tools.prefill then
            reject(400, 'messages: a final assistant turn (a prefill) cannot go with tool_choice "any" or "tool", '
                .. "which make the reply start with the call", "messages")
        end
        prefill = last.content
        if prefill:find("%s$") then
            reject(400, "messages: the final assistant content cannot end with trailing whitespace", "messages")
        end
    end
    local ok, text, spans = pcall(template.render, srv.template, list, { tools = tools and tools.list, plain = true })
    if not ok then reject(400, (tostring(text):gsub("^chat%.render: ", "")), "messages") end
    if prefill and prefill ~= "" then
        spans[#spans + 1], spans[#spans + 2] = #text, #text + #prefill
    end
    return text .. (prefill or "") .. (tools and tools.prefill or ""), tools, list, spans
end

function messages.options(srv, body)
    local o = {}
    if body.max_tokens == nil or body.max_tokens == json.null then
        reject(400, "max_tokens: the field is required", "max_tokens")
    end
    o.max_tokens = integer_field(body, "max_tokens", 1, srv.max_tokens_limit, nil,
        " (this server's limit is " .. srv.max_tokens_limit .. ")")
    local d = srv.sampling
    o.temperature = number_field(body, "temperature", 0, 1, math.min(d.temperature, 1))
    o.top_p = number_field(body, "top_p", 0, 1, d.top_p)
    if o.top_p == 0 then o.top_p = 1e-6 end
    o.top_k = integer_field(body, "top_k", 0, request.INT32_MAX, d.top_k)
    o.min_p, o.seed = d.min_p, d.seed
    o.frequency_penalty, o.presence_penalty, o.repeat_penalty, o.repeat_last_n = 0, 0, d.repeat_penalty, 64
    o.stop = {}
    local stop = body.stop_sequences
    if json.kind(stop) == "array" then
        if #stop > 16 then reject(400, ("stop_sequences: at most 16; got %d"):format(#stop), "stop_sequences") end
        for i, v in ipairs(stop) do
            if type(v) ~= "string" or v == "" then
                reject(400, ("stop_sequences[%d] must be a non-empty string; got %s"):format(i - 1, shown(v, stop, i)),
                    "stop_sequences")
            end
            check_utf8(v, "stop_sequences")
            o.stop[#o.stop + 1] = v
        end
    elseif stop ~= nil and stop ~= json.null then
        reject(400, "stop_sequences must be an array of strings; got " .. shown(stop, body, "stop_sequences"),
            "stop_sequences")
    end
    o.stream = boolean_field(body, "stream")
    return o
end

local STOP_REASON = { stop = "end_turn", length = "max_tokens", stop_sequence = "stop_sequence", tool_use = "tool_use" }

-- A Messages reply's tool_use blocks, one per call: {"type": "tool_use",
-- "id", "name", "input": the arguments object}.
local function tool_use_blocks(calls)
    local out = {}
    for k, c in ipairs(calls) do
        out[k] = { type = "tool_use", id = "toolu_" .. c.id:sub(6), name = c["function"].name,
            input = json.decode(c["function"].arguments) }
    end
    return out
end

-- A finished Messages job's content blocks: its text, or with tool calls
-- the text before them (when there is some) and a tool_use block per call.
local function message_content(srv, job)
    local calls, content = tools_mod.calls(srv, job)
    if not calls then return json.array({ { type = "text", text = job.text } }) end
    local blocks = json.array()
    if content then blocks[1] = { type = "text", text = content } end
    for _, b in ipairs(tool_use_blocks(calls)) do blocks[#blocks + 1] = b end
    return blocks
end

-- Opens a streamed Messages reply's text block (index 0), once.
local function open_block(srv, job)
    if job.block_open then return end
    job.block_open = true
    event(srv, job, "content_block_start", { type = "content_block_start", index = 0,
        content_block = { type = "text", text = "" } })
end

-- Streams a Messages reply's calls: the text block (when open) closes, then
-- each call is a tool_use block whose input comes as one input_json_delta.
local function tool_use_events(srv, job, calls)
    local first = 0
    if job.block_open then
        event(srv, job, "content_block_stop", { type = "content_block_stop", index = 0 })
        first = 1
    end
    for k, b in ipairs(tool_use_blocks(calls)) do
        local index = first + k - 1
        local arguments = calls[k]["function"].arguments
        b.input = json.object()
        event(srv, job, "content_block_start", { type = "content_block_start", index = index, content_block = b })
        event(srv, job, "content_block_delta", { type = "content_block_delta", index = index,
            delta = { type = "input_json_delta", partial_json = arguments } })
        event(srv, job, "content_block_stop", { type = "content_block_stop", index = index })
    end
    job.calls_sent = true
end

local function usage(job)
    return { input_tokens = #job.prompt - job.cached, output_tokens = #job.out_ids,
        cache_read_input_tokens = job.cached, cache_creation_input_tokens = 0 }
end

function messages.prompt(srv, body)
    local text, tools, list, plain = messages.render(srv, body)
    return { text = text, tools = tools, list = list, plain = plain }
end

function messages.start(srv, job)
    event(srv, job, "message_start", { type = "message_start", message = with_documents(job, {
        id = job.completion_id, type = "message", role = "assistant", model = job.name, content = json.array(),
        stop_reason = json.null, stop_sequence = json.null, usage = usage(job) }) })
    -- with tools, the text block opens at its first text (a reply may be tool_use blocks only)
    if not job.tools then open_block(srv, job) end
    event(srv, job, "ping", { type = "ping" })
end

function messages.delta(srv, job, delta)
    if delta.content and delta.content ~= "" then
        open_block(srv, job)
        event(srv, job, "content_block_delta", { type = "content_block_delta", index = 0,
            delta = { type = "text_delta", text = delta.content } })
    end
    if delta.tool_calls then tool_use_events(srv, job, delta.tool_calls) end
end

function messages.finish(srv, job)
    local reason = job.finish == "stop" and job.stop_hit and "stop_sequence" or job.finish
    if tools_mod.calls(srv, job) then reason = "tool_use" end
    if not job.opts.stream then
        -- ordered: each tool_use input keeps the keys in the order the model wrote them
        return srv.http:respond(job.id, 200, "application/json", json.encode(with_documents(job, {
            id = job.completion_id, type = "message", role = "assistant", model = job.name,
            content = message_content(srv, job), stop_reason = STOP_REASON[reason],
            stop_sequence = job.stop_hit or json.null, usage = usage(job) }), { ordered = true }))
    end
    if not job.calls_sent then
        open_block(srv, job) -- a reply with no text still has its (empty) text block
        event(srv, job, "content_block_stop", { type = "content_block_stop", index = 0 })
    end
    event(srv, job, "message_delta", { type = "message_delta",
        delta = { stop_reason = STOP_REASON[reason], stop_sequence = job.stop_hit or json.null },
        usage = { output_tokens = #job.out_ids } })
    event(srv, job, "message_stop", { type = "message_stop" })
    srv.http:stream_end(job.id)
end

-- An internal error after the stream began: Anthropic's error event.
function messages.stream_error(srv, job, message)
    srv.http:stream_write(job.id, "event: error\ndata: " .. messages.error_body(500, message) .. "\n\n")
end

return messages
