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
