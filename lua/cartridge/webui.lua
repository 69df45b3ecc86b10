-- cartridge.webui: the web page the server shows at / (files under web/)
-- and the JSON routes behind its views that the four API dialects do not
-- cover. recipes/serve.lua serves them through cartridge.server; docs/webui.md.
--
--   GET  /, /web/{file}     the page: web/index.html, and its script and style
--   GET  /v1/corpus         the document(s) of --corpus as the ICL arm gets them: {"system" (the
--                           system message report.lua's ICL arm wraps them in), "text", "tokens",
--                           "truncated", "kv_rows", "kv_bytes", "files"}
--   GET  /v1/qa             the questions of --qa: {"file", "questions": [{"index", "question",
--                           "answer", "phrasing"}]}
--   POST /v1/qa/score       {"replies": [{"index", "reply"}]} -> {"results": [{"index", "right",
--                           "reply"}]}: report.lua --qa's verdicts (the reply cleaned as it cleans it)
--   GET  /v1/training       the runs of --training: [{"name", "path", "state", "age_seconds",
--                           "lines_total", "since", "lines"}]; ?run=NAME&since=N: that run's lines from N
--   GET  /v1/fleet          the fleet's documents: name, tokens, rows, bytes, mapped (resident)
--
-- A view whose flag was not given answers 501 naming the flag. JSON handlers
-- return the text of a 200 and raise the server's request errors.

local json = require("cartridge.json")
local core = require("cartridge.core")
local fs = require("cartridge.fs")

local webui = {}

webui.DIR = core.root .. "/web"

-- route -> method; the static ones need no API key (the page holds no data)
webui.ROUTES = {
    ["/"] = "GET",
    ["/web/{file}"] = "GET",
    ["/v1/corpus"] = "GET",
    ["/v1/qa"] = "GET",
    ["/v1/qa/score"] = "POST",
    ["/v1/training"] = "GET",
    ["/v1/fleet"] = "GET",
}
webui.STATIC = { ["/"] = true, ["/web/{file}"] = true }

local TYPES = { html = "text/html; charset=utf-8", js = "text/javascript; charset=utf-8",
    css = "text/css; charset=utf-8", svg = "image/svg+xml", png = "image/png" }

-- The route of a path that names one of these (and the file of /web/...).
function webui.route_of(path)
    if path == "/" or path == "/index.html" then return "/", "index.html" end
    local file = path:match("^/web/([%w_%-]+%.%a+)$")
    if file then return "/web/{file}", file end
    for _, p in ipairs({ path, "/v1" .. path }) do
        if webui.ROUTES[p] and not webui.STATIC[p] then return p end
    end
    return nil
end

-- A static file's response: status, content type, body.
function webui.static(file)
    local ext = file:match("%.(%a+)$")
    local f = TYPES[ext] and io.open(webui.DIR .. "/" .. file, "rb")
    if not f then
        return 404, "application/json", json.encode({ error = { message = ("no file %s in the web page's folder %s")
            :format(file, webui.DIR), type = "invalid_request_error", code = "not_found" } })
    end
    local body = f:read("*a")
    f:close()
    return 200, TYPES[ext], body
end

local function off(srv, what, flag)
    srv.util.reject(501, ("this server has no %s: start recipes/serve.lua with %s"):format(what, flag), nil,
        "not_enabled")
end

local handlers = {}

handlers["/v1/corpus"] = function(srv)
    local w = srv.web
    if not w.corpus then off(srv, "corpus", "--corpus FILE") end
    local c = w.corpus
    return json.encode({ system = c.system, text = c.text, tokens = c.tokens, truncated = c.truncated, kv_rows = c.rows,
        kv_bytes = srv.m:kv_bytes(c.rows, srv.kv_dtype), files = json.array(c.files) })
end

handlers["/v1/qa"] = function(srv)
    local w = srv.web
    if not w.qa then off(srv, "questions", "--qa FILE (recipes/make_facts.lua writes one)") end
    local out = {}
    for i, e in ipairs(w.qa) do
        out[i] = { index = i - 1, question = e.question, answer = e.answer, phrasing = e.phrasing or "1" }
    end
    return json.encode({ file = w.qa_path, max_tokens = w.qa_max_a, questions = json.array(out) })
end

handlers["/v1/qa/score"] = function(srv, _, body)
    local w, s = srv.web, srv.util
    if not w.qa then off(srv, "questions", "--qa FILE (recipes/make_facts.lua writes one)") end
    local replies = body.replies
    if json.kind(replies) ~= "array" or #replies > #w.qa then
        s.reject(400, ("replies must be an array of at most %d {\"index\", \"reply\"}; got %s"):format(#w.qa,
            s.shown(replies, body, "replies")), "replies")
    end
    local facts, clean = require("cartridge.facts"), require("cartridge.selfstudy").clean
    local out = {}
    for k, r in ipairs(replies) do
        local i = json.kind(r) == "object" and r.index
        if type(i) ~= "number" or i ~= math.floor(i) or i < 0 or i >= #w.qa or type(r.reply) ~= "string" then
            s.reject(400, ("replies[%d] must be {\"index\": 0..%d, \"reply\": string}; got %s"):format(k - 1,
                #w.qa - 1, s.shown(r, replies, k)), "replies")
        end
        s.check_utf8(r.reply, ("replies[%d].reply"):format(k - 1))
        local e, reply = w.qa[i + 1], clean(r.reply)
        out[k] = { index = i, reply = reply, right = facts.correct(reply, e.answer, e.others) and true or false }
    end
    return json.encode({ results = json.array(out) })
end

-- A run's metrics: the live file while it trains (<stem>.metrics.jsonl.partial),
-- else the finished one; the state says which.
local function run_file(path)
    if path:match("%.jsonl$") or path:match("%.partial$") then
        return path, path:match("%.partial$") and "running" or "finished"
    end
    local stem = path:gsub("%.safetensors$", "")
    local live = stem .. ".metrics.jsonl.partial"
    if fs.kind(live) == "file" then return live, "running" end
    return stem .. ".metrics.jsonl", "finished"
end

-- Complete lines only (a writer may be inside the last one), decoded; a
-- line that is not JSON, or holds a number past a double's range, is
-- skipped and counted.
local function read_lines(file, since)
    local f = io.open(file, "rb")
    if not f then return nil end
    local text = f:read("*a")
    f:close()
    local lines, n, bad = {}, 0, 0
    for line in text:gmatch("([^\n]*)\n") do
        n = n + 1
        if n > since and line:find("%S") then
            local ok, v = pcall(json.decode, line)
            if ok and json.kind(v) == "object" and not json.nonfinite_at(v) then lines[#lines + 1] = v else bad = bad + 1 end
        end
    end
    return lines, n, bad
end

local function run_status(run, since)
    local file, state = run_file(run.path)
    local lines, n, bad = read_lines(file, since)
    if not lines then
        return { name = run.name, path = run.path, metrics = file, state = "waiting", lines_total = 0, since = since,
            lines = json.array({}) }
    end
    local last = lines[#lines]
    if state == "running" and last and last.event == "heldout_after" then state = "finished" end
    local mtime = fs.mtime_ns(file)
    return { name = run.name, path = run.path, metrics = file, state = state, lines_total = n, bad_lines = bad,
        since = since, age_seconds = mtime and math.max(0, os.time() - tonumber(mtime) / 1e9) or json.null,
        lines = json.array(lines) }
end

handlers["/v1/training"] = function(srv, req)
    local w, s = srv.web, srv.util
    if #w.training == 0 then off(srv, "training runs", "--training NAME=RUN.safetensors (a selfstudy --save path)") end
    local q = req.query or ""
    local want = q:match("run=([^&]+)")
    if want then -- as a browser's encodeURIComponent sends it
        want = want:gsub("%+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
    end
    local since = tonumber(q:match("since=(%d+)") or "0")
    local out = {}
    for _, run in ipairs(w.training) do
        if not want or want == run.name then out[#out + 1] = run_status(run, since) end
    end
    if want and #out == 0 then s.reject(404, ("no training run named %s; GET /v1/training lists them"):format(
        s.shown(want)), "run", "not_found") end
    return json.encode({ runs = json.array(out) })
end

handlers["/v1/fleet"] = function(srv)
    local f = srv.fleet
    if not f then off(srv, "fleet", "--fleet DIR (recipes/fleet.lua builds one)") end
    local docs = {}
    for i, d in ipairs(f.man.docs) do
        docs[i] = { index = i - 1, name = d.name, tokens = d.tokens or json.null, rows = d.rows,
            kv_bytes = srv.m:kv_bytes(d.rows, srv.kv_dtype), steps = d.steps or json.null, mapped = f.maps[i] ~= nil }
    end
    return json.encode({ name = f.name, dir = f.dir, budget = f.budget, rag_docs = f.rag_docs, mapped = f.mapped,
        stats = f.stats, documents = json.array(docs) })
end

-- The 200 body of a JSON route, or a request error raised.
function webui.handle(srv, req, body)
    return handlers[req.route](srv, req, body)
end

-- What serve.lua's flags give the views: opts.corpus (paths), opts.icl_max,
-- opts.qa (path), opts.qa_max_a, opts.training ({ "NAME=PATH" or "PATH" }).
function webui.state(m, opts)
    local w = { training = {}, qa_max_a = opts.qa_max_a or 24 }
    if opts.corpus and #opts.corpus > 0 then
        local tok, T = m:tokenizer(), require("cartridge.chat").for_model(m)
        local corpus = require("cartridge.corpus").load(opts.corpus, tok)
        local text, n, truncated = require("cartridge.answering").icl_text(corpus, tok, opts.icl_max or 4096)
        local selfstudy = require("cartridge.selfstudy")
        local block = selfstudy.system_block(T, text)
        -- the system message whose block report.lua's and selfstudy's ICL arm puts in front
        local system = T.name == "plain" and text or selfstudy.system_text(text)
        w.corpus = { system = system, text = text, tokens = n, truncated = truncated, files = opts.corpus,
            rows = #tok:encode(block, { special = true, add_special = true }) }
    end
    if opts.qa then w.qa, w.qa_path = require("cartridge.facts").read_qa(opts.qa), opts.qa end
    for _, spec in ipairs(opts.training or {}) do
        local name, path = spec:match("^([^=/]+)=(.+)$")
        if not name then path, name = spec, spec:match("([^/]+)$"):gsub("%.safetensors$", ""):gsub("%.metrics.*$", "") end
        w.training[#w.training + 1] = { name = name, path = path }
    end
    return w
end

return webui
