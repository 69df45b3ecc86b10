-- cartridge.server: an OpenAI-compatible HTTP server over one model and any
-- number of cartridges (recipes/serve.lua starts it).
--
-- One thread runs everything. Each turn of the loop polls the sockets
-- (cartridge.http: parsing, limits and timeouts are done in C), turns new
-- requests into jobs, prefills the jobs that got a slot, then advances every
-- running job by one token in a single lockstep forward pass: concurrent
-- requests share each pass over the weights.
--
-- Slots keep their KV caches between requests. A slot's cache holds its
-- cartridge's rows, then the real tokens of its last conversation; a new
-- request for the same cartridge reuses the longest common token prefix and
-- prefills only the rest (usage.prompt_tokens_details.cached_tokens reports
-- how many tokens were reused). A slot is taken for another cartridge only
-- when none is left, least recently used first. With a disk tier
-- (opts.kv_cache_dir, cartridge.kvstore), a conversation about to be
-- overwritten in a slot spills to a file first, and a request whose prompt
-- shares a longer prefix with a file than with any slot adopts its rows.
-- With a fleet (opts.fleet, cartridge.fleetserve), a request for the fleet's
-- name goes behind the cartridges retrieval picks for its conversation,
-- composed; the response names them in an extra field, "documents".
--
-- Endpoints: POST /v1/chat/completions, POST /v1/completions, POST
-- /v1/responses (OpenAI's Responses API), POST /v1/messages (Anthropic's
-- Messages API, its errors in Anthropic's shape),
-- GET /v1/models, GET /health, GET /metrics (Prometheus text format, behind
-- the API key); every /v1 route also without the prefix (/chat/completions),
-- as llama.cpp's server and clients with a bare base URL expect. Errors are OpenAI-shaped: {"error": {"message", "type",
-- "param", "code"}}.

local core = require("cartridge.core")
local json = require("cartridge.json")
local chat = require("cartridge.chat")
local sampler_mod = require("cartridge.sampler")
local logprobs = require("cartridge.logprobs")
local choices = require("cartridge.choices")
local fs = require("cartridge.fs")
local toolcall = require("cartridge.toolcall")
local metrics = require("cartridge.metrics")
local kvstore = require("cartridge.kvstore")
local grammar = require("cartridge.grammar")
local utility = require("cartridge.server_utility")
local webui = require("cartridge.webui")
local C = core.C
local ffi = core.ffi

local server = {}

local function now() return C.cart_now_seconds() end

-- ---------------------------------------------------------------------------
-- Errors and small helpers

local function error_body(message, type_, param, code)
    return json.encode({ error = { message = message, type = type_ or "invalid_request_error",
        param = param or json.null, code = code or json.null } })
end

-- Anthropic's error types by HTTP status.
local ANTHROPIC_ERROR = { [400] = "invalid_request_error", [401] = "authentication_error", [403] = "permission_error",
    [404] = "not_found_error", [405] = "invalid_request_error", [413] = "request_too_large",
    [429] = "rate_limit_error", [500] = "api_error", [503] = "overloaded_error", [529] = "overloaded_error" }

-- The error body a route answers with: Anthropic's shape on /v1/messages
-- ({"type": "error", "error": {"type", "message"}}), OpenAI's elsewhere.
local function route_error(route, status, message, type_, param, code)
    if route == "/v1/messages" or route == "/v1/messages/count_tokens" then
        return json.encode({ type = "error", error = { type = ANTHROPIC_ERROR[status] or "api_error", message = message } })
    end
    return error_body(message, type_, param, code)
end

-- A request error: raised inside request handling, answered with status.
local RequestError = {}
RequestError.__index = RequestError
local function reject(status, message, param, code, type_)
    error(setmetatable({ status = status, message = message, param = param, code = code, type = type_ }, RequestError), 0)
end

function server.is_request_error(e) return getmetatable(e) == RequestError end

-- How a value the client sent reads in an error message: numbers as sent
-- (1e309 stays 1e309), strings quoted and cut, other things by their kind.
local function shown(v, container, key)
    local text = container and json.number_text(container, key)
    if text then return text end
    local kind = json.kind(v)
    if kind == "number" then
        if v == math.floor(v) and math.abs(v) < 2 ^ 63 then return ("%.0f"):format(v) end
        return ("%.17g"):format(v)
    elseif kind == "string" then
        if C.cart_utf8_invalid_offset(v, #v) >= 0 then
            return ("a string of %d bytes that is not valid UTF-8"):format(#v)
        end
        if #v <= 48 then return json.encode(v) end
        local cut = 48
        while cut > 0 and v:byte(cut + 1) >= 0x80 and v:byte(cut + 1) < 0xC0 do cut = cut - 1 end
        return json.encode(v:sub(1, cut)) .. ("... (%d bytes)"):format(#v)
    elseif kind == "boolean" then
        return tostring(v)
    elseif kind == "null" then
        return "null"
    end
    return "an " .. kind -- an array, an object
end
server.shown = shown

local function int_text(v) return ("%.0f"):format(v) end

-- The limits of the C types request numbers are converted to.
local INT32_MAX = 2 ^ 31 - 1
local INT64_MIN, UINT64_END = -2 ^ 63, 2 ^ 64

-- body[name] as an integer in [lo, hi] (default when absent or null); with
-- open_hi, in [lo, hi) -- for a bound such as 2^64 whose predecessor a
-- double cannot hold. The range check comes before any conversion, so
-- nothing wraps.
local function integer_field(body, name, lo, hi, default, why, open_hi)
    local v = body[name]
    if v == nil or v == json.null then return default end
    if type(v) ~= "number" or not (v >= lo and (v < hi or not open_hi and v == hi)) or v ~= math.floor(v) then
        reject(400, ("%s must be an integer in [%s, %s%s%s; got %s"):format(name, int_text(lo), int_text(hi),
            open_hi and ")" or "]", why or "", shown(v, body, name)), name)
    end
    return v
end

-- body[name] as a finite number in [lo, hi].
local function number_field(body, name, lo, hi, default)
    local v = body[name]
    if v == nil or v == json.null then return default end
    if type(v) ~= "number" or not (v >= lo and v <= hi) then
        reject(400, ("%s must be a number in [%g, %g]; got %s"):format(name, lo, hi, shown(v, body, name)), name)
    end
    return v
end

local function boolean_field(body, name, where)
    local v = body[name]
    if v == nil or v == json.null then return false end
    if type(v) ~= "boolean" then
        reject(400, ("%s must be a boolean; got %s"):format(where or name, shown(v, body, name)), where or name)
    end
    return v
end

-- ---------------------------------------------------------------------------
-- The server object

local Server = {}
Server.__index = Server

-- opts: model (cartridge.model), cartridges ({ name = Cart }), model_name,
-- http (cartridge.http server), parallel (slots), ctx (rows per slot after
-- the cartridge), api_key, parse_special (special-token texts in what clients write are read as
-- those tokens; default: as text), max_tokens_limit, max_messages, queue_limit,
-- default_max_tokens, log (function(line) or nil); the disk tier:
-- kv_cache_dir, kv_cache_max (bytes) and warn (function(line) for the lines
-- a --quiet server still prints: skipped files, failed writes); fleet (a
-- cartridge.fleetserve, served under its name).
-- The sampling defaults of a server from a table of the fields given
-- (temperature, top_p, top_k, min_p, repeat_penalty, seed; nil: OpenAI's
-- default), checked against the ranges a request may ask for. Raises
-- "serve: --flag ..." for a value out of range.
function server.sampling_defaults(given)
    given = given or {}
    local d = { temperature = 1, top_p = 1, top_k = 0, min_p = 0, repeat_penalty = 1, seed = 0 }
    local ranges = { temperature = { 0, 2, "--temp" }, top_p = { 0, 1, "--top-p" }, top_k = { 0, INT32_MAX, "--top-k" },
        min_p = { 0, 1, "--min-p" }, repeat_penalty = { 1e-6, 100, "--repeat-penalty" }, seed = { 0, 2 ^ 53, "--seed" } }
    for key, r in pairs(ranges) do
        local v = given[key]
        if v ~= nil then
            if type(v) ~= "number" or v ~= v or v < r[1] or v > r[2] then
                error(("serve: %s must be a number in [%s, %s]; got %s"):format(r[3], tostring(r[1]), tostring(r[2]),
                    tostring(v)), 0)
            end
            d[key] = v
        end
    end
    return d
end

function server.new(opts)
    local self = setmetatable({}, Server)
    self.m = opts.model
    self.tok = self.m:tokenizer()
    self.template = chat.for_model(self.m)
    self.http = opts.http and choices.wrap(opts.http) -- several choices of a request merge there
    self.cartridges = opts.cartridges or {}
    self.model_name = opts.model_name
    self.api_key = opts.api_key
    self.util = server.util -- the request helpers cartridge.server_utility answers with
    -- the web page at / (off: --no-webui) and what its views read (cartridge.webui)
    self.webui = opts.webui ~= false
    self.web = opts.web or { training = {} }
    -- CORS (serve.lua --cors ORIGIN): every response allows that origin, and
    -- OPTIONS answers a browser's preflight; off, OPTIONS is a 405
    self.cors = opts.cors
    if self.cors and self.http then
        self.http.extra_headers = { ["Access-Control-Allow-Origin"] = self.cors, Vary = "Origin" }
    end
    -- more names of the bare model (serve.lua --alias), and the name a request
    -- without a model, or with an unknown one, gets (--default-model; nil:
    -- the bare model without one, a 404 for an unknown one)
    self.aliases = {}
    for _, a in ipairs(opts.aliases or {}) do self.aliases[a] = true end
    self.default_model = opts.default_model
    self.pooling = opts.pooling or "mean" -- /v1/embeddings: cartridge.embeddings
    if not require("cartridge.embeddings").POOLING[self.pooling] then
        error(("server.new: pooling must be mean or last; got %s"):format(tostring(self.pooling)), 0)
    end
    -- what a request that omits a sampling field gets (serve.lua --temp,
    -- --top-p, --top-k, --min-p, --repeat-penalty, --seed); OpenAI's
    -- defaults otherwise: temperature 1, top_p 1, no top-k, min-p or penalty
    self.sampling = server.sampling_defaults(opts.sampling)
    self.parse_special = opts.parse_special -- special-token texts in clients' messages are those tokens
    self.max_tokens_limit = opts.max_tokens_limit or 4096
    self.default_max_tokens = opts.default_max_tokens or 256
    self.max_messages = opts.max_messages or 256
    self.queue_limit = opts.queue_limit or 64
    self.log = opts.log or function() end
    self.created = os.time()
    self.queue = {}   -- jobs waiting for a slot
    self.jobs = {}    -- request id (or a choice's id) -> job
    self.groups = {}  -- request id -> its choices' jobs, when it has several (cartridge.choices)
    self.counter = 0
    local max_p = 0
    for _, c in pairs(self.cartridges) do max_p = math.max(max_p, c.p) end
    self.fleet = opts.fleet
    if self.fleet then max_p = math.max(max_p, self.fleet.max_rows) end
    self.ctx = opts.ctx or 4096
    self.slots = {}
    for i = 1, opts.parallel or 4 do
        self.slots[i] = { id = i, kv = self.m:new_kv(max_p + self.ctx, opts.kv or "f16"), cart = nil,
            tokens = {}, last_used = 0, job = nil }
    end
    self.metrics = metrics.server({ disk = opts.kv_cache_dir ~= nil, fleet = opts.fleet ~= nil })
    if self.http then self.http.on_answer = function(id, status) self.metrics:answered(id, status) end end
    if opts.kv_cache_dir then
        self.store = kvstore.open({ dir = opts.kv_cache_dir, max_bytes = opts.kv_cache_max or 8 * 2 ^ 30, model = self.m,
            kv = opts.kv or "f16", cartridges = self.cartridges, model_name = self.model_name, log = self.log,
            warn = opts.warn or self.log, exclusive = true })
    end
    self.kv_dtype, self.warn = opts.kv or "f16", opts.warn or self.log
    self.slot_save_path = opts.slot_save_path -- /slots/{id}?action=save|restore: cartridge.slots
    if self.slot_save_path then fs.mkdirs(self.slot_save_path) end
    self:check_names()
    return self
end

-- The spill-file reader and writer of /slots' save and restore (made on
-- first use: it hashes the model's weights once).
function Server:slot_store()
    if not self.slot_files then
        self.slot_files = kvstore.open({ dir = self.slot_save_path, max_bytes = math.huge, model = self.m,
            kv = self.kv_dtype, cartridges = self.cartridges, model_name = self.model_name, log = self.log,
            warn = self.warn, model_hash = self.store and self.store.model_hash })
    end
    return self.slot_files
end

-- Refuses aliases that are another model's name and a default model that
-- names nothing this server has.
function Server:check_names()
    for a in pairs(self.aliases) do
        if a == self.model_name or self.cartridges[a] or (self.fleet and self.fleet.name == a) then
            error(("serve: --alias %s is already the name of %s; choose another"):format(a,
                a == self.model_name and "the model" or self.cartridges[a] and "a cartridge" or "the fleet"), 0)
        end
    end
    if self.default_model and self:named(self.default_model) == false then
        error(("serve: --default-model %s names no model, alias, cartridge or fleet of this server"):format(
            self.default_model), 0)
    end
end

function Server:free()
    for _, s in ipairs(self.slots) do s.kv:free() end
    self.slots = {}
    if self.store then self.store:close() end
end

-- ---------------------------------------------------------------------------
-- Request parsing

local function check_auth(self, req)
    if not self.api_key then return end
    local h = req.header("authorization") or ""
    local token = h:match("^[Bb]earer%s+(.+)$")
    if token ~= self.api_key and req.header("x-api-key") ~= self.api_key then
        reject(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.", nil,
            "invalid_api_key")
    end
end

-- The body is read as JSON whatever Content-Type says (curl -d sends
-- application/x-www-form-urlencoded, and llama.cpp's server accepts that too).
local function parse_json(req)
    local ok, body = pcall(json.decode, req.body)
    if not ok then reject(400, "The body is not valid JSON: " .. tostring(body)) end
    if json.kind(body) ~= "object" then reject(400, "The body must be a JSON object; got " .. shown(body) .. ".") end
    return body
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

local function check_utf8(s, what)
    if C.cart_utf8_invalid_offset(s, #s) >= 0 then reject(400, what .. " is not valid UTF-8") end
end

-- What cartridge.server_utility's handlers raise and show errors with.
server.util = { reject = reject, shown = shown, check_utf8 = check_utf8, is_request_error = server.is_request_error }

-- Sampling and stopping options shared by both completion endpoints. Every
-- number is range-checked against the C type it becomes (engine/sampler.h:
-- float temperature/top_p/min_p, int32 top_k, uint64 seed).
function Server:common_options(body)
    local o = {}
    local mt_name = "max_completion_tokens"
    if body[mt_name] == nil or body[mt_name] == json.null then mt_name = "max_tokens" end
    o.max_tokens = integer_field(body, mt_name, 1, self.max_tokens_limit, self.default_max_tokens,
        " (this server's limit is " .. self.max_tokens_limit .. ")")
    local d = self.sampling
    o.temperature = number_field(body, "temperature", 0, 2, d.temperature)
    o.top_p = number_field(body, "top_p", 0, 1, d.top_p)
    if o.top_p == 0 then o.top_p = 1e-6 end
    o.top_k = integer_field(body, "top_k", 0, INT32_MAX, d.top_k)
    o.min_p = number_field(body, "min_p", 0, 1, d.min_p)
    -- penalties: OpenAI's two (in [-2, 2]) and llama.cpp's repetition
    -- penalty, all over the last repeat_last_n tokens of prompt and output
    -- together, as llama.cpp's server counts them (-1: the whole context)
    o.frequency_penalty = number_field(body, "frequency_penalty", -2, 2, 0)
    o.presence_penalty = number_field(body, "presence_penalty", -2, 2, 0)
    o.repeat_penalty = number_field(body, "repeat_penalty", 0, 100, d.repeat_penalty)
    if o.repeat_penalty == 0 then reject(400, "repeat_penalty must be positive (1: off)", "repeat_penalty") end
    o.repeat_last_n = integer_field(body, "repeat_last_n", -1, 1048576, 64)
    if o.repeat_last_n == -1 then o.repeat_last_n = self.ctx end
    -- a negative seed is taken as its two's complement, as a C cast would
    o.seed = integer_field(body, "seed", INT64_MIN, UINT64_END, d.seed, nil, true)
    local stop = body.stop
    o.stop = {}
    if type(stop) == "string" then
        if stop == "" then reject(400, 'stop must be a non-empty string (or omitted); got ""', "stop") end
        o.stop = { stop }
    elseif json.kind(stop) == "array" then
        if #stop > 4 then reject(400, ("at most 4 stop sequences; got %d"):format(#stop), "stop") end
        for i, s in ipairs(stop) do
            if type(s) ~= "string" or s == "" then
                reject(400, ("stop[%d] must be a non-empty string; got %s"):format(i - 1, shown(s, stop, i)), "stop")
            end
            o.stop[#o.stop + 1] = s
        end
    elseif stop ~= nil and stop ~= json.null then
        reject(400, ("stop must be a string or an array of strings; got %s"):format(shown(stop, body, "stop")), "stop")
    end
    for _, s in ipairs(o.stop) do check_utf8(s, "stop") end
    o.stream = boolean_field(body, "stream")
    local so = body.stream_options
    if so ~= nil and so ~= json.null then
        if json.kind(so) ~= "object" then
            reject(400, ("stream_options must be an object; got %s"):format(shown(so, body, "stream_options")),
                "stream_options")
        end
        o.include_usage = boolean_field(so, "include_usage", "stream_options.include_usage")
    end
    return o
end

-- The cartridge (or nil: the bare model) a request's "model" names.
-- What a model name serves: nil (the bare model, under its name or an
-- alias), the fleet, or a cartridge; false when the name is none of them.
function Server:named(name)
    if name == self.model_name or self.aliases[name] then return nil end
    if self.fleet and name == self.fleet.name then return self.fleet end
    return self.cartridges[name] or false
end

-- The cartridge (nil: the bare model) and name a request's model field
-- picks. Without one, or with an unknown one when the server has a
-- --default-model, the default's; else an unknown name is a 404.
function Server:pick(body)
    local name = body.model
    if name == nil or name == json.null then
        if self.default_model then return self:named(self.default_model), self.default_model end
        return nil, self.model_name
    end
    if type(name) ~= "string" then reject(400, "model must be a string; got " .. shown(name, body, "model"), "model") end
    local what = self:named(name)
    if what == false then
        if self.default_model then return self:named(self.default_model), self.default_model end
        reject(404, ("The model %s does not exist; GET /v1/models lists them."):format(shown(name)), "model",
            "model_not_found")
    end
    return what, name
end

-- body.messages, checked to be a non-empty array within the server's limit.
function Server:message_list(body)
    local msgs = body.messages
    if json.kind(msgs) ~= "array" or #msgs == 0 then
        reject(400, "messages must be a non-empty array; got " .. shown(msgs, body, "messages"), "messages")
    end
    if #msgs > self.max_messages then
        reject(400, ("%d messages is above this server's limit of %d"):format(#msgs, self.max_messages), "messages")
    end
    return msgs
end

function Server:parse_chat(body)
    local msgs = self:message_list(body)
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
        out[i] = { role = role, content = text, tool_calls = role == "assistant" and self:history_calls(msg, i) or nil }
    end
    if out[#out].role == "assistant" then reject(400, "the last message must not be the assistant's", "messages") end
    return out
end

-- ---------------------------------------------------------------------------
-- Tools (chat completions)

local TOOL_NAME = "^[%w_%-%.]+$"

-- The tool calls of an assistant message in the history:
-- { { name, arguments = JSON text } } or nil.
function Server:history_calls(msg, i)
    local calls = msg.tool_calls
    if calls == nil or calls == json.null then return nil end
    local where = ("messages[%d].tool_calls"):format(i - 1)
    if json.kind(calls) ~= "array" then reject(400, where .. " must be an array; got " .. shown(calls, msg, "tool_calls"), "messages") end
    local out = {}
    for k, call in ipairs(calls) do
        local f = json.kind(call) == "object" and call["function"]
        if json.kind(f) ~= "object" or type(f.name) ~= "string" or not f.name:find(TOOL_NAME) then
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

-- A chat request's tools: nil when it has none (or tool_choice is "none"),
-- else { list = tool definitions as the template writes them, prefill =
-- what the reply is made to start with (tool_choice "required" or a named
-- function), parallel = whether more than one call is kept }.
-- flat: the Responses API's shape, {"type": "function", "name", ...} for a
-- tool and {"type": "function", "name"} for a choice, instead of chat's
-- nested "function" object; the template is shown chat's shape either way.
-- extra: per tool, { where = how errors name its schema, strict } for
-- tools converted from another shape (Anthropic's, by anthropic_tools).
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

function Server:chat_tools(body, flat, extra)
    local tools, choice = body.tools, body.tool_choice
    boolean_field(body, "parallel_tool_calls") -- checked with or without tools
    local shape = flat and '{"type": "function", "name": ...}' or '{"type": "function", "function": {...}}'
    if tools == nil or tools == json.null then
        if choice ~= nil and choice ~= json.null and choice ~= "none" and choice ~= "auto" then
            reject(400, "tool_choice needs tools", "tool_choice")
        end
        return nil
    end
    if json.kind(tools) ~= "array" then reject(400, "tools must be an array; got " .. shown(tools, body, "tools"), "tools") end
    if #tools > 128 then reject(400, ("at most 128 tools; got %d"):format(#tools), "tools") end
    local list, names, functions = {}, {}, {}
    for k, tool in ipairs(tools) do
        local f = json.kind(tool) == "object" and tool.type == "function" and (flat and tool or tool["function"])
        if json.kind(f) ~= "object" then
            reject(400, ("tools[%d] must be %s; got %s"):format(k - 1, shape, shown(tool, tools, k)), "tools")
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
    if not self.template.tools_system then
        reject(400, ("this model's chat template (%s) has no tool-call format; tools need a Qwen-style chatml template")
            :format(self.template.name or "custom"), "tools")
    end
    local tools = { list = list, prefill = forced and "<tool_call>\n" or nil,
        parallel = body.parallel_tool_calls ~= false }
    -- The schemas compile in finish(), which make_job calls after the
    -- request's length check: the tools are part of the prompt, so their
    -- compile is then bounded by the context, never by the body's size.
    function tools.finish()
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
        tools.grammar = forced and self:call_grammar(forced)
    end
    return tools
end

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
function Server:call_grammar(forced)
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

-- ---------------------------------------------------------------------------
-- Structured output: response_format (chat) and text.format (Responses)

local FORMAT_NAME = "^[%w_%-]+$"

-- A response format object as { grammar, echo } (nil for text or absent).
-- where names it in messages ("response_format", "text.format"); flat: the
-- Responses shape, where name, schema and strict sit beside type instead
-- of in a json_schema object.
function Server:response_format(f, where, param, flat)
    if f == nil or f == json.null then return nil end
    if json.kind(f) ~= "object" then
        reject(400, ('%s must be an object such as {"type": "json_schema", ...}; got %s'):format(where, shown(f)), param)
    end
    local t = f.type
    if t == "text" then return nil end
    if t == "json_object" then
        self.any_object = self.any_object or grammar.json_object()
        return { grammar = self.any_object, echo = { type = "json_object" } }
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

-- The calls in a finished job's text (chat, Responses, Messages), as
-- OpenAI's tool_calls, and the content before them; nil when it made none.
function Server:job_calls(job)
    if not job.tools then return nil end
    if job.parsed then return job.parsed.calls, job.parsed.content end -- the text is final: parse it once
    job.parsed = {}
    local content, calls = toolcall.parse(job.text, self.template)
    if not calls then return nil end
    if job.kind == "messages" then
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

-- ---------------------------------------------------------------------------
-- Anthropic Messages (POST /v1/messages)

-- Text of a content value: a string, or an array of parts whose type is
-- one of `types` (a set) and whose text is a string. Errors name `where`
-- and carry `param`; `wanted` says what parts are read.
local function content_parts(content, where, param, types, wanted)
    if type(content) == "string" then return content end
    if json.kind(content) ~= "array" then
        reject(400, ("%s must be a string or an array of content parts; got %s"):format(where, shown(content)), param)
    end
    local parts = {}
    for j, part in ipairs(content) do
        local t = json.kind(part) == "object" and part.type
        if not (type(t) == "string" and types[t]) then
            reject(400, ("%s[%d]: %s are not supported by this server (%s only)"):format(where, j - 1,
                type(t) == "string" and ("parts of type " .. shown(t)) or ("parts like " .. shown(part, content, j)),
                wanted), param)
        end
        if type(part.text) ~= "string" then
            reject(400, ("%s[%d].text must be a string; got %s"):format(where, j - 1, shown(part.text, part, "text")),
                param)
        end
        parts[#parts + 1] = part.text
    end
    return table.concat(parts)
end

local ANTHROPIC_TEXT = { text = true }
local RESPONSES_TEXT = { input_text = true, output_text = true, text = true }

local function blocks_text(content, where)
    return content_parts(content, where, where:match("^[%a_]+"), ANTHROPIC_TEXT, "text blocks")
end

local ANTHROPIC_CHOICE = '{"type": "auto"}, {"type": "any"}, {"type": "tool", "name"} or {"type": "none"}'

-- A Messages request's tools, in Anthropic's shapes: tools as {"name",
-- "description", "input_schema"} (type "custom" or none; server tools are
-- refused), tool_choice {"type": "auto" | "any" | "tool" (with "name") |
-- "none", "disable_parallel_tool_use"}. They are turned into chat's shapes,
-- as llama-server converts them ({"type": "function", "function": {"name",
-- "description", "parameters"}}, any = required), and read by chat_tools:
-- the same template path, forced-call grammar and parsing as chat's.
function Server:anthropic_tools(body)
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
        return self:chat_tools(chat_body, false, extra)
    end
    return self:chat_tools(chat_body)
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
                result = content_parts(block.content, at .. ".content", "messages", ANTHROPIC_TEXT, "text blocks")
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
-- Returns the text, the tools (chat_tools' table, or nil) and the messages.
function Server:parse_messages(body)
    local msgs = self:message_list(body)
    local tools = self:anthropic_tools(body)
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
    local ok, text, spans = pcall(chat.render, self.template, list, { tools = tools and tools.list, plain = true })
    if not ok then reject(400, (tostring(text):gsub("^chat%.render: ", "")), "messages") end
    if prefill and prefill ~= "" then
        spans[#spans + 1], spans[#spans + 2] = #text, #text + #prefill
    end
    return text .. (prefill or "") .. (tools and tools.prefill or ""), tools, list, spans
end

function Server:messages_options(body)
    local o = {}
    if body.max_tokens == nil or body.max_tokens == json.null then
        reject(400, "max_tokens: the field is required", "max_tokens")
    end
    o.max_tokens = integer_field(body, "max_tokens", 1, self.max_tokens_limit, nil,
        " (this server's limit is " .. self.max_tokens_limit .. ")")
    local d = self.sampling
    o.temperature = number_field(body, "temperature", 0, 1, math.min(d.temperature, 1))
    o.top_p = number_field(body, "top_p", 0, 1, d.top_p)
    if o.top_p == 0 then o.top_p = 1e-6 end
    o.top_k = integer_field(body, "top_k", 0, INT32_MAX, d.top_k)
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

-- ---------------------------------------------------------------------------
-- OpenAI Responses (POST /v1/responses)

-- The prompt text of a Responses request: instructions as the system
-- message, then the input (a string: one user turn; or message items).
function Server:parse_responses(body)
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
        if #input > self.max_messages then
            reject(400, ("%d input items is above this server's limit of %d"):format(#input, self.max_messages), "input")
        end
        for i, item in ipairs(input) do
            local where = ("input[%d]"):format(i - 1)
            if json.kind(item) ~= "object" then reject(400, where .. " must be an object; got " .. shown(item, input, i), "input") end
            if item.type == "function_call" then
                if type(item.name) ~= "string" or not item.name:find(TOOL_NAME) or type(item.arguments) ~= "string" then
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
            local text = content_parts(item.content, where .. ".content", "input", RESPONSES_TEXT, "input_text parts")
            check_utf8(text, where .. ".content")
            list[#list + 1] = { role = role == "developer" and "system" or role, content = text }
            ::next_item::
        end
        if list[#list].role == "assistant" then reject(400, "the last input item must not be the assistant's", "input") end
    else
        reject(400, "input must be a string or a non-empty array of message items; got " .. shown(input, body, "input"),
            "input")
    end
    local tools = self:chat_tools(body, true)
    local ok, text, spans = pcall(chat.render, self.template, list, { tools = tools and tools.list, plain = true })
    if not ok then reject(400, (tostring(text):gsub("^chat%.render: ", "")), "input") end
    return text .. (tools and tools.prefill or ""), tools, list, spans
end

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

function Server:responses_options(body)
    local o = {}
    o.max_tokens = integer_field(body, "max_output_tokens", 1, self.max_tokens_limit, self.default_max_tokens,
        " (this server's limit is " .. self.max_tokens_limit .. ")")
    local d = self.sampling
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

-- Adds the fleet's extra field to a response object: the documents whose
-- cartridges the answer went behind, in composition order.
local function with_documents(job, obj)
    if job.documents then obj.documents = json.array({ unpack(job.documents) }) end
    return obj
end

-- A Responses API response object in its current state.
function Server:response_object(job, status)
    local item = { type = "message", id = "msg_" .. job.completion_id:sub(6), status = status == "in_progress"
        and "in_progress" or "completed", role = "assistant", content = json.array() }
    local output = json.array()
    local calls = nil
    if status ~= "in_progress" then
        local content
        calls, content = self:job_calls(job)
        local text = calls and (content or "") or job.text
        item.content = json.array({ { type = "output_text", text = text, annotations = json.array(),
            logprobs = job.opts.lp.on and logprobs.chat(self.tok, job.lps, 1, #job.lps) or json.array() } })
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

-- Opens a streamed response's message item (once), before its first text.
function Server:open_item(job)
    if job.item_open then return end
    job.item_open = true
    local _, item = self:response_object(job, "in_progress")
    self:response_event(job, "response.output_item.added", { output_index = 0, item = item })
    self:response_event(job, "response.content_part.added", { item_id = item.id, output_index = 0,
        content_index = 0, part = { type = "output_text", text = "", annotations = json.array() } })
end

-- One Responses stream event, numbered.
function Server:response_event(job, name, obj)
    obj.type = name
    obj.sequence_number = job.sequence or 0
    job.sequence = obj.sequence_number + 1
    self:event(job, name, obj)
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
function Server:message_content(job)
    local calls, content = self:job_calls(job)
    if not calls then return json.array({ { type = "text", text = job.text } }) end
    local blocks = json.array()
    if content then blocks[1] = { type = "text", text = content } end
    for _, b in ipairs(tool_use_blocks(calls)) do blocks[#blocks + 1] = b end
    return blocks
end

-- Opens a streamed Messages reply's text block (index 0), once.
function Server:open_block(job)
    if job.block_open then return end
    job.block_open = true
    self:event(job, "content_block_start", { type = "content_block_start", index = 0,
        content_block = { type = "text", text = "" } })
end

-- Streams a Messages reply's calls: the text block (when open) closes, then
-- each call is a tool_use block whose input comes as one input_json_delta.
function Server:tool_use_events(job, calls)
    local first = 0
    if job.block_open then
        self:event(job, "content_block_stop", { type = "content_block_stop", index = 0 })
        first = 1
    end
    for k, b in ipairs(tool_use_blocks(calls)) do
        local index = first + k - 1
        local arguments = calls[k]["function"].arguments
        b.input = json.object()
        self:event(job, "content_block_start", { type = "content_block_start", index = index, content_block = b })
        self:event(job, "content_block_delta", { type = "content_block_delta", index = index,
            delta = { type = "input_json_delta", partial_json = arguments } })
        self:event(job, "content_block_stop", { type = "content_block_stop", index = index })
    end
    job.calls_sent = true
end

local function anthropic_usage(job)
    return { input_tokens = #job.prompt - job.cached, output_tokens = #job.out_ids,
        cache_read_input_tokens = job.cached, cache_creation_input_tokens = 0 }
end

function Server:event(job, name, obj)
    self.http:stream_write(job.id, "event: " .. name .. "\ndata: " .. json.encode(obj) .. "\n\n")
end

-- ---------------------------------------------------------------------------
-- Jobs

-- Fields a client may send that this server does not honour yet: each
-- with the test of a value that asks for something (false, null, 0 and
-- empty ask for nothing and pass) and what to do instead. A request asking
-- for one gets a 400 naming it, never a reply that silently lacks it.
local function asks(v) return v ~= nil and v ~= json.null and v ~= false and v ~= 0 end
local UNHONOURED = {
    ["/v1/completions"] = {
        { "suffix", function(v) return type(v) == "string" and v ~= "" end },
        { "best_of", function(v) return asks(v) and v ~= 1 end },
    },
    ["/v1/messages"] = {
        { "thinking", function(v) return type(v) == "table" and v.type ~= nil and v.type ~= "disabled" end },
    },
}

-- The fields each route reads. Any other is refused by name: a field this
-- server does not know would otherwise be ignored without a word. "user"
-- (an end user's id) and Anthropic's "metadata" change no output, and
-- "store" is taken only when it asks for nothing.
local function fields(list)
    local t = {}
    for name in list:gmatch("%S+") do t[name] = true end
    return t
end
local SAMPLING = "model max_tokens temperature top_p top_k min_p seed stop stream stream_options n logprobs "
    .. "logit_bias frequency_penalty presence_penalty repeat_penalty repeat_last_n response_format user "
local KNOWN = {
    ["/v1/chat/completions"] = fields(SAMPLING .. "messages max_completion_tokens top_logprobs tools tool_choice "
        .. "parallel_tool_calls store"),
    ["/v1/completions"] = fields(SAMPLING .. "prompt echo best_of suffix"),
    ["/v1/responses"] = fields("model input instructions max_output_tokens temperature top_p stream metadata text "
        .. "tools tool_choice parallel_tool_calls previous_response_id include top_logprobs user store"),
    ["/v1/messages"] = fields("model messages system max_tokens temperature top_p top_k stop_sequences stream tools "
        .. "tool_choice metadata thinking"),
}

local function refuse_unhonoured(route, body)
    local known = KNOWN[route]
    if known then
        local unknown = {}
        for k in pairs(body) do
            if not known[k] then unknown[#unknown + 1] = tostring(k) end
        end
        table.sort(unknown)
        if unknown[1] then
            reject(400, ("%s: %s does not know this field, and would ignore it; leave it out"):format(unknown[1],
                route), unknown[1])
        end
        if asks(body.store) then
            reject(400, "store: this server stores no responses; leave it out or set it to false", "store")
        end
    end
    for _, f in ipairs(UNHONOURED[route] or {}) do
        if f[2](body[f[1]]) then
            reject(400, ("%s: this server does not support it yet (its replies would silently lack it); leave "
                .. "it out or set it to its off value; got %s"):format(f[1], shown(body[f[1]], body, f[1])), f[1])
        end
    end
end

-- Builds the jobs of a request: one, or (several choices) { group = the
-- child jobs } answering it together (cartridge.choices). Raises a
-- RequestError.
function Server:make_jobs(id, req)
    local route = req.route or req.path
    local body = parse_json(req)
    local list, n = choices.expand(route, body, { reject = reject, shown = shown, slots = #self.slots,
        seed = self.sampling.seed, n_vocab = self.m.n_vocab })
    if not list then return self:make_job(id, req, body) end
    local ids = choices.group(self.http, id, #list, n, function() self.groups[id] = nil end)
    local jobs = {}
    for i, c in ipairs(list) do
        local b = {}
        for k, v in pairs(body) do b[k] = v end
        b.n, b.seed = nil, c.seed
        if c.prompt then b.prompt = c.prompt end
        jobs[i] = self:make_job(ids[i], req, b)
    end
    return { group = jobs }
end

-- Builds a job from a request (body: its decoded JSON), or raises a
-- RequestError.
function Server:make_job(id, req, body)
    local route = req.route or req.path
    refuse_unhonoured(route, body)
    local cart, name = self:pick(body)
    local kind, text, tools, list, plain, given_ids
    local o
    if route == "/v1/messages" then o = self:messages_options(body)
    elseif route == "/v1/responses" then o = self:responses_options(body)
    else o = self:common_options(body) end
    o.lp = logprobs.options(route, body, { reject = reject, shown = shown, n_vocab = self.m.n_vocab, tok = self.tok })
    local format
    if route == "/v1/chat/completions" or route == "/v1/completions" then
        format = self:response_format(body.response_format, "response_format", "response_format")
    elseif route == "/v1/responses" then
        local t = body.text
        if t ~= nil and t ~= json.null then
            if json.kind(t) ~= "object" then
                reject(400, 'text must be an object such as {"format": {"type": "json_schema", ...}}; got ' ..
                    shown(t, body, "text"), "text")
            end
            format = self:response_format(t.format, "text.format", "text", true)
        end
        o.echo.text = { format = format and format.echo or { type = "text" } }
    end
    if route == "/v1/messages" then
        kind = "messages"
        text, tools, list, plain = self:parse_messages(body)
    elseif route == "/v1/responses" then
        kind = "responses"
        text, tools, list, plain = self:parse_responses(body)
    elseif route == "/v1/chat/completions" then
        kind = "chat"
        tools = self:chat_tools(body)
        list = self:parse_chat(body)
        local ok, rendered, spans = pcall(chat.render, self.template, list, { tools = tools and tools.list,
            plain = true })
        if not ok then
            if server.is_request_error(rendered) then error(rendered, 0) end
            reject(400, (tostring(rendered):gsub("^chat%.render: ", "")), "messages")
        end
        text, plain = rendered .. (tools and tools.prefill or ""), spans
    else
        kind = "text"
        local prompt = choices.prompts(body.prompt, { reject = reject, shown = shown, n_vocab = self.m.n_vocab },
            body)[1]
        if type(prompt) == "table" then -- token ids: the text they spell, for echo
            given_ids, prompt = prompt, self.tok:decode(prompt)
        else
            check_utf8(prompt, "prompt")
        end
        text = prompt
        list = { { role = "user", content = prompt } }
    end
    -- the template's markers are special tokens; what the client wrote is
    -- text (its "<|im_start|>" cannot open a turn) unless --parse-special
    local ids = given_ids or self.tok:encode(text, { special = kind ~= "text", add_special = cart == nil,
        plain = not self.parse_special and plain or nil })
    local what = kind == "text" and "prompt" or kind == "responses" and "input" or "messages"
    if #ids == 0 then reject(400, "the prompt is empty", what) end
    if #ids + o.max_tokens > self.ctx then
        reject(400, ("This request needs %d prompt tokens (its %s) + %d completion tokens, but the context holds %d; "
            .. "shorten the %s or lower max_tokens."):format(#ids, what, o.max_tokens, self.ctx, what), what,
            "context_length_exceeded")
    end
    if tools then tools.finish() end
    local documents
    if cart and cart == self.fleet then
        -- the fleet's cartridges for this conversation, retrieved over its
        -- user messages (after the length check: retrieval runs the model)
        local users = {}
        for _, msg in ipairs(list) do
            if msg.role == "user" then users[#users + 1] = msg.content end
        end
        if #users == 0 then reject(400, "a request to a fleet needs a user message to retrieve by", "messages") end
        cart = self.fleet:select(users)
        documents = cart.names
    end
    self.counter = self.counter + 1
    -- a forced tool call is held to its tool's schema; otherwise the reply to the response format
    local g = tools and tools.grammar or format and format.grammar
    return {
        id = id, kind = kind, name = name, cart = cart, prompt = ids, opts = o, tools = tools, grammar = g,
        documents = documents,
        call_close = tools and tools.grammar and "\n" .. self.template.call_close or nil,
        out_ids = {}, text = tools and tools.prefill or "", sent = 0, finish = nil, cached = 0,
        lps = {}, lp_sent = 0, -- the log-probability entries of out_ids, and how many were streamed
        echo = kind == "text" and o.lp.echo and text or nil, -- completions' echo: the prompt, before the reply
        completion_id = (kind == "chat" and "chatcmpl-" or kind == "messages" and "msg_" or
            kind == "responses" and "resp_" or "cmpl-")
            .. ("%d%06d"):format(self.created, self.counter),
        received = now(),
        created = os.time(), -- the response's time, as OpenAI's created (Unix seconds)
    }
end

local common_prefix = kvstore.common_prefix

-- The free slot for a job: same cartridge with the longest common prefix;
-- else the least recently used. nil when every slot is busy. With the disk
-- tier, a file that shares at least kvstore.MIN_GAIN more tokens than that
-- slot is chosen instead (job.disk, adopted by bind into the least recently
-- used slot).
function Server:choose_slot(job)
    local best, best_len, lru = nil, -1, nil
    for _, s in ipairs(self.slots) do
        if not s.job then
            if s.cart == job.cart and s.loaded then
                local n = common_prefix(s.tokens, job.prompt)
                if n > best_len then best, best_len = s, n end
            end
            if not lru or s.last_used < lru.last_used then lru = s end
        end
    end
    if lru and self.store then
        local entry, n = self.store:match(job.cart, job.prompt)
        local last = #job.prompt - 1 -- the last prompt token is always fed
        if entry and math.min(n, last) - math.min(math.max(best_len, 0), last) >= kvstore.MIN_GAIN then
            job.disk, job.disk_n = entry, math.min(n, last)
            return lru
        end
    end
    return best or lru
end

-- With the disk tier: spills the conversation a free slot holds when `job`
-- (nil: none, the server is stopping) is about to overwrite at least
-- kvstore.MIN_GAIN tokens of it (fewer could never be worth adopting).
function Server:spill_slot(slot, job)
    if not (self.store and slot.loaded) then return end
    local keep = 0
    if job and not job.disk and slot.cart == job.cart then
        keep = math.min(common_prefix(slot.tokens, job.prompt), #job.prompt - 1)
    end
    if #slot.tokens - keep >= kvstore.MIN_GAIN then self.store:spill(slot.cart, slot.tokens, slot.kv, job and job.disk) end
end

-- With the disk tier: puts job.disk's rows into the slot behind the
-- cartridge's (or counts a miss). A file that fails its checks leaves the
-- slot holding the cartridge rows alone.
function Server:adopt(job, slot)
    if not job.disk then return self.store:note_miss() end
    slot.kv:truncate(0)
    if job.cart then job.cart:append_to(slot.kv) end
    slot.cart, slot.loaded, slot.tokens = job.cart, true, {}
    if self.store:adopt(job.disk, slot.kv, job.cart, job.disk_n) then
        for i = 1, job.disk_n do slot.tokens[i] = job.prompt[i] end
    else
        self.store:note_miss()
    end
    job.disk = nil
end

-- Puts the job in a slot: cartridge rows, reused prefix, prefill ids left.
function Server:bind(job, slot)
    job.slot = slot
    slot.job = job
    slot.last_used = now()
    local p = job.cart and job.cart.p or 0
    if self.store then
        self:spill_slot(slot, job)
        self:adopt(job, slot)
    end
    if slot.cart ~= job.cart or not slot.loaded then
        slot.kv:truncate(0)
        if job.cart then job.cart:append_to(slot.kv) end
        slot.cart, slot.tokens, slot.loaded = job.cart, {}, true
    end
    -- keep the shared prefix, never all of the prompt (its last token must
    -- be fed to get fresh logits), never into the cartridge rows
    local keep = math.min(common_prefix(slot.tokens, job.prompt), #job.prompt - 1)
    slot.kv:truncate(p + keep)
    for i = #slot.tokens, keep + 1, -1 do slot.tokens[i] = nil end
    job.cached = keep
    job.pending = {}
    for i = keep + 1, #job.prompt do job.pending[#job.pending + 1] = job.prompt[i] end
    local seed = job.opts.seed
    if seed < 0 then seed = ffi.cast("uint64_t", ffi.cast("int64_t", seed)) end
    job.sampler = sampler_mod.new({ temperature = job.opts.temperature, top_p = job.opts.top_p, top_k = job.opts.top_k,
        min_p = job.opts.min_p, frequency_penalty = job.opts.frequency_penalty,
        presence_penalty = job.opts.presence_penalty, repeat_penalty = job.opts.repeat_penalty,
        repeat_last_n = job.opts.repeat_last_n, seed = seed })
    -- as llama.cpp's server, the penalties' window starts with the whole
    -- prompt, its reused prefix included
    job.sampler:accept_prompt(job.prompt)
    job.stream = self.tok:stream()
    if job.grammar then
        self.vocab = self.vocab or grammar.vocab(self.tok, self.m.n_vocab)
        job.matcher = grammar.matcher(job.grammar, self.vocab)
    end
end

-- The next token of a job from its row of logits: only tokens that can
-- continue its document when it has a grammar.
function Server:sample(job, logits)
    local saved = logprobs.bias(job.opts.lp.bias, logits)
    local id = job.sampler:sample(logits, self.m.n_vocab, job.matcher and (job.matcher:mask()))
    logprobs.unbias(saved, logits)
    if id >= 0 and job.opts.lp.on then job.lp_next = logprobs.entry(logits, self.m.n_vocab, id, job.opts.lp.top) end
    if id < 0 then
        error("no token of this model's vocabulary can continue the structured output (it lacks the bytes or the "
            .. "end-of-generation token the document needs)", 0)
    end
    return id
end

function Server:release(job)
    if job.held then
        job.held = false
        job.cart:release()
    end
    if job.slot and not job.counted then
        job.counted = true
        self.metrics:finished(job, now())
    end
    if job.sampler then job.sampler:free() end
    job.sampler = nil
    if job.matcher then job.matcher:free() end
    job.matcher = nil
    local slot = job.slot
    if slot and job.finish == "error" then
        -- what the failed work left in the cache is unknown: start afresh
        slot.loaded, slot.tokens, slot.job, slot.last_used = false, {}, nil, now()
    elseif slot then
        -- the slot remembers what its cache holds: the prompt and the
        -- completion tokens whose rows were computed
        local p = slot.cart and slot.cart.p or 0
        local rows = slot.kv:len() - p
        local tokens = {}
        for i = 1, #job.prompt do tokens[i] = job.prompt[i] end
        for _, id in ipairs(job.out_ids) do tokens[#tokens + 1] = id end
        for i = #tokens, rows + 1, -1 do tokens[i] = nil end
        slot.tokens = tokens
        slot.job = nil
        slot.last_used = now()
    end
    self.jobs[job.id] = nil
end

-- ---------------------------------------------------------------------------
-- Responses

local function usage(job)
    return {
        prompt_tokens = #job.prompt,
        completion_tokens = #job.out_ids,
        total_tokens = #job.prompt + #job.out_ids,
        prompt_tokens_details = { cached_tokens = job.cached },
    }
end

-- The log-probability entries accepted since the last call, in the job's
-- API shape; nil when the request did not ask for them.
function Server:new_logprobs(job)
    if not job.opts.lp.on then return nil end
    local i, j = job.lp_sent + 1, #job.lps
    job.lp_sent = j
    if job.kind == "text" then
        local o
        o, job.lp_chars = logprobs.legacy(self.tok, job.lps, i, j, job.lp_chars or 0)
        return o
    end
    local list = logprobs.chat(self.tok, job.lps, i, j)
    return job.kind == "chat" and { content = list, refusal = json.null } or list
end

function Server:chunk(job, delta, finish)
    local obj
    local lp = (finish or delta.content and delta.content ~= "") and job.kind ~= "messages"
        and self:new_logprobs(job) or nil
    if job.kind == "messages" then
        if delta.content and delta.content ~= "" then
            self:open_block(job)
            self:event(job, "content_block_delta", { type = "content_block_delta", index = 0,
                delta = { type = "text_delta", text = delta.content } })
        end
        if delta.tool_calls then self:tool_use_events(job, delta.tool_calls) end
        return
    elseif job.kind == "responses" then
        if delta.content and delta.content ~= "" then
            self:open_item(job)
            self:response_event(job, "response.output_text.delta", { item_id = "msg_" .. job.completion_id:sub(6),
                output_index = 0, content_index = 0, delta = delta.content, logprobs = lp or json.array() })
        end
        return
    elseif job.kind == "chat" then
        obj = { id = job.completion_id, object = "chat.completion.chunk", created = job.created, model = job.name,
            choices = json.array({ { index = 0, delta = delta, finish_reason = finish or json.null,
                logprobs = lp or json.null } }) }
    else
        obj = { id = job.completion_id, object = "text_completion", created = job.created, model = job.name,
            choices = json.array({ { index = 0, text = delta.content or "", finish_reason = finish or json.null,
                logprobs = lp or json.null } }) }
    end
    self.http:stream_write(job.id, "data: " .. json.encode(with_documents(job, obj)) .. "\n\n")
end

function Server:start_stream(job)
    self.http:stream_begin(job.id, 200, "text/event-stream", { ["Cache-Control"] = "no-cache" })
    job.streaming = true
    if job.kind == "messages" then
        self:event(job, "message_start", { type = "message_start", message = with_documents(job, { id = job.completion_id,
            type = "message", role = "assistant", model = job.name, content = json.array(), stop_reason = json.null,
            stop_sequence = json.null, usage = { input_tokens = #job.prompt - job.cached, output_tokens = 0,
                cache_read_input_tokens = job.cached, cache_creation_input_tokens = 0 } }) })
        -- with tools, the text block opens at its first text (a reply may be tool_use blocks only)
        if not job.tools then self:open_block(job) end
        self:event(job, "ping", { type = "ping" })
    elseif job.kind == "responses" then
        local obj = self:response_object(job, "in_progress")
        self:response_event(job, "response.created", { response = obj })
        self:response_event(job, "response.in_progress", { response = obj })
        -- with tools, the message item opens at its first text (a reply may be calls only)
        if not job.tools then self:open_item(job) end
    elseif job.kind == "chat" then
        self:chunk(job, { role = "assistant", content = "" })
    elseif job.echo then
        self:chunk(job, { content = job.echo })
    end
end

function Server:finish_job(job)
    local id = job.id
    local reason = job.finish == "stop" and job.stop_hit and "stop_sequence" or job.finish
    if job.kind == "messages" and self:job_calls(job) then reason = "tool_use" end
    if job.kind == "messages" and job.opts.stream then
        if not job.calls_sent then
            self:open_block(job) -- a reply with no text still has its (empty) text block
            self:event(job, "content_block_stop", { type = "content_block_stop", index = 0 })
        end
        self:event(job, "message_delta", { type = "message_delta",
            delta = { stop_reason = STOP_REASON[reason], stop_sequence = job.stop_hit or json.null },
            usage = { output_tokens = #job.out_ids } })
        self:event(job, "message_stop", { type = "message_stop" })
        self.http:stream_end(id)
    elseif job.kind == "responses" then
        local status = job.finish == "length" and "incomplete" or "completed"
        local obj, item, with_calls = self:response_object(job, status)
        if with_calls then status = "completed"; obj.status, obj.incomplete_details = status, json.null end
        if job.opts.stream then
            local part = item.content[1]
            if not with_calls and not job.item_open then self:open_item(job) end
            if job.item_open then
                self:response_event(job, "response.output_text.done", { item_id = item.id, output_index = 0,
                    content_index = 0, text = part.text, logprobs = part.logprobs })
                self:response_event(job, "response.content_part.done", { item_id = item.id, output_index = 0,
                    content_index = 0, part = part })
                self:response_event(job, "response.output_item.done", { output_index = 0, item = item })
            end
            for index, out in ipairs(with_calls or {}) do
                if out.type == "function_call" then
                    local added = { type = "function_call", id = out.id, call_id = out.call_id, name = out.name,
                        arguments = "", status = "in_progress" }
                    self:response_event(job, "response.output_item.added", { output_index = index - 1, item = added })
                    self:response_event(job, "response.function_call_arguments.delta", { item_id = out.id,
                        output_index = index - 1, delta = out.arguments })
                    self:response_event(job, "response.function_call_arguments.done", { item_id = out.id,
                        output_index = index - 1, arguments = out.arguments })
                    self:response_event(job, "response.output_item.done", { output_index = index - 1, item = out })
                end
            end
            self:response_event(job, status == "completed" and "response.completed" or "response.incomplete",
                { response = obj })
            self.http:stream_end(id)
        else
            obj.output_text = job.text
            self.http:respond(id, 200, "application/json", json.encode(obj))
        end
    elseif job.kind == "messages" then
        -- ordered: each tool_use input keeps the keys in the order the model wrote them
        self.http:respond(id, 200, "application/json", json.encode(with_documents(job, { id = job.completion_id,
            type = "message", role = "assistant", model = job.name, content = self:message_content(job),
            stop_reason = STOP_REASON[reason], stop_sequence = job.stop_hit or json.null, usage = anthropic_usage(job) }),
            { ordered = true }))
    elseif job.opts.stream then
        if job.kind == "chat" then self:chunk(job, json.object(), self:job_calls(job) and "tool_calls" or job.finish)
        else self:chunk(job, { content = "" }, job.finish) end
        if job.opts.include_usage then
            local obj = { id = job.completion_id, object = job.kind == "chat" and "chat.completion.chunk" or "text_completion",
                created = job.created, model = job.name, choices = json.array(), usage = usage(job) }
            self.http:stream_write(id, "data: " .. json.encode(with_documents(job, obj)) .. "\n\n")
        end
        self.http:stream_write(id, "data: [DONE]\n\n")
        self.http:stream_end(id)
    else
        local obj
        if job.kind == "chat" then
            local calls, content = self:job_calls(job)
            local message = { role = "assistant", content = job.text }
            if calls then message = { role = "assistant", content = content or json.null, tool_calls = calls } end
            obj = { id = job.completion_id, object = "chat.completion", created = job.created, model = job.name,
                choices = json.array({ { index = 0, message = message, finish_reason = calls and "tool_calls" or job.finish,
                    logprobs = self:new_logprobs(job) or json.null } }), usage = usage(job) }
        else
            obj = { id = job.completion_id, object = "text_completion", created = job.created, model = job.name,
                choices = json.array({ { index = 0, text = (job.echo or "") .. job.text, finish_reason = job.finish,
                    logprobs = self:new_logprobs(job) or json.null } }),
                usage = usage(job) }
        end
        self.http:respond(id, 200, "application/json", json.encode(with_documents(job, obj)))
    end
    self.log(("%s %s%s %d+%d tokens (%d cached) %s %.2f s"):format(job.kind, job.name,
        job.documents and (" [" .. table.concat(job.documents, ", ") .. "]") or "", #job.prompt, #job.out_ids,
        job.cached, job.finish, now() - job.received))
    self:release(job)
end

local pending_stop = require("cartridge.generate").pending_stop

-- A forced tool call (tool_choice required or named) cut short by
-- max_tokens or a stop sequence: the reply holds no broken call, only its
-- finish reason ("length" or "stop"), with empty content.
function Server:drop_broken_call(job)
    if job.call_close then job.text = "" end
end

-- Takes the sampled token of a running job; returns true when it finished.
function Server:accept(job, id)
    if self.tok:is_eog(id) then
        job.finish = "stop"
        job.text = job.text .. job.stream:flush() .. (job.call_close or "")
        return true
    end
    if job.matcher then job.matcher:accept(id) end
    job.sampler:accept(id)
    job.out_ids[#job.out_ids + 1] = id
    if job.lp_next then job.lps[#job.lps + 1], job.lp_next = job.lp_next, nil end
    job.text = job.text .. job.stream:push(id)
    for _, s in ipairs(job.opts.stop) do
        local at = job.text:find(s, 1, true)
        if at then
            job.text = job.text:sub(1, at - 1)
            job.finish, job.stop_hit = "stop", s
            self:drop_broken_call(job)
            return true
        end
    end
    if job.matcher and job.matcher:done() then
        -- the document is complete and nothing can follow: no need to wait for an end token
        job.finish = "stop"
        job.text = job.text .. job.stream:flush() .. (job.call_close or "")
        return true
    end
    if #job.out_ids >= job.opts.max_tokens then
        job.finish = "length"
        job.text = job.text .. job.stream:flush()
        self:drop_broken_call(job)
        return true
    end
    if job.opts.stream then
        local ready = #job.text - pending_stop(job.text, job.opts.stop)
        if job.tools then ready = math.min(ready, toolcall.visible(job.text, self.template)) end
        if ready > job.sent then
            self:chunk(job, { content = job.text:sub(job.sent + 1, ready) })
            job.sent = ready
        end
    end
    return false
end

-- Sends what is left of a streamed text before the final chunk.
-- With tools, a text that ends in well-formed calls sends its content, then
-- the calls as one tool_calls delta.
function Server:flush_text(job)
    if not job.opts.stream then return end
    local calls, content = self:job_calls(job)
    if calls then
        local n = content and #content or 0
        if n > job.sent then self:chunk(job, { content = content:sub(job.sent + 1) }) end
        job.sent = #job.text
        self:chunk(job, { tool_calls = calls })
        return
    end
    if #job.text > job.sent then
        self:chunk(job, { content = job.text:sub(job.sent + 1) })
        job.sent = #job.text
    end
end

function Server:dequeue(job)
    for i, q in ipairs(self.queue) do
        if q == job then return table.remove(self.queue, i) end
    end
end

-- Fails one job after an internal error: a 500 JSON error (mid-stream, an
-- error event and the end of the stream), one log line with its request id,
-- and its slot freed. The server goes on serving the others.
function Server:fail(job, err)
    local message = type(err) == "string" and err or tostring(err)
    self.log(("internal error in request %d (%s): %s"):format(job.id, job.completion_id or "-", message))
    job.finish = "error"
    self:dequeue(job)
    local route = job.kind == "messages" and "/v1/messages" or nil
    local body = route_error(route, 500, "internal error: " .. message, "server_error")
    pcall(function()
        if not self.http:is_open(job.id) then return end
        if job.streaming and route then
            self.http:stream_write(job.id, "event: error\ndata: " .. body .. "\n\n")
            self.http:stream_end(job.id)
        elseif job.streaming and job.kind == "responses" then
            self:response_event(job, "error", { code = "server_error", message = "internal error: " .. message,
                param = json.null })
            self.http:stream_end(job.id)
        elseif job.streaming then
            self.http:stream_write(job.id, "data: " .. body .. "\n\n")
            self.http:stream_end(job.id)
        else
            self.http:respond(job.id, 500, "application/json", body)
        end
    end)
    local ok, why = pcall(self.release, self, job)
    if not ok then
        self.log("internal error while releasing request " .. job.id .. ": " .. tostring(why))
        if job.slot then job.slot.job, job.slot.loaded = nil, false end
        self.jobs[job.id] = nil
    end
end

-- Calls f(...) for one job; an error fails that job. Returns ok, result.
function Server:guarded(job, f, ...)
    local ok, result = pcall(f, ...)
    if not ok then self:fail(job, result) end
    return ok, result
end

-- ---------------------------------------------------------------------------
-- Handling HTTP events

-- The entries of GET /v1/models: the bare model, its aliases, the
-- cartridges and the fleet.
function Server:models_list()
    local data = { { id = self.model_name, object = "model", created = self.created, owned_by = "cartridge" } }
    local aliases = {}
    for a in pairs(self.aliases) do aliases[#aliases + 1] = a end
    table.sort(aliases)
    for _, a in ipairs(aliases) do
        data[#data + 1] = { id = a, object = "model", created = self.created, owned_by = "cartridge",
            alias_of = self.model_name }
    end
    local names = {}
    for name in pairs(self.cartridges) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
        data[#data + 1] = { id = name, object = "model", created = self.created, owned_by = "cartridge",
            cartridge = { p = self.cartridges[name].p, base_model = self.model_name, kv_rows = self.cartridges[name].p,
                kv_bytes = self.m:kv_bytes(self.cartridges[name].p, self.kv_dtype) } }
    end
    if self.fleet then
        local f = self.fleet
        data[#data + 1] = { id = f.name, object = "model", created = self.created, owned_by = "cartridge",
            fleet = { documents = #f.man.docs, rag_docs = f.rag_docs, budget = f.budget, base_model = self.model_name } }
    end
    return data
end

function Server:models_body()
    return json.encode({ object = "list", data = json.array(self:models_list()) })
end

local ROUTES = {
    ["/health"] = { GET = true },
    ["/metrics"] = { GET = true },
    ["/v1/models"] = { GET = true },
    ["/v1/chat/completions"] = { POST = true },
    ["/v1/completions"] = { POST = true },
    ["/v1/messages"] = { POST = true },
    ["/v1/responses"] = { POST = true },
}

for route, method in pairs(utility.ROUTES) do ROUTES[route] = { [method] = true } end
for route, method in pairs(webui.ROUTES) do ROUTES[route] = { [method] = true } end

-- The route a path names: itself, the /v1 route it abbreviates, a utility
-- route (with the model id of /v1/models/{id}) or the web page's (with the
-- file of /web/{file}).
local function route_of(path)
    local route, id = utility.route_of(path)
    if route then return route, id end
    route, id = webui.route_of(path)
    if route then return route, id end
    if ROUTES[path] then return path end
    if ROUTES["/v1" .. path] then return "/v1" .. path end
    return nil
end

function Server:on_request(id)
    local req = self.http:request(id)
    req.route, req.model_id = route_of(req.path)
    self.metrics:route(id, req.route)
    local allowed = ROUTES[req.route]
    if req.method == "OPTIONS" and self.cors and allowed then
        -- a browser's preflight: which methods and headers a page may use
        local methods = { "OPTIONS" }
        for k in pairs(allowed) do methods[#methods + 1] = k end
        table.sort(methods)
        return self.http:respond(id, 204, nil, "", { ["Access-Control-Allow-Methods"] = table.concat(methods, ", "),
            ["Access-Control-Allow-Headers"] = "Authorization, Content-Type, x-api-key, anthropic-version",
            ["Access-Control-Max-Age"] = "86400" })
    end
    if webui.STATIC[req.route] and not self.webui then allowed = nil end
    if not allowed then
        return self.http:respond(id, 404, "application/json",
            error_body(("Unknown endpoint %s %s"):format(req.method, req.path), "invalid_request_error", nil, "not_found"))
    end
    local function fail_with(status, message, type_, param, code, headers)
        return self.http:respond(id, status, "application/json", route_error(req.route, status, message, type_, param,
            code), headers)
    end
    if not allowed[req.method] then
        local methods = {}
        for k in pairs(allowed) do methods[#methods + 1] = k end
        return fail_with(405, ("%s does not accept %s; use %s"):format(req.path, req.method, table.concat(methods, ", ")),
            nil, nil, nil, { Allow = table.concat(methods, ", ") })
    end
    if webui.STATIC[req.route] then -- the page itself: no API key (it holds no data)
        local status, ctype, body = webui.static(req.model_id)
        return self.http:respond(id, status, ctype, body, { ["Cache-Control"] = "no-cache" })
    end
    if req.route == "/health" then
        local busy = 0
        for _, slot in ipairs(self.slots) do
            if slot.job then busy = busy + 1 end
        end
        return self.http:respond(id, 200, "application/json", json.encode({ status = "ok",
            slots_idle = #self.slots - busy, slots_processing = busy, queue = #self.queue }))
    end
    local ok, job = pcall(function()
        check_auth(self, req)
        if req.route == "/v1/models" or req.route == "/metrics" then return req.route end
        if webui.ROUTES[req.route] then
            return { utility = webui.handle(self, req, req.method == "POST" and parse_json(req) or nil) }
        end
        if utility.ROUTES[req.route] then
            -- a slot's erase may come without a body, as llama-server takes it
            local bodyless = req.route == "/slots/{id}" and (req.body or "") == ""
            return { utility = utility.handle(self, req, req.method == "POST" and not bodyless and parse_json(req)
                or nil) }
        end
        return self:make_jobs(id, req)
    end)
    if not ok then
        if getmetatable(job) == RequestError then
            return fail_with(job.status, job.message, job.type or "invalid_request_error", job.param, job.code)
        end
        self.log("internal error: " .. tostring(job))
        return fail_with(500, "internal error: " .. tostring(job), "server_error")
    end
    if job == "/v1/models" then return self.http:respond(id, 200, "application/json", self:models_body()) end
    if type(job) == "table" and job.utility then return self.http:respond(id, 200, "application/json", job.utility) end
    if job == "/metrics" then return self.http:respond(id, 200, metrics.CONTENT_TYPE, self.metrics:render(self)) end
    -- Waiting jobs first fill the free slots (at the next admit), then the
    -- queue: requests that arrive together are counted against both.
    local free = 0
    for _, slot in ipairs(self.slots) do
        if not slot.job then free = free + 1 end
    end
    local list = job.group or { job }
    if #self.queue + #list > self.queue_limit + free then
        if job.group then choices.forget(self.http, list[1].id) end
        return fail_with(429, ("The server is busy (%d requests waiting); retry later."):format(#self.queue),
            "rate_limit_error", nil, "queue_full", { ["Retry-After"] = "1" })
    end
    if job.group then self.groups[id] = list end
    for _, j in ipairs(list) do
        self.jobs[j.id] = j
        self.queue[#self.queue + 1] = j
    end
end

function Server:on_closed(id)
    if self.groups[id] then -- every choice of the request
        for _, child in ipairs(self.groups[id]) do self:on_closed(child.id) end
        self.groups[id] = nil
        return
    end
    local job = self.jobs[id]
    if not job then return end
    self:dequeue(job)
    job.finish = "cancelled"
    self.log(("client went away: %s after %d tokens"):format(job.completion_id, #job.out_ids))
    self:release(job)
end

-- ---------------------------------------------------------------------------
-- The loop

-- Moves waiting jobs into free slots and prefills them (one pass for all).
-- An error fails the jobs it touches, never the loop.
function Server:admit()
    local started = {}
    local at = 1
    while at <= #self.queue do
        local job = self.queue[at]
        local slot = self:choose_slot(job)
        if not slot then break end
        if job.cart and job.cart.acquire and not job.held then
            -- a fleet's cartridges are mapped within its budget: this request
            -- waits while others hold it, and the requests behind it that
            -- need no more of it go first. A document that cannot be mapped
            -- (missing, damaged, another model's) fails this request, named
            -- and logged, and the queue goes on
            local ok, got = pcall(job.cart.acquire, job.cart)
            if not ok then
                self:fail(job, got)
                goto continue
            end
            if not got then
                at = at + 1
                goto continue
            end
            job.held = true
        end
        table.remove(self.queue, at)
        if self:guarded(job, function()
                self:bind(job, slot)
                if job.opts.stream then self:start_stream(job) end
            end) then
            started[#started + 1] = job
        end
        ::continue::
    end
    if #started == 0 then return end
    local kvs, ids = {}, {}
    for i, job in ipairs(started) do kvs[i], ids[i] = job.slot.kv, job.pending end
    local ok, logits = pcall(self.m.forward_batch, self.m, kvs, ids, "last")
    if not ok then
        for _, job in ipairs(started) do self:fail(job, logits) end
        return
    end
    for i, job in ipairs(started) do
        self:guarded(job, function()
            for _, t in ipairs(job.pending) do job.slot.tokens[#job.slot.tokens + 1] = t end
            job.next = self:sample(job, logits + (i - 1) * self.m.n_vocab)
            self.metrics:first_token(job, now())
        end)
    end
end

-- One lockstep step for every running job.
function Server:step()
    local running = {}
    for _, s in ipairs(self.slots) do
        if s.job and s.job.next then running[#running + 1] = s.job end
    end
    if #running == 0 then return false end
    local kvs, ids, live = {}, {}, {}
    for _, job in ipairs(running) do
        self:guarded(job, function()
            if not self.http:is_open(job.id) then
                self:on_closed(job.id)
            elseif self:accept(job, job.next) then
                self:flush_text(job)
                self:finish_job(job)
            else
                kvs[#kvs + 1], ids[#ids + 1] = job.slot.kv, { job.next }
                live[#live + 1] = job
            end
        end)
    end
    if #live == 0 then return true end
    local ok, logits = pcall(self.m.forward_batch, self.m, kvs, ids, "last")
    if not ok then
        for _, job in ipairs(live) do self:fail(job, logits) end
        return true
    end
    for i, job in ipairs(live) do
        self:guarded(job, function()
            job.slot.tokens[#job.slot.tokens + 1] = job.next
            job.next = self:sample(job, logits + (i - 1) * self.m.n_vocab)
            self.metrics:next_token(job, now())
        end)
    end
    return true
end

-- One HTTP event. An error while handling a request answers it with a 500.
function Server:on_event(ev)
    if ev.kind == "request" then
        local ok, err = pcall(self.on_request, self, ev.id)
        if not ok then
            local job = self.jobs[ev.id]
            if job then return self:fail(job, err) end
            self.log(("internal error in request %d: %s"):format(ev.id, tostring(err)))
            pcall(self.http.respond, self.http, ev.id, 500, "application/json",
                error_body("internal error: " .. tostring(err), "server_error"))
        end
    elseif ev.kind == "closed" then
        self.metrics:closed(ev.id)
        self:on_closed(ev.id)
    elseif ev.kind == "signal" then
        self.log("signal received: shutting down")
        self.running = false
    end
end

-- The last line of defence: an error that escaped admit or step fails the
-- jobs that were running, and the loop goes on.
function Server:turn()
    local ok, err = pcall(function()
        self:admit()
        self:step()
    end)
    if not ok then
        for _, s in ipairs(self.slots) do
            if s.job then self:fail(s.job, err) end
        end
    end
end

-- Runs until a signal (SIGINT/SIGTERM) or until stop() is called.
function Server:run()
    self.running = true
    while self.running do
        local busy = #self.queue > 0
        for _, s in ipairs(self.slots) do busy = busy or s.job ~= nil end
        self.http:poll(busy and 0 or 100)
        for ev in self.http:events() do self:on_event(ev) end
        if self.running then self:turn() end
    end
    -- clean shutdown: running requests end with what they have
    for _, s in ipairs(self.slots) do
        if s.job then
            s.job.finish = s.job.finish or "length"
            if self.http:is_open(s.job.id) then
                self:flush_text(s.job)
                self:finish_job(s.job)
            else
                self:release(s.job)
            end
        end
    end
    for _, job in ipairs(self.queue) do
        self.http:respond(job.id, 503, "application/json", route_error(job.kind == "messages" and "/v1/messages" or nil,
            503, "The server is shutting down.", "server_error"))
    end
    self.queue = {}
    self.http:drain(1000) -- let queued output reach the clients
    -- the disk tier keeps what the slots hold for the next start
    for _, s in ipairs(self.slots) do self:spill_slot(s) end
end

function Server:stop()
    self.running = false
end

server.error_body = error_body
return server
