-- cartridge.chat: turning messages into the prompt text a model was trained on.
--
--   local chat = require("cartridge.chat")
--   local template = chat.for_model(m)            -- "chatml", "llama3" or "plain"
--   local text = chat.render(template, {
--       { role = "system", content = "You are terse." },
--       { role = "user", content = "What is a cartridge?" },
--   })                                            -- ends with the assistant opener
--   local ids = tok:encode(text, { special = true, add_special = true })
--
-- Templates (pick one by name, or pass your own table with the same fields to
-- chat.render to override what the model declares):
--   chatml  Qwen3: <|im_start|>role\n ... <|im_end|>\n per message; the
--           assistant opener carries an empty think block, which is how
--           Qwen3's template turns thinking off.
--   qwen2   Qwen2/Qwen2.5: the same turns, an opener without a think
--           block, and the system message Qwen2.5's template writes when a
--           conversation has none ("You are Qwen, created by Alibaba
--           Cloud. You are a helpful assistant.").
--   llama3  <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>; the
--           tokenizer adds <|begin_of_text|> (add_bos).
--   gemma   gemma4: <|turn>role\n ... <turn|>\n per message, the assistant's
--           role named "model"; the opener primes the model's turn with an
--           empty thought channel (<|channel>thought\n<channel|>), which is
--           how gemma4's template turns thinking off; the tokenizer adds <bos>.
--   plain   base models without a template: each message's content on its
--           own, system first, followed by a blank line; the opener is empty,
--           so the model simply continues the text.
-- The choice is read from tokenizer.chat_template: a template mentioning
-- <|im_start|> is chatml (qwen2 when it never mentions <think>), one
-- mentioning <|start_header_id|> is llama3, one
-- mentioning <|turn> is gemma, anything else (or none) is plain.

local chat = {}

chat.templates = {
    chatml = {
        name = "chatml",
        message = function(role, content) return "<|im_start|>" .. role .. "\n" .. content .. "<|im_end|>\n" end,
        opener = function(thinking)
            return "<|im_start|>assistant\n" .. (thinking and "" or "<think>\n\n</think>\n\n")
        end,
        -- the pieces self-study builds its prompts from
        system_open = "<|im_start|>system\n",
        user_open = "<|im_start|>user\n",
        close = "<|im_end|>\n",
        stop = "<|im_end|>",
        -- tools, as Qwen3's template writes them (hermes-style): the tool
        -- list in the system message, calls as <tool_call> JSON, results
        -- as <tool_response> blocks in a user turn
        tools_system = function(system, tools)
            return "<|im_start|>system\n" .. (system and system .. "\n\n" or "")
                .. "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                .. "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
                .. table.concat(tools, "\n") .. "\n</tools>\n\nFor each function call, return a json object with "
                .. "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                .. '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        end,
        tool_call = function(name, arguments)
            return '<tool_call>\n{"name": "' .. name .. '", "arguments": ' .. arguments .. "}\n</tool_call>"
        end,
        call_open = "<tool_call>", call_close = "</tool_call>",
        tool_response = function(content, first, last)
            return (first and "<|im_start|>user" or "") .. "\n<tool_response>\n" .. content .. "\n</tool_response>"
                .. (last and "<|im_end|>\n" or "")
        end,
    },
    llama3 = {
        name = "llama3",
        message = function(role, content)
            return "<|start_header_id|>" .. role .. "<|end_header_id|>\n\n" .. content .. "<|eot_id|>"
        end,
        opener = function() return "<|start_header_id|>assistant<|end_header_id|>\n\n" end,
        system_open = "<|start_header_id|>system<|end_header_id|>\n\n",
        user_open = "<|start_header_id|>user<|end_header_id|>\n\n",
        close = "<|eot_id|>",
        stop = "<|eot_id|>",
    },
    gemma = {
        name = "gemma",
        message = function(role, content)
            return "<|turn>" .. (role == "assistant" and "model" or role) .. "\n" .. content .. "<turn|>\n"
        end,
        opener = function(thinking) return "<|turn>model\n" .. (thinking and "" or "<|channel>thought\n<channel|>") end,
        system_open = "<|turn>system\n",
        user_open = "<|turn>user\n",
        close = "<turn|>\n",
        stop = "<turn|>",
    },
    plain = {
        name = "plain",
        message = function(_, content) return content .. "\n\n" end,
        opener = function() return "" end,
        system_open = "",
        user_open = "",
        close = "\n\n",
        stop = nil,
    },
}

-- Qwen2.5's: chatml's turns and tools, no think block, a default system message.
do
    local qwen2 = {}
    for k, v in pairs(chat.templates.chatml) do qwen2[k] = v end
    qwen2.name = "qwen2"
    qwen2.opener = function() return "<|im_start|>assistant\n" end
    qwen2.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    chat.templates.qwen2 = qwen2
end

-- The template a GGUF declares (a gguf File object), by name.
function chat.detect(file)
    local t = file:get("tokenizer.chat_template")
    if type(t) == "string" then
        if t:find("<|im_start|>", 1, true) then return t:find("<think>", 1, true) and "chatml" or "qwen2" end
        if t:find("<|start_header_id|>", 1, true) then return "llama3" end
        if t:find("<|turn>", 1, true) then return "gemma" end
    end
    return "plain"
end

-- The template table for a loaded model (cartridge.model).
function chat.for_model(m)
    return chat.templates[chat.detect(m.file)]
end

local function strip_think(content)
    return (content:gsub("^%s*<think>.-</think>%s*", ""))
end

-- Renders messages ({ role, content }) and, unless opts.add_generation_prompt
-- is false, the assistant opener. opts.thinking = true leaves Qwen3's think
-- block open. A trailing assistant message is an error: the opener would
-- follow a finished turn.
-- opts: add_generation_prompt (true), thinking (false), tools (a list of
-- tool definitions as JSON text, written into the system message). A
-- message may be { role = "tool", content } (a tool's result) or an
-- assistant message with tool_calls = { { name, arguments = JSON text } }.
-- Tools need a template that has a tool format (chatml's, Qwen3's).
--
-- opts.plain: also return the byte ranges (0-based, a flat list { start,
-- end, ... }) of every string the caller gave -- contents, the system text,
-- tool definitions, tool names and arguments -- so that the tokenizer can
-- parse the template's special tokens and leave the caller's text as text
-- (tokenizer opts.plain). The strings must not hold the byte 0xFF (no UTF-8
-- text does).
function chat.render(template, messages, opts)
    opts = opts or {}
    if type(template) == "string" then
        template = chat.templates[template] or error("chat.render: unknown template '" .. template .. "'", 0)
    end
    local held = {}
    -- the caller's strings go in as markers "\255<n>\255", resolved at the end
    local function given(s)
        if not opts.plain or type(s) ~= "string" or s == "" then return s end
        if s:find("\255", 1, true) then error("chat.render: a message holds the byte 0xFF, which is not UTF-8", 0) end
        held[#held + 1] = s
        return "\255" .. #held .. "\255"
    end
    local text = chat.render_parts(template, messages, opts, given)
    if not opts.plain then return text end
    local out, spans, pos, last = {}, {}, 0, 1
    for a, n, b in text:gmatch("()\255(%d+)\255()") do
        out[#out + 1] = text:sub(last, a - 1)
        pos = pos + (a - last)
        local s = held[tonumber(n)]
        spans[#spans + 1], spans[#spans + 2] = pos, pos + #s
        out[#out + 1] = s
        pos, last = pos + #s, b
    end
    out[#out + 1] = text:sub(last)
    return table.concat(out), spans
end

-- A message is a table with a string role and string content.
local function check_message(i, msg)
    if type(msg) ~= "table" then
        error(("chat.render: message %d is a %s, not a table"):format(i, type(msg)), 0)
    end
    if type(msg.role) ~= "string" then
        error(("chat.render: message %d has no string role"):format(i), 0)
    end
    if type(msg.content) ~= "string" then
        error(("chat.render: message %d has no string content"):format(i), 0)
    end
    if msg.tool_calls ~= nil and type(msg.tool_calls) ~= "table" then
        error(("chat.render: message %d has tool_calls that are not a list"):format(i), 0)
    end
end

-- chat.render's work, with each string the caller gave passed through
-- given(s) first.
function chat.render_parts(template, messages, opts, given)
    local parts = {}
    local uses_tools = opts.tools and #opts.tools > 0
    for i, msg in ipairs(messages) do
        check_message(i, msg)
        uses_tools = uses_tools or msg.role == "tool" or msg.tool_calls and #msg.tool_calls > 0
    end
    if uses_tools and not template.tools_system then
        error(("chat.render: the %s template has no tool-call format; tools need a Qwen-style (chatml) template")
            :format(template.name or "given"), 0)
    end
    local first = 1
    local has_system = messages[1] and messages[1].role == "system"
    if opts.tools and #opts.tools > 0 then
        local sys = has_system and messages[1].content or template.default_system
        local defs = {}
        for k, def in ipairs(opts.tools) do defs[k] = given(def) end
        parts[1] = template.tools_system(given(sys), defs)
        if has_system then first = 2 end
    elseif template.default_system and not has_system then
        parts[1] = template.message("system", template.default_system)
    end
    for i = first, #messages do
        local msg = messages[i]
        local content = msg.content
        if msg.role == "assistant" then content = strip_think(content) end
        content = given(content)
        if msg.role == "tool" then
            local prev, nxt = messages[i - 1], messages[i + 1]
            parts[#parts + 1] = template.tool_response(content, not (prev and prev.role == "tool"),
                not (nxt and nxt.role == "tool"))
        elseif msg.role == "assistant" and msg.tool_calls and #msg.tool_calls > 0 then
            local calls = {}
            for k, call in ipairs(msg.tool_calls) do
                calls[k] = ((k == 1 and content ~= "" or k > 1) and "\n" or "") .. template.tool_call(given(call.name),
                    given(call.arguments))
            end
            parts[#parts + 1] = template.message("assistant", content .. table.concat(calls))
        else
            parts[#parts + 1] = template.message(msg.role, content)
        end
    end
    if opts.add_generation_prompt ~= false then
        if #messages > 0 and messages[#messages].role == "assistant" then
            error("chat.render: the last message is the assistant's; nothing to answer", 0)
        end
        parts[#parts + 1] = template.opener(opts.thinking)
    end
    return table.concat(parts)
end

return chat
