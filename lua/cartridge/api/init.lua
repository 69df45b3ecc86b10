-- cartridge.api: the HTTP APIs the server speaks, one module per dialect:
--
--   cartridge.api.chat         POST /v1/chat/completions (OpenAI)
--   cartridge.api.completions  POST /v1/completions (OpenAI, text)
--   cartridge.api.responses    POST /v1/responses (OpenAI's Responses API)
--   cartridge.api.messages     POST /v1/messages (Anthropic)
--
-- and what they share: cartridge.api.request (errors, field readers, the
-- OpenAI sampling fields), cartridge.api.tools (function calling) and
-- cartridge.api.format (structured output). cartridge.server keeps the
-- slots, the batching and the event loop, and calls a dialect through this
-- interface (srv: the server; job: what make_job built; o: the options):
--
--   route, kind, id_prefix   its POST route, the job's kind (in logs), its ids' prefix
--   what                     how errors name the prompt ("messages", "prompt", "input")
--   known                    the set of body fields it reads: any other is a 400
--   unhonoured               { { field, asks(value) } }: fields it refuses when they ask for something
--   options(srv, body)       -> o: max_tokens, sampling, stop, stream (checked)
--   format(srv, body, o)     -> structured output { grammar, echo } or nil (optional)
--   prompt(srv, body, o)     -> { text, tools, list (the turns), plain (spans of client text),
--                                 ids (given token ids), raw (text read as text), echo }
--   start(srv, job)          a streamed reply's opening events
--   delta(srv, job, delta, finish)  a streamed piece: { content } or { tool_calls }
--   finish(srv, job)         the reply's end: its last events, or the whole body
--   error_body(status, message, type, param, code)  an error in its shape
--   stream_error(srv, job, message)  an internal error after the stream began
--   object_arguments         calls' arguments are objects in its replies (optional)
--   error_routes             other routes answering errors in its shape (optional)
--
-- Adding a dialect is one module with that interface and its line below.

local request = require("cartridge.api.request")

local api = {
    DIALECTS = {
        require("cartridge.api.chat"),
        require("cartridge.api.completions"),
        require("cartridge.api.responses"),
        require("cartridge.api.messages"),
    },
}

api.by_route = {}    -- POST route -> dialect
api.error_shape = {} -- route -> the dialect whose error shape it answers with
for _, d in ipairs(api.DIALECTS) do
    api.by_route[d.route] = d
    api.error_shape[d.route] = d
    for _, r in ipairs(d.error_routes or {}) do api.error_shape[r] = d end
end

-- The error body a route answers with: its dialect's shape; OpenAI's for
-- any other route.
function api.error_body(route, status, message, type_, param, code)
    local d = route and api.error_shape[route]
    if d then return d.error_body(status, message, type_, param, code) end
    return request.error_body(message, type_, param, code)
end

return api
