/*
 * common.c - last-error bookkeeping, allocation helpers, version.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "internal.h"

enum { MESSAGE_CAP = 2048 };

/* Messages longer than the buffer are cut on purpose. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static _Thread_local char last_message[MESSAGE_CAP];
static _Thread_local int32_t last_status;

static void set_message(int status, const char *fmt, va_list ap) {
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    last_status = status;
}

int cart_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_message(status, fmt, ap);
    va_end(ap);
    return status;
}

int cart_fail_errno(int status, const char *fmt, ...) {
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    set_message(status, fmt, ap);
    va_end(ap);
    size_t used = strlen(last_message);
    snprintf(last_message + used, sizeof last_message - used, ": %s", strerror(saved));
    return status;
}

int cart_fail_context(int status, const char *fmt, ...) {
    char inner[MESSAGE_CAP];
    memcpy(inner, last_message, sizeof inner);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    size_t used = strlen(last_message);
    snprintf(last_message + used, sizeof last_message - used, ": %s", inner);
    last_status = status;
    return status;
}

const char *cart_last_error(void) {
    return last_message;
}

int32_t cart_last_status(void) {
    return last_status;
}

void cart_clear_error(void) {
    last_message[0] = '\0';
    last_status = CART_OK;
}

const char *cart_status_name(int32_t status) {
    switch (status) {
    case CART_OK: return "CART_OK";
    case CART_E_IO: return "CART_E_IO";
    case CART_E_FORMAT: return "CART_E_FORMAT";
    case CART_E_NOMEM: return "CART_E_NOMEM";
    case CART_E_ARG: return "CART_E_ARG";
    case CART_E_UNSUPPORTED: return "CART_E_UNSUPPORTED";
    case CART_E_NOT_FOUND: return "CART_E_NOT_FOUND";
    case CART_E_STATE: return "CART_E_STATE";
    default: return "CART_E_UNKNOWN";
    }
}

double cart_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cart_sleep_seconds(double seconds) {
    if (!(seconds > 0)) return;
    const double end = cart_now_seconds() + seconds;
    for (double left = seconds; left > 0; left = end - cart_now_seconds()) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL); /* EINTR: the loop sleeps what is left */
    }
}

const char *cart_version(void) {
    return CART_VERSION_STRING;
}

void *cart_malloc(size_t n, const char *what) {
    void *p = malloc(n ? n : 1);
    if (!p) cart_fail(CART_E_NOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

void *cart_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        cart_fail(CART_E_NOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size,
                  what);
    return p;
}

void *cart_realloc(void *p, size_t n, const char *what) {
    void *q = realloc(p, n ? n : 1);
    if (!q) cart_fail(CART_E_NOMEM, "out of memory growing %s to %zu bytes", what, n);
    return q;
}

char *cart_strdup(const char *s, const char *what) {
    size_t n = strlen(s) + 1;
    char *p = cart_malloc(n, what);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- cs64 ---------------------------------------------------------------- */

static const uint64_t CS_PRIME = 0x100000001b3ULL;

static uint64_t cs_step(uint64_t h, uint64_t w) {
    h ^= w;
    return ((h << 29) | (h >> 35)) * CS_PRIME;
}

static uint64_t load_le64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
#endif
}

void cart_cs64_init(cart_cs64 *c) {
    memset(c, 0, sizeof *c);
    for (int j = 0; j < 4; j++) c->lane[j] = 0x9e3779b97f4a7c15ULL * (uint64_t)(j + 1);
}

static void cs_block(cart_cs64 *c, const uint8_t *p) {
    for (int j = 0; j < 4; j++) c->lane[j] = cs_step(c->lane[j], load_le64(p + 8 * j));
}

void cart_cs64_update(cart_cs64 *c, const void *data, uint64_t n) {
    const uint8_t *p = data;
    if (n == 0) return;
    c->n += n;
    if (c->fill) {
        size_t take = 32 - c->fill < n ? 32 - c->fill : (size_t)n;
        memcpy(c->block + c->fill, p, take);
        c->fill += take;
        p += take;
        n -= take;
        if (c->fill < 32) return;
        cs_block(c, c->block);
        c->fill = 0;
    }
    for (; n >= 32; p += 32, n -= 32) cs_block(c, p);
    memcpy(c->block, p, (size_t)n);
    c->fill = (size_t)n;
}

void cart_cs64_update_u64(cart_cs64 *c, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    cart_cs64_update(c, b, 8);
}

uint64_t cart_cs64_final(cart_cs64 *c) {
    if (c->fill) {
        memset(c->block + c->fill, 0, 32 - c->fill);
        cs_block(c, c->block);
    }
    uint64_t h = c->lane[0];
    for (int j = 1; j < 4; j++) h = cs_step(h, c->lane[j]);
    h ^= c->n; /* then the splitmix64 finalizer */
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}
