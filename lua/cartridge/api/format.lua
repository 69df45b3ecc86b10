-- cartridge.api.format: structured output, the reply held to a JSON Schema
-- (or to any JSON object) by a grammar: chat's and text completions'
-- response_format, the Responses API's text.format.

local json = require("cartridge.json")
local grammar = require("cartridge.grammar")
local request = require("cartridge.api.request")

local reject, shown = request.reject, request.shown

local format = {}

local FORMAT_NAME = "^[%w_%-]+$"

-- A response format object as { grammar, echo } (nil for text or absent).
-- where names it in messages ("response_format", "text.format"); flat: the
-- Responses shape, where name, schema and strict sit beside type instead
-- of in a json_schema object.
function format.read(srv, f, where, param, flat)
    if f == nil or f == json.null then return nil end
    if json.kind(f) ~= "object" then
        reject(400, ('%s must be an object such as {"type": "json_schema", ...}; got %s'):format(where, shown(f)), param)
    end
    local t = f.type
    if t == "text" then return nil end
    if t == "json_object" then
        srv.any_object = srv.any_object or grammar.json_object()
        return { grammar = srv.any_object, echo = { type = "json_object" } }
    end
    if t ~= "json_schema" then
        reject(400, ('%s.type must be "text", "json_object" or "json_schema"; got %s'):format(where,
            shown(t, f, "type")), param)
    end
    local js, jwhere = f, where
    if not flat then
        js, jwhere = f.json_schema, where .. ".json_schema"
        if json.kind(js) ~= "object" then
            reject(400, ('%s must be an object {"name", "schema", "strict"}; got %s'):format(jwhere,
                shown(js, f, "json_schema")), param)
        end
    end
    if type(js.name) ~= "string" or #js.name > 64 or not js.name:find(FORMAT_NAME) then
        reject(400, ("%s.name must be 1 to 64 letters, digits, _ or -; got %s"):format(jwhere,
            shown(js.name, js, "name")), param)
    end
    local strict = js.strict
    if strict ~= nil and strict ~= json.null and type(strict) ~= "boolean" then
        reject(400, ("%s.strict must be a boolean; got %s"):format(jwhere, shown(strict, js, "strict")), param)
    end
    if js.description ~= nil and js.description ~= json.null and type(js.description) ~= "string" then
        reject(400, ("%s.description must be a string; got %s"):format(jwhere, shown(js.description, js,
            "description")), param)
    end
    if json.kind(js.schema) ~= "object" then
        reject(400, ("%s.schema must be a JSON Schema object; got %s"):format(jwhere, shown(js.schema, js, "schema")),
            param)
    end
    local ok, g = pcall(grammar.schema, js.schema, { lenient = strict ~= true })
    if not ok then
        reject(400, ("%s.schema: %s%s"):format(jwhere, (tostring(g):gsub("^grammar%.schema: schema: ", "")
            :gsub("^grammar%.schema: ", "")), strict == true and
            "; with strict: false unsupported keywords are ignored instead" or ""), param)
    end
    return { grammar = g, echo = { type = "json_schema", name = js.name, schema = js.schema,
        strict = strict == true, description = js.description } }
end

return format
