/*
 * fuzz_common.h - what the C fuzz targets share: a check that turns a broken
 * invariant into a finding, a way to make ASan look at every byte a reader
 * hands out, and the paths of the repository's fixtures.
 *
 * A finding is anything libFuzzer reports: a sanitizer report, a crash, or
 * abort() from FUZZ_CHECK. A reader refusing bad input with an error code is
 * the expected outcome and never a finding.
 */
#ifndef CART_FUZZ_COMMON_H
#define CART_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef CART_SOURCE_DIR
#define CART_SOURCE_DIR "."
#endif

/* Aborts with a message naming the broken invariant. */
#define FUZZ_CHECK(cond, ...)                                                    \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "\nfuzz: invariant broken at %s:%d: %s\n  ", __FILE__, \
                    __LINE__, #cond);                                            \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            fflush(stderr);                                                      \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* Reads every byte of [p, p + n) so that ASan reports a range that is not
 * wholly inside the input. The sum goes to a volatile sink so the reads stay. */
static volatile uint64_t fuzz_sink;
static inline void fuzz_touch(const void *p, uint64_t n) {
    const volatile uint8_t *b = (const volatile uint8_t *)p;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) sum += b[i];
    fuzz_sink += sum;
}

/* A reader that refused its input must have left no handle, returned one of
 * the codes a malformed file gets, and said why. */
#define FUZZ_CHECK_REFUSAL(rc, handle)                                                        \
    do {                                                                                       \
        FUZZ_CHECK((handle) == NULL, "a failed open left a handle");                           \
        FUZZ_CHECK((rc) == CART_E_FORMAT || (rc) == CART_E_UNSUPPORTED || (rc) == CART_E_NOMEM, \
                   "open returned %d (%s)", (rc), cart_status_name(rc));                       \
        FUZZ_CHECK(cart_last_error()[0] != '\0', "open failed without a message");            \
    } while (0)

/* Opens with `call` (which sets handle); a refusal is checked as above and
 * ends the input. */
#define FUZZ_OPEN_OR_RETURN(handle, call)       \
    do {                                        \
        int open_rc_ = (call);                  \
        if (open_rc_ != CART_OK) {              \
            FUZZ_CHECK_REFUSAL(open_rc_, handle); \
            return 0;                           \
        }                                       \
    } while (0)

/* $name when set and non-empty, else fallback. */
static inline const char *fuzz_env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && v[0] ? v : fallback;
}

#endif
