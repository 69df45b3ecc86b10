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
-- when none is left, least recently used first.
--
-- Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
-- GET /health. Errors are OpenAI-shaped: {"error": {"message", "type",
-- "param", "code"}}.

local core = require("cartridge.core")
local json = require("cartridge.json")
local chat = require("cartridge.chat")
local sampler_mod = require("cartridge.sampler")
local C = core.C

local server = {}

local function now() return C.cart_now_seconds() end

-- ---------------------------------------------------------------------------
-- Errors and small helpers

local function error_body(message, type_, param, code)
    return json.encode({ error = { message = message, type = type_ or "invalid_request_error",
        param = param or json.null, code = code or json.null } })
end

-- A request error: raised inside request handling, answered with status.
local RequestError = {}
RequestError.__index = RequestError
local function reject(status, message, param, code, type_)
    error(setmetatable({ status = status, message = message, param = param, code = code, type = type_ }, RequestError), 0)
end

local function is_int(v) return type(v) == "number" and v == math.floor(v) end

-- ---------------------------------------------------------------------------
-- The server object

local Server = {}
Server.__index = Server

-- opts: model (cartridge.model), cartridges ({ name = Cart }), model_name,
-- http (cartridge.http server), parallel (slots), ctx (rows per slot after
-- the cartridge), api_key, max_tokens_limit, max_messages, queue_limit,
-- default_max_tokens, log (function(line) or nil).
function server.new(opts)
    local self = setmetatable({}, Server)
    self.m = opts.model
    self.tok = self.m:tokenizer()
    self.template = chat.for_model(self.m)
    self.http = opts.http
    self.cartridges = opts.cartridges or {}
    self.model_name = opts.model_name
    self.api_key = opts.api_key
    self.max_tokens_limit = opts.max_tokens_limit or 4096
    self.default_max_tokens = opts.default_max_tokens or 256
    self.max_messages = opts.max_messages or 256
    self.queue_limit = opts.queue_limit or 64
    self.log = opts.log or function() end
    self.created = os.time()
    self.queue = {}   -- jobs waiting for a slot
    self.jobs = {}    -- request id -> job
    self.counter = 0
    local max_p = 0
    for _, c in pairs(self.cartridges) do max_p = math.max(max_p, c.p) end
    self.ctx = opts.ctx or 4096
    self.slots = {}
    for i = 1, opts.parallel or 4 do
        self.slots[i] = { id = i, kv = self.m:new_kv(max_p + self.ctx, opts.kv or "f16"), cart = nil,
            tokens = {}, last_used = 0, job = nil }
    end
    return self
end

function Server:free()
    for _, s in ipairs(self.slots) do s.kv:free() end
    self.slots = {}
end

-- ---------------------------------------------------------------------------
-- Request parsing

local function check_auth(self, req)
    if not self.api_key then return end
    local h = req.header("authorization") or ""
    local token = h:match("^[Bb]earer%s+(.+)$")
    if token ~= self.api_key then
        reject(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.", nil, "invalid_api_key")
    end
end

-- The body is read as JSON whatever Content-Type says (curl -d sends
-- application/x-www-form-urlencoded, and llama.cpp's server accepts that too).
local function parse_json(req)
    local ok, body = pcall(json.decode, req.body)
    if not ok then reject(400, "The body is not valid JSON: " .. tostring(body)) end
    if type(body) ~= "table" or #body > 0 then reject(400, "The body must be a JSON object.") end
    return body
end

local function content_text(content, i)
    if type(content) == "string" then return content end
    if type(content) == "table" then
        local parts = {}
        for j, part in ipairs(content) do
            if type(part) ~= "table" or part.type ~= "text" or type(part.text) ~= "string" then
                reject(400, ("messages[%d].content[%d] must be a {\"type\": \"text\", \"text\": ...} part"):format(i - 1, j - 1),
                    "messages")
            end
            parts[#parts + 1] = part.text
        end
        return table.concat(parts)
    end
    reject(400, ("messages[%d].content must be a string or an array of text parts"):format(i - 1), "messages")
end

local function check_utf8(s, what)
    if C.cart_utf8_invalid_offset(s, #s) >= 0 then reject(400, what .. " is not valid UTF-8") end
end

-- Sampling and stopping options shared by both completion endpoints.
function Server:common_options(body)
    local o = {}
    local mt = body.max_completion_tokens
    if mt == nil or mt == json.null then mt = body.max_tokens end
    if mt == nil or mt == json.null then mt = self.default_max_tokens end
    if not is_int(mt) or mt < 1 then reject(400, "max_tokens must be a positive integer", "max_tokens") end
    if mt > self.max_tokens_limit then
        reject(400, ("max_tokens %d is above this server's limit of %d"):format(mt, self.max_tokens_limit), "max_tokens")
    end
    o.max_tokens = mt
    local function number(name, lo, hi, default)
        local v = body[name]
        if v == nil or v == json.null then return default end
        if type(v) ~= "number" or v < lo or v > hi then
            reject(400, ("%s must be a number in [%g, %g]"):format(name, lo, hi), name)
        end
        return v
    end
    o.temperature = number("temperature", 0, 2, 1)
    o.top_p = number("top_p", 0, 1, 1)
    if o.top_p == 0 then o.top_p = 1e-6 end
    o.top_k = body.top_k
    if o.top_k == nil or o.top_k == json.null then o.top_k = 0 end
    if not is_int(o.top_k) or o.top_k < 0 then reject(400, "top_k must be a non-negative integer", "top_k") end
    o.min_p = number("min_p", 0, 1, 0)
    local seed = body.seed
    if seed ~= nil and seed ~= json.null and not is_int(seed) then reject(400, "seed must be an integer", "seed") end
    o.seed = (seed ~= nil and seed ~= json.null) and seed or 0
    local n = body.n
    if n ~= nil and n ~= json.null and n ~= 1 then reject(400, "only n = 1 is supported", "n") end
    local stop = body.stop
    o.stop = {}
    if type(stop) == "string" then
        o.stop = { stop }
    elseif type(stop) == "table" then
        if #stop > 4 then reject(400, "at most 4 stop sequences", "stop") end
        for _, s in ipairs(stop) do
            if type(s) ~= "string" or s == "" then reject(400, "stop must be non-empty strings", "stop") end
            o.stop[#o.stop + 1] = s
        end
    elseif stop ~= nil and stop ~= json.null then
        reject(400, "stop must be a string or an array of strings", "stop")
    end
    if body.stream ~= nil and body.stream ~= json.null and type(body.stream) ~= "boolean" then
        reject(400, "stream must be a boolean", "stream")
    end
    o.stream = body.stream == true
    local so = body.stream_options
    o.include_usage = type(so) == "table" and so.include_usage == true
    return o
end

-- The cartridge (or nil: the bare model) a request's "model" names.
function Server:pick(body)
    local name = body.model
    if name == nil or name == json.null then return nil, self.model_name end
    if type(name) ~= "string" then reject(400, "model must be a string", "model") end
    if name == self.model_name then return nil, name end
    local c = self.cartridges[name]
    if not c then
        reject(404, ("The model '%s' does not exist; GET /v1/models lists them."):format(name), "model",
            "model_not_found")
    end
    return c, name
end

function Server:parse_chat(body)
    local msgs = body.messages
    if type(msgs) ~= "table" or #msgs == 0 then reject(400, "messages must be a non-empty array", "messages") end
    if #msgs > self.max_messages then
        reject(400, ("%d messages is above this server's limit of %d"):format(#msgs, self.max_messages), "messages")
    end
    local out = {}
    for i, msg in ipairs(msgs) do
        if type(msg) ~= "table" then reject(400, ("messages[%d] must be an object"):format(i - 1), "messages") end
        local role = msg.role
        if role ~= "system" and role ~= "user" and role ~= "assistant" and role ~= "developer" then
            reject(400, ("messages[%d].role must be system, user or assistant"):format(i - 1), "messages")
        end
        if role == "developer" then role = "system" end
        local text = content_text(msg.content, i)
        check_utf8(text, ("messages[%d].content"):format(i - 1))
        out[i] = { role = role, content = text }
    end
    if out[#out].role == "assistant" then reject(400, "the last message must not be the assistant's", "messages") end
    return out
end

-- ---------------------------------------------------------------------------
-- Jobs

-- Builds a job from a request, or raises a RequestError.
function Server:make_job(id, req)
    local body = parse_json(req)
    local cart, name = self:pick(body)
    local o = self:common_options(body)
    local kind, text
    if req.path == "/v1/chat/completions" then
        kind = "chat"
        text = chat.render(self.template, self:parse_chat(body))
    else
        kind = "text"
        local prompt = body.prompt
        if type(prompt) == "table" and #prompt == 1 and type(prompt[1]) == "string" then prompt = prompt[1] end
        if type(prompt) ~= "string" then reject(400, "prompt must be a string", "prompt") end
        check_utf8(prompt, "prompt")
        text = prompt
    end
    local ids = self.tok:encode(text, { special = kind == "chat", add_special = cart == nil })
    if #ids == 0 then reject(400, "the prompt is empty", kind == "chat" and "messages" or "prompt") end
    if #ids + o.max_tokens > self.ctx then
        reject(400, ("This request needs %d prompt + %d completion tokens, but the context holds %d; "
            .. "shorten the prompt or lower max_tokens."):format(#ids, o.max_tokens, self.ctx), "messages",
            "context_length_exceeded")
    end
    self.counter = self.counter + 1
    return {
        id = id, kind = kind, name = name, cart = cart, prompt = ids, opts = o,
        out_ids = {}, text = "", sent = 0, finish = nil, cached = 0,
        completion_id = (kind == "chat" and "chatcmpl-" or "cmpl-") .. ("%d%06d"):format(self.created, self.counter),
        received = now(),
    }
end

local function common_prefix(a, b)
    local n = 0
    while n < #a and n < #b and a[n + 1] == b[n + 1] do n = n + 1 end
    return n
end

-- The free slot for a job: same cartridge with the longest common prefix;
-- else the least recently used. nil when every slot is busy.
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
    return best or lru
end

-- Puts the job in a slot: cartridge rows, reused prefix, prefill ids left.
function Server:bind(job, slot)
    job.slot = slot
    slot.job = job
    slot.last_used = now()
    local p = job.cart and job.cart.p or 0
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
    job.sampler = sampler_mod.new({ temperature = job.opts.temperature == 0 and 0 or job.opts.temperature,
        top_p = job.opts.top_p, top_k = job.opts.top_k, min_p = job.opts.min_p, seed = job.opts.seed })
    job.stream = self.tok:stream()
end

function Server:release(job)
    if job.sampler then job.sampler:free() end
    local slot = job.slot
    if slot then
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

function Server:chunk(job, delta, finish)
    local obj
    if job.kind == "chat" then
        obj = { id = job.completion_id, object = "chat.completion.chunk", created = self.created, model = job.name,
            choices = json.array({ { index = 0, delta = delta, finish_reason = finish or json.null, logprobs = json.null } }) }
    else
        obj = { id = job.completion_id, object = "text_completion", created = self.created, model = job.name,
            choices = json.array({ { index = 0, text = delta.content or "", finish_reason = finish or json.null,
                logprobs = json.null } }) }
    end
    self.http:stream_write(job.id, "data: " .. json.encode(obj) .. "\n\n")
end

function Server:start_stream(job)
    self.http:stream_begin(job.id, 200, "text/event-stream", { ["Cache-Control"] = "no-cache" })
    if job.kind == "chat" then self:chunk(job, { role = "assistant", content = "" }) end
end

function Server:finish_job(job)
    local id = job.id
    if job.opts.stream then
        if job.kind == "chat" then self:chunk(job, json.object(), job.finish)
        else self:chunk(job, { content = "" }, job.finish) end
        if job.opts.include_usage then
            local obj = { id = job.completion_id, object = job.kind == "chat" and "chat.completion.chunk" or "text_completion",
                created = self.created, model = job.name, choices = json.array(), usage = usage(job) }
            self.http:stream_write(id, "data: " .. json.encode(obj) .. "\n\n")
        end
        self.http:stream_write(id, "data: [DONE]\n\n")
        self.http:stream_end(id)
    else
        local obj
        if job.kind == "chat" then
            obj = { id = job.completion_id, object = "chat.completion", created = self.created, model = job.name,
                choices = json.array({ { index = 0, message = { role = "assistant", content = job.text },
                    finish_reason = job.finish, logprobs = json.null } }), usage = usage(job) }
        else
            obj = { id = job.completion_id, object = "text_completion", created = self.created, model = job.name,
                choices = json.array({ { index = 0, text = job.text, finish_reason = job.finish, logprobs = json.null } }),
                usage = usage(job) }
        end
        self.http:respond(id, 200, "application/json", json.encode(obj))
    end
    self.log(("%s %s %d+%d tokens (%d cached) %s %.2f s"):format(job.kind, job.name, #job.prompt, #job.out_ids,
        job.cached, job.finish, now() - job.received))
    self:release(job)
end

local pending_stop = require("cartridge.generate").pending_stop

-- Takes the sampled token of a running job; returns true when it finished.
function Server:accept(job, id)
    if self.tok:is_eog(id) then
        job.finish = "stop"
        job.text = job.text .. job.stream:flush()
        return true
    end
    job.sampler:accept(id)
    job.out_ids[#job.out_ids + 1] = id
    job.text = job.text .. job.stream:push(id)
    for _, s in ipairs(job.opts.stop) do
        local at = job.text:find(s, 1, true)
        if at then
            job.text = job.text:sub(1, at - 1)
            job.finish = "stop"
            return true
        end
    end
    if #job.out_ids >= job.opts.max_tokens then
        job.finish = "length"
        job.text = job.text .. job.stream:flush()
        return true
    end
    if job.opts.stream then
        local ready = #job.text - pending_stop(job.text, job.opts.stop)
        if ready > job.sent then
            self:chunk(job, { content = job.text:sub(job.sent + 1, ready) })
            job.sent = ready
        end
    end
    return false
end

-- Sends what is left of a streamed text before the final chunk.
function Server:flush_text(job)
    if job.opts.stream and #job.text > job.sent then
        self:chunk(job, { content = job.text:sub(job.sent + 1) })
        job.sent = #job.text
    end
end

-- ---------------------------------------------------------------------------
-- Handling HTTP events

function Server:models_body()
    local data = { { id = self.model_name, object = "model", created = self.created, owned_by = "cartridge" } }
    local names = {}
    for name in pairs(self.cartridges) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
        data[#data + 1] = { id = name, object = "model", created = self.created, owned_by = "cartridge",
            cartridge = { p = self.cartridges[name].p, base_model = self.model_name } }
    end
    return json.encode({ object = "list", data = json.array(data) })
end

local ROUTES = {
    ["/health"] = { GET = true },
    ["/v1/models"] = { GET = true },
    ["/v1/chat/completions"] = { POST = true },
    ["/v1/completions"] = { POST = true },
}

function Server:on_request(id)
    local req = self.http:request(id)
    local allowed = ROUTES[req.path]
    if not allowed then
        return self.http:respond(id, 404, "application/json",
            error_body(("Unknown endpoint %s %s"):format(req.method, req.path), "invalid_request_error", nil, "not_found"))
    end
    if not allowed[req.method] then
        local methods = {}
        for k in pairs(allowed) do methods[#methods + 1] = k end
        return self.http:respond(id, 405, "application/json",
            error_body(("%s does not accept %s; use %s"):format(req.path, req.method, table.concat(methods, ", "))),
            { Allow = table.concat(methods, ", ") })
    end
    if req.path == "/health" then
        return self.http:respond(id, 200, "application/json", json.encode({ status = "ok" }))
    end
    local ok, job = pcall(function()
        check_auth(self, req)
        if req.path == "/v1/models" then return "models" end
        return self:make_job(id, req)
    end)
    if not ok then
        if getmetatable(job) == RequestError then
            return self.http:respond(id, job.status, "application/json",
                error_body(job.message, job.type or (job.status == 401 and "invalid_request_error" or "invalid_request_error"),
                    job.param, job.code))
        end
        self.log("internal error: " .. tostring(job))
        return self.http:respond(id, 500, "application/json", error_body("internal error: " .. tostring(job), "server_error"))
    end
    if job == "models" then return self.http:respond(id, 200, "application/json", self:models_body()) end
    -- Waiting jobs first fill the free slots (at the next admit), then the
    -- queue: requests that arrive together are counted against both.
    local free = 0
    for _, slot in ipairs(self.slots) do
        if not slot.job then free = free + 1 end
    end
    if #self.queue >= self.queue_limit + free then
        return self.http:respond(id, 429, "application/json",
            error_body(("The server is busy (%d requests waiting); retry later."):format(#self.queue), "rate_limit_error", nil,
                "queue_full"), { ["Retry-After"] = "1" })
    end
    self.jobs[id] = job
    self.queue[#self.queue + 1] = job
end

function Server:on_closed(id)
    local job = self.jobs[id]
    if not job then return end
    for i, q in ipairs(self.queue) do
        if q == job then
            table.remove(self.queue, i)
            break
        end
    end
    job.finish = "cancelled"
    self.log(("client went away: %s after %d tokens"):format(job.completion_id, #job.out_ids))
    self:release(job)
end

-- ---------------------------------------------------------------------------
-- The loop

-- Moves waiting jobs into free slots and prefills them (one pass for all).
function Server:admit()
    local started = {}
    while #self.queue > 0 do
        local job = self.queue[1]
        local slot = self:choose_slot(job)
        if not slot then break end
        table.remove(self.queue, 1)
        self:bind(job, slot)
        started[#started + 1] = job
    end
    if #started == 0 then return end
    local kvs, ids = {}, {}
    for i, job in ipairs(started) do
        kvs[i], ids[i] = job.slot.kv, job.pending
        if job.opts.stream then self:start_stream(job) end
    end
    local logits = self.m:forward_batch(kvs, ids, "last")
    for i, job in ipairs(started) do
        for _, t in ipairs(job.pending) do job.slot.tokens[#job.slot.tokens + 1] = t end
        local id = job.sampler:sample(logits + (i - 1) * self.m.n_vocab, self.m.n_vocab)
        job.next = id
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
        if not self.http:is_open(job.id) then
            self:on_closed(job.id)
        elseif self:accept(job, job.next) then
            self:flush_text(job)
            self:finish_job(job)
        else
            kvs[#kvs + 1], ids[#ids + 1] = job.slot.kv, { job.next }
            live[#live + 1] = job
        end
    end
    if #live == 0 then return true end
    local logits = self.m:forward_batch(kvs, ids, "last")
    for i, job in ipairs(live) do
        job.slot.tokens[#job.slot.tokens + 1] = job.next
        job.next = job.sampler:sample(logits + (i - 1) * self.m.n_vocab, self.m.n_vocab)
    end
    return true
end

-- Runs until a signal (SIGINT/SIGTERM) or until stop() is called.
function Server:run()
    self.running = true
    while self.running do
        local busy = #self.queue > 0
        for _, s in ipairs(self.slots) do busy = busy or s.job ~= nil end
        self.http:poll(busy and 0 or 100)
        for ev in self.http:events() do
            if ev.kind == "request" then
                self:on_request(ev.id)
            elseif ev.kind == "closed" then
                self:on_closed(ev.id)
            elseif ev.kind == "signal" then
                self.log("signal received: shutting down")
                self.running = false
            end
        end
        if self.running then
            self:admit()
            self:step()
        end
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
        self.http:respond(job.id, 503, "application/json", error_body("The server is shutting down.", "server_error"))
    end
    self.queue = {}
    self.http:drain(1000) -- let queued output reach the clients
end

function Server:stop()
    self.running = false
end

server.error_body = error_body
return server
