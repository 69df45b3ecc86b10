/*
 * http.h - a small non-blocking HTTP/1.1 server for one thread.
 *
 * This is the only part of the engine that talks to sockets. The caller (the
 * Lua server loop) owns the thread and the loop:
 *
 *   cart_http_listen(&h, &opts);
 *   for (;;) {
 *       cart_http_poll(h, 10);                 // all socket I/O happens here
 *       while (cart_http_next_event(h, &ev)) { // requests, disconnects, signals
 *           ...read the request, start or cancel work...
 *       }
 *       ...run one model step, then cart_http_respond / cart_http_stream_write...
 *   }
 *
 * Nothing here blocks on a client: sockets are non-blocking, responses are
 * queued per connection and flushed by later polls (and by an immediate
 * non-blocking attempt when they are queued), so a slow client costs memory
 * (bounded by max_output_bytes) but never time.
 *
 * Requests. A request becomes a CART_HTTP_REQUEST event once its head and its
 * whole body (Content-Length) have arrived. Its id is unique for the server's
 * lifetime. The caller answers it exactly once, with cart_http_respond or with
 * cart_http_stream_begin / _write... / _end. A connection handles one request
 * at a time: a pipelined request behind it is not parsed into an event until
 * the response to the one before is complete, and responses go out in order.
 * Keep-alive is the default for HTTP/1.1; "Connection: close" is honoured and
 * HTTP/1.0 connections close after one response. Request bodies must come
 * with Content-Length: chunked request bodies are refused with 411, any
 * other Transfer-Encoding with 501. "Expect: 100-continue" is answered with
 * "100 Continue" when the body is acceptable (413 when it is too large, 417
 * for any other expectation).
 *
 * Protocol errors are answered here, never reach the caller, and close the
 * connection. The body is an OpenAI-style error,
 * {"error":{"message":"...","type":"invalid_request_error","code":null}}
 * ("server_error" for 5xx): 400 malformed request line or header, 408 head
 * not complete within header_timeout_ms or body not complete within
 * body_timeout_ms, 411/501 Transfer-Encoding, 413 body over max_body_bytes
 * (answered as soon as the head arrives), 417 unknown expectation, 431 head
 * over max_header_bytes or more than max_headers lines, 503 over
 * max_connections, 505 an HTTP major version other than 1. Application errors
 * (404, 405, bad JSON) are the caller's.
 *
 * Floods. What one peer can hold is bounded, so that idle or slow sockets
 * cannot lock other clients out. A new connection that sends no byte within
 * first_byte_timeout_ms (or header_timeout_ms when that is shorter) is
 * closed quietly, as is a keep-alive one idle for idle_timeout_ms. When the table
 * is full (max_connections), or the newcomer's address (its IP, without the
 * port) already holds max_connections_per_peer, the connection that waited
 * longest without sending a byte is closed to make room (within that address
 * for the per-address cap); then the oldest head still arriving after 1 s (a
 * slowloris); only when no such connection exists does the newcomer get 503.
 * A client that sends its request as it connects, such as a health check,
 * is therefore always served.
 *
 * Disconnects. A CART_HTTP_CLOSED event says that a request already delivered
 * and not yet answered in full lost its connection: the client closed or
 * reset it (a client that half-closes after sending counts as gone), a write
 * failed, the client stopped reading for write_timeout_ms, or its queued
 * output would pass max_output_bytes. Stop that work; later writes to the id
 * fail with CART_E_STATE. A request whose connection goes before its REQUEST
 * event was taken is dropped silently.
 *
 * Not supported: TLS, HTTP/2, chunked request bodies, trailers, request
 * header folding (refused with 400). The Host header is not required. The
 * path is given as sent (no percent-decoding).
 */
#ifndef CART_HTTP_H
#define CART_HTTP_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_http cart_http;

typedef struct cart_http_options {
    const char *host;          /* address to bind: "127.0.0.1" (default), "0.0.0.0", "localhost" */
    int32_t port;              /* 0: an ephemeral port (see cart_http_port) */
    int32_t backlog;           /* listen(2) backlog, default 4096 (the kernel caps it at somaxconn) */
    int32_t max_connections;   /* open client connections, default 256; more get 503 */
    int32_t max_headers;       /* header lines per request, default 100; more get 431 */
    int64_t max_header_bytes;  /* request line + headers, default 16 KiB; more get 431 */
    int64_t max_body_bytes;    /* Content-Length limit, default 1 MiB; more get 413 */
    int64_t max_output_bytes;  /* queued response bytes per connection, default 8 MiB */
    int32_t header_timeout_ms; /* the whole head must arrive within it, default 10000 */
    int32_t body_timeout_ms;   /* the whole body must arrive within it, default 30000 */
    int32_t idle_timeout_ms;   /* keep-alive connection with no request, default 60000 */
    int32_t write_timeout_ms;  /* queued output making no progress, default 60000 */
    int32_t max_connections_per_peer; /* open connections from one address, default 64 */
    int32_t first_byte_timeout_ms;    /* a request's first byte must come within it, default 2000 */
} cart_http_options;

typedef enum cart_http_event_kind {
    CART_HTTP_REQUEST = 1, /* a complete request is ready: answer it */
    CART_HTTP_CLOSED = 2,  /* a delivered, unanswered request lost its client */
    CART_HTTP_SIGNAL = 3   /* SIGINT or SIGTERM arrived (cart_http_catch_signals) */
} cart_http_event_kind;

typedef struct cart_http_event {
    int32_t kind;    /* a cart_http_event_kind */
    int32_t signal;  /* CART_HTTP_SIGNAL: the signal number (2 SIGINT, 15 SIGTERM); else 0 */
    int64_t request; /* REQUEST / CLOSED: the request id; SIGNAL: 0 */
} cart_http_event;

/* One request. Every cart_str is borrowed: it lives until the response to the
 * request is complete (cart_http_respond or cart_http_stream_end returned),
 * until a cart_http_poll reports the request CLOSED, or until
 * cart_http_close, whichever comes first. */
typedef struct cart_http_request {
    int64_t id;
    cart_str method; /* "GET", "POST", ... as sent (methods are case-sensitive) */
    cart_str target; /* the request target as sent: "/v1/models?x=1" */
    cart_str path;   /* target up to '?', not percent-decoded */
    cart_str query;  /* after '?', without it; empty when none */
    cart_str body;   /* Content-Length bytes; empty when none */
    cart_str remote; /* the peer's address, "127.0.0.1:54321" or "[::1]:54321" */
    int32_t version; /* 10 for HTTP/1.0, 11 for HTTP/1.1 */
    int32_t n_headers;
} cart_http_request;

/* Fills o with the defaults listed in cart_http_options. */
void cart_http_default_options(cart_http_options *o);

/* Resolves o->host (getaddrinfo; the first IPv4 address it gives, else the
 * first IPv6 one), binds it with SO_REUSEADDR and listens. o may be NULL for
 * the defaults. Every limit and timeout must be positive (max_body_bytes may
 * be 0); CART_E_ARG names the field otherwise. A port in use or a host that
 * does not resolve gives CART_E_IO with a message naming host:port. On
 * success *out owns the socket; free it with cart_http_close. */
int cart_http_listen(cart_http **out, const cart_http_options *o);

/* Closes every connection (queued output is discarded: poll until
 * cart_http_pending_output is 0 first to deliver it), the listening socket and
 * the signal pipe, restores the signal handlers cart_http_catch_signals
 * replaced, and frees h. Pending events are dropped. NULL is a no-op. */
void cart_http_close(cart_http *h);

/* The port the server listens on (the chosen one when o->port was 0). */
int32_t cart_http_port(const cart_http *h);

/* Installs SIGINT and SIGTERM handlers (sigaction) that wake cart_http_poll
 * through a self-pipe and make it deliver a CART_HTTP_SIGNAL event per
 * signal, instead of killing the process. One server per process may hold
 * them: CART_E_STATE when another does. cart_http_close restores the previous
 * handlers. SIGPIPE is never raised by this server's writes (MSG_NOSIGNAL). */
int cart_http_catch_signals(cart_http *h);

/* Does all pending socket work: accepts connections, reads and parses
 * requests, writes queued output, enforces the timeouts and limits, and
 * queues events. Waits at most timeout_ms milliseconds for something to
 * happen (0: do not wait; negative: wait until something happens); it does
 * not wait when events are already queued or a request is ready to parse.
 * Returns CART_OK (also when interrupted by a signal), or CART_E_IO when
 * poll(2) itself fails. Client misbehaviour is never an error here. */
int cart_http_poll(cart_http *h, int32_t timeout_ms);

/* Takes the oldest queued event into *ev. Returns 1 when one was written, 0
 * when there is none (ev untouched). */
int32_t cart_http_next_event(cart_http *h, cart_http_event *ev);

/* Describes request `request` in *out (strings borrowed, see
 * cart_http_request). CART_E_STATE when the id is not a request in flight
 * (never delivered, already answered, or closed). */
int cart_http_request_get(const cart_http *h, int64_t request, cart_http_request *out);

/* The value of the first header named `name` (compared case-insensitively),
 * without surrounding whitespace. Returns 1 and sets *value when present;
 * returns 0 and sets *value to empty when absent or when the request is not
 * in flight. Borrowed like cart_http_request's strings. */
int32_t cart_http_header(const cart_http *h, int64_t request, const char *name, cart_str *value);

/* The i-th header line (0 <= i < n_headers) of a request in flight, name as
 * sent. CART_E_STATE for a request not in flight, CART_E_ARG for i out of
 * range. */
int cart_http_header_at(const cart_http *h, int64_t request, int32_t i, cart_str *name,
                        cart_str *value);

/* Answers a request in one piece: status 200..599, content_type (NULL: no
 * Content-Type header), len bytes of body (NULL when len is 0), and
 * extra_headers: NULL or "Name: value\r\n" lines (they may not set
 * Content-Length, Transfer-Encoding or Connection, which the server owns).
 * The server adds Date, Server, Content-Length and, when the connection will
 * close, "Connection: close". No body is sent for HEAD requests and for 204
 * and 304 (which must have len 0). The bytes are copied; the request is
 * finished when this returns CART_OK. CART_E_STATE when the request is not in
 * flight or already has a streamed response begun, or when its client went
 * away (including this write passing max_output_bytes, which drops the
 * connection and reports CLOSED at the next poll). CART_E_ARG for a bad
 * status or header text. */
int cart_http_respond(cart_http *h, int64_t request, int32_t status, const char *content_type,
                      const void *body, int64_t len, const char *extra_headers);

/* Starts a streamed response: the head (as cart_http_respond, with
 * "Transfer-Encoding: chunked" instead of Content-Length; for HTTP/1.0
 * clients the body is sent raw and the connection closes at the end).
 * Errors as cart_http_respond; status 204 and 304 are refused (CART_E_ARG). */
int cart_http_stream_begin(cart_http *h, int64_t request, int32_t status, const char *content_type,
                           const char *extra_headers);

/* Queues len bytes as one chunk of a begun stream (len 0 is a no-op) and
 * tries to send at once. CART_E_STATE when the stream was not begun or its
 * client went away (as cart_http_respond). */
int cart_http_stream_write(cart_http *h, int64_t request, const void *data, int64_t len);

/* Ends a begun stream (the last, empty chunk); the request is finished. */
int cart_http_stream_end(cart_http *h, int64_t request);

/* 1 when the request is in flight and its client is still there (a response
 * may be written), else 0. */
int32_t cart_http_is_open(const cart_http *h, int64_t request);

/* Open client connections (including ones being closed). */
int32_t cart_http_connections(const cart_http *h);

/* Response bytes queued and not yet sent, over all connections. */
int64_t cart_http_pending_output(const cart_http *h);

#ifdef __cplusplus
}
#endif

#endif
