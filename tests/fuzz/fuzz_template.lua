-- fuzz_template.lua: libFuzzer target (through lua_harness.c) for the chat
-- template renderer, require("cartridge.chat").render(template, messages, opts).
--
-- Input:
--   byte 0   bits 0-1: the template (chatml, llama3, plain; 3: by an unknown
--            name); bit 2: pass the template's name instead of its table;
--            bit 3: add_generation_prompt = false; bit 4: thinking = true;
--            bit 5: no opts table at all
--   then     messages separated by "\x1e", each a tag byte and a payload.
--            Tags 0-3 (mod 8): a message { role, content } with the payload
--            split at "\x1f" (no "\x1f": no content). 4: no role. 5: a number
--            as content. 6: a number instead of a message table. 7: a table
--            as content.
--
-- render must either return a string or raise a string starting with
-- "chat.render: " (bad input: a message that is not a table, a role or
-- content that is not a string, an unknown template, a last message from the
-- assistant with the generation prompt asked for). On success the output
-- must be the messages rendered one by one and then the opener, and each
-- template must put its markers around every message.

local util = require("fuzz_util")
local chat = require("cartridge.chat")

local NAMES = { "chatml", "llama3", "plain" }
local MARKER = { chatml = "<|im_start|>", llama3 = "<|start_header_id|>" }

local function parse(data)
    local r = util.reader(data)
    local ctl = r:byte()
    local messages = {}
    while not r:done() do
        local record = r:upto("\x1e")
        local tag = (record:byte(1) or 0) % 8
        local payload = record:sub(2)
        local role, content = payload:match("^(.-)\x1f(.*)$")
        if not role then role = payload end
        local msg
        if tag <= 3 then
            msg = { role = role, content = content }
        elseif tag == 4 then
            msg = { content = payload }
        elseif tag == 5 then
            msg = { role = role, content = #payload }
        elseif tag == 6 then
            msg = #payload
        else
            msg = { role = role, content = { payload } }
        end
        messages[#messages + 1] = msg
    end
    local which = ctl % 4
    local name = NAMES[which + 1] or "no-such-template"
    local template = name
    if which < 3 and ctl % 8 < 4 then template = chat.templates[name] end
    local opts = { add_generation_prompt = math.floor(ctl / 8) % 2 == 0 and nil or false,
        thinking = math.floor(ctl / 16) % 2 == 1 }
    if math.floor(ctl / 32) % 2 == 1 then opts = nil end
    return template, name, messages, opts
end

local function well_formed(messages)
    for _, msg in ipairs(messages) do
        if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
            return false
        end
    end
    return true
end

return function(data)
    local template, name, messages, opts = parse(data)
    local ok, text = pcall(chat.render, template, messages, opts)
    if not ok then
        util.expect_rejection(text, { "chat.render: " }, "chat.render")
        local gen = not opts or opts.add_generation_prompt ~= false
        local last = messages[#messages]
        local ends_with_assistant = type(last) == "table" and last.role == "assistant"
        if chat.templates[name] and well_formed(messages) and not (gen and ends_with_assistant) then
            util.finding("chat.render refused well-formed messages: %s", text)
        end
        return
    end
    if type(text) ~= "string" then util.finding("chat.render returned a %s", type(text)) end
    if not chat.templates[name] then util.finding("chat.render accepted the unknown template '%s'", name) end
    if not well_formed(messages) then util.finding("chat.render accepted a malformed message") end
    local t = chat.templates[name]
    local pieces = {}
    for i, msg in ipairs(messages) do
        local one = chat.render(t, { msg }, { add_generation_prompt = false })
        if MARKER[name] and one:sub(1, #MARKER[name]) ~= MARKER[name] then
            util.finding("%s rendered message %d without its opening marker", name, i)
        end
        if msg.role ~= "assistant" and not one:find(msg.content, 1, true) then
            util.finding("%s lost the content of message %d", name, i)
        end
        pieces[#pieces + 1] = one
    end
    if not opts or opts.add_generation_prompt ~= false then pieces[#pieces + 1] = t.opener(opts and opts.thinking) end
    if table.concat(pieces) ~= text then
        util.finding("%s: rendering all messages differs from rendering them one by one", name)
    end
end
