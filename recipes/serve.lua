-- serve.lua: an OpenAI-compatible HTTP server that serves cartridges.
--
--   cartridge run recipes/serve.lua MODEL.gguf --port 8080 --cartridge docs=out/docs.safetensors
--   curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \
--        -d '{"model": "docs", "messages": [{"role": "user", "content": "How do I install it?"}]}'
--
-- The request's "model" picks a cartridge by name (--cartridge name=path,
-- repeatable; a bare path is named after its file) or the bare model (its
-- GGUF name, see GET /v1/models). Every conversation starts from the
-- cartridge's rows in its slot's cache; follow-up turns reuse the cached
-- tokens they share with the previous turn. Concurrent requests decode
-- together, one pass over the weights per token for all of them. With
-- --kv-cache-dir, conversations evicted from the slots (and those the slots
-- hold when the server stops) spill to disk and are adopted again by a
-- request that continues them. GET /metrics answers in Prometheus's text
-- format. SIGINT or SIGTERM stops the server cleanly. See docs/server.md.
--
-- --fleet [NAME=]DIR serves a fleet (recipes/fleet.lua) as the model NAME
-- (default "fleet"): each conversation goes behind the cartridges retrieval
-- picks for its user messages, composed, mapped from DIR as needed with at
-- most --budget of them mapped at once; the response's "documents" field
-- names them. See docs/fleet.md.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local http = require("cartridge.http")
local server_mod = require("cartridge.server")

local opts = options.parse(arg, {
    summary = "Serve a GGUF model and its cartridges over an OpenAI-compatible HTTP API.",
    positional = { { "gguf", help = "the GGUF model (or --model)" } },
    flags = {
        { "model", help = "the GGUF model (the same as the positional argument)" },
        { "served-model-name", help = "the bare model's name in the API (default: the GGUF's general.name)" },
        { "alias", repeatable = true, help = "another name requests may give for the bare model (repeatable)" },
        { "cors", metavar = "ORIGIN", help = "let web pages from ORIGIN (or * for any) call the API: "
            .. "Access-Control-Allow-Origin on every response, OPTIONS preflights answered (default: off)" },
        { "default-model", help = "what a request without model, or with an unknown one, gets (default: the "
            .. "bare model without one, a 404 for an unknown one)" },
        { "host", default = "127.0.0.1", help = "address to listen on" },
        { "port", type = "int", default = 8080, help = "port (0: any free port, printed at start)" },
        { "cartridge", repeatable = true, help = "NAME=PATH or PATH of a cartridge to serve (repeatable)" },
        { "ctx", type = "int", default = 4096, help = "tokens per slot after the cartridge rows (prompt + completion)" },
        { "parallel", type = "int", default = 4, help = "slots: requests decoded together" },
        { "api-key", help = "require 'Authorization: Bearer KEY' on /v1 requests" },
        { "temp", type = "number", help = "temperature of a request that gives none (default 1, OpenAI's)" },
        { "top-p", type = "number", help = "top_p of a request that gives none (default 1: off)" },
        { "top-k", type = "int", help = "top_k of a request that gives none (default 0: off)" },
        { "min-p", type = "number", help = "min_p of a request that gives none (default 0: off)" },
        { "repeat-penalty", type = "number", help = "repeat_penalty of a request that gives none (default 1: off)" },
        { "seed", type = "int", help = "sampling seed of a request that gives none (default 0)" },
        { "parse-special", type = "boolean", help = "read special-token texts (<|im_start|>, ...) in what clients "
            .. "write as those tokens (default: as text, so that no client can forge a turn)" },
        { "pooling", default = "mean", choices = { "mean", "last" }, help = "/v1/embeddings: the mean of an "
            .. "input's final hidden states, or the last token's (each then scaled to unit length)" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        { "kv", default = "f16", choices = { "f16", "f32" }, help = "KV cache dtype" },
        { "max-tokens", type = "int", default = 4096, help = "largest max_tokens a request may ask for" },
        { "max-messages", type = "int", default = 256, help = "most messages a chat request may carry" },
        { "max-body", type = "int", default = 1048576, help = "largest request body, bytes" },
        { "queue", type = "int", default = 64, help = "requests waiting for a slot before 429" },
        { "max-connections", type = "int", default = 256, help = "open client connections (idle ones make room)" },
        { "max-per-address", type = "int", default = 64, help = "open connections from one client address" },
        { "kv-cache-dir", metavar = "DIR", help = "disk tier: spill idle slots' KV here and adopt it again, across restarts too" },
        { "kv-cache-max", metavar = "SIZE", default = "8G", help = "disk tier: most bytes its files take (K, M, G, T suffixes)" },
        { "slot-save-path", metavar = "DIR", help = "where POST /slots/{id}?action=save writes a slot's "
            .. "conversation and action=restore reads one (made if missing; default: saving is off)" },
        { "quiet", type = "boolean", help = "no per-request log lines" },
        { "webui", type = "boolean", default = true, help = "the web page at / (chat, compare, training, fleet; "
            .. "docs/webui.md)" },
        { "open", type = "boolean", help = "open the web page in the desktop's browser (xdg-open) once listening" },
        { "corpus", repeatable = true, help = "the document(s) a cartridge was trained on: GET /v1/corpus, the "
            .. "page's corpus-in-context arm (a file or a directory of .md files; repeatable)" },
        { "icl-max", type = "int", default = 4096, help = "with --corpus: its tokens in context at most" },
        { "qa", metavar = "FILE", help = "questions and answers (recipes/make_facts.lua's qa.jsonl): GET /v1/qa and "
            .. "POST /v1/qa/score, the page's score table" },
        { "qa-max-tokens", type = "int", default = 24, help = "with --qa: the answer budget the page asks for "
            .. "(report.lua --max-a)" },
        { "training", repeatable = true, metavar = "[NAME=]PATH", help = "a self-study run to show: its --save path "
            .. "(its metrics, live while it trains) or a metrics.jsonl (repeatable; GET /v1/training)" },
        { "fleet", metavar = "[NAME=]DIR", help = "serve a fleet directory as the model NAME (default: fleet)" },
        { "budget", type = "int", default = 8, help = "with --fleet: most cartridges mapped at once" },
        { "rag-docs", type = "int", default = 2, help = "with --fleet: most documents composed per conversation" },
        { "rag-chunks", type = "int", default = 8, help = "with --fleet: best chunks whose documents are considered" },
        require("cartridge.cart").FOREIGN_FLAG,
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

if opts.model and opts.gguf and opts.model ~= opts.gguf then
    error(("serve: two models: %s (positional) and --model %s; give one"):format(opts.gguf, opts.model), 0)
end
if opts.open and not opts.webui then error("serve: --open shows the web page, which --no-webui turns off", 0) end
opts.model = opts.model or opts.gguf
if not opts.model then error("serve: give the model: serve.lua MODEL.gguf, or --model MODEL.gguf (see --help)", 0) end
if opts.parallel < 1 or opts.ctx < 16 then error("serve: --parallel must be >= 1 and --ctx >= 16", 0) end
if opts.qa_max_tokens < 1 or opts.icl_max < 1 then error("serve: --qa-max-tokens and --icl-max must be at least 1", 0) end
local sampling = server_mod.sampling_defaults({ temperature = opts.temp, top_p = opts.top_p, top_k = opts.top_k,
    min_p = opts.min_p, repeat_penalty = opts.repeat_penalty, seed = opts.seed })
local kv_cache_max, why = require("cartridge.kvstore").parse_size(opts.kv_cache_max)
if not kv_cache_max then error("serve: --kv-cache-max: " .. why, 0) end
cartridge.set_threads(opts.threads)
opts.model = require("cartridge.defaults").resolve_model(opts.model)
local m = cartridge.model.load(opts.model)
local model_name = opts.served_model_name
    or tostring(m.file:get("general.name") or opts.model:match("([^/]+)%.gguf$") or opts.model)
local carts = {}
for _, spec in ipairs(opts.cartridge) do
    local name, path = spec:match("^([^=]+)=(.+)$")
    if not name then
        path = spec
        name = spec:match("([^/]+)%.safetensors$") or spec
    end
    if carts[name] or name == model_name then
        error(("serve: two models would be named '%s'; name them with --cartridge NAME=PATH"):format(name), 0)
    end
    carts[name] = cartridge.cart.load(path, m)
    io.stderr:write(("cartridge '%s': %s (p = %d)\n"):format(name, path, carts[name].p))
end

local fleet
if opts.fleet then
    if #opts.cartridge > 0 or opts.kv_cache_dir then
        error("serve: --fleet serves the fleet alone: leave out --cartridge and --kv-cache-dir", 0)
    end
    if opts.rag_docs < 1 or opts.rag_chunks < 1 then error("serve: --rag-docs and --rag-chunks must be at least 1", 0) end
    local name, dir = opts.fleet:match("^([^=/]+)=(.+)$")
    if not name then name, dir = "fleet", opts.fleet end
    if name == model_name then
        error(("serve: the fleet and the model would both be named '%s'; name it with --fleet NAME=DIR"):format(name), 0)
    end
    fleet = require("cartridge.fleetserve").open(m, dir, { name = name, budget = opts.budget, rag_docs = opts.rag_docs,
        rag_chunks = opts.rag_chunks })
    io.stderr:write(("fleet '%s': %s (%d documents, up to %d composed, %d mapped at most)\n"):format(name, dir,
        #fleet.man.docs, opts.rag_docs, opts.budget))
end

local web = require("cartridge.webui").state(m, { corpus = opts.corpus, icl_max = opts.icl_max, qa = opts.qa,
    qa_max_a = opts.qa_max_tokens, training = opts.training })

local h = http.listen({ host = opts.host, port = opts.port, max_body_bytes = opts.max_body,
    max_connections = opts.max_connections, max_connections_per_peer = opts.max_per_address })
h:catch_signals()
local srv = server_mod.new({
    model = m, model_name = model_name, cartridges = carts, http = h, parallel = opts.parallel, ctx = opts.ctx,
    kv = opts.kv, api_key = opts.api_key, parse_special = opts.parse_special, sampling = sampling,
    aliases = opts.alias, default_model = opts.default_model, cors = opts.cors, pooling = opts.pooling,
    slot_save_path = opts.slot_save_path, webui = opts.webui, web = web,
    max_tokens_limit = opts.max_tokens, max_messages = opts.max_messages,
    queue_limit = opts.queue, kv_cache_dir = opts.kv_cache_dir, kv_cache_max = kv_cache_max, fleet = fleet,
    log = not opts.quiet and function(line) io.stderr:write(line, "\n") end or nil,
    warn = function(line) io.stderr:write(line, "\n") end,
})
print(("serving %s (%s) and %d cartridge(s)%s on http://%s:%d with %d slots"):format(model_name, opts.model,
    #opts.cartridge, fleet and (" and the fleet '%s' of %d documents"):format(fleet.name, #fleet.man.docs) or "",
    opts.host, h:port(), opts.parallel))
print(("sampling when a request omits it: temperature %g, top_p %g, top_k %d, min_p %g, repeat_penalty %g, seed %d")
    :format(sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.repeat_penalty,
        sampling.seed))
if opts.webui then
    local page = ("http://%s:%d/"):format(opts.host, h:port())
    print("the web page: " .. page)
    if opts.open then
        -- xdg-open returns at once; a machine without a desktop says so and the server goes on
        local proc = require("cartridge.proc")
        if proc.exists("xdg-open") then
            proc.wait(proc.spawn({ "xdg-open", page }, { stdin = "/dev/null", stdout = "/dev/null", stderr = "/dev/null" }), 10)
        else print("(--open: this machine has no xdg-open; open " .. page .. " in a browser)") end
    end
end
io.stdout:flush()
srv:run()
srv:free()
if fleet then fleet:free() end
h:close()
io.stderr:write("serve: stopped\n")
