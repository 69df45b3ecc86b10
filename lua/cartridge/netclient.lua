-- cartridge.netclient: HTTP/1.1 client connections over libc sockets (FFI),
-- for load generators and tests that need what curl cannot do: hundreds of
-- idle or trickling sockets, many requests in flight from one process,
-- disconnects in the middle of a stream.
--
--   local nc = require("cartridge.netclient")
--   local c = nc.connect("127.0.0.1", port)          -- raises when refused
--   c:send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
--   local r = c:wait(1.0)   -- { status, headers, body, seconds } or nil, "timeout" | "closed"
--   c:close()
--
-- Many at once: create connections, send on each, then call nc.pump(conns,
-- timeout_s) until every one has a response (r = c.response) or failed
-- (c.failed). Responses with Content-Length, chunked bodies and bodies ended
-- by the close are understood; only IPv4 addresses are taken.

local ffi = require("ffi")
local C = ffi.C

pcall(ffi.cdef, [[
struct cart_nc_sockaddr_in { uint16_t family; uint16_t port; uint32_t addr; uint8_t zero[8]; };
struct cart_nc_pollfd { int fd; short events; short revents; };
int socket(int domain, int type, int protocol);
int connect(int fd, const void *addr, uint32_t len);
int close(int fd);
long send(int fd, const void *buf, size_t n, int flags);
long recv(int fd, void *buf, size_t n, int flags);
int poll(struct cart_nc_pollfd *fds, unsigned long n, int timeout);
int inet_pton(int af, const char *src, void *dst);
int setsockopt(int fd, int level, int name, const void *val, uint32_t len);
]])

local AF_INET, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 2, 1, 2048, 524288
local MSG_DONTWAIT, MSG_NOSIGNAL = 64, 16384
local POLLIN, POLLOUT = 1, 4
local EAGAIN, EINPROGRESS = 11, 115

local nc = {}

local function now() return require("cartridge.core").C.cart_now_seconds() end

local Conn = {}
Conn.__index = Conn

local buf = ffi.new("char[65536]")

-- A connection to host:port (IPv4), non-blocking once connected. Raises on
-- failure unless soft, which returns nil, why instead.
function nc.connect(host, port, soft)
    local fd = C.socket(AF_INET, SOCK_STREAM + SOCK_CLOEXEC + SOCK_NONBLOCK, 0)
    if fd < 0 then
        local why = "socket() failed (errno " .. ffi.errno() .. "; too many open files?)"
        if soft then return nil, why end
        error("netclient: " .. why, 0)
    end
    local sa = ffi.new("struct cart_nc_sockaddr_in")
    sa.family = AF_INET
    sa.port = bit.bor(bit.rshift(port, 8), bit.lshift(bit.band(port, 0xff), 8))
    assert(C.inet_pton(AF_INET, host, ffi.cast("void *", ffi.cast("char *", sa) + 4)) == 1, "bad IPv4 address " .. host)
    if C.connect(fd, sa, ffi.sizeof(sa)) ~= 0 and ffi.errno() ~= EINPROGRESS then
        C.close(fd)
        local why = ("cannot connect to %s:%d (errno %d)"):format(host, port, ffi.errno())
        if soft then return nil, why end
        error("netclient: " .. why, 0)
    end
    return setmetatable({ fd = fd, inbuf = {}, inlen = 0, out = "", started = now() }, Conn)
end

-- Queues bytes and sends what the socket takes now.
function Conn:send(s)
    self.out = self.out .. s
    self:flush()
end

function Conn:flush()
    while #self.out > 0 and self.fd >= 0 do
        local n = tonumber(C.send(self.fd, self.out, #self.out, MSG_NOSIGNAL + MSG_DONTWAIT))
        if n < 0 then
            local e = ffi.errno()
            if e == EAGAIN or e == EINPROGRESS then return end
            self.failed = "send failed (errno " .. e .. ")"
            return
        end
        self.out = self.out:sub(n + 1)
    end
end

-- Parses a complete response out of the received bytes, or returns nil.
local function parse(data, closed)
    local head_end = data:find("\r\n\r\n", 1, true)
    if not head_end then return nil end
    local head = data:sub(1, head_end - 1)
    local status = tonumber(head:match("^HTTP/1%.%d (%d%d%d)"))
    if not status then return { status = -1, head = head, body = "" } end
    local headers = {}
    for name, value in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[name:lower()] = value end
    local rest = data:sub(head_end + 4)
    if status == 100 then
        local r = parse(rest, closed)
        return r
    end
    local length = tonumber(headers["content-length"] or "")
    if length then
        if #rest < length then return nil end
        return { status = status, headers = headers, body = rest:sub(1, length) }
    end
    if (headers["transfer-encoding"] or ""):lower():find("chunked", 1, true) then
        local body, pos = {}, 1
        while true do
            local line_end = rest:find("\r\n", pos, true)
            if not line_end then return nil end
            local size = tonumber(rest:sub(pos, line_end - 1):match("^%x+"), 16)
            if not size then return { status = -1, head = head, body = "" } end
            if size == 0 then return { status = status, headers = headers, body = table.concat(body) } end
            if #rest < line_end + 1 + size + 2 then return nil end
            body[#body + 1] = rest:sub(line_end + 2, line_end + 1 + size)
            pos = line_end + 2 + size + 2
        end
    end
    if closed then return { status = status, headers = headers, body = rest } end
    return nil
end

-- Reads what has arrived; sets self.response when one is complete, self.eof
-- when the server closed.
function Conn:pull()
    if self.fd < 0 then return end
    while true do
        local n = tonumber(C.recv(self.fd, buf, 65536, MSG_DONTWAIT))
        if n > 0 then
            self.inbuf[#self.inbuf + 1] = ffi.string(buf, n)
            self.inlen = self.inlen + n
        elseif n == 0 then
            self.eof = true
            break
        else
            local e = ffi.errno()
            if e ~= EAGAIN then self.eof, self.reset = true, e end
            break
        end
    end
    if not self.response and self.inlen > 0 then
        local data = table.concat(self.inbuf)
        self.inbuf = { data }
        local r = parse(data, self.eof)
        if r then
            r.seconds = now() - self.started
            self.response = r
        end
    end
    if self.eof and not self.response then self.failed = self.failed or "closed" end
end

-- Polls conns (those not done) for up to timeout_s; returns when all are
-- done (a response, a failure or a close) or the time is up.
function nc.pump(conns, timeout_s)
    local deadline = now() + timeout_s
    while true do
        local pending = false
        for _, c in ipairs(conns) do pending = pending or (c.fd >= 0 and not c.response and not c.failed) end
        if not pending then return true end
        local left = deadline - now()
        if left <= 0 then return false end
        nc.step(conns, math.min(left, 0.05))
    end
end

-- One round for a set of connections: sends what is queued and reads what
-- has arrived, waiting at most timeout_s for something to happen.
function nc.step(conns, timeout_s)
    local n = 0
    local pfds = ffi.new("struct cart_nc_pollfd[?]", math.max(#conns, 1))
    local live = {}
    for _, c in ipairs(conns) do
        if c.fd >= 0 and not c.response and not c.failed then
            c:flush()
            pfds[n].fd, pfds[n].events, pfds[n].revents = c.fd, #c.out > 0 and POLLIN + POLLOUT or POLLIN, 0
            n = n + 1
            live[n] = c
        end
    end
    if n == 0 then return end
    C.poll(pfds, n, math.floor(timeout_s * 1000))
    for i = 0, n - 1 do
        if pfds[i].revents ~= 0 then live[i + 1]:pull() end
    end
end

-- Bytes received so far (for a stream read before its end).
function Conn:received() return self.inlen end

-- Waits for this connection's response: r, or nil and "timeout" / "closed".
function Conn:wait(timeout_s)
    nc.pump({ self }, timeout_s)
    if self.response then return self.response end
    return nil, self.failed or "timeout"
end

-- True while the server keeps the connection open (reads nothing it sent).
function Conn:is_open()
    self:pull()
    return not self.eof
end

function Conn:close()
    if self.fd >= 0 then C.close(self.fd) end
    self.fd = -1
end

-- One request on a new connection: the response (with .seconds), or nil, why.
function nc.request(host, port, method, path, body, timeout_s, headers)
    local c, why = nc.connect(host, port, true)
    if not c then return nil, why end
    local extra = ""
    for k, v in pairs(headers or {}) do extra = extra .. k .. ": " .. v .. "\r\n" end
    c:send(("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%sContent-Length: %d\r\n\r\n%s"):format(method, path,
        host, extra, body and #body or 0, body or ""))
    local r, err = c:wait(timeout_s or 30)
    c:close()
    return r, err
end

-- A request's bytes, for sending on a connection of one's own.
function nc.format(method, path, body, keep_alive)
    return ("%s %s HTTP/1.1\r\nHost: localhost\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s")
        :format(method, path, keep_alive and "" or "Connection: close\r\n", body and #body or 0, body or "")
end

return nc
