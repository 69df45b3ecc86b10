/*
 * test_http.c - the HTTP server against real sockets.
 *
 * Each case starts a server on an ephemeral port of 127.0.0.1. A client thread
 * plays the scenario with plain blocking sockets (5 s receive timeout) and
 * records what it saw; this thread runs the server's loop the way the Lua
 * server does (poll, drain events, one "model step" tick) with a small
 * application: /echo answers the body back, /inspect describes the request,
 * /stream sends three chunks, /forever streams a chunk per tick until the
 * client goes, /hold answers only after 20 ticks, anything else is 404. The
 * checks run on this thread after the client has finished.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "check.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------
 * The client side: runs on its own thread, records results, checks nothing. */

enum { RESULTS = 24, BODY_CAP = 8192, HEAD_CAP = 2048, CLIENT_BUF = 1 << 18 };

typedef struct result {
    int status;          /* -1: no response */
    char head[HEAD_CAP]; /* status line and headers */
    char body[BODY_CAP]; /* the body (chunks joined), cut at BODY_CAP - 1 */
    size_t body_len;     /* the whole body's length */
    int chunks;          /* chunked: the number of non-empty chunks */
    int eof;             /* the server closed the connection afterwards */
    double seconds;      /* scenario-specific timing */
} result;

typedef struct job job;
struct job {
    void (*client)(job *j);
    int port;
    atomic_int done;
    atomic_int server_saw_close; /* set by the application on a CLOSED event */
    int n;
    result r[RESULTS];
    char *buf; /* CLIENT_BUF bytes, the receive buffer of rx */
};

/* A client connection: the socket and the bytes received but not consumed. */
typedef struct rx {
    int fd;
    char *data;
    size_t len;
} rx;

static rx client_connect(job *j) {
    rx c = {-1, j->buf, 0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return c;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)j->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return c;
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    c.fd = fd;
    return c;
}

/* A second connection needs its own buffer. */
static rx client_connect_with(job *j, char *buf) {
    rx c = client_connect(j);
    c.data = buf;
    return c;
}

static int send_str(rx *c, const char *s) {
    size_t n = strlen(s), off = 0;
    while (off < n) {
        ssize_t k = send(c->fd, s + off, n - off, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        off += (size_t)k;
    }
    return 0;
}

/* Reads more bytes: > 0 read, 0 EOF, -1 error or timeout. */
static int fill(rx *c) {
    if (c->len >= CLIENT_BUF) return -1;
    ssize_t n = recv(c->fd, c->data + c->len, CLIENT_BUF - c->len, 0);
    if (n > 0) c->len += (size_t)n;
    return n > 0 ? 1 : n == 0 ? 0 : -1;
}

static void take(rx *c, size_t n) {
    memmove(c->data, c->data + n, c->len - n);
    c->len -= n;
}

/* The value of header `name` in a response head, or NULL. */
static const char *head_value(const char *head, const char *name, char *out, size_t cap) {
    size_t n = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, n) == 0 && p[2 + n] == ':') {
            const char *v = p + 3 + n;
            while (*v == ' ') v++;
            size_t k = strcspn(v, "\r");
            if (k >= cap) k = cap - 1;
            memcpy(out, v, k);
            out[k] = '\0';
            return out;
        }
    }
    return NULL;
}

static void add_body(result *r, const char *p, size_t n) {
    size_t room = BODY_CAP - 1 - (r->body_len < BODY_CAP - 1 ? r->body_len : BODY_CAP - 1);
    size_t k = n < room ? n : room;
    memcpy(r->body + (BODY_CAP - 1 - room), p, k);
    r->body_len += n;
    r->body[r->body_len < BODY_CAP - 1 ? r->body_len : BODY_CAP - 1] = '\0';
}

/* Reads one response into r. head_only: a response to HEAD (no body).
 * Returns 0, or -1 when the connection ended or timed out first. */
static int read_response(rx *c, result *r, int head_only) {
    memset(r, 0, sizeof *r);
    r->status = -1;
    char *end;
    while (!(end = memmem(c->data, c->len, "\r\n\r\n", 4)))
        if (fill(c) <= 0) return -1;
    size_t hl = (size_t)(end - c->data) + 4;
    size_t keep = hl < HEAD_CAP - 1 ? hl : HEAD_CAP - 1;
    memcpy(r->head, c->data, keep);
    r->head[keep] = '\0';
    take(c, hl);
    if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    char v[64];
    if (head_only || r->status < 200 || r->status == 204 || r->status == 304) return 0;
    if (head_value(r->head, "Transfer-Encoding", v, sizeof v)) {
        for (;;) {
            char *nl;
            while (!(nl = memmem(c->data, c->len, "\r\n", 2)))
                if (fill(c) <= 0) return -1;
            size_t size = strtoul(c->data, NULL, 16);
            take(c, (size_t)(nl - c->data) + 2);
            while (c->len < size + 2)
                if (fill(c) <= 0) return -1;
            if (size == 0) {
                take(c, 2);
                return 0;
            }
            add_body(r, c->data, size);
            r->chunks++;
            take(c, size + 2);
        }
    }
    if (head_value(r->head, "Content-Length", v, sizeof v)) {
        size_t n = strtoul(v, NULL, 10);
        while (c->len < n)
            if (fill(c) <= 0) return -1;
        add_body(r, c->data, n);
        take(c, n);
        return 0;
    }
    int k;
    while ((k = fill(c)) > 0) {
    }
    add_body(r, c->data, c->len);
    take(c, c->len);
    r->eof = k == 0;
    return k == 0 ? 0 : -1;
}

/* 1 when the server closes the connection (EOF or reset) within the receive
 * timeout; 0 otherwise. Bytes that arrive meanwhile are dropped. */
static int wait_closed(rx *c) {
    for (;;) {
        c->len = 0;
        int k = fill(c);
        if (k == 0) return 1;
        if (k < 0) return errno == ECONNRESET;
    }
}

static void client_close(rx *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Sends `request` on a new connection, reads one response into r, then
 * records whether the server closed the connection. */
static void one_shot(job *j, const char *request, result *r) {
    rx c = client_connect(j);
    if (send_str(&c, request) == 0 && read_response(&c, r, 0) == 0 && !r->eof)
        r->eof = wait_closed(&c);
    client_close(&c);
}

/* ---------------------------------------------------------------------------
 * The server side: this thread's loop and its small application. */

typedef struct app {
    job *job;
    int requests;          /* REQUEST events */
    int closed;            /* CLOSED events */
    int64_t closed_id;     /* the request of the last CLOSED event */
    int64_t forever_id;    /* the /forever stream, written every tick while open */
    int forever_chunks;    /* chunks written to it */
    int forever_bytes;     /* bytes per chunk (default 16) */
    int write_after_close; /* stream_write's status once the request closed */
    int open_after_close;  /* is_open once the request closed */
    int64_t hold_id;       /* the /hold request, answered after 20 ticks */
    int hold_ticks;
    int requests_at_release; /* REQUEST events seen when /hold was answered */
    int max_connections;     /* most open connections seen at a tick */
    int misuse[10];          /* statuses of the /misuse calls */
    char *big;               /* forever_bytes of filler */
} app;

static void app_request(cart_http *h, app *a, int64_t id) {
    cart_http_request q;
    if (cart_http_request_get(h, id, &q) != CART_OK) return;
    a->requests++;
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)q.path.len, q.path.data);
    if (strcmp(path, "/echo") == 0) {
        cart_http_respond(h, id, 200, "application/json", q.body.data, (int64_t)q.body.len,
                          "X-Echo: yes\r\n");
    } else if (strcmp(path, "/inspect") == 0) {
        cart_str v;
        int found = cart_http_header(h, id, "x-CUSTOM", &v);
        cart_str name, value;
        int at = cart_http_header_at(h, id, 0, &name, &value);
        char text[1024];
        int n = snprintf(
            text, sizeof text, "%.*s|%.*s|%.*s|%.*s|%d|%d|%d|%.*s|%s", (int)q.method.len,
            q.method.data, (int)q.path.len, q.path.data, (int)q.query.len, q.query.data,
            found ? (int)v.len : 6, found ? v.data : "(none)", (int)q.version, (int)q.n_headers, at,
            (int)name.len, name.data,
            q.remote.len > 0 && strncmp(q.remote.data, "127.0.0.1:", 10) == 0 ? "local" : "other");
        cart_http_respond(h, id, 200, "text/plain", text, n, NULL);
    } else if (strcmp(path, "/stream") == 0) {
        cart_http_stream_begin(h, id, 200, "text/event-stream", "Cache-Control: no-cache\r\n");
        for (int i = 1; i <= 3; i++) {
            char chunk[32];
            int n = snprintf(chunk, sizeof chunk, "data: %d\n\n", i);
            cart_http_stream_write(h, id, chunk, n);
        }
        cart_http_stream_end(h, id);
    } else if (strcmp(path, "/forever") == 0) {
        cart_http_stream_begin(h, id, 200, "text/event-stream", NULL);
        a->forever_id = id;
    } else if (strcmp(path, "/hold") == 0) {
        a->hold_id = id;
        a->hold_ticks = 0;
    } else if (strcmp(path, "/misuse") == 0) {
        int *m = a->misuse;
        m[0] = cart_http_stream_write(h, id, "x", 1); /* no stream begun */
        m[1] = cart_http_respond(h, id, 99, NULL, NULL, 0, NULL);
        m[2] = cart_http_respond(h, id, 200, NULL, NULL, 0, "Content-Length: 5\r\n");
        m[3] = cart_http_respond(h, id, 200, NULL, NULL, 0, "X-A: b");
        m[4] = cart_http_respond(h, id, 204, NULL, "x", 1, NULL);
        m[5] = cart_http_respond(h, id, 200, "text/plain", "ok", 2, "X-A: b\r\nX-B: c\r\n");
        m[6] = cart_http_respond(h, id, 200, NULL, NULL, 0, NULL); /* answered already */
        m[7] = cart_http_stream_write(h, id, "x", 1);
        m[8] = cart_http_request_get(h, id, &q);
        m[9] = cart_http_respond(h, 987654321, 200, NULL, NULL, 0, NULL);
    } else {
        static const char nf[] = "{\"error\":{\"message\":\"no such endpoint\","
                                 "\"type\":\"invalid_request_error\",\"code\":null}}";
        cart_http_respond(h, id, 404, "application/json", nf, sizeof nf - 1, NULL);
    }
}

static void app_event(cart_http *h, app *a, const cart_http_event *ev) {
    if (ev->kind == CART_HTTP_REQUEST) app_request(h, a, ev->request);
    if (ev->kind == CART_HTTP_CLOSED) {
        a->closed++;
        a->closed_id = ev->request;
        if (ev->request == a->forever_id) {
            a->write_after_close = cart_http_stream_write(h, a->forever_id, "late", 4);
            a->open_after_close = cart_http_is_open(h, a->forever_id);
            a->forever_id = 0;
        }
        atomic_store(&a->job->server_saw_close, 1);
    }
}

/* One "model step": the work the application does between polls. */
static void app_tick(cart_http *h, app *a) {
    int n = cart_http_connections(h);
    if (n > a->max_connections) a->max_connections = n;
    if (a->forever_id && cart_http_is_open(h, a->forever_id)) {
        int bytes = a->forever_bytes ? a->forever_bytes : 16;
        if (!a->big) {
            a->big = malloc((size_t)bytes);
            memset(a->big, 'x', (size_t)bytes);
            memcpy(a->big, "data: ", 6);
        }
        if (cart_http_stream_write(h, a->forever_id, a->big, bytes) == CART_OK) a->forever_chunks++;
    }
    if (a->hold_id && ++a->hold_ticks >= 20) {
        cart_http_request q;
        if (cart_http_request_get(h, a->hold_id, &q) == CART_OK) {
            a->requests_at_release = a->requests;
            cart_http_respond(h, a->hold_id, 200, "text/plain", q.body.data, (int64_t)q.body.len,
                              NULL);
        }
        a->hold_id = 0;
    }
}

static void *client_main(void *p) {
    job *j = p;
    j->client(j);
    atomic_store(&j->done, 1);
    return NULL;
}

/* Runs `client` on a thread against h while this thread serves, then polls
 * on for `after_ms` so the server sees the client's last closes. */
static job *serve(cart_http *h, app *a, void (*client)(job *), int after_ms) {
    job *j = calloc(1, sizeof *j);
    j->buf = malloc(CLIENT_BUF);
    j->client = client;
    j->port = cart_http_port(h);
    a->job = j;
    pthread_t t;
    pthread_create(&t, NULL, client_main, j);
    double stop_at = 0;
    for (;;) {
        CHECK_OK(cart_http_poll(h, 5));
        cart_http_event ev;
        while (cart_http_next_event(h, &ev)) app_event(h, a, &ev);
        app_tick(h, a);
        if (atomic_load(&j->done)) {
            if (stop_at == 0) stop_at = now_s() + after_ms / 1000.0;
            if (now_s() >= stop_at) break;
        }
    }
    pthread_join(t, NULL);
    return j;
}

static void job_free(job *j, app *a) {
    free(j->buf);
    free(j);
    free(a->big);
}

static cart_http *start(cart_http_options *o) {
    cart_http *h = NULL;
    CHECK_OK(cart_http_listen(&h, o));
    return h;
}

static cart_http *start_default(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    return start(&o);
}

/* An OpenAI-shaped protocol error with `status`, followed by a close. */
static int is_protocol_error(const result *r, int status) {
    const char *type =
        status >= 500 ? "\"type\":\"server_error\"" : "\"type\":\"invalid_request_error\"";
    return r->status == status && strstr(r->body, "{\"error\":{\"message\":\"") == r->body &&
           strstr(r->body, type) && strstr(r->body, "\"code\":null}}") && r->eof;
}

/* ---------------------------------------------------------------------------
 * Cases */

static void client_round_trip(job *j) {
    one_shot(j,
             "GET /inspect?a=1&b=two HTTP/1.1\r\nHost: x\r\nX-Custom:   padded value  \r\n"
             "Connection: close\r\n\r\n",
             &j->r[0]);
    one_shot(j,
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: 17\r\nConnection: close\r\n\r\n{\"hello\":\"world\"}",
             &j->r[1]);
    one_shot(j, "GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &j->r[2]);
}

static void test_answers_a_get_and_echoes_a_post(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_round_trip, 20);
    char v[64];
    CHECK_MSG(j->r[0].status == 200, "GET status %d", j->r[0].status);
    CHECK_MSG(strcmp(j->r[0].body, "GET|/inspect|a=1&b=two|padded value|11|3|0|Host|local") == 0,
              "GET saw '%s'", j->r[0].body);
    CHECK(head_value(j->r[0].head, "Date", v, sizeof v) && strstr(v, "GMT"));
    CHECK_MSG(j->r[1].status == 200, "POST status %d", j->r[1].status);
    CHECK_MSG(strcmp(j->r[1].body, "{\"hello\":\"world\"}") == 0, "echo '%s'", j->r[1].body);
    CHECK(head_value(j->r[1].head, "Content-Type", v, sizeof v) &&
          strcmp(v, "application/json") == 0);
    CHECK(head_value(j->r[1].head, "X-Echo", v, sizeof v) && strcmp(v, "yes") == 0);
    CHECK_MSG(j->r[2].status == 404, "unknown path status %d", j->r[2].status);
    CHECK(strstr(j->r[2].body, "no such endpoint") != NULL);
    CHECK(j->r[0].eof && j->r[1].eof && j->r[2].eof);
    CHECK_MSG(a.requests == 3, "%d requests", a.requests);
    printf("  3 requests answered; GET saw '%s'\n", j->r[0].body);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_keep_alive(job *j) {
    rx c = client_connect(j);
    send_str(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst");
    read_response(&c, &j->r[0], 0);
    send_str(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsecond");
    read_response(&c, &j->r[1], 0);
    send_str(&c, "HEAD /inspect HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(&c, &j->r[2], 1);
    send_str(&c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(&c, &j->r[3], 0);
    client_close(&c);
}

static void test_keeps_a_connection_alive_across_sequential_requests(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_keep_alive, 20);
    CHECK(j->r[0].status == 200 && strcmp(j->r[0].body, "first") == 0);
    CHECK(j->r[1].status == 200 && strcmp(j->r[1].body, "second") == 0);
    char v[32];
    CHECK_MSG(j->r[2].status == 200 && head_value(j->r[2].head, "Content-Length", v, sizeof v) &&
                  atoi(v) > 0,
              "HEAD status %d", j->r[2].status);
    CHECK_MSG(j->r[3].status == 200 && j->r[3].body_len == 0,
              "GET after HEAD: status %d, %zu body bytes (a HEAD body leaked?)", j->r[3].status,
              j->r[3].body_len);
    CHECK_MSG(a.max_connections == 1, "%d connections for 4 requests", a.max_connections);
    CHECK(!head_value(j->r[0].head, "Connection", v, sizeof v));
    printf("  4 requests on %d connection\n", a.max_connections);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_pipeline(job *j) {
    rx c = client_connect(j);
    send_str(&c, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
                 "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nsecond"
                 "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(&c, &j->r[0], 0);
    read_response(&c, &j->r[1], 0);
    read_response(&c, &j->r[2], 0);
    client_close(&c);
}

static void test_answers_pipelined_requests_in_order_one_at_a_time(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_pipeline, 20);
    CHECK_MSG(j->r[0].status == 200 && strcmp(j->r[0].body, "first") == 0, "1st: %d '%s'",
              j->r[0].status, j->r[0].body);
    CHECK_MSG(j->r[1].status == 200 && strcmp(j->r[1].body, "second") == 0, "2nd: %d '%s'",
              j->r[1].status, j->r[1].body);
    CHECK_MSG(j->r[2].status == 404, "3rd: %d", j->r[2].status);
    CHECK_MSG(a.requests_at_release == 1,
              "%d requests were delivered while the first was held for 20 ticks (expected 1)",
              a.requests_at_release);
    CHECK(a.requests == 3);
    printf("  requests delivered while the first was held: %d; all %d answered in order\n",
           a.requests_at_release, a.requests);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_close_requests(job *j) {
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n", &j->r[0]);
    one_shot(j, "GET /echo HTTP/1.0\r\n\r\n", &j->r[1]);
    one_shot(j, "GET /stream HTTP/1.0\r\n\r\n", &j->r[2]);
}

static void test_closes_after_connection_close_and_after_http10(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_close_requests, 20);
    char v[32];
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(j->r[i].status == 200, "request %d: status %d", i, j->r[i].status);
        CHECK_MSG(head_value(j->r[i].head, "Connection", v, sizeof v) && strcmp(v, "close") == 0,
                  "request %d: no 'Connection: close' in\n%s", i, j->r[i].head);
        CHECK_MSG(j->r[i].eof, "request %d: the server kept the connection open", i);
    }
    CHECK_MSG(strcmp(j->r[2].body, "data: 1\n\ndata: 2\n\ndata: 3\n\n") == 0,
              "HTTP/1.0 stream body '%s'", j->r[2].body);
    CHECK(!head_value(j->r[2].head, "Transfer-Encoding", v, sizeof v));
    job_free(j, &a);
    cart_http_close(h);
}

static void client_stream(job *j) {
    rx c = client_connect(j);
    send_str(&c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(&c, &j->r[0], 0);
    send_str(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nafter");
    read_response(&c, &j->r[1], 0);
    client_close(&c);
}

static void test_streams_a_response_as_chunks(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_stream, 20);
    char v[32];
    CHECK_MSG(j->r[0].status == 200, "status %d", j->r[0].status);
    CHECK(head_value(j->r[0].head, "Transfer-Encoding", v, sizeof v) && strcmp(v, "chunked") == 0);
    CHECK(head_value(j->r[0].head, "Cache-Control", v, sizeof v) && strcmp(v, "no-cache") == 0);
    CHECK_MSG(j->r[0].chunks == 3, "%d chunks", j->r[0].chunks);
    CHECK_MSG(strcmp(j->r[0].body, "data: 1\n\ndata: 2\n\ndata: 3\n\n") == 0, "body '%s'",
              j->r[0].body);
    CHECK_MSG(j->r[1].status == 200 && strcmp(j->r[1].body, "after") == 0,
              "the request after the stream: %d '%s'", j->r[1].status, j->r[1].body);
    printf("  %d chunks, %zu bytes, then a keep-alive request\n", j->r[0].chunks, j->r[0].body_len);
    job_free(j, &a);
    cart_http_close(h);
}

static const char *const malformed[] = {
    "GARBAGE\r\n\r\n",
    "GET /x HTTP/1.1 extra\r\n\r\n",
    "GET nopath HTTP/1.1\r\n\r\n",
    "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    "GET / HTTP/1.1\r\nName : value\r\n\r\n",
    "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
    "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
    "GET / HTTP/x.1\r\n\r\n",
    "\x16\x03\x01\x02\x05\x01\x07\x01\xfc\x03\x03\r\n\r\n",
};
enum { N_MALFORMED = sizeof malformed / sizeof malformed[0] };

static void client_malformed(job *j) {
    for (int i = 0; i < N_MALFORMED; i++) one_shot(j, malformed[i], &j->r[i]);
    one_shot(j, "GET / HTTP/2.0\r\n\r\n", &j->r[N_MALFORMED]);
    one_shot(j, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
             &j->r[N_MALFORMED + 1]);
    one_shot(j, "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
             &j->r[N_MALFORMED + 2]);
    one_shot(j, "POST /echo HTTP/1.1\r\nExpect: teapot\r\nContent-Length: 3\r\n\r\nabc",
             &j->r[N_MALFORMED + 3]);
}

static void test_answers_malformed_requests_with_protocol_errors_and_closes(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_malformed, 20);
    for (int i = 0; i < N_MALFORMED; i++)
        CHECK_MSG(is_protocol_error(&j->r[i], 400), "case %d: status %d eof %d body '%s'", i,
                  j->r[i].status, j->r[i].eof, j->r[i].body);
    CHECK_MSG(is_protocol_error(&j->r[N_MALFORMED], 505), "HTTP/2.0: %d", j->r[N_MALFORMED].status);
    CHECK_MSG(is_protocol_error(&j->r[N_MALFORMED + 1], 411), "chunked body: %d",
              j->r[N_MALFORMED + 1].status);
    CHECK_MSG(is_protocol_error(&j->r[N_MALFORMED + 2], 501), "gzip body: %d",
              j->r[N_MALFORMED + 2].status);
    CHECK_MSG(is_protocol_error(&j->r[N_MALFORMED + 3], 417), "Expect: teapot: %d",
              j->r[N_MALFORMED + 3].status);
    CHECK_MSG(a.requests == 0, "%d malformed requests reached the application", a.requests);
    printf("  %d malformed requests got 400, e.g. %s\n", (int)N_MALFORMED, j->r[0].body);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_big_head(job *j) {
    char req[8192];
    int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', 4000);
    strcpy(req + n + 4000, "\r\n\r\n");
    one_shot(j, req, &j->r[0]);
    /* a head that never ends: the limit applies before the blank line */
    n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'b', 3000);
    req[n + 3000] = '\0';
    one_shot(j, req, &j->r[1]);
    /* many small header lines */
    n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 20; i++) n += snprintf(req + n, sizeof req - (size_t)n, "X-%d: v\r\n", i);
    snprintf(req + n, sizeof req - (size_t)n, "\r\n");
    one_shot(j, req, &j->r[2]);
}

static void test_refuses_oversized_heads_with_431(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_header_bytes = 1024;
    o.max_headers = 10;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_big_head, 20);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(is_protocol_error(&j->r[i], 431), "case %d: status %d eof %d '%s'", i,
                  j->r[i].status, j->r[i].eof, j->r[i].body);
    printf("  431 for a 4 KiB head, an unfinished 3 KiB head and 20 header lines (limits 1024 "
           "bytes, 10 lines): %s\n",
           j->r[0].body);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_big_body(job *j) {
    double t0 = now_s();
    /* only the head is sent: the answer must not wait for the body */
    one_shot(j, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", &j->r[0]);
    j->r[0].seconds = now_s() - t0;
    one_shot(
        j, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n",
        &j->r[1]);
    /* the body sent right away with the head: the unread rest must not reset the answer */
    char *req = malloc(70000);
    int n = sprintf(req, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n");
    memset(req + n, 'z', 60000);
    req[n + 60000] = '\0';
    one_shot(j, req, &j->r[2]);
    free(req);
    /* an acceptable body behind Expect: 100 Continue first, then the echo */
    rx c = client_connect(j);
    send_str(&c, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "
                 "4\r\n\r\n");
    read_response(&c, &j->r[3], 0);
    send_str(&c, "body");
    read_response(&c, &j->r[4], 0);
    client_close(&c);
}

static void test_refuses_an_oversized_body_with_413_before_reading_it(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_body_bytes = 1000;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_big_body, 20);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(is_protocol_error(&j->r[i], 413), "case %d: status %d eof %d '%s'", i,
                  j->r[i].status, j->r[i].eof, j->r[i].body);
    CHECK_MSG(j->r[0].seconds < 2.0, "413 took %.3f s", j->r[0].seconds);
    CHECK_MSG(j->r[3].status == 100, "Expect: 100-continue got %d first", j->r[3].status);
    CHECK_MSG(j->r[4].status == 200 && strcmp(j->r[4].body, "body") == 0, "then %d '%s'",
              j->r[4].status, j->r[4].body);
    CHECK(a.requests == 1);
    printf("  413 in %.1f ms without the body (limit 1000 bytes): %s\n", j->r[0].seconds * 1e3,
           j->r[0].body);
    job_free(j, &a);
    cart_http_close(h);
}

/* Sends `head` a byte every 40 ms until the server answers; records the
 * response and the seconds from connecting to the answer. */
static void trickle(job *j, const char *head, result *r) {
    double t0 = now_s();
    rx c = client_connect(j);
    size_t n = strlen(head), i = 0;
    for (;;) {
        struct pollfd p = {c.fd, POLLIN, 0};
        if (poll(&p, 1, 40) > 0) break;
        if (i < n && send(c.fd, head + i, 1, MSG_NOSIGNAL) == 1) i++;
        if (now_s() - t0 > 5) break;
    }
    r->seconds = now_s() - t0;
    double s = r->seconds;
    if (read_response(&c, r, 0) == 0 && !r->eof) r->eof = wait_closed(&c);
    r->seconds = s;
    client_close(&c);
}

static void client_slow(job *j) {
    /* slowloris: a head trickled forever never completes */
    trickle(
        j,
        "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        &j->r[0]);
    /* a body that stops halfway */
    double t0 = now_s();
    one_shot(j, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", &j->r[1]);
    j->r[1].seconds = now_s() - t0;
    /* a connection that sends nothing at all: closed without an answer */
    t0 = now_s();
    rx c = client_connect(j);
    j->r[2].status = read_response(&c, &j->r[2], 0) == 0 ? j->r[2].status : -1;
    j->r[2].eof = c.len == 0;
    j->r[2].seconds = now_s() - t0;
    client_close(&c);
}

static void test_times_out_slow_heads_and_bodies_with_408_and_closes_silent_ones(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.header_timeout_ms = 300;
    o.body_timeout_ms = 300;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_slow, 20);
    const char *what[3] = {"trickled head", "half a body", "silent connection"};
    for (int i = 0; i < 3; i++) {
        if (i == 2)
            CHECK_MSG(j->r[i].status == -1 && j->r[i].eof, "%s: status %d eof %d", what[i],
                      j->r[i].status, j->r[i].eof);
        else
            CHECK_MSG(is_protocol_error(&j->r[i], 408), "%s: status %d eof %d", what[i],
                      j->r[i].status, j->r[i].eof);
        CHECK_MSG(j->r[i].seconds >= 0.25 && j->r[i].seconds < 1.5,
                  "%s: answered after %.3f s (timeout 0.3 s)", what[i], j->r[i].seconds);
        printf("  %s: %s after %.0f ms (timeout 300 ms)\n", what[i], i == 2 ? "closed" : "408",
               j->r[i].seconds * 1e3);
    }
    CHECK(a.requests == 0);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_leaves_stream(job *j) {
    rx c = client_connect(j);
    send_str(&c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    while (!memmem(c.data, c.len, "data: ", 6))
        if (fill(&c) <= 0) break;
    j->r[0].status = memmem(c.data, c.len, "200 OK", 6) ? 200 : -1;
    client_close(&c);
    for (int i = 0; i < 500 && !atomic_load(&j->server_saw_close); i++) sleep_ms(10);
}

static void test_reports_closed_when_the_client_leaves_a_stream(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_leaves_stream, 20);
    CHECK(j->r[0].status == 200);
    CHECK_MSG(a.closed == 1, "%d CLOSED events", a.closed);
    CHECK_MSG(a.closed_id == 1, "CLOSED for request %lld", (long long)a.closed_id);
    CHECK_MSG(a.write_after_close == CART_E_STATE, "write after CLOSED returned %d",
              a.write_after_close);
    CHECK(a.open_after_close == 0);
    CHECK_MSG(cart_http_connections(h) == 0, "%d connections left", cart_http_connections(h));
    printf("  CLOSED for request %lld after %d chunks; a later write returns %s\n",
           (long long)a.closed_id, a.forever_chunks, cart_status_name(a.write_after_close));
    job_free(j, &a);
    cart_http_close(h);
}

static void client_never_reads(job *j) {
    rx c = client_connect(j);
    int small = 4096;
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    send_str(&c, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    double t0 = now_s();
    for (int i = 0; i < 1000 && !atomic_load(&j->server_saw_close); i++) sleep_ms(10);
    j->r[0].seconds = now_s() - t0;
    client_close(&c);
}

static void test_drops_a_client_that_stops_reading(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_output_bytes = 1 << 20;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    a.forever_bytes = 256 * 1024;
    job *j = serve(h, &a, client_never_reads, 20);
    CHECK_MSG(a.closed == 1, "%d CLOSED events", a.closed);
    CHECK(a.write_after_close == CART_E_STATE);
    printf("  dropped after %d chunks of 256 KiB (%.2f s), queue limit 1 MiB\n", a.forever_chunks,
           j->r[0].seconds);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_too_many(job *j) {
    static char buf_a[CLIENT_BUF], buf_b[CLIENT_BUF];
    rx ca = client_connect_with(j, buf_a);
    rx cb = client_connect_with(j, buf_b);
    /* both busy: one request being handled, one head arriving (for < 1 s) */
    send_str(&ca, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    send_str(&cb, "GET /echo HTTP/1.1\r\n");
    sleep_ms(50);
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &j->r[0]);
    send_str(&cb, "Host: x\r\n\r\n");
    read_response(&cb, &j->r[1], 0);
    read_response(&ca, &j->r[4], 0);
    /* both are now idle keep-alive connections: a newcomer replaces the one idle longest (cb) */
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &j->r[2]);
    j->r[3].eof = wait_closed(&cb);
    client_close(&ca);
    client_close(&cb);
}

static void test_refuses_connections_over_the_limit_with_503(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_connections = 2;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_too_many, 20);
    CHECK_MSG(is_protocol_error(&j->r[0], 503), "3rd connection: status %d eof %d '%s'",
              j->r[0].status, j->r[0].eof, j->r[0].body);
    CHECK_MSG(j->r[1].status == 200 && j->r[4].status == 200, "the busy ones: %d %d",
              j->r[1].status, j->r[4].status);
    CHECK_MSG(j->r[2].status == 200, "newcomer after an idle keep-alive: status %d",
              j->r[2].status);
    CHECK_MSG(j->r[3].eof, "the idle keep-alive connection was not closed for the newcomer");
    printf("  limit 2, both busy: the 3rd connection got 503; later the idle one made room (%s)\n",
           j->r[0].body);
    job_free(j, &a);
    cart_http_close(h);
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

enum { FLOOD = 600 };

/* FLOOD sockets that connect and say nothing, then real requests beside
 * them; then heads trickled on every slot, then a newcomer. */
static void client_flood(job *j) {
    static int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) fds[i] = client_connect(j).fd;
    sleep_ms(50);
    double t0 = now_s();
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &j->r[0]);
    j->r[0].seconds = now_s() - t0;
    t0 = now_s();
    one_shot(j, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
             &j->r[1]);
    j->r[1].seconds = now_s() - t0;
    /* how many of the silent ones the server still holds open */
    int open = 0;
    for (int i = 0; i < FLOOD; i++) {
        char b;
        if (fds[i] >= 0 && recv(fds[i], &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN) open++;
    }
    j->r[2].status = open;
    /* after first_byte_timeout_ms the rest are gone too */
    sleep_ms(400);
    open = 0;
    for (int i = 0; i < FLOOD; i++) {
        char b;
        if (fds[i] >= 0 && recv(fds[i], &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN) open++;
        if (fds[i] >= 0) close(fds[i]);
    }
    j->r[3].status = open;
}

static void test_a_flood_of_silent_connections_locks_nobody_out(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_connections = 64;
    o.max_connections_per_peer = 32;
    o.first_byte_timeout_ms = 250;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_flood, 20);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(j->r[i].status == 200 && j->r[i].seconds < 1.0, "request %d beside the flood: %d after %.3f s",
                  i, j->r[i].status, j->r[i].seconds);
    CHECK_MSG(j->r[2].status <= 32, "%d silent connections held (cap 32 per address)", j->r[2].status);
    CHECK_MSG(j->r[3].status == 0, "%d silent connections still open after the first-byte timeout",
              j->r[3].status);
    CHECK_MSG(a.max_connections <= 33, "%d connections at once (cap 32 per address + the newcomer)",
              a.max_connections);
    printf("  %d silent sockets: requests answered in %.1f and %.1f ms; %d held (cap 32 per address), "
           "%d after 250 ms\n",
           FLOOD, j->r[0].seconds * 1e3, j->r[1].seconds * 1e3, j->r[2].status, j->r[3].status);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_slowloris(job *j) {
    static char bufs[4][CLIENT_BUF];
    rx c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = client_connect_with(j, bufs[i]);
        send_str(&c[i], "GET /echo HTTP/1.1\r\nX-Slow: a");
    }
    sleep_ms(100);
    /* every slot holds a head that is still young: the newcomer is refused */
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", &j->r[0]);
    /* once the heads are older than a real client takes, the oldest makes room */
    for (int k = 0; k < 11; k++) {
        sleep_ms(100);
        for (int i = 0; i < 4; i++) send_str(&c[i], "a");
    }
    double t0 = now_s();
    one_shot(j, "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &j->r[1]);
    j->r[1].seconds = now_s() - t0;
    j->r[2].eof = wait_closed(&c[0]);
    for (int i = 0; i < 4; i++) client_close(&c[i]);
}

static void test_evicts_the_oldest_slow_head_when_full(void) {
    cart_http_options o;
    cart_http_default_options(&o);
    o.max_connections = 4;
    cart_http *h = start(&o);
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_slowloris, 20);
    CHECK_MSG(is_protocol_error(&j->r[0], 503), "newcomer beside young heads: %d '%s'", j->r[0].status,
              j->r[0].body);
    CHECK_MSG(j->r[1].status == 200 && j->r[1].seconds < 1.0, "newcomer beside old heads: %d after %.3f s",
              j->r[1].status, j->r[1].seconds);
    CHECK_MSG(j->r[2].eof, "the oldest slow head was not closed for the newcomer");
    printf("  4 slots of trickled heads: 503 while young; after 1.2 s the oldest made room (%.1f ms)\n",
           j->r[1].seconds * 1e3);
    job_free(j, &a);
    cart_http_close(h);
}

static void client_many(job *j) {
    for (int i = 0; i < 200; i++) {
        char req[256];
        snprintf(req, sizeof req,
                 "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n%s\r\n%03d",
                 i % 2 ? "Connection: close\r\n" : "", i);
        rx c = client_connect(j);
        result *r = &j->r[0];
        if (send_str(&c, req) != 0 || read_response(&c, r, 0) != 0 || r->status != 200 ||
            (int)strtol(r->body, NULL, 10) != i)
            j->n++; /* failures */
        client_close(&c);
    }
}

static void test_serves_200_sequential_connections_without_leaking_descriptors(void) {
    int before = count_fds();
    cart_http *h = start_default();
    if (!h) return;
    int listening = count_fds();
    app a = {0};
    job *j = serve(h, &a, client_many, 20);
    for (int i = 0; i < 200 && cart_http_connections(h) > 0; i++) cart_http_poll(h, 5);
    int served = count_fds();
    CHECK_MSG(j->n == 0, "%d of 200 exchanges failed", j->n);
    CHECK(a.requests == 200);
    CHECK_MSG(cart_http_connections(h) == 0, "%d connections still open", cart_http_connections(h));
    job_free(j, &a);
    cart_http_close(h);
    int after = count_fds();
    CHECK_MSG(served == listening, "descriptors with the server up: %d before, %d after", listening,
              served);
    CHECK_MSG(after == before, "descriptors: %d before the server, %d after close", before, after);
    printf("  200 connections; descriptors %d -> %d (server up) -> %d (closed)\n", before, served,
           after);
}

static void client_misuse(job *j) {
    one_shot(j, "GET /misuse HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &j->r[0]);
}

static void test_refuses_bad_writes_without_crashing(void) {
    cart_http *h = start_default();
    if (!h) return;
    app a = {0};
    job *j = serve(h, &a, client_misuse, 20);
    const int want[10] = {CART_E_STATE, CART_E_ARG,   CART_E_ARG,   CART_E_ARG,   CART_E_ARG,
                          CART_OK,      CART_E_STATE, CART_E_STATE, CART_E_STATE, CART_E_STATE};
    for (int i = 0; i < 10; i++)
        CHECK_MSG(a.misuse[i] == want[i], "call %d returned %s, expected %s", i,
                  cart_status_name(a.misuse[i]), cart_status_name(want[i]));
    char v[16];
    CHECK(j->r[0].status == 200 && strcmp(j->r[0].body, "ok") == 0);
    CHECK(head_value(j->r[0].head, "X-B", v, sizeof v) && strcmp(v, "c") == 0);
    cart_http_request q;
    CHECK_ERR(cart_http_request_get(h, 1, &q), CART_E_STATE);
    CHECK_ERR(cart_http_stream_end(h, 1), CART_E_STATE);
    cart_str s;
    CHECK(cart_http_header(h, 1, "host", &s) == 0 && s.len == 0);
    CHECK(cart_http_is_open(h, 1) == 0);
    CHECK(cart_http_is_open(NULL, 1) == 0);
    CHECK_ERR(cart_http_poll(NULL, 0), CART_E_ARG);
    job_free(j, &a);
    cart_http_close(h);
    cart_http_close(NULL);
}

static void test_reports_a_port_in_use_naming_host_and_port(void) {
    cart_http *h = start_default();
    if (!h) return;
    cart_http_options o;
    cart_http_default_options(&o);
    o.port = cart_http_port(h);
    cart_http *h2 = NULL;
    CHECK_ERR(cart_http_listen(&h2, &o), CART_E_IO);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", (int)o.port);
    CHECK_ERROR_MENTIONS(where);
    CHECK(h2 == NULL);
    printf("  %s\n", cart_last_error());
    o.host = "no-such-host.invalid";
    o.port = 0;
    CHECK_ERR(cart_http_listen(&h2, &o), CART_E_IO);
    CHECK_ERROR_MENTIONS("no-such-host.invalid:0");
    o.host = "localhost";
    CHECK_OK(cart_http_listen(&h2, &o));
    CHECK(cart_http_port(h2) > 0);
    cart_http_close(h2);
    cart_http_close(h);
}

static void test_rejects_invalid_options_naming_the_field(void) {
    cart_http_options o;
    cart_http *h = NULL;
    cart_http_default_options(&o);
    o.max_connections = 0;
    CHECK_ERR(cart_http_listen(&h, &o), CART_E_ARG);
    CHECK_ERROR_MENTIONS("max_connections");
    cart_http_default_options(&o);
    o.header_timeout_ms = -5;
    CHECK_ERR(cart_http_listen(&h, &o), CART_E_ARG);
    CHECK_ERROR_MENTIONS("header_timeout_ms");
    cart_http_default_options(&o);
    o.port = 70000;
    CHECK_ERR(cart_http_listen(&h, &o), CART_E_ARG);
    CHECK_ERROR_MENTIONS("port");
    CHECK(h == NULL);
    CHECK_OK(cart_http_listen(&h, NULL)); /* NULL options: the defaults */
    cart_http_close(h);
}

static void test_delivers_sigint_and_sigterm_as_events(void) {
    cart_http *h = start_default();
    cart_http *h2 = start_default();
    if (!h || !h2) return;
    CHECK_OK(cart_http_catch_signals(h));
    CHECK_ERR(cart_http_catch_signals(h2), CART_E_STATE);
    raise(SIGTERM);
    raise(SIGINT);
    double t0 = now_s();
    CHECK_OK(cart_http_poll(h, 2000));
    double waited = now_s() - t0;
    cart_http_event ev[2];
    int n = 0;
    while (n < 2 && cart_http_next_event(h, &ev[n])) n++;
    CHECK_MSG(n == 2, "%d events", n);
    CHECK(n >= 1 && ev[0].kind == CART_HTTP_SIGNAL && ev[0].signal == SIGTERM);
    CHECK(n >= 2 && ev[1].kind == CART_HTTP_SIGNAL && ev[1].signal == SIGINT);
    CHECK_MSG(waited < 1.0, "poll waited %.3f s with a signal pending", waited);
    cart_http_close(h);
    struct sigaction now;
    sigaction(SIGTERM, NULL, &now);
    CHECK_MSG(now.sa_handler == SIG_DFL, "SIGTERM handler not restored");
    CHECK_OK(cart_http_catch_signals(h2)); /* free again after close */
    cart_http_close(h2);
    printf("  SIGTERM then SIGINT delivered as events; poll returned after %.1f ms\n",
           waited * 1e3);
}

int main(void) {
    RUN(test_answers_a_get_and_echoes_a_post);
    RUN(test_keeps_a_connection_alive_across_sequential_requests);
    RUN(test_answers_pipelined_requests_in_order_one_at_a_time);
    RUN(test_closes_after_connection_close_and_after_http10);
    RUN(test_streams_a_response_as_chunks);
    RUN(test_answers_malformed_requests_with_protocol_errors_and_closes);
    RUN(test_refuses_oversized_heads_with_431);
    RUN(test_refuses_an_oversized_body_with_413_before_reading_it);
    RUN(test_times_out_slow_heads_and_bodies_with_408_and_closes_silent_ones);
    RUN(test_reports_closed_when_the_client_leaves_a_stream);
    RUN(test_drops_a_client_that_stops_reading);
    RUN(test_refuses_connections_over_the_limit_with_503);
    RUN(test_a_flood_of_silent_connections_locks_nobody_out);
    RUN(test_evicts_the_oldest_slow_head_when_full);
    RUN(test_serves_200_sequential_connections_without_leaking_descriptors);
    RUN(test_refuses_bad_writes_without_crashing);
    RUN(test_reports_a_port_in_use_naming_host_and_port);
    RUN(test_rejects_invalid_options_naming_the_field);
    RUN(test_delivers_sigint_and_sigterm_as_events);
    return check_finish("http");
}
