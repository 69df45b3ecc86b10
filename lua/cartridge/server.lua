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
-- Endpoints: the API dialects of cartridge.api, each a module (POST
-- /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages),
-- GET /v1/models, GET /health, GET /metrics (Prometheus text format, behind
-- the API key), llama-server's utility routes (cartridge.server_utility)
-- and the web page (cartridge.webui); every /v1 route also without the
-- prefix (/chat/completions), as llama.cpp's server and clients with a bare
-- base URL expect. Errors are in the shape of the route's API (OpenAI's:
-- {"error": {"message", "type", "param", "code"}} outside the dialects).

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
local api = require("cartridge.api")
local request = require("cartridge.api.request")
local tools_mod = require("cartridge.api.tools")
local C = core.C
local ffi = core.ffi

local server = {}

local function now() return C.cart_now_seconds() end

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local error_body = request.error_body
server.is_request_error = request.is_request_error
server.shown = shown

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
    local ranges = { temperature = { 0, 2, "--temp" }, top_p = { 0, 1, "--top-p" }, top_k = { 0, request.INT32_MAX, "--top-k" },
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


-- What cartridge.server_utility's handlers raise and show errors with.
server.util = { reject = reject, shown = shown, check_utf8 = check_utf8, is_request_error = server.is_request_error }

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


-- ---------------------------------------------------------------------------
-- Jobs

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


-- The token ids of a job's prompt. The template's markers are special
-- tokens; what the client wrote is text (its "<|im_start|>" cannot open a
-- turn) unless --parse-special; a raw prompt (text completions) is text.
function Server:prompt_ids(p, cart)
    return p.ids or self.tok:encode(p.text, { special = not p.raw, add_special = cart == nil,
        plain = not self.parse_special and p.plain or nil })
end

-- The fleet's cartridges for a conversation, retrieved over its user
-- messages (after the length check: retrieval runs the model), and their
-- document names.
function Server:fleet_select(list)
    local users = {}
    for _, msg in ipairs(list) do
        if msg.role == "user" then users[#users + 1] = msg.content end
    end
    if #users == 0 then reject(400, "a request to a fleet needs a user message to retrieve by", "messages") end
    local cart = self.fleet:select(users)
    return cart, cart.names
end

-- Builds a job from a request (body: its decoded JSON) through its route's
-- dialect (cartridge.api), or raises a RequestError.
function Server:make_job(id, req, body)
    local d = api.by_route[req.route or req.path]
    request.refuse_unknown(d, body)
    local cart, name = self:pick(body)
    local o = d.options(self, body)
    o.lp = logprobs.options(d.route, body, { reject = reject, shown = shown, n_vocab = self.m.n_vocab, tok = self.tok })
    local format = d.format and d.format(self, body, o)
    local p = d.prompt(self, body, o)
    local ids = self:prompt_ids(p, cart)
    if #ids == 0 then reject(400, "the prompt is empty", d.what) end
    if #ids + o.max_tokens > self.ctx then
        reject(400, ("This request needs %d prompt tokens (its %s) + %d completion tokens, but the context holds %d; "
            .. "shorten the %s or lower max_tokens."):format(#ids, d.what, o.max_tokens, self.ctx, d.what), d.what,
            "context_length_exceeded")
    end
    local tools = p.tools
    if tools then tools.finish() end
    local documents
    if cart and cart == self.fleet then cart, documents = self:fleet_select(p.list) end
    self.counter = self.counter + 1
    -- a forced tool call is held to its tool's schema; otherwise the reply to the response format
    local g = tools and tools.grammar or format and format.grammar
    return {
        id = id, api = d, kind = d.kind, name = name, cart = cart, prompt = ids, opts = o, tools = tools, grammar = g,
        documents = documents,
        call_close = tools and tools.grammar and "\n" .. self.template.call_close or nil,
        out_ids = {}, text = tools and tools.prefill or "", sent = 0, finish = nil, cached = 0,
        lps = {}, lp_sent = 0, -- the log-probability entries of out_ids, and how many were streamed
        echo = p.echo, -- completions' echo: the prompt, before the reply
        completion_id = d.id_prefix .. ("%d%06d"):format(self.created, self.counter),
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
-- Replies (their shape is the dialect's)

function Server:start_stream(job)
    self.http:stream_begin(job.id, 200, "text/event-stream", { ["Cache-Control"] = "no-cache" })
    job.streaming = true
    job.api.start(self, job)
end

function Server:finish_job(job)
    job.api.finish(self, job)
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
            job.api.delta(self, job, { content = job.text:sub(job.sent + 1, ready) })
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
    local calls, content = tools_mod.calls(self, job)
    if calls then
        local n = content and #content or 0
        if n > job.sent then job.api.delta(self, job, { content = content:sub(job.sent + 1) }) end
        job.sent = #job.text
        job.api.delta(self, job, { tool_calls = calls })
        return
    end
    if #job.text > job.sent then
        job.api.delta(self, job, { content = job.text:sub(job.sent + 1) })
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
    pcall(function()
        if not self.http:is_open(job.id) then return end
        if job.streaming then
            job.api.stream_error(self, job, "internal error: " .. message)
            self.http:stream_end(job.id)
        else
            self.http:respond(job.id, 500, "application/json", job.api.error_body(500, "internal error: " .. message,
                "server_error"))
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
}

for route in pairs(api.by_route) do ROUTES[route] = { POST = true } end

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
        return self.http:respond(id, status, "application/json", api.error_body(req.route, status, message, type_, param,
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
        if server.is_request_error(job) then
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
        self.http:respond(job.id, 503, "application/json", job.api.error_body(503,
            "The server is shutting down.", "server_error"))
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
