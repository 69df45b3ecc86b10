-- cartridge.server_utility: the server's routes beside the four API
-- dialects, answered at once (no slot, no queue). recipes/serve.lua serves
-- them through cartridge.server.
--
--   GET  /v1/models/{id}            one entry of GET /v1/models (404 model_not_found)
--   POST /v1/messages/count_tokens  Anthropic's: {"input_tokens": N} of a Messages request
--   POST /tokenize                  llama-server's: {"content", "add_special", "with_pieces"} -> {"tokens"}
--   POST /detokenize                llama-server's: {"tokens"} -> {"content"}
--   POST /apply-template            llama-server's: {"messages"} -> {"prompt"}, the chat template applied
--   GET  /props                     llama-server's: the sampling defaults, slots, context and template
--   POST /v1/embeddings             OpenAI's: pooled, unit-length hidden states (cartridge.embeddings)
--   GET  /slots, POST /slots/{id}   llama-server's: the slots; save, restore, erase (cartridge.slots)
--
-- Each handler takes the server, the request and its decoded body (nil for
-- GET) and returns the JSON text of a 200; bad input raises the server's
-- request errors (a 4xx naming the field).

local json = require("cartridge.json")
local core = require("cartridge.core")
local C = core.C

local utility = {}

-- route -> the method it takes
utility.ROUTES = {
    ["/v1/models/{id}"] = "GET",
    ["/v1/messages/count_tokens"] = "POST",
    ["/tokenize"] = "POST",
    ["/detokenize"] = "POST",
    ["/apply-template"] = "POST",
    ["/props"] = "GET",
    ["/v1/embeddings"] = "POST",
    ["/slots"] = "GET",
    ["/slots/{id}"] = "POST",
}

-- The route of a path that names one of these, and its model id for
-- /v1/models/{id}; nil when none.
function utility.route_of(path)
    local id = path:match("^/v1/models/(.+)$") or path:match("^/models/(.+)$")
    if id then return "/v1/models/{id}", id end
    local slot = path:match("^/slots/([^/]+)$")
    if slot then return "/slots/{id}", slot end
    if utility.ROUTES[path] then return path end
    if path == "/messages/count_tokens" then return "/v1/messages/count_tokens" end
    return nil
end

local function boolean_field(s, body, name)
    local v = body[name]
    if v == nil or v == json.null then return false end
    if type(v) ~= "boolean" then s.reject(400, ("%s must be true or false; got %s"):format(name, s.shown(v)), name) end
    return v
end

local handlers = {}

handlers["/v1/models/{id}"] = function(srv, req)
    for _, entry in ipairs(srv:models_list()) do
        if entry.id == req.model_id then return json.encode(entry) end
    end
    srv.util.reject(404, ("The model '%s' does not exist; GET /v1/models lists the models this server has")
        :format(req.model_id), "model", "model_not_found")
end

-- The prompt tokens /v1/messages would count for this body (its messages,
-- system and tools rendered by the model's chat template), without running it.
handlers["/v1/messages/count_tokens"] = function(srv, _, body)
    local text, _, _, plain = require("cartridge.api.messages").render(srv, body)
    local ids = srv.tok:encode(text, { special = true, add_special = true,
        plain = not srv.parse_special and plain or nil })
    return json.encode({ input_tokens = #ids })
end

-- A token's text for with_pieces: the string when it is valid UTF-8 (a
-- byte-level piece may be a part of a character), else its bytes.
local function piece_value(tok, id)
    local text = tok:decode({ id }, { special = true })
    if C.cart_utf8_invalid_offset(text, #text) < 0 then return text end
    return json.array({ text:byte(1, -1) })
end

handlers["/tokenize"] = function(srv, _, body)
    local s = srv.util
    local content = body.content
    if type(content) ~= "string" then
        s.reject(400, "content must be a string; got " .. s.shown(content, body, "content"), "content")
    end
    s.check_utf8(content, "content")
    local add_special = boolean_field(s, body, "add_special")
    local with_pieces = boolean_field(s, body, "with_pieces")
    -- llama-server's parse_special defaults to true here: the text is the caller's own prompt
    local parse = body.parse_special == nil or body.parse_special == json.null or body.parse_special
    if type(parse) ~= "boolean" then
        s.reject(400, "parse_special must be true or false; got " .. s.shown(parse), "parse_special")
    end
    local ids = srv.tok:encode(content, { special = parse, add_special = add_special })
    local tokens = {}
    for i, id in ipairs(ids) do
        tokens[i] = with_pieces and { id = id, piece = piece_value(srv.tok, id) } or id
    end
    return json.encode({ tokens = json.array(tokens) })
end

handlers["/detokenize"] = function(srv, _, body)
    local s = srv.util
    local tokens = body.tokens
    if json.kind(tokens) ~= "array" then
        s.reject(400, "tokens must be an array of token ids; got " .. s.shown(tokens, body, "tokens"), "tokens")
    end
    local n_vocab = srv.m.n_vocab
    for i, id in ipairs(tokens) do
        if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= n_vocab then
            s.reject(400, ("tokens[%d] must be a token id in [0, %d); got %s"):format(i - 1, n_vocab,
                s.shown(id, tokens, i)), "tokens")
        end
    end
    -- ids that end inside a character decode to a part of it: U+FFFD in JSON
    local text = require("cartridge.tokenizer").well_formed(srv.tok:decode(tokens, { special = true }))
    return json.encode({ content = text })
end

handlers["/apply-template"] = function(srv, _, body)
    local tools = require("cartridge.api.tools").read(srv, body)
    local list = require("cartridge.api.chat").messages(srv, body)
    local ok, text = pcall(require("cartridge.chat").render, srv.template, list, { tools = tools and tools.list })
    if not ok then
        if srv.util.is_request_error(text) then error(text, 0) end
        srv.util.reject(400, (tostring(text):gsub("^chat%.render: ", "")), "messages")
    end
    return json.encode({ prompt = text .. (tools and tools.prefill or "") })
end

handlers["/props"] = function(srv)
    local d = srv.sampling
    return json.encode({
        default_generation_settings = { temperature = d.temperature, top_p = d.top_p, top_k = d.top_k,
            min_p = d.min_p, repeat_penalty = d.repeat_penalty, seed = d.seed, n_ctx = srv.ctx,
            max_tokens = srv.default_max_tokens or json.null },
        total_slots = #srv.slots,
        model_alias = srv.model_name,
        model_path = srv.m.path,
        chat_template = srv.template.name,
        n_vocab = srv.m.n_vocab,
        pooling = srv.pooling,
        build_info = core.ffi.string(C.cart_version()),
    })
end

handlers["/v1/embeddings"] = function(srv, _, body)
    return require("cartridge.embeddings").handle(srv, body)
end

handlers["/slots"] = function(srv)
    return require("cartridge.slots").list(srv)
end

handlers["/slots/{id}"] = function(srv, req, body)
    return require("cartridge.slots").action(srv, req, body)
end

-- The 200 body of a utility route, or a request error raised.
function utility.handle(srv, req, body)
    return handlers[req.route](srv, req, body)
end

return utility
