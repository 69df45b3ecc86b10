-- cartridge.api.request: what every API dialect reads a request with
-- (cartridge.api lists the dialects). A request error is raised with
-- reject() and answered by the server with its status, in the shape of the
-- route's API; the field readers range-check every number against the C type
-- it becomes (engine/sampler.h) before any conversion, so nothing wraps.

local core = require("cartridge.core")
local json = require("cartridge.json")
local C = core.C

local request = {}

-- OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
function request.error_body(message, type_, param, code)
    return json.encode({ error = { message = message, type = type_ or "invalid_request_error",
        param = param or json.null, code = code or json.null } })
end

-- A request error: raised inside request handling, answered with status.
local RequestError = {}
RequestError.__index = RequestError
function request.reject(status, message, param, code, type_)
    error(setmetatable({ status = status, message = message, param = param, code = code, type = type_ }, RequestError), 0)
end
local reject = request.reject

function request.is_request_error(e) return getmetatable(e) == RequestError end

-- How a value the client sent reads in an error message: numbers as sent
-- (1e309 stays 1e309), strings quoted and cut, other things by their kind.
function request.shown(v, container, key)
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
local shown = request.shown

local function int_text(v) return ("%.0f"):format(v) end

-- The limits of the C types request numbers are converted to.
local INT32_MAX = 2 ^ 31 - 1
local INT64_MIN, UINT64_END = -2 ^ 63, 2 ^ 64
request.INT32_MAX = INT32_MAX

-- body[name] as an integer in [lo, hi] (default when absent or null); with
-- open_hi, in [lo, hi) -- for a bound such as 2^64 whose predecessor a
-- double cannot hold. The range check comes before any conversion, so
-- nothing wraps.
function request.integer_field(body, name, lo, hi, default, why, open_hi)
    local v = body[name]
    if v == nil or v == json.null then return default end
    if type(v) ~= "number" or not (v >= lo and (v < hi or not open_hi and v == hi)) or v ~= math.floor(v) then
        reject(400, ("%s must be an integer in [%s, %s%s%s; got %s"):format(name, int_text(lo), int_text(hi),
            open_hi and ")" or "]", why or "", shown(v, body, name)), name)
    end
    return v
end

-- body[name] as a finite number in [lo, hi].
function request.number_field(body, name, lo, hi, default)
    local v = body[name]
    if v == nil or v == json.null then return default end
    if type(v) ~= "number" or not (v >= lo and v <= hi) then
        reject(400, ("%s must be a number in [%g, %g]; got %s"):format(name, lo, hi, shown(v, body, name)), name)
    end
    return v
end

function request.boolean_field(body, name, where)
    local v = body[name]
    if v == nil or v == json.null then return false end
    if type(v) ~= "boolean" then
        reject(400, ("%s must be a boolean; got %s"):format(where or name, shown(v, body, name)), where or name)
    end
    return v
end

-- ---------------------------------------------------------------------------
-- The server object
local integer_field, number_field, boolean_field = request.integer_field, request.number_field, request.boolean_field

function request.check_utf8(s, what)
    if C.cart_utf8_invalid_offset(s, #s) >= 0 then reject(400, what .. " is not valid UTF-8") end
end
local check_utf8 = request.check_utf8

-- body.messages, checked to be a non-empty array within the server's limit.
function request.message_list(srv, body)
    local msgs = body.messages
    if json.kind(msgs) ~= "array" or #msgs == 0 then
        reject(400, "messages must be a non-empty array; got " .. shown(msgs, body, "messages"), "messages")
    end
    if #msgs > srv.max_messages then
        reject(400, ("%d messages is above this server's limit of %d"):format(#msgs, srv.max_messages), "messages")
    end
    return msgs
end

-- Text of a content value: a string, or an array of parts whose type is
-- one of `types` (a set) and whose text is a string. Errors name `where`
-- and carry `param`; `wanted` says what parts are read.
function request.content_parts(content, where, param, types, wanted)
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


-- The OpenAI stop field: a string or an array of at most 4.
local function stop_list(body)
    local stop, out = body.stop, {}
    if type(stop) == "string" then
        if stop == "" then reject(400, 'stop must be a non-empty string (or omitted); got ""', "stop") end
        out = { stop }
    elseif json.kind(stop) == "array" then
        if #stop > 4 then reject(400, ("at most 4 stop sequences; got %d"):format(#stop), "stop") end
        for i, s in ipairs(stop) do
            if type(s) ~= "string" or s == "" then
                reject(400, ("stop[%d] must be a non-empty string; got %s"):format(i - 1, shown(s, stop, i)), "stop")
            end
            out[#out + 1] = s
        end
    elseif stop ~= nil and stop ~= json.null then
        reject(400, ("stop must be a string or an array of strings; got %s"):format(shown(stop, body, "stop")), "stop")
    end
    for _, s in ipairs(out) do check_utf8(s, "stop") end
    return out
end

-- Sampling and stopping options shared by both OpenAI completion endpoints
-- (chat and text), with the server's defaults (srv.sampling) for what the
-- request leaves out.
function request.openai_options(srv, body)
    local o = {}
    local mt_name = "max_completion_tokens"
    if body[mt_name] == nil or body[mt_name] == json.null then mt_name = "max_tokens" end
    o.max_tokens = integer_field(body, mt_name, 1, srv.max_tokens_limit, srv.default_max_tokens,
        " (this server's limit is " .. srv.max_tokens_limit .. ")")
    local d = srv.sampling
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
    if o.repeat_last_n == -1 then o.repeat_last_n = srv.ctx end
    -- a negative seed is taken as its two's complement, as a C cast would
    o.seed = integer_field(body, "seed", INT64_MIN, UINT64_END, d.seed, nil, true)
    o.stop = stop_list(body)
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

-- Whether a field's value asks for something: false, null, 0 and absent
-- ask for nothing.
function request.asks(v) return v ~= nil and v ~= json.null and v ~= false and v ~= 0 end

-- A set of field names from a space-separated list.
function request.fields(list)
    local t = {}
    for name in list:gmatch("%S+") do t[name] = true end
    return t
end

-- The fields the OpenAI completion endpoints share.
request.OPENAI_SAMPLING = "model max_tokens temperature top_p top_k min_p seed stop stream stream_options n logprobs "
    .. "logit_bias frequency_penalty presence_penalty repeat_penalty repeat_last_n response_format user "

-- Refuses a field the dialect does not read (it would otherwise be ignored
-- without a word), "store" when it asks for something, and a field of
-- dialect.unhonoured ({ name, asks(v) }) that asks for what this server does
-- not do yet: a 400 naming the field, never a reply that silently lacks it.
function request.refuse_unknown(dialect, body)
    local unknown = {}
    for k in pairs(body) do
        if not dialect.known[k] then unknown[#unknown + 1] = tostring(k) end
    end
    table.sort(unknown)
    if unknown[1] then
        reject(400, ("%s: %s does not know this field, and would ignore it; leave it out"):format(unknown[1],
            dialect.route), unknown[1])
    end
    if request.asks(body.store) then
        reject(400, "store: this server stores no responses; leave it out or set it to false", "store")
    end
    for _, f in ipairs(dialect.unhonoured or {}) do
        if f[2](body[f[1]]) then
            reject(400, ("%s: this server does not support it yet (its replies would silently lack it); leave "
                .. "it out or set it to its off value; got %s"):format(f[1], shown(body[f[1]], body, f[1])), f[1])
        end
    end
end

-- Adds the fleet's extra field to a response object: the documents whose
-- cartridges the answer went behind, in composition order.
function request.with_documents(job, obj)
    if job.documents then obj.documents = json.array({ unpack(job.documents) }) end
    return obj
end

-- OpenAI's usage object of a finished job.
function request.usage(job)
    return {
        prompt_tokens = #job.prompt,
        completion_tokens = #job.out_ids,
        total_tokens = #job.prompt + #job.out_ids,
        prompt_tokens_details = { cached_tokens = job.cached },
    }
end

-- The range of log-probability entries accepted since the last call (and
-- marks them sent); nil when the request did not ask for them.
function request.new_logprobs(job)
    if not job.opts.lp.on then return nil end
    local i, j = job.lp_sent + 1, #job.lps
    job.lp_sent = j
    return i, j
end

-- One server-sent event with a name (Responses, Messages).
function request.event(srv, job, name, obj)
    srv.http:stream_write(job.id, "event: " .. name .. "\ndata: " .. json.encode(obj) .. "\n\n")
end

-- One unnamed server-sent event (chat and text completions).
function request.data(srv, job, obj)
    srv.http:stream_write(job.id, "data: " .. json.encode(obj) .. "\n\n")
end

-- An error body in OpenAI's shape, as a dialect's error_body (status unused).
function request.openai_error(_, message, type_, param, code)
    return request.error_body(message, type_, param, code)
end

-- The end of an OpenAI stream (chat and text completions): the usage chunk
-- when stream_options.include_usage asked for it, then [DONE].
function request.openai_stream_end(srv, job, object)
    if job.opts.include_usage then
        request.data(srv, job, request.with_documents(job, { id = job.completion_id, object = object,
            created = job.created, model = job.name, choices = json.array(), usage = request.usage(job) }))
    end
    srv.http:stream_write(job.id, "data: [DONE]\n\n")
    srv.http:stream_end(job.id)
end

-- An internal error after an OpenAI stream began: one data event holding
-- the error body (the server ends the stream).
function request.openai_stream_error(srv, job, message)
    srv.http:stream_write(job.id, "data: " .. request.error_body(message, "server_error") .. "\n\n")
end

return request
