/*
 * fuzz_http.c - libFuzzer target for the HTTP/1.1 server (engine/http.h):
 * request parsing and the connection state machine, through the public API
 * and real loopback sockets.
 *
 * LLVMFuzzerInitialize starts one server on an ephemeral 127.0.0.1 port with
 * small limits and millisecond timeouts. Each input plays one client
 * connection:
 *
 *   byte 0   bits 0-2: how many extra cuts split the bytes into writes (with
 *            server polls between them: partial reads, pipelining); bit 3:
 *            close gracefully (FIN) instead of with a reset; bit 4: half-close
 *            after sending; bits 5-6: how many times the clock moves past the
 *            timeouts after sending (3: past the write timeout too); bit 7:
 *            the clock also moves past them halfway through the writes
 *   bytes 1-2 how the application answers each request, 3 bits per request
 *            (see the action enum): respond, 204, stream, stream left open,
 *            answer only after the client closed, a big body, bad calls then
 *            an error status
 *   byte 3+  what the client sends
 *
 * After sending, the server is polled until nothing moves, the client reads
 * what came back, closes, and the server is polled until the connection is
 * gone, so no state leaks into the next input. Checked (abort() on
 * violation, a finding):
 *   - every request id is delivered once, ids only grow, request_get and the
 *     header accessors agree with each other for a request in flight;
 *   - a CLOSED event comes exactly for the delivered requests not answered in
 *     full, and never twice; an answered or closed id is no longer in flight;
 *   - the bytes the client got are a sequence of responses, each starting
 *     with "HTTP/1.1 ", in the order the requests were answered, with the
 *     status the application gave and a body as its framing says (Content-
 *     Length, chunked, or raw to the end for HTTP/1.0 streams); anything
 *     after them is one protocol error response of the statuses http.h lists,
 *     with "Connection: close", and nothing after it;
 *   - the connection is gone within two seconds of the client closing, with
 *     no output left queued.
 *
 * Time: the server's clock is virtual. This file defines clock_gettime, so
 * the executable's calls (http.c's, and libstdc++'s, whose dynamic symbol
 * binds to it) come here: every clock reads the kernel's, and
 * CLOCK_MONOTONIC, the one http.c uses, reads it plus an offset that the
 * harness advances to let a timeout pass. Timeouts then fire exactly where an
 * input asks for them, at no cost in real time, and never by accident
 * (libFuzzer's own timing uses CLOCK_REALTIME).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "http.h"
#include "fuzz_common.h"

enum {
    HEADER = 3,             /* control bytes before the client's bytes */
    MAX_REQS = 256,         /* requests one input can produce (bounded by max_len) */
    RX_CAP = 1 << 20,       /* bytes the client keeps */
    TIMEOUT_MS = 50,        /* header, body, first-byte and idle timeouts (virtual) */
    WRITE_TIMEOUT_MS = 200, /* queued output making no progress (virtual) */
    GONE_WITHIN_MS = 2000   /* real time */
};

/* ------------------------------------------------------------------------- */
/* The virtual clock */

static int64_t monotonic_offset_ns;

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long rc = syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && clock == CLOCK_MONOTONIC && monotonic_offset_ns) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + monotonic_offset_ns;
        ts->tv_sec = ns / 1000000000;
        ts->tv_nsec = ns % 1000000000;
    }
    return rc == 0 ? 0 : -1;
}

static void advance_clock_ms(int64_t ms) { monotonic_offset_ns += ms * 1000000; }

static double real_ms(void) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

typedef enum action {
    A_ECHO_PATH = 0,  /* 200 text/plain, the path */
    A_ECHO_BODY = 1,  /* 200 with the body and an extra header */
    A_NO_CONTENT = 2, /* 204 */
    A_STREAM = 3,     /* a stream of two chunks */
    A_STREAM_OPEN = 4,/* a stream begun now and ended at a later poll */
    A_DEFER = 5,      /* answered only after the client closed */
    A_BIG = 6,        /* a body of 256 B .. 32 KiB */
    A_BAD_CALLS = 7   /* calls that must fail with CART_E_ARG, then an error status */
} action;

typedef enum req_state { R_PENDING, R_STREAMING, R_FINISHED, R_CLOSED } req_state;

typedef struct req {
    int64_t id;
    int action;
    req_state state;
    int head_only, version;
} req;

/* A response the application queued: what the wire must show, in order. */
typedef struct expected {
    int status;
    int head_only;
} expected;

typedef struct client {
    int fd;
    int closed;   /* the client side is closed: answers may fail */
    int lenient;  /* the output may stop short (a write failed, the client half-closed) */
    uint16_t actions;
    req reqs[MAX_REQS];
    int n_reqs;
    expected exp[MAX_REQS];
    int n_exp;
    char *rx;
    size_t rx_len;
} client;

static cart_http *server;
static int32_t port;
static int64_t last_id;
static char *rx_buf;
static int trace; /* CART_FUZZ_HTTP_TRACE=1: print what the client received */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    cart_http_options o;
    cart_http_default_options(&o);
    o.host = "127.0.0.1";
    o.port = 0;
    o.max_connections = 4;
    o.max_headers = 16;
    o.max_header_bytes = 1024;
    o.max_body_bytes = 1024;
    o.max_output_bytes = 16384;
    o.header_timeout_ms = TIMEOUT_MS;
    o.body_timeout_ms = TIMEOUT_MS;
    o.idle_timeout_ms = TIMEOUT_MS;
    o.write_timeout_ms = WRITE_TIMEOUT_MS;
    o.first_byte_timeout_ms = TIMEOUT_MS;
    o.max_connections_per_peer = 4;
    FUZZ_CHECK(cart_http_listen(&server, &o) == CART_OK, "listen: %s", cart_last_error());
    port = cart_http_port(server);
    trace = getenv("CART_FUZZ_HTTP_TRACE") != NULL;
    rx_buf = malloc(RX_CAP);
    FUZZ_CHECK(rx_buf != NULL, "out of memory");
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The application side */

static req *find_req(client *c, int64_t id) {
    for (int i = 0; i < c->n_reqs; i++)
        if (c->reqs[i].id == id) return &c->reqs[i];
    return NULL;
}

static int str_is(cart_str s, const char *z) {
    return (size_t)s.len == strlen(z) && memcmp(s.data, z, (size_t)s.len) == 0;
}

/* request_get, header_at and header agree with each other. */
static void check_request(int64_t id, cart_http_request *r) {
    FUZZ_CHECK(cart_http_request_get(server, id, r) == CART_OK, "request_get(%lld): %s",
               (long long)id, cart_last_error());
    FUZZ_CHECK(r->id == id, "request_get gave id %lld for %lld", (long long)r->id, (long long)id);
    FUZZ_CHECK(r->version == 10 || r->version == 11, "version %d", (int)r->version);
    FUZZ_CHECK(r->method.len > 0 && r->target.len > 0, "empty method or target");
    FUZZ_CHECK(r->path.data >= r->target.data &&
                   r->path.data + r->path.len <= r->target.data + r->target.len,
               "path is not inside the target");
    fuzz_touch(r->body.data, (uint64_t)r->body.len);
    fuzz_touch(r->remote.data, (uint64_t)r->remote.len);
    FUZZ_CHECK(r->n_headers >= 0 && r->n_headers <= 16, "%d headers", (int)r->n_headers);
    cart_str name, value, first;
    for (int32_t i = 0; i < r->n_headers; i++) {
        FUZZ_CHECK(cart_http_header_at(server, id, i, &name, &value) == CART_OK, "header_at %d", (int)i);
        fuzz_touch(value.data, (uint64_t)value.len);
        char z[1100];
        if (name.len == 0 || name.len >= sizeof z) continue;
        memcpy(z, name.data, (size_t)name.len);
        z[name.len] = '\0';
        FUZZ_CHECK(cart_http_header(server, id, z, &first) == 1, "header('%s') absent", z);
        /* the first header of that name, compared case-insensitively */
        for (int32_t j = 0; j <= i; j++) {
            cart_str n2, v2;
            cart_http_header_at(server, id, j, &n2, &v2);
            if (n2.len == name.len && strncasecmp(n2.data, name.data, (size_t)name.len) == 0) {
                FUZZ_CHECK(v2.data == first.data && v2.len == first.len,
                           "header('%s') is not the first of that name", z);
                break;
            }
        }
    }
    FUZZ_CHECK(cart_http_header_at(server, id, r->n_headers, &name, &value) == CART_E_ARG,
               "header_at past the end");
    if (cart_http_header(server, id, "content-length", &value)) {
        uint64_t n = 0;
        for (uint64_t k = 0; k < value.len; k++) n = n * 10 + (uint64_t)(value.data[k] - '0');
        FUZZ_CHECK(n == (uint64_t)r->body.len, "Content-Length %llu, body %lld bytes",
                   (unsigned long long)n, (long long)r->body.len);
    } else {
        FUZZ_CHECK(r->body.len == 0, "a body of %lld bytes without Content-Length",
                   (long long)r->body.len);
    }
}

/* The outcome of a call that may only succeed or find the client gone. */
static int answered(client *c, req *q, int rc, const char *what) {
    FUZZ_CHECK(rc == CART_OK || rc == CART_E_STATE, "%s for request %lld: %d (%s)", what,
               (long long)q->id, rc, cart_last_error());
    if (rc != CART_OK) c->lenient = 1;
    return rc == CART_OK;
}

static void expect_response(client *c, req *q, int status) {
    if (c->closed || c->n_exp >= MAX_REQS) return;
    c->exp[c->n_exp++] = (expected){status, q->head_only};
}

static void respond(client *c, req *q, int status, const char *type, const void *body, int64_t len,
                    const char *extra) {
    int rc = cart_http_respond(server, q->id, status, type, body, len, extra);
    if (answered(c, q, rc, "respond")) {
        expect_response(c, q, status);
        q->state = R_FINISHED;
    }
}

static void stream_begin(client *c, req *q) {
    int rc = cart_http_stream_begin(server, q->id, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
    if (answered(c, q, rc, "stream_begin")) {
        expect_response(c, q, 200);
        q->state = R_STREAMING;
        answered(c, q, cart_http_stream_write(server, q->id, "data: a\n\n", 9), "stream_write");
    }
}

static void stream_end(client *c, req *q) {
    if (answered(c, q, cart_http_stream_end(server, q->id), "stream_end")) q->state = R_FINISHED;
}

static void answer(client *c, req *q, const cart_http_request *r) {
    static char big[32768];
    switch (q->action) {
    case A_ECHO_PATH:
        respond(c, q, 200, "text/plain", r->path.data, r->path.len, NULL);
        break;
    case A_ECHO_BODY:
        respond(c, q, 200, "application/json", r->body.data, r->body.len, "X-Fuzz: yes\r\n");
        break;
    case A_NO_CONTENT:
        respond(c, q, 204, NULL, NULL, 0, NULL);
        break;
    case A_STREAM:
        stream_begin(c, q);
        if (q->state == R_STREAMING) {
            answered(c, q, cart_http_stream_write(server, q->id, r->path.data, r->path.len),
                     "stream_write");
            stream_end(c, q);
        }
        break;
    case A_STREAM_OPEN:
        stream_begin(c, q);
        break;
    case A_DEFER:
        break;
    case A_BIG: {
        int64_t n = (int64_t)256 << (q->id & 7);
        memset(big, 'x', (size_t)n);
        respond(c, q, 200, "text/plain", big, n, NULL);
        break;
    }
    case A_BAD_CALLS:
        FUZZ_CHECK(cart_http_respond(server, q->id, 99, NULL, NULL, 0, NULL) == CART_E_ARG, "status 99");
        FUZZ_CHECK(cart_http_respond(server, q->id, 200, NULL, NULL, 0, "Content-Length: 5\r\n") ==
                       CART_E_ARG, "an extra Content-Length header");
        FUZZ_CHECK(cart_http_respond(server, q->id, 204, NULL, "x", 1, NULL) == CART_E_ARG,
                   "204 with a body");
        FUZZ_CHECK(cart_http_stream_write(server, q->id, "x", 1) == CART_E_STATE,
                   "stream_write before stream_begin");
        respond(c, q, q->id & 1 ? 404 : 503, "application/json", "{}", 2, NULL);
        break;
    }
}

static void on_request(client *c, int64_t id) {
    FUZZ_CHECK(id > last_id, "request id %lld after %lld", (long long)id, (long long)last_id);
    last_id = id;
    FUZZ_CHECK(c->n_reqs < MAX_REQS, "more than %d requests", MAX_REQS);
    req *q = &c->reqs[c->n_reqs];
    q->id = id;
    q->action = (c->actions >> (3 * (c->n_reqs % 5))) & 7;
    q->state = R_PENDING;
    c->n_reqs++;
    cart_http_request r;
    check_request(id, &r);
    q->head_only = str_is(r.method, "HEAD");
    q->version = r.version;
    if (q->action == A_DEFER && c->closed)
        respond(c, q, 200, NULL, "late", 4, NULL);
    else
        answer(c, q, &r);
}

static void on_closed(client *c, int64_t id) {
    req *q = find_req(c, id);
    FUZZ_CHECK(q != NULL, "CLOSED for request %lld, never delivered", (long long)id);
    FUZZ_CHECK(q->state == R_PENDING || q->state == R_STREAMING,
               "CLOSED for request %lld in state %d", (long long)id, (int)q->state);
    q->state = R_CLOSED;
    c->lenient = 1;
}

/* Takes every queued event; returns how many. */
static int handle_events(client *c) {
    cart_http_event ev;
    int n = 0;
    while (cart_http_next_event(server, &ev)) {
        n++;
        if (ev.kind == CART_HTTP_REQUEST)
            on_request(c, ev.request);
        else if (ev.kind == CART_HTTP_CLOSED)
            on_closed(c, ev.request);
        else
            FUZZ_CHECK(0, "event of kind %d", (int)ev.kind);
    }
    return n;
}

/* Ends the streams left open by A_STREAM_OPEN, one poll after they began. */
static int end_open_streams(client *c) {
    int n = 0;
    for (int i = 0; i < c->n_reqs; i++) {
        req *q = &c->reqs[i];
        if (q->state == R_STREAMING && q->action == A_STREAM_OPEN) {
            stream_end(c, q);
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------------------- */
/* The client side */

static int client_read(client *c) {
    if (c->fd < 0) return 0;
    int got = 0;
    while (c->rx_len < RX_CAP) {
        ssize_t n = recv(c->fd, c->rx + c->rx_len, RX_CAP - c->rx_len, MSG_DONTWAIT);
        if (n > 0) {
            c->rx_len += (size_t)n;
            got = 1;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c->lenient = 1; /* reset */
        break;
    }
    if (c->rx_len == RX_CAP) c->lenient = 1;
    return got;
}

/* One server poll and everything that follows from it; nonzero when
 * anything happened. */
static int pump(client *c) {
    FUZZ_CHECK(cart_http_poll(server, 0) == CART_OK, "poll: %s", cart_last_error());
    int n = handle_events(c);
    n += end_open_streams(c);
    n += client_read(c);
    return n;
}

static void pump_until_quiet(client *c) {
    for (int k = 0; k < 64; k++)
        if (!pump(c) && cart_http_pending_output(server) == 0) break;
}

/* Sends all n bytes unless the server closed on us. */
static void client_send(client *c, const uint8_t *p, size_t n) {
    size_t off = 0;
    for (int spins = 0; off < n && spins < 1000; spins++) {
        ssize_t k = send(c->fd, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            pump(c);
            continue;
        }
        c->lenient = 1; /* the server closed: the rest is not sent */
        return;
    }
}

static int connect_client(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0 && errno == EINTR) { /* libFuzzer's timer signal: the connect goes on; wait for it */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        while (poll(&p, 1, 1000) < 0 && errno == EINTR) {}
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err ? -1 : 0;
        errno = err;
    }
    FUZZ_CHECK(rc == 0, "connect: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void close_client(client *c, int graceful) {
    if (!graceful) {
        struct linger l = {1, 0}; /* close with a reset: no TIME_WAIT left behind */
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(c->fd);
    c->fd = -1;
    c->closed = 1;
}

/* ------------------------------------------------------------------------- */
/* What the client received */

static const char *find_crlf2(const char *p, const char *end) {
    for (; p + 4 <= end; p++)
        if (p[0] == '\r' && p[1] == '\n' && p[2] == '\r' && p[3] == '\n') return p;
    return NULL;
}

/* The value of header `name` in the head [p, end), or NULL. */
static const char *head_value(const char *p, const char *end, const char *name, size_t *len) {
    size_t n = strlen(name);
    for (const char *line = p; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        if ((size_t)(eol - line) > n + 1 && strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            while (v < eol && *v == ' ') v++;
            const char *ve = eol;
            if (ve > v && ve[-1] == '\r') ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        line = eol + 1;
    }
    return NULL;
}

static int is_protocol_error(int status) {
    static const int statuses[] = {400, 408, 411, 413, 417, 431, 501, 503, 505};
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i] == status) return 1;
    return 0;
}

/* Skips a chunked body at *pos; 0 when it is cut short. */
static int skip_chunked(const char *b, size_t len, size_t *pos) {
    for (;;) {
        size_t at = *pos, size = 0;
        int digits = 0;
        while (at < len && ((b[at] >= '0' && b[at] <= '9') || (b[at] >= 'a' && b[at] <= 'f'))) {
            size = size * 16 + (size_t)(b[at] <= '9' ? b[at] - '0' : b[at] - 'a' + 10);
            at++;
            digits++;
        }
        if (at + 2 > len) return 0;
        FUZZ_CHECK(digits > 0 && b[at] == '\r' && b[at + 1] == '\n', "malformed chunk size line");
        at += 2;
        if (at + size + 2 > len) return 0;
        FUZZ_CHECK(b[at + size] == '\r' && b[at + size + 1] == '\n', "chunk not followed by CRLF");
        *pos = at + size + 2;
        if (size == 0) return 1;
    }
}

/* Checks the client's bytes; returns 1 when they stop short of what the
 * framing says (more may still be in flight), 0 when complete. */
static int check_wire(client *c) {
    const char *b = c->rx;
    size_t len = c->rx_len, pos = 0;
    int k = 0, saw_error = 0;
    while (pos < len) {
        FUZZ_CHECK(!saw_error, "bytes after a protocol error response");
        const char *start = b + pos, *end = b + len;
        if (len - pos < 9) {
            FUZZ_CHECK(memcmp(start, "HTTP/1.1 ", len - pos) == 0, "a response starts with '%.*s'",
                       (int)(len - pos), start);
            return 1;
        }
        FUZZ_CHECK(memcmp(start, "HTTP/1.1 ", 9) == 0, "a response starts with '%.9s'", start);
        const char *head_end = find_crlf2(start, end);
        if (!head_end) return 1;
        int status = atoi(start + 9);
        size_t after = (size_t)(head_end + 4 - b);
        if (status == 100) { /* interim answer to Expect: 100-continue */
            pos = after;
            continue;
        }
        size_t vlen = 0;
        const char *cl = head_value(start, head_end, "Content-Length", &vlen);
        const char *te = head_value(start, head_end, "Transfer-Encoding", &vlen);
        size_t body = cl ? (size_t)strtoull(cl, NULL, 10) : 0;
        if (k < c->n_exp) {
            const expected *e = &c->exp[k++];
            FUZZ_CHECK(status == e->status, "response %d has status %d, the application gave %d", k,
                       status, e->status);
            if (e->head_only || status == 204 || status == 304) {
                pos = after;
            } else if (te) {
                pos = after;
                if (!skip_chunked(b, len, &pos)) return 1;
            } else if (cl) {
                if (after + body > len) return 1;
                pos = after + body;
            } else {
                return 0; /* HTTP/1.0 stream: raw to the end */
            }
            continue;
        }
        FUZZ_CHECK(is_protocol_error(status), "unrequested response with status %d", status);
        FUZZ_CHECK(head_value(start, head_end, "Connection", &vlen) && vlen == 5,
                   "a protocol error response without Connection: close");
        FUZZ_CHECK(cl != NULL, "a protocol error response without Content-Length");
        if (after + body > len) return 1;
        FUZZ_CHECK(body > 10 && memcmp(b + after, "{\"error\":{", 10) == 0, "error body '%.*s'",
                   (int)body, b + after);
        pos = after + body;
        saw_error = 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < HEADER) return 0;
    FUZZ_CHECK(cart_http_connections(server) == 0, "%d connections left from the input before",
               (int)cart_http_connections(server));
    static client c;
    memset(&c, 0, sizeof c);
    c.rx = rx_buf;
    uint8_t ctl = data[0];
    c.actions = (uint16_t)(data[1] | data[2] << 8);
    const uint8_t *msg = data + HEADER;
    size_t len = size - HEADER;

    /* the cut points, sorted */
    size_t cuts[9];
    int n_cuts = ctl & 7;
    for (int i = 0; i < n_cuts; i++)
        cuts[i] = len ? mix((uint32_t)i * 2654435761U ^ c.actions ^ (uint32_t)ctl << 24) % (len + 1) : 0;
    qsort(cuts, (size_t)n_cuts, sizeof cuts[0], cmp_size);
    cuts[n_cuts] = len;

    c.fd = connect_client();
    pump(&c); /* accept */
    size_t at = 0;
    for (int i = 0; i <= n_cuts; i++) {
        if (cuts[i] > at) client_send(&c, msg + at, cuts[i] - at);
        at = cuts[i] > at ? cuts[i] : at;
        pump(&c);
        if ((ctl & 0x80) && i == n_cuts / 2) { /* a timeout while the bytes arrive */
            advance_clock_ms(TIMEOUT_MS + 1);
            pump(&c);
        }
    }
    if (ctl & 0x10) {
        shutdown(c.fd, SHUT_WR);
        c.lenient = 1;
    }
    pump_until_quiet(&c);
    int waits = (ctl >> 5) & 3; /* header, body, first-byte, idle: 408s and quiet closes */
    for (int w = 0; w < waits; w++) {
        advance_clock_ms(w == 2 ? WRITE_TIMEOUT_MS + 1 : TIMEOUT_MS + 1);
        pump_until_quiet(&c);
    }
    client_read(&c);
    if (trace)
        fprintf(stderr, "fuzz_http: %d requests; the client received %zu bytes:\n%.*s\n", c.n_reqs,
                c.rx_len, (int)(c.rx_len < 4000 ? c.rx_len : 4000), c.rx);
    /* loopback delivery may lag behind the server's send under load: a
     * response cut short is only a finding when no more bytes come */
    for (int tries = 0; check_wire(&c) && !c.lenient; tries++) {
        FUZZ_CHECK(tries < 40, "the responses stop short after %zu bytes", c.rx_len);
        struct pollfd p = {.fd = c.fd, .events = POLLIN};
        poll(&p, 1, 50);
        client_read(&c);
    }
    close_client(&c, ctl & 0x08);

    /* the deferred answers, now that the client is gone: they may still
     * succeed when the server has not noticed yet */
    for (int i = 0; i < c.n_reqs; i++)
        if (c.reqs[i].action == A_DEFER && c.reqs[i].state == R_PENDING)
            respond(&c, &c.reqs[i], 200, NULL, "late", 4, NULL);

    double started = real_ms();
    while (cart_http_connections(server) > 0) {
        FUZZ_CHECK(real_ms() - started < GONE_WITHIN_MS,
                   "the connection is still open %d ms after the client closed", GONE_WITHIN_MS);
        cart_http_poll(server, 1);
        handle_events(&c);
        end_open_streams(&c);
    }
    handle_events(&c);
    FUZZ_CHECK(cart_http_pending_output(server) == 0, "%lld bytes still queued",
               (long long)cart_http_pending_output(server));

    for (int i = 0; i < c.n_reqs; i++) {
        const req *q = &c.reqs[i];
        FUZZ_CHECK(q->state == R_FINISHED || q->state == R_CLOSED,
                   "request %lld (action %d) neither answered nor reported CLOSED (state %d)",
                   (long long)q->id, q->action, (int)q->state);
        cart_http_request r;
        FUZZ_CHECK(cart_http_request_get(server, q->id, &r) == CART_E_STATE,
                   "request %lld is still in flight", (long long)q->id);
        FUZZ_CHECK(!cart_http_is_open(server, q->id), "request %lld is still open", (long long)q->id);
        FUZZ_CHECK(cart_http_respond(server, q->id, 200, NULL, NULL, 0, NULL) == CART_E_STATE,
                   "respond to finished request %lld", (long long)q->id);
    }
    return 0;
}
