-- cartridge.toolcall: finding a model's tool calls in its text, in the
-- format its chat template taught it (lua/cartridge/chat.lua; for chatml,
-- Qwen3's hermes-style <tool_call> JSON blocks).
--
--   local toolcall = require("cartridge.toolcall")
--   local content, calls = toolcall.parse(text, template)
--   -- content: the text before the first call (nil when empty);
--   -- calls: { { name, arguments = JSON text }, ... }, or nil when the text
--   -- holds no well-formed call (then all of it is content)
--   local n = toolcall.visible(text, template)  -- bytes safe to stream as content

local json = require("cartridge.json")

local toolcall = {}

-- Parses every <tool_call> block of text. A block must hold a JSON object
-- with a string "name" and "arguments" (an object, or a string of JSON
-- text); anything else, or an unclosed block, makes the whole text content,
-- as llama.cpp's parser falls back.
function toolcall.parse(text, template)
    local open, close = template.call_open, template.call_close
    if not open then return text, nil end
    local first = text:find(open, 1, true)
    if not first then return text, nil end
    local calls, at = {}, first
    while true do
        local s = text:find(open, at, true)
        if not s then
            if text:sub(at):find("%S") then return text, nil end -- text after the calls: not a call turn
            break
        end
        if text:sub(at, s - 1):find("%S") then return text, nil end
        local e = text:find(close, s + #open, true)
        if not e then return text, nil end
        local ok, obj = pcall(json.decode, text:sub(s + #open, e - 1))
        if not ok or json.kind(obj) ~= "object" or type(obj.name) ~= "string" or obj.name == "" then
            return text, nil
        end
        local args = obj.arguments
        if json.kind(args) == "object" then
            local ok_enc, text_args = pcall(json.encode, args, { ordered = true })
            if not ok_enc then return text, nil end -- a number no JSON text holds (1e999)
            args = text_args
        elseif type(args) == "string" then
            local ok_args, v = pcall(json.decode, args)
            if not ok_args or json.kind(v) ~= "object" then return text, nil end
        elseif args == nil or args == json.null then
            args = "{}"
        else
            return text, nil
        end
        calls[#calls + 1] = { name = obj.name, arguments = args }
        at = e + #close
    end
    local content = text:sub(1, first - 1):gsub("%s+$", "")
    return content ~= "" and content or nil, calls
end

-- How many leading bytes of a growing text can be streamed as content: all
-- of it up to the first call's opening tag, and never a tail that could
-- still become that tag.
function toolcall.visible(text, template)
    local open = template.call_open
    if not open then return #text end
    local s = text:find(open, 1, true)
    if s then return s - 1 end
    for k = math.min(#open - 1, #text), 1, -1 do
        if text:sub(-k) == open:sub(1, k) then return #text - k end
    end
    return #text
end

return toolcall
