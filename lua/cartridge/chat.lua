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
--   chatml  Qwen2/Qwen3: <|im_start|>role\n ... <|im_end|>\n per message; the
--           assistant opener carries an empty think block, which is how
--           Qwen3's template turns thinking off.
--   llama3  <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>; the
--           tokenizer adds <|begin_of_text|> (add_bos).
--   plain   base models without a template: each message's content on its
--           own, system first, followed by a blank line; the opener is empty,
--           so the model simply continues the text.
-- The choice is read from tokenizer.chat_template: a template mentioning
-- <|im_start|> is chatml, one mentioning <|start_header_id|> is llama3,
-- anything else (or none) is plain.

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

-- The template a GGUF declares (a gguf File object), by name.
function chat.detect(file)
    local t = file:get("tokenizer.chat_template")
    if type(t) == "string" then
        if t:find("<|im_start|>", 1, true) then return "chatml" end
        if t:find("<|start_header_id|>", 1, true) then return "llama3" end
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
function chat.render(template, messages, opts)
    opts = opts or {}
    if type(template) == "string" then
        template = chat.templates[template] or error("chat.render: unknown template '" .. template .. "'", 0)
    end
    local parts = {}
    for i, msg in ipairs(messages) do
        if type(msg) ~= "table" then
            error(("chat.render: message %d is a %s, not a table"):format(i, type(msg)), 0)
        end
        if type(msg.role) ~= "string" then
            error(("chat.render: message %d has no string role"):format(i), 0)
        end
        if type(msg.content) ~= "string" then
            error(("chat.render: message %d has no string content"):format(i), 0)
        end
        local content = msg.content
        if msg.role == "assistant" then content = strip_think(content) end
        parts[#parts + 1] = template.message(msg.role, content)
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
