-- cartridge.http: the engine's one-thread HTTP/1.1 server (engine/http.h).
--
--   local http = require("cartridge.http")
--   local srv = http.listen({ host = "127.0.0.1", port = 8080, max_body_bytes = 4 * 1024 * 1024 })
--   srv:catch_signals()                      -- SIGINT/SIGTERM become "signal" events
--   while running do
--       srv:poll(10)                         -- all socket I/O happens here
--       for ev in srv:events() do            -- { kind = "request"|"closed"|"signal", id, signal }
--           if ev.kind == "request" then
--               local req = srv:request(ev.id)   -- method, path, query, body, header(name), ...
--               srv:respond(ev.id, 200, "application/json", '{"ok":true}')
--           end
--       end
--       -- ...one model step; srv:stream_write(id, "data: ...\n\n") for each running stream...
--   end
--   srv:close()
--
-- The C side parses, enforces the limits and timeouts, answers protocol
-- errors (400, 408, 411, 413, 431, 503, ...) itself and buffers output, so a
-- slow client never blocks this loop. Request ids are Lua numbers.
--
-- Writes (respond, stream_begin/write/end) return true, or false and a
-- message when the request is no longer open (the client went away, or it was
-- answered already); the matching "closed" event comes from a later poll. Any
-- other failure (a bad status, header text the server owns) raises.
--
-- srv.on_answer, when set to a function(id, status), is called each time
-- respond or stream_begin has queued a response (to count them by status).

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local http = {}

local Server = {}
Server.__index = Server

local CART_E_STATE = C.CART_E_STATE
local KINDS = { [1] = "request", [2] = "closed", [3] = "signal" }

-- Options: the fields of cart_http_options (host, port, backlog,
-- max_connections, max_headers, max_header_bytes, max_body_bytes,
-- max_output_bytes, header_timeout_ms, body_timeout_ms, idle_timeout_ms,
-- write_timeout_ms, max_connections_per_peer, first_byte_timeout_ms); missing
-- ones keep the C defaults.
local OPTION_FIELDS = {
    "port", "backlog", "max_connections", "max_headers", "max_header_bytes", "max_body_bytes",
    "max_output_bytes", "header_timeout_ms", "body_timeout_ms", "idle_timeout_ms", "write_timeout_ms",
    "max_connections_per_peer", "first_byte_timeout_ms",
}

-- Starts a server listening on opts.host:opts.port (port 0 or nil: an
-- ephemeral port, see :port()). Raises with the engine's message on failure.
function http.listen(opts)
    opts = opts or {}
    local o = ffi.new("cart_http_options")
    C.cart_http_default_options(o)
    local known = { host = true }
    for _, k in ipairs(OPTION_FIELDS) do
        known[k] = true
        if opts[k] ~= nil then o[k] = opts[k] end
    end
    for k in pairs(opts) do
        if not known[k] then error("http.listen: unknown option '" .. tostring(k) .. "'", 0) end
    end
    local host = opts.host
    if host ~= nil then o.host = host end -- kept alive by `host` until listen returns
    return setmetatable({
        handle = core.new("cart_http", C.cart_http_listen, C.cart_http_close, "http.listen", o),
        ev = ffi.new("cart_http_event"),
        req = ffi.new("cart_http_request"),
        name = ffi.new("cart_str"),
        value = ffi.new("cart_str"),
    }, Server)
end

local function handle(self)
    if self.handle == nil then error("http: the server is closed", 0) end
    return self.handle
end

-- The port the server listens on.
function Server:port()
    return C.cart_http_port(handle(self))
end

-- Does the pending socket work, waiting at most ms milliseconds (default 0;
-- negative: until something happens) for something to happen.
function Server:poll(ms)
    core.check(C.cart_http_poll(handle(self), ms or 0), "http:poll")
end

-- An iterator over the queued events: { kind = "request" | "closed" |
-- "signal", id = request id (0 for signals), signal = signal number }.
function Server:events()
    local h, ev = handle(self), self.ev
    return function()
        if C.cart_http_next_event(h, ev) == 0 then return nil end
        return { kind = KINDS[ev.kind] or tostring(ev.kind), id = core.int(ev.request),
            signal = ev.signal }
    end
end

-- A request in flight as a table of Lua strings (copied, so it outlives the
-- response): id, method, target, path, query, body, remote, version (10 or
-- 11), headers ({ lowercased name = value }, the first of repeated names),
-- header_list ({ { name, value }, ... } as sent) and header(name) (case-
-- insensitive; both req.header(n) and req:header(n) work). nil when the
-- request is not in flight.
function Server:request(id)
    local h, q = handle(self), self.req
    if C.cart_http_request_get(h, id, q) ~= 0 then return nil end
    local headers, list = {}, {}
    for i = 0, q.n_headers - 1 do
        core.check(C.cart_http_header_at(h, id, i, self.name, self.value), "http:request")
        local name, value = core.str(self.name), core.str(self.value)
        list[#list + 1] = { name, value }
        local key = name:lower()
        if headers[key] == nil then headers[key] = value end
    end
    local req = {
        id = core.int(q.id),
        method = core.str(q.method),
        target = core.str(q.target),
        path = core.str(q.path),
        query = core.str(q.query),
        body = core.str(q.body),
        remote = core.str(q.remote),
        version = q.version,
        headers = headers,
        header_list = list,
    }
    req.header = function(a, b)
        local name = (a == req) and b or a
        return headers[tostring(name):lower()]
    end
    return req
end

-- "Name: value\r\n" lines from a table: { Name = "value" } (sorted by name)
-- or a list of { name, value } pairs (in order).
local function header_text(headers)
    if headers == nil then return nil end
    if type(headers) == "string" then return headers end
    local lines = {}
    if #headers > 0 then
        for _, pair in ipairs(headers) do
            lines[#lines + 1] = tostring(pair[1]) .. ": " .. tostring(pair[2]) .. "\r\n"
        end
    else
        local names = {}
        for k in pairs(headers) do names[#names + 1] = k end
        table.sort(names)
        for _, k in ipairs(names) do lines[#lines + 1] = k .. ": " .. tostring(headers[k]) .. "\r\n" end
    end
    if #lines == 0 then return nil end
    return table.concat(lines)
end

-- true; or false and the message when the request is gone; raises otherwise.
local function written(rc, what)
    if rc == 0 then return true end
    if rc == CART_E_STATE then return false, what .. ": " .. core.last_error() end
    core.check(rc, what)
end

-- Answers request id: status, content_type (nil: none), body (a string, nil
-- = empty), headers (a table, see header_text; the server sets
-- Content-Length, Transfer-Encoding and Connection itself).
-- headers merged with self.extra_headers (headers every response carries,
-- e.g. CORS's Access-Control-Allow-Origin), the call's own winning.
local function with_extra(self, headers)
    if not self.extra_headers then return headers end
    local all = {}
    for k, v in pairs(self.extra_headers) do all[k] = v end
    for k, v in pairs(headers or {}) do all[k] = v end
    return all
end

function Server:respond(id, status, content_type, body, headers)
    headers = with_extra(self, headers)
    body = body or ""
    local ok, why = written(C.cart_http_respond(handle(self), id, status, content_type, body, #body,
        header_text(headers)), "http:respond")
    if ok and self.on_answer then self.on_answer(id, status) end
    return ok, why
end

-- Starts a chunked response; send the body with stream_write and finish with
-- stream_end.
function Server:stream_begin(id, status, content_type, headers)
    headers = with_extra(self, headers)
    local ok, why = written(C.cart_http_stream_begin(handle(self), id, status, content_type,
        header_text(headers)), "http:stream_begin")
    if ok and self.on_answer then self.on_answer(id, status) end
    return ok, why
end

-- Queues one chunk (sent by this call if the socket takes it, else by polls).
function Server:stream_write(id, data)
    return written(C.cart_http_stream_write(handle(self), id, data, #data), "http:stream_write")
end

function Server:stream_end(id)
    return written(C.cart_http_stream_end(handle(self), id), "http:stream_end")
end

-- true while the request is in flight and its client is there.
function Server:is_open(id)
    return C.cart_http_is_open(handle(self), id) == 1
end

-- SIGINT and SIGTERM become "signal" events instead of ending the process
-- (until :close()).
function Server:catch_signals()
    core.check(C.cart_http_catch_signals(handle(self)), "http:catch_signals")
end

-- Open client connections.
function Server:connections()
    return C.cart_http_connections(handle(self))
end

-- Response bytes queued and not yet sent; poll until 0 before :close() to
-- deliver the last responses.
function Server:pending()
    return core.int(C.cart_http_pending_output(handle(self)))
end

-- Polls until queued output is sent or `ms` milliseconds (default 1000) pass.
function Server:drain(ms)
    local h = handle(self)
    local deadline = C.cart_now_seconds() + (ms or 1000) / 1000
    while C.cart_http_pending_output(h) > 0 and C.cart_now_seconds() < deadline do
        core.check(C.cart_http_poll(h, 10), "http:drain")
    end
    return C.cart_http_pending_output(h) == 0
end

-- Closes every connection and the listening socket (queued output is
-- dropped: :drain() first). Safe to call twice.
function Server:close()
    core.free(self, C.cart_http_close)
end

return http
