/*
 * common.h - status codes, the thread's last error message, borrowed strings.
 *
 * Every fallible call in the engine returns an int: CART_OK (0) on success or a
 * negative CART_E_* code. On failure it also records a message that names the
 * file, the field and what was expected; cart_last_error() returns it. Nothing
 * in the engine calls exit() or abort() on input a user can get wrong.
 *
 * This header, like every public header, is read as-is by the LuaJIT FFI
 * (lua/cartridge/core.lua): fixed-width types, explicit enum values, no macros.
 */
#ifndef CART_COMMON_H
#define CART_COMMON_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_status {
    CART_OK = 0,
    CART_E_IO = -1,          /* open, read, write, mmap, rename failed */
    CART_E_FORMAT = -2,      /* a file's content is malformed or truncated */
    CART_E_NOMEM = -3,       /* an allocation failed */
    CART_E_ARG = -4,         /* the caller passed an invalid argument */
    CART_E_UNSUPPORTED = -5, /* valid, but this engine does not implement it */
    CART_E_NOT_FOUND = -6,   /* a named key, tensor or file does not exist */
    CART_E_STATE = -7        /* the call is not valid in the object's current state */
} cart_status;

/* A borrowed byte string: `len` bytes at `data`, not NUL-terminated (GGUF
 * keys and values point straight into the mapped file). Lives as long as the
 * object that returned it. */
typedef struct cart_str {
    const char *data;
    uint64_t len;
} cart_str;

/* The message of the last failure on this thread, or "" when none has been
 * recorded. The string is owned by the engine and stays valid until the next
 * failing call on the same thread. */
const char *cart_last_error(void);

/* The status code that went with cart_last_error(), or CART_OK. */
int32_t cart_last_status(void);

/* Forgets the last error on this thread. */
void cart_clear_error(void);

/* A short constant name for a status code: "CART_E_FORMAT", ... */
const char *cart_status_name(int32_t status);

/* Seconds on a monotonic clock (CLOCK_MONOTONIC), for timing: differences
 * are wall time, unaffected by clock changes. */
double cart_now_seconds(void);

/* Sleeps for `seconds` (>= 0; resumed after a signal until the time is up),
 * on the same monotonic clock. */
void cart_sleep_seconds(double seconds);

/* The engine's version string, e.g. "0.1.0". Static storage. */
const char *cart_version(void);

#ifdef __cplusplus
}
#endif

#endif
