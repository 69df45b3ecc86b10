/*
 * http_internal.h - what the HTTP server (http.c) and its request parser
 * (http_parse.c) share: a parsed request and the byte classes of RFC 9110.
 * Not part of the API: hidden, never exported from libcartridge.
 */
#ifndef CART_HTTP_INTERNAL_H
#define CART_HTTP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "http.h"

#pragma GCC visibility push(hidden)

/* How a begun response carries its body. */
typedef enum stream_mode {
    RESP_NONE = 0,
    RESP_CHUNKED = 1, /* HTTP/1.1 chunked */
    RESP_RAW = 2,     /* HTTP/1.0: raw bytes, the connection closes at the end */
    RESP_DISCARD = 3  /* HEAD request: head only, writes are dropped */
} stream_mode;

/* Offsets into the request's bytes (head at offset 0). */
typedef struct span {
    size_t off, len;
} span;

typedef struct header_line {
    span name, value;
} header_line;

typedef struct request {
    int64_t id;
    char *raw;       /* head + body once complete (owned); NULL while in BODY */
    size_t head_len; /* bytes of request line + headers + blank line */
    size_t body_len; /* Content-Length */
    span method, target, path, query;
    header_line *headers;
    int32_t n_headers;
    int32_t version;     /* 10 or 11 */
    int head_only;       /* HEAD: the response carries no body bytes */
    int close;           /* close the connection after the response */
    int expect_continue; /* send "100 Continue" before reading the body */
    int delivered;       /* the REQUEST event was taken */
    stream_mode mode;    /* set by cart_http_stream_begin */
} request;

static inline int is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Header field value bytes: visible, space, tab and obs-text; no CR, LF, NUL. */
static inline int is_value_char(unsigned char c) {
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static inline int span_ieq(const char *base, span s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && strncasecmp(base + s.off, lit, n) == 0;
}

/* Parses the head_len bytes of a request head at b (request line, header
 * lines, the blank line) into *out (freed with cart_http_request_free).
 * Returns 0, or the status to answer (400, 413, 417, 431, 503, 505) with
 * the reason in why. */
int32_t cart_http_parse_head(const cart_http_options *o, const char *b, size_t head_len, request **out,
                             char *why, size_t why_cap);
void cart_http_request_free(request *r);

#pragma GCC visibility pop

#endif
