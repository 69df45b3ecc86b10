-- fuzz_request.lua: libFuzzer target (through lua_harness.c) for the
-- server's request bodies: lua/cartridge/json.lua and the field validation in
-- lua/cartridge/server.lua.
--
-- Input: byte 0 picks the endpoint (its value mod 4: /v1/chat/completions,
-- /v1/completions, /v1/messages, /v1/responses; with bit 2 set instead
-- /v1/messages/count_tokens, /tokenize, /detokenize, /apply-template, the
-- utility routes, checked by check_utility, or with bits 2 and 3 set
-- /v1/embeddings; with bit 4 set, the web page's routes of
-- cartridge.webui: mod 4 = 0 or 3 POST /v1/qa/score with the body, 1 GET
-- /v1/training with the body as the query string, 2 GET /v1/training over a
-- run whose metrics file holds the body); the rest is the request body.
--
--   1. json.decode(body). When it decodes, json.encode of the value must
--      succeed and decode to an equal value whose encoding is the same text
--      (a stable round trip). A decode error must be a "json: " string.
--   2. Server:make_jobs(1, req) on a server built once over the fuzz model (an
--      HTTP stub that is never called): one job, or several choices (n,
--      prompt arrays), each checked as one. A raised request error (server.is_request_error, or until that
--      exists a table with a numeric status) must have a 4xx status and a
--      string message: the client's mistake, answered with that status. Any
--      other error is a finding: the real server would answer 500.
--   3. A job that was made must have options within the C types they become
--      (engine/sampler.h), and Server:bind must take it into a slot (it
--      creates the job's sampler and detokenizer); Server:release frees
--      them. A request that passes validation but cannot be bound would fail
--      later, inside the server loop.

local util = require("fuzz_util")
local ffi = require("ffi")
local json = require("cartridge.json")
local server = require("cartridge.server")
local model = require("cartridge.model")

local m = model.load(util.model_path())
local srv = server.new({ model = m, cartridges = {}, model_name = "m", parallel = 2, ctx = 256,
    default_max_tokens = 16, http = {} })
local n_vocab = m.n_vocab

local function is_request_error(e)
    if server.is_request_error then return server.is_request_error(e) end
    return type(e) == "table" and type(e.status) == "number"
end

local function is_integer(v, lo, hi)
    return type(v) == "number" and v == math.floor(v) and v >= lo and v < hi
end

-- The options of an accepted job fit the C types they become (sampler.h).
local function check_options(o)
    if not is_integer(o.max_tokens, 1, srv.max_tokens_limit + 1) then
        util.finding("accepted max_tokens %s", tostring(o.max_tokens))
    end
    if not is_integer(o.top_k, 0, 2 ^ 31) then util.finding("accepted top_k %s", tostring(o.top_k)) end
    if not is_integer(o.seed, -2 ^ 63, 2 ^ 64) then
        util.known_finding("seed-range", "accepted seed %.17g, outside [-2^63, 2^64): the sampler gets %s", o.seed,
            tostring(ffi.cast("uint64_t", o.seed >= 0 and o.seed or 0)))
    end
    for _, f in ipairs({ { "temperature", 0, 2 }, { "top_p", 1e-6, 1 }, { "min_p", 0, 1 } }) do
        local v = o[f[1]]
        if type(v) ~= "number" or not (v >= f[2] and v <= f[3]) then
            util.finding("accepted %s %s", f[1], tostring(v))
        end
    end
end

local PATHS = { "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses" }
local KIND = { ["/v1/chat/completions"] = "chat", ["/v1/completions"] = "text", ["/v1/messages"] = "messages",
    ["/v1/responses"] = "responses" }

local function check_job(job, path)
    local kind = KIND[path]
    if job.kind ~= kind then util.finding("a %s request made a %s job", kind, tostring(job.kind)) end
    if #job.prompt < 1 or #job.prompt + job.opts.max_tokens > srv.ctx then
        util.finding("job of %d prompt + %d completion tokens in a context of %d", #job.prompt,
            job.opts.max_tokens, srv.ctx)
    end
    for i, id in ipairs(job.prompt) do
        if type(id) ~= "number" or id < 0 or id >= n_vocab then
            util.finding("prompt[%d] = %s is not a token id", i, tostring(id))
        end
    end
    check_options(job.opts)
    -- what the server loop does next: a slot, the sampler, the detokenizer
    local slot = srv.slots[1]
    local ok, err = pcall(srv.bind, srv, job, slot)
    if not ok then util.finding("Server:bind failed on a job make_job accepted: %s", util.describe(err)) end
    srv:release(job)
    slot.cart, slot.tokens, slot.loaded, slot.last_used = nil, {}, nil, 0 -- nothing carries over
end

-- The utility routes (cartridge.server_utility): a body either gives a 200
-- whose text is JSON (token ids in the vocabulary) or a 4xx request error.
local utility = require("cartridge.server_utility")
local UTILITY = { "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/apply-template" }

-- A route handler's answer: the decoded 200 body, or nil after a 4xx
-- request error; anything else (another error, a body that is not JSON) is
-- a finding.
local function answered(handle, req, value)
    local done, out = pcall(handle, srv, req, value)
    if not done then
        if not (is_request_error(out) and out.status >= 400 and out.status <= 499 and type(out.message) == "string") then
            util.finding("%s raised %s", req.route, util.describe(out))
        end
        return nil
    end
    local parsed_ok, r = pcall(json.decode, out)
    if not parsed_ok or type(r) ~= "table" then util.finding("%s answered text that is not JSON: %s", req.route, out) end
    return r
end

local function check_utility(route, body)
    if route == "/v1/embeddings" and #body > 4096 then return end -- the model runs at once: keep inputs short
    local ok, value = pcall(json.decode, body)
    if not ok or type(value) ~= "table" then return end
    local req = { path = route, route = route, method = "POST", body = body, header = function() return nil end }
    local r = answered(utility.handle, req, value)
    if not r then return end
    for i, t in ipairs(route == "/tokenize" and r.tokens or {}) do
        local id = type(t) == "table" and t.id or t
        if type(id) ~= "number" or id < 0 or id >= n_vocab then util.finding("/tokenize: tokens[%d] = %s", i, tostring(id)) end
    end
end

-- The web page's routes (cartridge.webui), over two questions and one run
-- whose metrics file the input may write: a 200 of JSON, or a 4xx.
local webui = require("cartridge.webui")
local tmp_name = os.tmpname()
os.remove(tmp_name)
local metrics_file = tmp_name .. ".metrics.jsonl" -- read as it is (a run's --save path would be read beside it)
srv.web = { qa = { { question = "Where?", answer = "Longri", others = { "Tarn" } }, { question = "Who?", answer = "Hosshe" } },
    qa_path = "qa.jsonl", training = { { name = "run", path = metrics_file } } }

local function check_web(kind, body)
    local route, query, value = "/v1/training", nil, nil
    if kind == 1 then query = body
    elseif kind == 2 then
        local f = assert(io.open(metrics_file, "wb"))
        f:write(body)
        f:close()
    else
        route = "/v1/qa/score"
        local ok
        ok, value = pcall(json.decode, body)
        if not ok or type(value) ~= "table" then return end
    end
    local req = { path = route, route = route, method = value and "POST" or "GET", query = query, body = body,
        header = function() return nil end }
    answered(webui.handle, req, value)
end

return function(data)
    if #data == 0 then return end
    if data:byte(1) % 32 >= 16 then return check_web(data:byte(1) % 4, data:sub(2)) end
    if data:byte(1) % 16 >= 12 then return check_utility("/v1/embeddings", data:sub(2)) end
    if data:byte(1) % 8 >= 4 then return check_utility(UTILITY[data:byte(1) % 4 + 1], data:sub(2)) end
    local path = PATHS[data:byte(1) % 4 + 1]
    local body = data:sub(2)
    util.check_json(body)
    local req = { path = path, method = "POST", body = body, header = function() return nil end }
    local ok, job = pcall(srv.make_jobs, srv, 1, req)
    if ok and job.group then
        if #job.group < 2 or #job.group > require("cartridge.choices").MAX then
            util.finding("a request made %d choices", #job.group)
        end
        for _, child in ipairs(job.group) do check_job(child, path) end
        require("cartridge.choices").forget(srv.http, job.group[1].id)
    elseif ok then
        check_job(job, path)
    elseif type(job) == "table" and is_request_error(job) then
        if not (type(job.status) == "number" and job.status >= 400 and job.status <= 499) then
            util.finding("make_job rejected with status %s: %s", tostring(job.status), tostring(job.message))
        end
        if type(job.message) ~= "string" or job.message == "" then
            util.finding("make_job rejected with status %d and no message", job.status)
        end
    else
        util.finding("make_job raised %s", util.describe(job))
    end
end
