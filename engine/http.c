/*
 * http.c - the HTTP/1.1 server of http.h: the only file that talks to sockets.
 *
 * One thread, one poll(2) per cart_http_poll. Each client connection is a
 * small state machine:
 *
 *   HEAD      reading the request line and headers (header_timeout_ms from
 *             the first byte; a new connection waits first_byte_timeout_ms
 *             for that byte, an idle keep-alive one idle_timeout_ms)
 *   BODY      head parsed, reading Content-Length bytes (body_timeout_ms)
 *   HANDLING  a REQUEST event is queued or taken; the caller answers; input
 *             is read only to notice a disconnect (and buffered, bounded, for
 *             the next pipelined request)
 *   CLOSING   a last response (an error, or one marked Connection: close) is
 *             flushing; input is discarded
 *   LINGER    output flushed and our side shut down (SHUT_WR); input is read
 *             and discarded for up to LINGER_MS until the client closes, so
 *             that closing with unread input does not reset the connection and
 *             destroy the response before the client has read it
 *
 * Buffers: `in` holds received, unconsumed bytes, at most max_header_bytes +
 * max_body_bytes; `out` holds queued response bytes, flushed by polls and by
 * an immediate non-blocking send whenever something is queued. A completed
 * request's head and body are copied out of `in` into the request, so the
 * borrowed strings handed to the caller never move while more input arrives.
 *
 * Slots: max_connections connections may be active (HEAD, BODY, HANDLING);
 * REJECT_RESERVE more slots hold connections that are being refused (503) or
 * closed. When every slot is taken, a new connection is closed at once. When
 * the active ones are all taken, or the newcomer's address holds
 * max_connections_per_peer, a connection is evicted to make room (see
 * pick_victim: silent ones first, then slow heads), else the newcomer gets
 * 503.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "http_internal.h"
#include "internal.h"

enum {
    REJECT_RESERVE = 64,  /* slots beyond max_connections for refusing and closing */
    LINGER_MS = 2000,     /* how long a closed-for-writing connection drains input */
    READ_CHUNK = 65536,   /* most bytes one recv() takes */
    IN_INITIAL = 4096,    /* first input buffer size */
    OUT_KEEP = 65536,     /* an emptied output buffer bigger than this is freed */
    ACCEPT_BURST = 256,   /* most connections accepted per poll */
    ACCEPT_PAUSE_MS = 100, /* accept() back-off after running out of descriptors */
    SLOW_HEAD_MS = 1000    /* a head still arriving after this may be evicted for a newcomer */
};

typedef enum conn_state { S_HEAD, S_BODY, S_HANDLING, S_CLOSING, S_LINGER } conn_state;

typedef struct conn {
    int fd;
    conn_state state;
    char *in; /* received bytes not yet consumed: [0, in_len) of in_cap */
    size_t in_len, in_cap;
    size_t scan; /* HEAD: offset of the line where the search for the blank line resumes */
    char *out;   /* queued output: [out_off, out_len) of out_cap */
    size_t out_off, out_len, out_cap;
    int64_t deadline; /* ms, HEAD / BODY / LINGER */
    int64_t progress; /* ms, last time queued output moved (or began to wait) */
    request *req;     /* BODY: the parsed head; HANDLING: the request in flight */
    int parse_pending;
    int broken;       /* a send outside poll failed or overflowed: drop at the next poll */
    int input_paused; /* HANDLING with a full input buffer: watch for hang-up only */
    int input_eof;    /* CLOSING: the client finished sending; stop polling input */
    int64_t since;    /* HEAD with no input: ms since when it has waited for a byte */
    int64_t head_since; /* HEAD with input: ms when the head's first byte came */
    char remote[64];
    char peer[64]; /* the address without the port: what the per-peer cap counts */
} conn;

struct cart_http {
    int listen_fd;
    int32_t port;
    cart_http_options o;
    size_t in_limit; /* max_header_bytes + max_body_bytes */
    conn **conns;    /* n_slots entries, NULL when free */
    int32_t n_slots;
    int32_t n_open;
    int64_t next_id;
    cart_http_event *events; /* queue: [ev_head, ev_head + ev_len) of ev_cap */
    size_t ev_head, ev_len, ev_cap;
    int64_t accept_paused_until;
    struct pollfd *pfds; /* n_slots + 2 */
    int32_t *pfd_slot;
    int sig_pipe[2];
    int signals_held;
    struct sigaction old_int, old_term;
};

/* ---------------------------------------------------------------------------
 * Small helpers */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *reason_phrase(int32_t status) {
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 303:
        return "See Other";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 406:
        return "Not Acceptable";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Status";
    }
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" (IMF-fixdate), independent of the locale. */
static void http_date(char *buf, size_t n) {
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(buf, n, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7], tm.tm_mday,
             months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* ---------------------------------------------------------------------------
 * Events */

static void push_event(cart_http *h, int32_t kind, int32_t sig, int64_t id) {
    if (h->ev_head + h->ev_len == h->ev_cap) {
        if (h->ev_head > 0) {
            memmove(h->events, h->events + h->ev_head, h->ev_len * sizeof *h->events);
            h->ev_head = 0;
        } else {
            size_t cap = h->ev_cap ? h->ev_cap * 2 : 64;
            cart_http_event *e = realloc(h->events, cap * sizeof *e);
            if (!e) return; /* out of memory: the event is lost, writes still fail cleanly */
            h->events = e;
            h->ev_cap = cap;
        }
    }
    cart_http_event *ev = &h->events[h->ev_head + h->ev_len++];
    ev->kind = kind;
    ev->signal = sig;
    ev->request = id;
}

/* Withdraws a REQUEST event not yet taken (its connection went away). */
static void cancel_request_event(cart_http *h, int64_t id) {
    for (size_t i = 0; i < h->ev_len; i++) {
        cart_http_event *ev = &h->events[h->ev_head + i];
        if (ev->kind == CART_HTTP_REQUEST && ev->request == id) ev->kind = 0;
    }
}

int32_t cart_http_next_event(cart_http *h, cart_http_event *ev) {
    if (!h || !ev) return 0;
    while (h->ev_len > 0) {
        cart_http_event e = h->events[h->ev_head];
        h->ev_head++;
        h->ev_len--;
        if (h->ev_len == 0) h->ev_head = 0;
        if (e.kind == 0) continue; /* withdrawn */
        if (e.kind == CART_HTTP_REQUEST) {
            for (int32_t i = 0; i < h->n_slots; i++) {
                conn *c = h->conns[i];
                if (c && c->state == S_HANDLING && c->req && c->req->id == e.request)
                    c->req->delivered = 1;
            }
        }
        *ev = e;
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Connections */

/* Closes and frees the connection in `slot`. A delivered request still in
 * flight is reported CLOSED; one not yet delivered is withdrawn. */
static void conn_drop(cart_http *h, int32_t slot) {
    conn *c = h->conns[slot];
    if (!c) return;
    if (c->state == S_HANDLING && c->req) {
        if (c->req->delivered)
            push_event(h, CART_HTTP_CLOSED, 0, c->req->id);
        else
            cancel_request_event(h, c->req->id);
    }
    close(c->fd);
    free(c->in);
    free(c->out);
    cart_http_request_free(c->req);
    free(c);
    h->conns[slot] = NULL;
    h->n_open--;
}

static size_t out_pending(const conn *c) {
    return c->out_len - c->out_off;
}

/* Appends n bytes to the output queue. Returns 0, or -1 when out of memory. */
static int out_append(conn *c, const void *p, size_t n, int64_t now) {
    if (n == 0) return 0;
    if (out_pending(c) == 0) {
        c->out_off = c->out_len = 0;
        c->progress = now; /* the write timeout counts from when output starts waiting */
    }
    if (c->out_len + n > c->out_cap && c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, out_pending(c));
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n) cap *= 2;
        char *b = realloc(c->out, cap);
        if (!b) return -1;
        c->out = b;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 0;
}

/* Sends queued output until the socket would block. Returns 0, or -1 when
 * the connection failed (the caller drops it). */
static int flush(conn *c, int64_t now) {
    while (out_pending(c) > 0) {
        ssize_t n = send(c->fd, c->out + c->out_off, out_pending(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->progress = now;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > OUT_KEEP) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return 0;
}

/* Tries to send now; a failure marks the connection for the next poll. */
static void kick(conn *c, int64_t now) {
    if (flush(c, now) != 0) c->broken = 1;
}

/* Removes the first n bytes of the input buffer. */
static void consume(conn *c, size_t n) {
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
}

static void json_escape_into(char *dst, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[k++] = '\\';
            dst[k++] = (char)ch;
        } else if (ch < 0x20) {
            k += (size_t)snprintf(dst + k, cap - k, "\\u%04x", ch);
        } else {
            dst[k++] = (char)ch;
        }
    }
    dst[k] = '\0';
}

/* Answers a protocol error with an OpenAI-style JSON body and moves the
 * connection to CLOSING. Only called before a request is delivered. */
static void fail_conn(conn *c, int32_t status, int64_t now, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_conn(conn *c, int32_t status, int64_t now, const char *fmt, ...) {
    char message[256], escaped[512], body[768], head[512], date[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    json_escape_into(escaped, sizeof escaped, message);
    int bn = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":null}}", escaped,
                      status >= 500 ? "server_error" : "invalid_request_error");
    if (bn < 0 || (size_t)bn >= sizeof body) bn = (int)strlen(body);
    http_date(date, sizeof date);
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nServer: cartridge\r\nDate: %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n",
                      (int)status, reason_phrase(status), date, bn);
    cart_http_request_free(c->req);
    c->req = NULL;
    c->state = S_CLOSING;
    c->in_len = 0;
    c->parse_pending = 0;
    if (out_append(c, head, (size_t)hn, now) != 0 || out_append(c, body, (size_t)bn, now) != 0)
        c->broken = 1;
    else
        kick(c, now);
}

/* ---------------------------------------------------------------------------
 * Request parsing (the head itself: http_parse.c) */

/* HEAD/BODY: advances the parse of c->in as far as the buffered bytes allow.
 * At most one request per call becomes HANDLING (and a REQUEST event). */
static void parse_input(cart_http *h, conn *c, int64_t now) {
    if (c->state == S_HEAD) {
        size_t skip = 0; /* empty lines before a request line are ignored (RFC 9112 2.2) */
        while (skip < c->in_len && (c->in[skip] == '\r' || c->in[skip] == '\n')) skip++;
        if (skip) {
            consume(c, skip);
            c->scan = 0;
        }
        if (c->in_len == 0) return;
        size_t pos = c->scan, head_len = 0;
        while (pos < c->in_len) {
            const char *nl = memchr(c->in + pos, '\n', c->in_len - pos);
            if (!nl) break;
            size_t e = (size_t)(nl - c->in);
            if (e == pos || (e == pos + 1 && c->in[pos] == '\r')) {
                head_len = e + 1;
                break;
            }
            pos = e + 1;
        }
        c->scan = pos;
        if (head_len == 0 && c->in_len < (size_t)h->o.max_header_bytes) return;
        if (head_len == 0 || head_len > (size_t)h->o.max_header_bytes) {
            fail_conn(c, 431, now, "request head is over the limit of %lld bytes",
                      (long long)h->o.max_header_bytes);
            return;
        }
        char why[200];
        int32_t status = cart_http_parse_head(&h->o, c->in, head_len, &c->req, why, sizeof why);
        if (status) {
            fail_conn(c, status, now, "%s", why);
            return;
        }
        c->state = S_BODY;
        c->deadline = now + h->o.body_timeout_ms;
        if (c->req->expect_continue && c->in_len < head_len + c->req->body_len) {
            static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
            if (out_append(c, cont, sizeof cont - 1, now) != 0) c->broken = 1;
            kick(c, now);
        }
    }
    if (c->state != S_BODY) return;
    request *r = c->req;
    size_t total = r->head_len + r->body_len;
    if (c->in_len < total) return;
    r->raw = malloc(total);
    if (!r->raw) {
        fail_conn(c, 503, now, "server out of memory");
        return;
    }
    memcpy(r->raw, c->in, total);
    consume(c, total);
    c->scan = 0;
    r->id = ++h->next_id;
    c->state = S_HANDLING;
    c->input_paused = 0;
    push_event(h, CART_HTTP_REQUEST, 0, r->id);
}

/* ---------------------------------------------------------------------------
 * Socket I/O within a poll */

static int active_state(conn_state s) {
    return s == S_HEAD || s == S_BODY || s == S_HANDLING;
}

static void conn_read(cart_http *h, int32_t slot, int64_t now) {
    conn *c = h->conns[slot];
    if (c->state == S_CLOSING || c->state == S_LINGER) {
        char sink[16384];
        for (int k = 0; k < 4; k++) {
            ssize_t n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (n > 0) continue;
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n == 0 && c->state == S_CLOSING) {
                c->input_eof = 1; /* keep flushing; stop watching input */
                return;
            }
            conn_drop(h, slot); /* LINGER finished, or an error */
            return;
        }
        return;
    }
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= h->in_limit) {
            c->input_paused = 1; /* only HANDLING gets here: HEAD and BODY fail first */
            return;
        }
        size_t cap = c->in_cap ? c->in_cap * 2 : IN_INITIAL;
        if (cap > h->in_limit) cap = h->in_limit;
        char *b = realloc(c->in, cap);
        if (!b) {
            conn_drop(h, slot);
            return;
        }
        c->in = b;
        c->in_cap = cap;
    }
    size_t room = c->in_cap - c->in_len;
    if (room > READ_CHUNK) room = READ_CHUNK;
    ssize_t n = recv(c->fd, c->in + c->in_len, room, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
        /* EOF or reset: nobody is left to answer (HANDLING reports CLOSED) */
        conn_drop(h, slot);
        return;
    }
    if (c->state == S_HEAD && c->in_len == 0) {
        c->deadline = now + h->o.header_timeout_ms; /* the wait for a byte is over: the head clock starts */
        c->head_since = now;
    }
    c->in_len += (size_t)n;
    if (c->state == S_HEAD || c->state == S_BODY) parse_input(h, c, now);
}

static int64_t first_byte_ms(const cart_http *h) {
    int32_t t = h->o.first_byte_timeout_ms;
    return t < h->o.header_timeout_ms ? t : h->o.header_timeout_ms;
}

/* The connection to evict for a newcomer, among those from `peer` (NULL:
 * any): the one that has waited longest without sending a byte (a new
 * connection, or keep-alive between requests), else the head that has been
 * arriving longest, if for more than SLOW_HEAD_MS; -1 when none may go. */
static int32_t pick_victim(const cart_http *h, int32_t newcomer, const char *peer, int64_t now) {
    int32_t silent = -1, slow = -1;
    for (int32_t i = 0; i < h->n_slots; i++) {
        const conn *o = h->conns[i];
        if (!o || i == newcomer || o->state != S_HEAD || out_pending(o) > 0) continue;
        if (peer && strcmp(o->peer, peer) != 0) continue;
        if (o->in_len == 0) {
            if (silent < 0 || o->since < h->conns[silent]->since) silent = i;
        } else if (now - o->head_since >= SLOW_HEAD_MS) {
            if (slow < 0 || o->head_since < h->conns[slow]->head_since) slow = i;
        }
    }
    return silent >= 0 ? silent : slow;
}

/* The newcomer in `slot` is in the table: keep the table and its address
 * within their caps, evicting a connection or refusing the newcomer (503). */
static void make_room(cart_http *h, int32_t slot, int64_t now) {
    conn *c = h->conns[slot];
    int32_t active = 0, same_peer = 0;
    for (int32_t i = 0; i < h->n_slots; i++) {
        const conn *o = h->conns[i];
        if (!o || i == slot || !active_state(o->state)) continue;
        active++;
        if (strcmp(o->peer, c->peer) == 0) same_peer++;
    }
    int32_t per_peer = h->o.max_connections_per_peer;
    if (same_peer >= per_peer) {
        int32_t victim = pick_victim(h, slot, c->peer, now);
        if (victim < 0) {
            fail_conn(c, 503, now, "too many connections from %s (limit %d per address); try again later",
                      c->peer, (int)per_peer);
            return;
        }
        conn_drop(h, victim);
        active--;
    }
    if (active >= h->o.max_connections) {
        int32_t victim = pick_victim(h, slot, NULL, now);
        if (victim < 0) {
            fail_conn(c, 503, now, "too many connections (limit %d); try again later",
                      (int)h->o.max_connections);
            return;
        }
        conn_drop(h, victim);
    }
}

static int32_t free_slot(const cart_http *h) {
    for (int32_t i = 0; i < h->n_slots; i++)
        if (!h->conns[i]) return i;
    return -1;
}

static void accept_new(cart_http *h, int64_t now) {
    for (int k = 0; k < ACCEPT_BURST; k++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(h->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                h->accept_paused_until = now + ACCEPT_PAUSE_MS;
            return;
        }
        int32_t slot = free_slot(h);
        conn *c = slot >= 0 ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        c->state = S_HEAD;
        c->deadline = now + first_byte_ms(h);
        c->since = now;
        c->progress = now;
        char addr[INET6_ADDRSTRLEN] = "?";
        if (sa.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&sa;
            inet_ntop(AF_INET, &a->sin_addr, addr, sizeof addr);
            snprintf(c->remote, sizeof c->remote, "%s:%u", addr, (unsigned)ntohs(a->sin_port));
        } else if (sa.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
            inet_ntop(AF_INET6, &a->sin6_addr, addr, sizeof addr);
            snprintf(c->remote, sizeof c->remote, "[%s]:%u", addr, (unsigned)ntohs(a->sin6_port));
        }
        snprintf(c->peer, sizeof c->peer, "%s", addr);
        h->conns[slot] = c;
        h->n_open++;
        make_room(h, slot, now);
    }
}

static void drain_signals(cart_http *h) {
    if (!h->signals_held) return;
    unsigned char buf[64];
    for (;;) {
        ssize_t n = read(h->sig_pipe[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        for (ssize_t i = 0; i < n; i++) push_event(h, CART_HTTP_SIGNAL, buf[i], 0);
    }
}

/* Drops broken connections, moves flushed CLOSING ones to LINGER and parses
 * buffered pipelined requests. */
static void settle(cart_http *h, int64_t now) {
    for (int32_t i = 0; i < h->n_slots; i++) {
        conn *c = h->conns[i];
        if (!c) continue;
        if (c->broken) {
            conn_drop(h, i);
            continue;
        }
        if (c->state == S_CLOSING && out_pending(c) == 0) {
            if (c->input_eof) {
                conn_drop(h, i);
                continue;
            }
            shutdown(c->fd, SHUT_WR);
            c->state = S_LINGER;
            c->deadline = now + LINGER_MS;
        }
        if (c->state == S_HEAD && c->parse_pending) {
            c->parse_pending = 0;
            parse_input(h, c, now);
            if (c->broken) conn_drop(h, i);
        }
    }
}

/* Enforces deadlines; returns the time of the next one (INT64_MAX: none). */
static int64_t enforce_timeouts(cart_http *h, int64_t now) {
    int64_t next = INT64_MAX;
    for (int32_t i = 0; i < h->n_slots; i++) {
        conn *c = h->conns[i];
        if (!c) continue;
        if (out_pending(c) > 0) {
            int64_t t = c->progress + h->o.write_timeout_ms;
            if (now >= t) {
                conn_drop(h, i); /* the client stopped reading */
                continue;
            }
            if (t < next) next = t;
        }
        if (c->state == S_HANDLING || c->state == S_CLOSING) continue;
        if (now < c->deadline) {
            if (c->deadline < next) next = c->deadline;
            continue;
        }
        if (c->state == S_HEAD && c->in_len == 0) {
            conn_drop(h, i); /* no byte came (new or keep-alive connection): close quietly */
        } else if (c->state == S_HEAD) {
            fail_conn(c, 408, now, "request head not received within %d ms",
                      (int)h->o.header_timeout_ms);
        } else if (c->state == S_BODY) {
            fail_conn(c, 408, now, "request body not received within %d ms",
                      (int)h->o.body_timeout_ms);
        } else {
            conn_drop(h, i); /* LINGER over */
        }
    }
    return next;
}

int cart_http_poll(cart_http *h, int32_t timeout_ms) {
    if (!h) return cart_fail(CART_E_ARG, "http poll: server is NULL");
    int64_t now = now_ms();
    settle(h, now);
    int64_t next = enforce_timeouts(h, now);
    settle(h, now);

    int64_t wait = timeout_ms < 0 ? INT64_MAX : timeout_ms;
    if (h->ev_len > 0) wait = 0;
    if (next != INT64_MAX && next - now < wait) wait = next - now > 0 ? next - now : 0;

    /* the pollfd list: listener, signal pipe, connections */
    int32_t n = 0;
    if (now >= h->accept_paused_until) {
        h->pfds[n] = (struct pollfd){.fd = h->listen_fd, .events = POLLIN};
        h->pfd_slot[n++] = -1;
    } else if (h->accept_paused_until - now < wait) {
        wait = h->accept_paused_until - now;
    }
    if (h->signals_held) {
        h->pfds[n] = (struct pollfd){.fd = h->sig_pipe[0], .events = POLLIN};
        h->pfd_slot[n++] = -2;
    }
    for (int32_t i = 0; i < h->n_slots; i++) {
        conn *c = h->conns[i];
        if (!c) continue;
        short ev = 0;
        if (out_pending(c) > 0) ev |= POLLOUT;
        if (c->state == S_HANDLING && c->input_paused)
            ev |= POLLRDHUP;
        else if (!(c->state == S_CLOSING && c->input_eof))
            ev |= POLLIN;
        h->pfds[n] = (struct pollfd){.fd = c->fd, .events = ev};
        h->pfd_slot[n++] = i;
    }
    int r =
        poll(h->pfds, (nfds_t)n, wait == INT64_MAX ? -1 : (int)(wait > 1 << 30 ? 1 << 30 : wait));
    if (r < 0 && errno != EINTR) return cart_fail_errno(CART_E_IO, "http poll: poll failed");
    now = now_ms();
    int listener_ready = 0;
    for (int32_t k = 0; r > 0 && k < n; k++) {
        short re = h->pfds[k].revents;
        int32_t slot = h->pfd_slot[k];
        if (!re) continue;
        if (slot == -1) {
            listener_ready = 1;
            continue;
        }
        if (slot == -2) continue; /* drained below either way */
        conn *c = h->conns[slot];
        if (!c) continue;
        if (re & (POLLERR | POLLHUP | POLLNVAL)) {
            conn_drop(h, slot);
            continue;
        }
        if ((re & POLLRDHUP) && c->state == S_HANDLING && c->input_paused) {
            conn_drop(h, slot);
            continue;
        }
        if ((re & POLLOUT) && flush(c, now) != 0) {
            conn_drop(h, slot);
            continue;
        }
        if (re & POLLIN) conn_read(h, slot, now);
    }
    if (listener_ready) accept_new(h, now);
    drain_signals(h); /* also after EINTR, when revents are not set */
    settle(h, now);
    enforce_timeouts(h, now);
    settle(h, now);
    return CART_OK;
}

/* ---------------------------------------------------------------------------
 * Requests and responses, called by the application between polls */

/* The connection whose request in flight is `id`, or NULL. */
static conn *find(const cart_http *h, int64_t id) {
    if (!h || id <= 0) return NULL;
    for (int32_t i = 0; i < h->n_slots; i++) {
        conn *c = h->conns[i];
        if (c && c->state == S_HANDLING && c->req && c->req->id == id) return c;
    }
    return NULL;
}

static cart_str str_of(const request *r, span s) {
    return (cart_str){r->raw + s.off, s.len};
}

int cart_http_request_get(const cart_http *h, int64_t request_id, cart_http_request *out) {
    if (!out) return cart_fail(CART_E_ARG, "http request: out is NULL");
    memset(out, 0, sizeof *out);
    conn *c = find(h, request_id);
    if (!c)
        return cart_fail(CART_E_STATE, "http request: request %lld is not in flight",
                         (long long)request_id);
    const request *r = c->req;
    out->id = r->id;
    out->method = str_of(r, r->method);
    out->target = str_of(r, r->target);
    out->path = str_of(r, r->path);
    out->query = str_of(r, r->query);
    out->body = (cart_str){r->raw + r->head_len, r->body_len};
    out->remote = (cart_str){c->remote, strlen(c->remote)};
    out->version = r->version;
    out->n_headers = r->n_headers;
    return CART_OK;
}

int32_t cart_http_header(const cart_http *h, int64_t request_id, const char *name,
                         cart_str *value) {
    if (value) *value = (cart_str){"", 0};
    conn *c = find(h, request_id);
    if (!c || !name || !value) return 0;
    const request *r = c->req;
    size_t n = strlen(name);
    for (int32_t i = 0; i < r->n_headers; i++) {
        span s = r->headers[i].name;
        if (s.len == n && strncasecmp(r->raw + s.off, name, n) == 0) {
            *value = str_of(r, r->headers[i].value);
            return 1;
        }
    }
    return 0;
}

int cart_http_header_at(const cart_http *h, int64_t request_id, int32_t i, cart_str *name,
                        cart_str *value) {
    if (name) *name = (cart_str){"", 0};
    if (value) *value = (cart_str){"", 0};
    conn *c = find(h, request_id);
    if (!c)
        return cart_fail(CART_E_STATE, "http header_at: request %lld is not in flight",
                         (long long)request_id);
    if (i < 0 || i >= c->req->n_headers)
        return cart_fail(CART_E_ARG, "http header_at: index %d out of range (%d headers)", (int)i,
                         (int)c->req->n_headers);
    if (name) *name = str_of(c->req, c->req->headers[i].name);
    if (value) *value = str_of(c->req, c->req->headers[i].value);
    return CART_OK;
}

int32_t cart_http_is_open(const cart_http *h, int64_t request_id) {
    conn *c = find(h, request_id);
    return c && !c->broken;
}

/* The connection for a write to `id`, or NULL with the error recorded. */
static conn *writable(cart_http *h, int64_t id, const char *what) {
    if (!h) {
        cart_fail(CART_E_ARG, "http %s: server is NULL", what);
        return NULL;
    }
    conn *c = find(h, id);
    if (!c) {
        cart_fail(CART_E_STATE,
                  "http %s: request %lld is not in flight (answered, closed or unknown)", what,
                  (long long)id);
        return NULL;
    }
    if (c->broken) {
        cart_fail(CART_E_STATE, "http %s: the client of request %lld went away", what,
                  (long long)id);
        return NULL;
    }
    return c;
}

/* Checks room for n more queued bytes: over max_output_bytes (with output
 * already waiting) the connection is dropped at the next poll. */
static int room_for(cart_http *h, conn *c, size_t n, const char *what) {
    size_t pending = out_pending(c);
    if (pending > 0 && pending + n > (uint64_t)h->o.max_output_bytes) {
        c->broken = 1;
        return cart_fail(CART_E_STATE,
                         "http %s: the client of request %lld is not reading (%zu bytes queued, "
                         "limit %lld); connection dropped",
                         what, (long long)c->req->id, pending, (long long)h->o.max_output_bytes);
    }
    return CART_OK;
}

static int queue(conn *c, const void *p, size_t n, const char *what, int64_t now) {
    if (out_append(c, p, n, now) != 0) {
        c->broken = 1;
        return cart_fail(CART_E_NOMEM, "http %s: out of memory queueing %zu bytes", what, n);
    }
    return CART_OK;
}

static int check_status(int32_t status, const char *what) {
    if (status < 200 || status > 599)
        return cart_fail(CART_E_ARG, "http %s: status %d is not between 200 and 599", what,
                         (int)status);
    return CART_OK;
}

static int check_content_type(const char *ct, const char *what) {
    for (const char *p = ct; p && *p; p++)
        if (!is_value_char((unsigned char)*p))
            return cart_fail(CART_E_ARG, "http %s: content type contains a control character",
                             what);
    return CART_OK;
}

/* extra_headers: "Name: value\r\n" lines; not the headers the server owns. */
static int check_extra_headers(const char *s, const char *what) {
    static const char *const owned[] = {"content-length", "transfer-encoding", "connection"};
    if (!s) return CART_OK;
    int line = 1;
    while (*s) {
        const char *n = s;
        while (is_tchar((unsigned char)*s)) s++;
        if (s == n || *s != ':')
            return cart_fail(CART_E_ARG, "http %s: extra header line %d is not 'Name: value\\r\\n'",
                             what, line);
        for (size_t k = 0; k < sizeof owned / sizeof owned[0]; k++)
            if ((size_t)(s - n) == strlen(owned[k]) &&
                strncasecmp(n, owned[k], (size_t)(s - n)) == 0)
                return cart_fail(CART_E_ARG,
                                 "http %s: extra header line %d sets %.*s, which the server sets",
                                 what, line, (int)(s - n), n);
        s++;
        while (*s && *s != '\r' && *s != '\n') {
            if (!is_value_char((unsigned char)*s))
                return cart_fail(CART_E_ARG,
                                 "http %s: extra header line %d has a control character", what,
                                 line);
            s++;
        }
        if (s[0] != '\r' || s[1] != '\n')
            return cart_fail(CART_E_ARG, "http %s: extra header line %d does not end with \\r\\n",
                             what, line);
        s += 2;
        line++;
    }
    return CART_OK;
}

/* Queues the status line and headers. length < 0: no Content-Length. */
static int queue_head(conn *c, int32_t status, const char *content_type, int64_t length,
                      int chunked, const char *extra, const char *what, int64_t now) {
    char date[64], fixed[512];
    http_date(date, sizeof date);
    int n = snprintf(fixed, sizeof fixed, "HTTP/1.1 %d %s\r\nServer: cartridge\r\nDate: %s\r\n",
                     (int)status, reason_phrase(status), date);
    int rc = queue(c, fixed, (size_t)n, what, now);
    if (rc == CART_OK && content_type) {
        rc = queue(c, "Content-Type: ", 14, what, now);
        if (rc == CART_OK) rc = queue(c, content_type, strlen(content_type), what, now);
        if (rc == CART_OK) rc = queue(c, "\r\n", 2, what, now);
    }
    n = 0;
    if (length >= 0)
        n += snprintf(fixed + n, sizeof fixed - (size_t)n, "Content-Length: %lld\r\n",
                      (long long)length);
    if (chunked)
        n += snprintf(fixed + n, sizeof fixed - (size_t)n, "Transfer-Encoding: chunked\r\n");
    if (c->req->close) n += snprintf(fixed + n, sizeof fixed - (size_t)n, "Connection: close\r\n");
    if (rc == CART_OK) rc = queue(c, fixed, (size_t)n, what, now);
    if (rc == CART_OK && extra) rc = queue(c, extra, strlen(extra), what, now);
    if (rc == CART_OK) rc = queue(c, "\r\n", 2, what, now);
    return rc;
}

static size_t head_estimate(const char *content_type, const char *extra) {
    return 512 + (content_type ? strlen(content_type) : 0) + (extra ? strlen(extra) : 0);
}

/* The response is complete: free the request, then keep the connection
 * alive for the next request or close it. */
static void finish(cart_http *h, conn *c, int64_t now) {
    int close_after = c->req->close;
    cart_http_request_free(c->req);
    c->req = NULL;
    c->input_paused = 0;
    if (close_after) {
        c->state = S_CLOSING;
        c->in_len = 0;
    } else {
        c->state = S_HEAD;
        c->scan = 0;
        c->parse_pending = c->in_len > 0;
        c->deadline = now + (c->in_len > 0 ? h->o.header_timeout_ms : h->o.idle_timeout_ms);
        c->since = c->head_since = now;
    }
}

int cart_http_respond(cart_http *h, int64_t request_id, int32_t status, const char *content_type,
                      const void *body, int64_t len, const char *extra_headers) {
    const char *what = "respond";
    conn *c = writable(h, request_id, what);
    if (!c) return cart_last_status();
    if (c->req->mode != RESP_NONE)
        return cart_fail(CART_E_STATE,
                         "http respond: request %lld has a streamed response begun; end it with "
                         "stream_end",
                         (long long)request_id);
    int rc = check_status(status, what);
    if (rc == CART_OK) rc = check_content_type(content_type, what);
    if (rc == CART_OK) rc = check_extra_headers(extra_headers, what);
    if (rc != CART_OK) return rc;
    if (len < 0 || (len > 0 && !body))
        return cart_fail(CART_E_ARG, "http respond: body of %lld bytes at %p", (long long)len,
                         body);
    int no_content = status == 204 || status == 304;
    if (no_content && len > 0)
        return cart_fail(CART_E_ARG, "http respond: status %d cannot carry a body (%lld bytes)",
                         (int)status, (long long)len);
    int send_body = !no_content && !c->req->head_only;
    int64_t now = now_ms();
    rc = room_for(h, c, head_estimate(content_type, extra_headers) + (send_body ? (size_t)len : 0),
                  what);
    if (rc == CART_OK)
        rc =
            queue_head(c, status, content_type, no_content ? -1 : len, 0, extra_headers, what, now);
    if (rc == CART_OK && send_body) rc = queue(c, body, (size_t)len, what, now);
    if (rc != CART_OK) return rc;
    finish(h, c, now);
    kick(c, now);
    return CART_OK;
}

int cart_http_stream_begin(cart_http *h, int64_t request_id, int32_t status,
                           const char *content_type, const char *extra_headers) {
    const char *what = "stream_begin";
    conn *c = writable(h, request_id, what);
    if (!c) return cart_last_status();
    if (c->req->mode != RESP_NONE)
        return cart_fail(CART_E_STATE, "http stream_begin: request %lld already has a response",
                         (long long)request_id);
    int rc = check_status(status, what);
    if (rc == CART_OK && (status == 204 || status == 304))
        rc = cart_fail(CART_E_ARG, "http stream_begin: status %d cannot carry a body", (int)status);
    if (rc == CART_OK) rc = check_content_type(content_type, what);
    if (rc == CART_OK) rc = check_extra_headers(extra_headers, what);
    if (rc != CART_OK) return rc;
    int64_t now = now_ms();
    request *r = c->req;
    stream_mode mode = r->head_only ? RESP_DISCARD : r->version == 10 ? RESP_RAW : RESP_CHUNKED;
    if (mode == RESP_RAW) r->close = 1;
    rc = room_for(h, c, head_estimate(content_type, extra_headers), what);
    if (rc == CART_OK)
        rc = queue_head(c, status, content_type, -1, r->version == 11, extra_headers, what, now);
    if (rc != CART_OK) return rc;
    r->mode = mode;
    kick(c, now);
    return CART_OK;
}

int cart_http_stream_write(cart_http *h, int64_t request_id, const void *data, int64_t len) {
    const char *what = "stream_write";
    conn *c = writable(h, request_id, what);
    if (!c) return cart_last_status();
    if (c->req->mode == RESP_NONE)
        return cart_fail(CART_E_STATE, "http stream_write: request %lld has no stream begun",
                         (long long)request_id);
    if (len < 0 || (len > 0 && !data))
        return cart_fail(CART_E_ARG, "http stream_write: %lld bytes at %p", (long long)len, data);
    if (len == 0 || c->req->mode == RESP_DISCARD) return CART_OK;
    int64_t now = now_ms();
    char size_line[32];
    int n = c->req->mode == RESP_CHUNKED
                ? snprintf(size_line, sizeof size_line, "%llx\r\n", (unsigned long long)len)
                : 0;
    int rc = room_for(h, c, (size_t)len + (size_t)n + 2, what);
    if (rc == CART_OK) rc = queue(c, size_line, (size_t)n, what, now);
    if (rc == CART_OK) rc = queue(c, data, (size_t)len, what, now);
    if (rc == CART_OK && c->req->mode == RESP_CHUNKED) rc = queue(c, "\r\n", 2, what, now);
    if (rc != CART_OK) return rc;
    kick(c, now);
    return CART_OK;
}

int cart_http_stream_end(cart_http *h, int64_t request_id) {
    const char *what = "stream_end";
    conn *c = writable(h, request_id, what);
    if (!c) return cart_last_status();
    if (c->req->mode == RESP_NONE)
        return cart_fail(CART_E_STATE, "http stream_end: request %lld has no stream begun",
                         (long long)request_id);
    int64_t now = now_ms();
    if (c->req->mode == RESP_CHUNKED) {
        int rc = queue(c, "0\r\n\r\n", 5, what, now);
        if (rc != CART_OK) return rc;
    }
    finish(h, c, now);
    kick(c, now);
    return CART_OK;
}

int32_t cart_http_connections(const cart_http *h) {
    return h ? h->n_open : 0;
}

int64_t cart_http_pending_output(const cart_http *h) {
    int64_t total = 0;
    for (int32_t i = 0; h && i < h->n_slots; i++)
        if (h->conns[i]) total += (int64_t)out_pending(h->conns[i]);
    return total;
}

/* ---------------------------------------------------------------------------
 * Signals */

/* The write end of the pipe of the server holding the signals, or -1. */
static volatile sig_atomic_t signal_fd = -1;
static cart_http *signal_owner;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    int fd = signal_fd;
    if (fd >= 0) {
        ssize_t n = write(fd, &b, 1); /* a full pipe drops it: enough are queued */
        (void)n;
    }
    errno = saved;
}

int cart_http_catch_signals(cart_http *h) {
    if (!h) return cart_fail(CART_E_ARG, "http catch_signals: server is NULL");
    if (signal_owner == h) return CART_OK;
    if (signal_owner)
        return cart_fail(CART_E_STATE,
                         "http catch_signals: another server already catches SIGINT/SIGTERM");
    if (pipe2(h->sig_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
        return cart_fail_errno(CART_E_IO, "http catch_signals: pipe2 failed");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* other blocking calls restart; poll(2) still wakes */
    signal_fd = h->sig_pipe[1];
    if (sigaction(SIGINT, &sa, &h->old_int) != 0) {
        int rc = cart_fail_errno(CART_E_IO, "http catch_signals: sigaction(SIGINT) failed");
        signal_fd = -1;
        close(h->sig_pipe[0]);
        close(h->sig_pipe[1]);
        return rc;
    }
    if (sigaction(SIGTERM, &sa, &h->old_term) != 0) {
        int rc = cart_fail_errno(CART_E_IO, "http catch_signals: sigaction(SIGTERM) failed");
        sigaction(SIGINT, &h->old_int, NULL);
        signal_fd = -1;
        close(h->sig_pipe[0]);
        close(h->sig_pipe[1]);
        return rc;
    }
    h->signals_held = 1;
    signal_owner = h;
    return CART_OK;
}

static void release_signals(cart_http *h) {
    if (!h->signals_held) return;
    sigaction(SIGINT, &h->old_int, NULL);
    sigaction(SIGTERM, &h->old_term, NULL);
    signal_fd = -1;
    signal_owner = NULL;
    close(h->sig_pipe[0]);
    close(h->sig_pipe[1]);
    h->signals_held = 0;
}

/* ---------------------------------------------------------------------------
 * Listening */

void cart_http_default_options(cart_http_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 0;
    o->backlog = 4096;
    o->max_connections = 256;
    o->max_headers = 100;
    o->max_header_bytes = 16 * 1024;
    o->max_body_bytes = 1024 * 1024;
    o->max_output_bytes = 8 * 1024 * 1024;
    o->header_timeout_ms = 10000;
    o->body_timeout_ms = 30000;
    o->idle_timeout_ms = 60000;
    o->write_timeout_ms = 60000;
    o->max_connections_per_peer = 64;
    o->first_byte_timeout_ms = 2000;
}

static int check_range(const char *field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return cart_fail(CART_E_ARG, "http options: %s must be between %lld and %lld, got %lld",
                         field, (long long)lo, (long long)hi, (long long)v);
    return CART_OK;
}

static int check_options(const cart_http_options *o) {
    int rc = check_range("port", o->port, 0, 65535);
    if (rc == CART_OK) rc = check_range("backlog", o->backlog, 1, 65535);
    if (rc == CART_OK) rc = check_range("max_connections", o->max_connections, 1, 65536);
    if (rc == CART_OK) rc = check_range("max_headers", o->max_headers, 1, 100000);
    if (rc == CART_OK) rc = check_range("max_header_bytes", o->max_header_bytes, 64, 1LL << 30);
    if (rc == CART_OK) rc = check_range("max_body_bytes", o->max_body_bytes, 0, 1LL << 40);
    if (rc == CART_OK) rc = check_range("max_output_bytes", o->max_output_bytes, 1, 1LL << 40);
    if (rc == CART_OK) rc = check_range("header_timeout_ms", o->header_timeout_ms, 1, INT32_MAX);
    if (rc == CART_OK) rc = check_range("body_timeout_ms", o->body_timeout_ms, 1, INT32_MAX);
    if (rc == CART_OK) rc = check_range("idle_timeout_ms", o->idle_timeout_ms, 1, INT32_MAX);
    if (rc == CART_OK) rc = check_range("write_timeout_ms", o->write_timeout_ms, 1, INT32_MAX);
    if (rc == CART_OK)
        rc = check_range("max_connections_per_peer", o->max_connections_per_peer, 1, 65536);
    if (rc == CART_OK)
        rc = check_range("first_byte_timeout_ms", o->first_byte_timeout_ms, 1, INT32_MAX);
    return rc;
}

/* Binds and listens on the first address of `family` in res; -1 when none
 * works (errno from the last attempt). */
static int bind_family(const struct addrinfo *res, int family, int backlog) {
    int fd = -1;
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family != family) continue;
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) return fd;
        int saved = errno;
        close(fd);
        errno = saved;
        fd = -1;
    }
    return -1;
}

int cart_http_listen(cart_http **out, const cart_http_options *opts) {
    if (!out) return cart_fail(CART_E_ARG, "http listen: out is NULL");
    *out = NULL;
    cart_http_options o;
    cart_http_default_options(&o);
    if (opts) o = *opts;
    if (!o.host || !o.host[0]) o.host = "127.0.0.1";
    int rc = check_options(&o);
    if (rc != CART_OK) return rc;

    char port[16];
    snprintf(port, sizeof port, "%d", (int)o.port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(o.host, port, &hints, &res);
    if (gai != 0)
        return cart_fail(CART_E_IO, "http listen: cannot resolve %s:%d: %s", o.host, (int)o.port,
                         gai_strerror(gai));
    errno = EADDRNOTAVAIL;
    int fd = bind_family(res, AF_INET, o.backlog);
    if (fd < 0) fd = bind_family(res, AF_INET6, o.backlog);
    int saved = errno;
    freeaddrinfo(res);
    if (fd < 0) {
        errno = saved;
        return cart_fail_errno(CART_E_IO, "http listen: cannot listen on %s:%d", o.host,
                               (int)o.port);
    }

    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int32_t bound = o.port;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
        if (sa.ss_family == AF_INET) bound = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        if (sa.ss_family == AF_INET6) bound = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    }

    cart_http *h = cart_calloc(1, sizeof *h, "http server");
    int32_t slots = o.max_connections + REJECT_RESERVE;
    if (h) {
        h->conns = cart_calloc((size_t)slots, sizeof *h->conns, "http connection table");
        h->pfds = cart_calloc((size_t)slots + 2, sizeof *h->pfds, "http poll list");
        h->pfd_slot = cart_calloc((size_t)slots + 2, sizeof *h->pfd_slot, "http poll list");
    }
    if (!h || !h->conns || !h->pfds || !h->pfd_slot) {
        if (h) {
            free(h->conns);
            free(h->pfds);
            free(h->pfd_slot);
            free(h);
        }
        close(fd);
        return CART_E_NOMEM;
    }
    h->listen_fd = fd;
    h->port = bound;
    h->o = o;
    h->o.host = NULL; /* not kept: the caller's string may not outlive us */
    h->in_limit = (size_t)o.max_header_bytes + (size_t)o.max_body_bytes;
    h->n_slots = slots;
    h->sig_pipe[0] = h->sig_pipe[1] = -1;
    *out = h;
    return CART_OK;
}

int32_t cart_http_port(const cart_http *h) {
    return h ? h->port : 0;
}

void cart_http_close(cart_http *h) {
    if (!h) return;
    for (int32_t i = 0; i < h->n_slots; i++) {
        conn *c = h->conns[i];
        if (!c) continue;
        close(c->fd);
        free(c->in);
        free(c->out);
        cart_http_request_free(c->req);
        free(c);
    }
    release_signals(h);
    close(h->listen_fd);
    free(h->conns);
    free(h->pfds);
    free(h->pfd_slot);
    free(h->events);
    free(h);
}
