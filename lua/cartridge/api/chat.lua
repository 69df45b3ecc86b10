-- cartridge.api.chat: OpenAI's chat completions, POST /v1/chat/completions.
-- The messages go through the model's chat template (cartridge.chat), with
-- the tools; a streamed reply is chat.completion.chunk events ending in
-- [DONE]. The interface every dialect has is described in cartridge.api.

local json = require("cartridge.json")
local template = require("cartridge.chat")
local logprobs = require("cartridge.logprobs")
local request = require("cartridge.api.request")
local tools_mod = require("cartridge.api.tools")
local format = require("cartridge.api.format")

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local with_documents = request.with_documents

local chat = { route = "/v1/chat/completions", kind = "chat", id_prefix = "chatcmpl-", what = "messages" }

chat.known = request.fields(request.OPENAI_SAMPLING .. "messages max_completion_tokens top_logprobs tools "
    .. "tool_choice parallel_tool_calls store")
chat.options = request.openai_options

function chat.format(srv, body)
    return format.read(srv, body.response_format, "response_format", "response_format")
end

-- A message's content: a string, or an array of text parts. Only an
-- assistant message may have none (null).
local function content_text(msg, i, role)
    local content = msg.content
    if type(content) == "string" then return content end
    if role == "assistant" and (content == nil or content == json.null) then return "" end
    if json.kind(content) == "array" then
        local parts = {}
        for j, part in ipairs(content) do
            if json.kind(part) ~= "object" or part.type ~= "text" or type(part.text) ~= "string" then
                reject(400, ("messages[%d].content[%d] must be a {\"type\": \"text\", \"text\": ...} part; got %s")
                    :format(i - 1, j - 1, shown(part, content, j)), "messages")
            end
            parts[#parts + 1] = part.text
        end
        return table.concat(parts)
    end
    reject(400, ("messages[%d].content must be a string or an array of text parts; got %s")
        :format(i - 1, shown(content, msg, "content")), "messages")
end

-- The tool calls of an assistant message in the history:
-- { { name, arguments = JSON text } } or nil.
local function history_calls(msg, i)
    local calls = msg.tool_calls
    if calls == nil or calls == json.null then return nil end
    local where = ("messages[%d].tool_calls"):format(i - 1)
    if json.kind(calls) ~= "array" then reject(400, where .. " must be an array; got " .. shown(calls, msg, "tool_calls"), "messages") end
    local out = {}
    for k, call in ipairs(calls) do
        local f = json.kind(call) == "object" and call["function"]
        if json.kind(f) ~= "object" or type(f.name) ~= "string" or not f.name:find(tools_mod.NAME) then
            reject(400, ("%s[%d] must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}; got %s")
                :format(where, k - 1, shown(call, calls, k)), "messages")
        end
        local args = f.arguments
        if type(args) ~= "string" then
            reject(400, ("%s[%d].function.arguments must be a string of JSON; got %s"):format(where, k - 1,
                shown(args, f, "arguments")), "messages")
        end
        check_utf8(args, where)
        out[k] = { name = f.name, arguments = args }
    end
    return out
end

-- A request's messages as the template takes them ({ role, content,
-- tool_calls }); developer turns are system turns.
function chat.messages(srv, body)
    local msgs = request.message_list(srv, body)
    local out = {}
    for i, msg in ipairs(msgs) do
        if json.kind(msg) ~= "object" then
            reject(400, ("messages[%d] must be an object; got %s"):format(i - 1, shown(msg, msgs, i)), "messages")
        end
        local role = msg.role
        if role ~= "system" and role ~= "user" and role ~= "assistant" and role ~= "developer" and role ~= "tool" then
            reject(400, ("messages[%d].role must be system, user, assistant, developer or tool; got %s")
                :format(i - 1, shown(role, msg, "role")), "messages")
        end
        if role == "developer" then role = "system" end
        local text = content_text(msg, i, role)
        check_utf8(text, ("messages[%d].content"):format(i - 1))
        out[i] = { role = role, content = text, tool_calls = role == "assistant" and history_calls(msg, i) or nil }
    end
    if out[#out].role == "assistant" then reject(400, "the last message must not be the assistant's", "messages") end
    return out
end

function chat.prompt(srv, body)
    local tools = tools_mod.read(srv, body)
    local list = chat.messages(srv, body)
    local ok, rendered, spans = pcall(template.render, srv.template, list, { tools = tools and tools.list,
        plain = true })
    if not ok then
        if request.is_request_error(rendered) then error(rendered, 0) end
        reject(400, (tostring(rendered):gsub("^chat%.render: ", "")), "messages")
    end
    return { text = rendered .. (tools and tools.prefill or ""), tools = tools, list = list, plain = spans }
end

-- The log-probability entries since the last call, in chat's shape.
local function new_logprobs(srv, job)
    local i, j = request.new_logprobs(job)
    if not i then return nil end
    return { content = logprobs.chat(srv.tok, job.lps, i, j), refusal = json.null }
end

function chat.delta(srv, job, delta, finish)
    local lp = (finish or delta.content and delta.content ~= "") and new_logprobs(srv, job) or nil
    request.data(srv, job, with_documents(job, { id = job.completion_id, object = "chat.completion.chunk",
        created = job.created, model = job.name, choices = json.array({ { index = 0, delta = delta,
            finish_reason = finish or json.null, logprobs = lp or json.null } }) }))
end

function chat.start(srv, job)
    chat.delta(srv, job, { role = "assistant", content = "" })
end

function chat.finish(srv, job)
    local calls, content = tools_mod.calls(srv, job)
    if job.opts.stream then
        chat.delta(srv, job, json.object(), calls and "tool_calls" or job.finish)
        return request.openai_stream_end(srv, job, "chat.completion.chunk")
    end
    local message = { role = "assistant", content = job.text }
    if calls then message = { role = "assistant", content = content or json.null, tool_calls = calls } end
    local obj = { id = job.completion_id, object = "chat.completion", created = job.created, model = job.name,
        choices = json.array({ { index = 0, message = message, finish_reason = calls and "tool_calls" or job.finish,
            logprobs = new_logprobs(srv, job) or json.null } }), usage = request.usage(job) }
    srv.http:respond(job.id, 200, "application/json", json.encode(with_documents(job, obj)))
end

chat.error_body = request.openai_error
chat.stream_error = request.openai_stream_error

return chat
