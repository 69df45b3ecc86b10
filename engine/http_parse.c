/*
 * http_parse.c - an HTTP/1.x request head: the request line, the target,
 * the header lines and the headers the server acts on, checked against the
 * options' limits (RFC 9112). Pure: bytes in, a request or a status and its
 * reason out; http.c reads the sockets and calls it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http.h"
#include "http_internal.h"
#include "internal.h"

void cart_http_request_free(request *r) {
    if (!r) return;
    free(r->raw);
    free(r->headers);
    free(r);
}

/* The line starting at *pos within [0, end): sets [*ls, *le) to its content
 * without the line ending and advances *pos past the LF. Returns 0, or -1 for
 * a bare CR inside the line. The caller guarantees a LF before end. */
static int next_line(const char *b, size_t *pos, size_t end, size_t *ls, size_t *le) {
    const char *nl = memchr(b + *pos, '\n', end - *pos);
    size_t e = (size_t)(nl - b);
    *ls = *pos;
    *le = (e > *pos && b[e - 1] == '\r') ? e - 1 : e;
    *pos = e + 1;
    return memchr(b + *ls, '\r', *le - *ls) ? -1 : 0;
}

/* The request line: method SP request-target SP HTTP-version. Fills
 * r->method, target and version; 0, or the status to answer (why says). */
static int32_t parse_request_line(const char *b, request *r, size_t *pos, size_t head_len, char *why,
                                  size_t why_cap) {
    size_t ls, le;
    if (next_line(b, pos, head_len, &ls, &le) != 0) {
        snprintf(why, why_cap, "malformed request line: stray carriage return");
        return 400;
    }
    size_t i = ls;
    while (i < le && is_tchar((unsigned char)b[i])) i++;
    if (i == ls || i >= le || b[i] != ' ') {
        snprintf(why, why_cap, "malformed request line: expected 'METHOD /path HTTP/1.1'");
        return 400;
    }
    r->method = (span){ls, i - ls};
    size_t t0 = ++i;
    while (i < le && b[i] != ' ') {
        unsigned char ch = (unsigned char)b[i];
        if (ch < 0x21 || ch == 0x7f) break;
        i++;
    }
    if (i == t0 || i >= le || b[i] != ' ') {
        snprintf(why, why_cap, "malformed request line: expected 'METHOD /path HTTP/1.1'");
        return 400;
    }
    r->target = (span){t0, i - t0};
    i++;
    if (le - i != 8 || memcmp(b + i, "HTTP/", 5) != 0 || b[i + 5] < '0' || b[i + 5] > '9' ||
        b[i + 6] != '.' || b[i + 7] < '0' || b[i + 7] > '9') {
        snprintf(why, why_cap, "malformed request line: bad HTTP version");
        return 400;
    }
    if (b[i + 5] != '1') {
        snprintf(why, why_cap, "HTTP version %c.%c is not supported; use HTTP/1.1", b[i + 5],
                 b[i + 7]);
        return 505;
    }
    r->version = b[i + 7] == '0' ? 10 : 11;
    return 0;
}

/* r->path and r->query from the target: origin-form "/p?q", absolute-form
 * "http://host/p?q", or "*". */
static int32_t parse_target(const char *b, request *r, char *why, size_t why_cap) {
    size_t p0 = r->target.off, tend = r->target.off + r->target.len;
    if (b[p0] != '/') {
        size_t skip = 0;
        if (r->target.len >= 7 && strncasecmp(b + p0, "http://", 7) == 0) skip = 7;
        if (r->target.len >= 8 && strncasecmp(b + p0, "https://", 8) == 0) skip = 8;
        if (skip) {
            const char *slash = memchr(b + p0 + skip, '/', tend - p0 - skip);
            if (!slash) {
                snprintf(why, why_cap, "malformed request target: no path");
                return 400;
            }
            p0 = (size_t)(slash - b);
        } else if (!(r->target.len == 1 && b[p0] == '*')) {
            snprintf(why, why_cap, "malformed request target: must start with '/'");
            return 400;
        }
    }
    const char *qm = memchr(b + p0, '?', tend - p0);
    size_t pend = qm ? (size_t)(qm - b) : tend;
    r->path = (span){p0, pend - p0};
    r->query = qm ? (span){pend + 1, tend - pend - 1} : (span){tend, 0};
    return 0;
}

/* The header lines up to the blank one: header-field = field-name ":" OWS
 * field-value OWS, into r->headers. */
static int32_t parse_header_lines(const char *b, request *r, size_t *pos, size_t head_len, char *why,
                                  size_t why_cap) {
    size_t ls, le;
    while (*pos < head_len) {
        if (next_line(b, pos, head_len, &ls, &le) != 0) {
            snprintf(why, why_cap, "malformed header line: stray carriage return");
            return 400;
        }
        if (ls == le) break; /* the blank line */
        if (b[ls] == ' ' || b[ls] == '\t') {
            snprintf(why, why_cap, "malformed header: obsolete line folding is not accepted");
            return 400;
        }
        size_t k = ls;
        while (k < le && is_tchar((unsigned char)b[k])) k++;
        if (k == ls || k >= le || b[k] != ':') {
            snprintf(why, why_cap, "malformed header line (expected 'Name: value')");
            return 400;
        }
        size_t vs = k + 1, ve = le;
        while (vs < ve && (b[vs] == ' ' || b[vs] == '\t')) vs++;
        while (ve > vs && (b[ve - 1] == ' ' || b[ve - 1] == '\t')) ve--;
        for (size_t q = vs; q < ve; q++) {
            if (!is_value_char((unsigned char)b[q])) {
                snprintf(why, why_cap, "malformed header value: control character");
                return 400;
            }
        }
        header_line *hl = &r->headers[r->n_headers++];
        hl->name = (span){ls, k - ls};
        hl->value = (span){vs, ve - vs};
    }
    return 0;
}

/* Content-Length as a number; -1 when malformed. */
static int64_t content_length(const char *b, span v) {
    if (v.len == 0 || v.len > 18) return -1;
    int64_t x = 0;
    for (size_t q = 0; q < v.len; q++) {
        char d = b[v.off + q];
        if (d < '0' || d > '9') return -1;
        x = x * 10 + (d - '0');
    }
    return x;
}

/* Whether a Connection value lists the "close" token. */
static int lists_close(const char *b, span v) {
    size_t q = v.off, vend = v.off + v.len;
    while (q < vend) {
        size_t s = q;
        while (q < vend && b[q] != ',') q++;
        span tok = {s, q - s};
        while (tok.len && (b[tok.off] == ' ' || b[tok.off] == '\t')) tok.off++, tok.len--;
        while (tok.len && (b[tok.off + tok.len - 1] == ' ' || b[tok.off + tok.len - 1] == '\t'))
            tok.len--;
        if (span_ieq(b, tok, "close")) return 1;
        q++;
    }
    return 0;
}

/* The headers the server itself acts on: Content-Length, Transfer-Encoding,
 * Connection and Expect. */
static int32_t apply_headers(const cart_http_options *o, const char *b, request *r, char *why, size_t why_cap) {
    int have_length = 0, te = 0, te_chunked = 0;
    int64_t length = 0;
    for (int32_t k = 0; k < r->n_headers; k++) {
        span n = r->headers[k].name, v = r->headers[k].value;
        if (span_ieq(b, n, "content-length")) {
            int64_t x = content_length(b, v);
            if (x < 0) {
                snprintf(why, why_cap, "malformed Content-Length");
                return 400;
            }
            if (have_length && x != length) {
                snprintf(why, why_cap, "conflicting Content-Length headers");
                return 400;
            }
            have_length = 1;
            length = x;
        } else if (span_ieq(b, n, "transfer-encoding")) {
            te = 1;
            for (size_t q = 0; q + 7 <= v.len; q++)
                if (strncasecmp(b + v.off + q, "chunked", 7) == 0) te_chunked = 1;
        } else if (span_ieq(b, n, "connection")) {
            if (lists_close(b, v)) r->close = 1;
        } else if (span_ieq(b, n, "expect")) {
            if (!span_ieq(b, v, "100-continue")) {
                snprintf(why, why_cap, "unsupported Expect header; only 100-continue is known");
                return 417;
            }
            if (r->version == 11) r->expect_continue = 1;
        }
    }
    if (te) {
        snprintf(why, why_cap,
                 te_chunked ? "chunked request bodies are not supported; send "
                              "the body with a Content-Length header"
                            : "Transfer-Encoding is not supported; send the body "
                              "with a Content-Length header");
        return te_chunked ? 411 : 501;
    }
    if (length > o->max_body_bytes) {
        snprintf(why, why_cap, "request body of %llu bytes is over the limit of %lld bytes",
                 (unsigned long long)length, (long long)o->max_body_bytes);
        return 413;
    }
    r->body_len = (size_t)length;
    return 0;
}

int32_t cart_http_parse_head(const cart_http_options *o, const char *b, size_t head_len, request **out,
                             char *why, size_t why_cap) {
    *out = NULL;
    size_t lines = 0;
    for (size_t i = 0; i < head_len; i++) lines += b[i] == '\n';
    if (lines < 2) { /* cannot happen: a head is a line and a blank line */
        snprintf(why, why_cap, "malformed request");
        return 400;
    }
    if ((int64_t)lines - 2 > o->max_headers) {
        snprintf(why, why_cap, "too many header lines (%zu, limit %d)", lines - 2,
                 (int)o->max_headers);
        return 431;
    }
    request *r = calloc(1, sizeof *r);
    if (r) r->headers = calloc(lines, sizeof *r->headers);
    if (!r || !r->headers) {
        cart_http_request_free(r);
        snprintf(why, why_cap, "server out of memory");
        return 503;
    }
    r->head_len = head_len;
    size_t pos = 0;
    int32_t status = parse_request_line(b, r, &pos, head_len, why, why_cap);
    if (!status) status = parse_target(b, r, why, why_cap);
    if (!status) status = parse_header_lines(b, r, &pos, head_len, why, why_cap);
    if (!status) status = apply_headers(o, b, r, why, why_cap);
    if (status) {
        cart_http_request_free(r);
        return status;
    }
    if (r->version == 10) r->close = 1;
    r->head_only = r->method.len == 4 && memcmp(b + r->method.off, "HEAD", 4) == 0;
    *out = r;
    return 0;
}
