-- cartridge.api.tools: function calling, shared by the dialects that offer
-- it (chat completions, Responses, Messages). A request's tools are written
-- into the prompt by the model's chat template; a forced call (tool_choice
-- "required" or a named function) is held to a grammar of its schema; the
-- reply's text is parsed back into calls (cartridge.toolcall).

local json = require("cartridge.json")
local grammar = require("cartridge.grammar")
local toolcall = require("cartridge.toolcall")
local request = require("cartridge.api.request")

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local boolean_field = request.boolean_field

local tools = {}

-- A tool's name in OpenAI's shapes.
tools.NAME = "^[%w_%-%.]+$"
local TOOL_NAME = tools.NAME

-- A JSON Schema's $refs ("#/...") made to point into the schema placed at
-- `prefix` of a bigger one; enum, const, default and examples hold data,
-- not schemas, and are left as they are. Changes t in place.
local DATA_KEYWORDS = { enum = true, const = true, default = true, examples = true }
local function rebase_refs(t, prefix)
    if type(t) ~= "table" or t == json.null then return end
    for k, v in pairs(t) do
        if k == "$ref" and type(v) == "string" and v:sub(1, 1) == "#" then
            t[k] = prefix .. v:sub(2)
        elseif not DATA_KEYWORDS[k] then
            rebase_refs(v, prefix)
        end
    end
end

-- The grammar of a forced tool call: the JSON object {"name": one of the
-- tools, "arguments": what its parameters schema accepts} (any object when
-- it has none). A strict function's schema must compile as it is; the others
-- are read leniently (unsupported keywords ignored). Errors are 400s naming
-- the tool.
local function call_grammar(forced)
    local alts = {}
    for i, t in ipairs(forced) do
        local f = t.f
        local params = f.parameters
        local strict = t.strict
        if params ~= nil then
            local ok, g = pcall(grammar.schema, params, { lenient = not strict })
            if not ok then
                reject(400, ("tools[%d]: %s cannot be enforced for a forced call: %s%s"):format(t.index, t.where,
                    (tostring(g):gsub("^grammar%.schema: ", "")),
                    strict and " (without strict: true unsupported keywords are ignored)" or ""), "tools")
            end
            g:free()
            rebase_refs(params, #forced == 1 and "#/properties/arguments" or
                ("#/anyOf/%d/properties/arguments"):format(i - 1))
        end
        local ok, text = pcall(json.encode, params or { type = "object" }, { ordered = true })
        if not ok then reject(400, ("tools[%d]: %s cannot be written: %s"):format(t.index, t.where, text), "tools") end
        alts[i] = '{"type":"object","properties":{"name":{"const":' .. json.encode(f.name) .. '},"arguments":' ..
            text .. '},"required":["name","arguments"],"additionalProperties":false}'
    end
    local schema = #alts == 1 and alts[1] or '{"anyOf":[' .. table.concat(alts, ",") .. "]}"
    local ok, g = pcall(grammar.schema, schema, { lenient = true })
    if not ok then reject(400, "tools: the forced call cannot be enforced: " .. tostring(g), "tools") end
    return g
end

-- The tools a forced call may name: all of them for tool_choice
-- "required", the one it names for a function, nil for "auto" (or none).
local function forced_tools(body, flat, names, functions)
    local choice = body.tool_choice
    local function bad()
        reject(400, ('tool_choice must be "none", "auto", "required" or %s; got %s'):format(flat and
            '{"type": "function", "name"}' or '{"type": "function", "function": {"name"}}',
            shown(choice, body, "tool_choice")), "tool_choice")
    end
    if choice == "required" then return functions end
    if json.kind(choice) == "object" then
        local f = choice.type == "function" and (flat and choice or choice["function"])
        if json.kind(f) ~= "object" or type(f.name) ~= "string" then bad() end
        if not names[f.name] then
            reject(400, ("tool_choice names %s, which is not among the tools"):format(shown(f.name)), "tool_choice")
        end
        return { names[f.name] }
    end
    if choice ~= nil and choice ~= json.null and choice ~= "auto" then bad() end
    return nil
end

-- A chat request's tools: nil when it has none (or tool_choice is "none"),
-- else { list = tool definitions as the template writes them, prefill =
-- what the reply is made to start with (tool_choice "required" or a named
-- function), parallel = whether more than one call is kept }.
-- flat: the Responses API's shape, {"type": "function", "name", ...} for a
-- tool and {"type": "function", "name"} for a choice, instead of chat's
-- nested "function" object; the template is shown chat's shape either way.
-- extra: per tool, { where = how errors name its schema, strict } for
-- tools converted from another shape (Anthropic's, by cartridge.api.messages).
function tools.read(srv, body, flat, extra)
    local given, choice = body.tools, body.tool_choice
    boolean_field(body, "parallel_tool_calls") -- checked with or without tools
    local shape = flat and '{"type": "function", "name": ...}' or '{"type": "function", "function": {...}}'
    if given == nil or given == json.null then
        if choice ~= nil and choice ~= json.null and choice ~= "none" and choice ~= "auto" then
            reject(400, "tool_choice needs tools", "tool_choice")
        end
        return nil
    end
    if json.kind(given) ~= "array" then reject(400, "tools must be an array; got " .. shown(given, body, "tools"), "tools") end
    if #given > 128 then reject(400, ("at most 128 tools; got %d"):format(#given), "tools") end
    local list, names, functions = {}, {}, {}
    for k, tool in ipairs(given) do
        local f = json.kind(tool) == "object" and tool.type == "function" and (flat and tool or tool["function"])
        if json.kind(f) ~= "object" then
            reject(400, ("tools[%d] must be %s; got %s"):format(k - 1, shape, shown(tool, given, k)), "tools")
        end
        local pre = ("tools[%d].%s"):format(k - 1, flat and "" or "function.")
        if type(f.name) ~= "string" or #f.name > 64 or not f.name:find(TOOL_NAME) then
            reject(400, ("%sname must be 1 to 64 letters, digits, _, - or .; got %s"):format(pre,
                shown(f.name, f, "name")), "tools")
        end
        if f.parameters ~= nil and json.kind(f.parameters) ~= "object" then
            reject(400, ("%sparameters must be a JSON Schema object; got %s"):format(pre,
                shown(f.parameters, f, "parameters")), "tools")
        end
        if f.description ~= nil and type(f.description) ~= "string" then
            reject(400, ("%sdescription must be a string"):format(pre), "tools")
        end
        if names[f.name] then
            reject(400, ("%sname %s repeats tools[%d]'s: tool names must be unique"):format(pre, shown(f.name),
                names[f.name].index), "tools")
        end
        names[f.name] = { f = f, index = k - 1, where = extra and extra[k].where or pre .. "parameters",
            strict = extra and extra[k].strict or f.strict == true }
        functions[#functions + 1] = names[f.name]
        if flat then f.type = nil end -- chat's shape: the function's own fields, in the client's order
        local strict = f.strict
        if flat then f.strict = nil end -- chat's shape for the template: strict sits beside the function there
        local ok, text = pcall(json.encode, flat and f or tool, { python = true })
        if flat then f.strict = strict end
        if ok and flat then text = '{"type": "function", "function": ' .. text .. "}" end
        if not ok then
            reject(400, ("tools[%d] cannot be written into the prompt: %s"):format(k - 1,
                (tostring(text):gsub("^json%.encode: ", ""))), "tools")
        end
        check_utf8(text, ("tools[%d]"):format(k - 1))
        list[k] = text
    end
    if #list == 0 and (choice == "required" or json.kind(choice) == "object") then
        reject(400, "tool_choice needs tools; tools is empty", "tool_choice")
    end
    if #list == 0 or choice == "none" then return nil end
    local forced = forced_tools(body, flat, names, functions)
    if not srv.template.tools_system then
        reject(400, ("this model's chat template (%s) has no tool-call format; tools need a Qwen-style chatml template")
            :format(srv.template.name or "custom"), "tools")
    end
    local t = { list = list, prefill = forced and "<tool_call>\n" or nil,
        parallel = body.parallel_tool_calls ~= false }
    -- The schemas compile in finish(), which make_job calls after the
    -- request's length check: the tools are part of the prompt, so their
    -- compile is then bounded by the context, never by the body's size.
    function t.finish()
        -- a strict function's schema must be one the engine can enforce,
        -- forced or not (the docs promise a 400 for an unsupported keyword)
        if not forced then
            for _, t in ipairs(functions) do
                if t.strict and t.f.parameters ~= nil then
                    local ok, g = pcall(grammar.schema, t.f.parameters, { lenient = false })
                    if not ok then
                        reject(400, ("tools[%d]: strict: true, and %s cannot be enforced: %s (without strict: true "
                            .. "unsupported keywords are ignored)"):format(t.index, t.where,
                            (tostring(g):gsub("^grammar%.schema: ", ""))), "tools")
                    end
                    g:free()
                end
            end
        end
        t.grammar = forced and call_grammar(forced)
    end
    return t
end

-- The calls in a finished job's text (chat, Responses, Messages), as
-- OpenAI's tool_calls, and the content before them; nil when it made none.
function tools.calls(srv, job)
    if not job.tools then return nil end
    if job.parsed then return job.parsed.calls, job.parsed.content end -- the text is final: parse it once
    job.parsed = {}
    local content, calls = toolcall.parse(job.text, srv.template)
    if not calls then return nil end
    if job.api.object_arguments then
        -- Anthropic's input is an object in the reply, not a string: a call
        -- whose arguments no JSON text re-encodes (1e999) leaves the text content
        for _, c in ipairs(calls) do
            if not pcall(json.encode, json.decode(c.arguments)) then return nil end
        end
    end
    if not job.tools.parallel then calls = { calls[1] } end
    local out = {}
    for k, c in ipairs(calls) do
        out[k] = { index = k - 1, id = ("call_%s_%d"):format(job.completion_id:match("%d+$"), k - 1), type = "function",
            ["function"] = { name = c.name, arguments = c.arguments } }
    end
    job.parsed = { calls = out, content = content }
    return out, content
end

return tools
