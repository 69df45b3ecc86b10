-- cartridge.api.completions: OpenAI's (legacy) text completions, POST
-- /v1/completions. The prompt is text, or token ids, read as the client
-- wrote it: no chat template, and special-token texts stay text. echo puts
-- the prompt before the reply; log probabilities come in the legacy shape.
-- The interface every dialect has is described in cartridge.api.

local json = require("cartridge.json")
local logprobs = require("cartridge.logprobs")
local choices = require("cartridge.choices")
local request = require("cartridge.api.request")
local format = require("cartridge.api.format")

local reject, shown, check_utf8 = request.reject, request.shown, request.check_utf8
local with_documents, asks = request.with_documents, request.asks

local completions = { route = "/v1/completions", kind = "text", id_prefix = "cmpl-", what = "prompt" }

completions.known = request.fields(request.OPENAI_SAMPLING .. "prompt echo best_of suffix")
completions.unhonoured = {
    { "suffix", function(v) return type(v) == "string" and v ~= "" end },
    { "best_of", function(v) return asks(v) and v ~= 1 end },
}
completions.options = request.openai_options

function completions.format(srv, body)
    return format.read(srv, body.response_format, "response_format", "response_format")
end

-- The first prompt (cartridge.choices answers a list of them with a job
-- each): text, or token ids and the text they spell (for echo).
function completions.prompt(srv, body, o)
    local prompt = choices.prompts(body.prompt, { reject = reject, shown = shown, n_vocab = srv.m.n_vocab }, body)[1]
    local ids
    if type(prompt) == "table" then
        ids, prompt = prompt, srv.tok:decode(prompt)
    else
        check_utf8(prompt, "prompt")
    end
    return { text = prompt, ids = ids, raw = true, list = { { role = "user", content = prompt } },
        echo = o.lp.echo and prompt or nil }
end

local function new_logprobs(srv, job)
    local i, j = request.new_logprobs(job)
    if not i then return nil end
    local o
    o, job.lp_chars = logprobs.legacy(srv.tok, job.lps, i, j, job.lp_chars or 0)
    return o
end

local function chunk(srv, job, text, finish)
    local lp = (finish or text ~= "") and new_logprobs(srv, job) or nil
    request.data(srv, job, with_documents(job, { id = job.completion_id, object = "text_completion",
        created = job.created, model = job.name, choices = json.array({ { index = 0, text = text,
            finish_reason = finish or json.null, logprobs = lp or json.null } }) }))
end

function completions.delta(srv, job, delta, finish)
    chunk(srv, job, delta.content or "", finish)
end

function completions.start(srv, job)
    if job.echo then chunk(srv, job, job.echo) end
end

function completions.finish(srv, job)
    if job.opts.stream then
        chunk(srv, job, "", job.finish)
        return request.openai_stream_end(srv, job, "text_completion")
    end
    local obj = { id = job.completion_id, object = "text_completion", created = job.created, model = job.name,
        choices = json.array({ { index = 0, text = (job.echo or "") .. job.text, finish_reason = job.finish,
            logprobs = new_logprobs(srv, job) or json.null } }), usage = request.usage(job) }
    srv.http:respond(job.id, 200, "application/json", json.encode(with_documents(job, obj)))
end

completions.error_body = request.openai_error
completions.stream_error = request.openai_stream_error

return completions
