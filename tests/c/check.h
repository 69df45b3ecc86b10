/*
 * check.h - the tiny harness every C test program uses.
 *
 * A test program is a list of named cases, each a function. CHECK records a
 * failure and carries on; CHECK_OK expects a CART_OK status and prints
 * cart_last_error() otherwise; CHECK_NEAR prints the difference and the
 * tolerance every time, so numeric results show their margins in the log.
 *
 *   static void test_rounds_ties_to_even(void) { CHECK(cart_f32_to_f16(x) == 0x3c00); }
 *   int main(void) {
 *       RUN(test_rounds_ties_to_even);
 *       return check_finish("dtype");
 *   }
 */
#ifndef CART_TEST_CHECK_H
#define CART_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu.h"

static int check_failures;
static int check_cases;
static int check_case_failed;
static const char *check_current = "";

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                      \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* Expects status CART_OK. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int check_rc_ = (expr);                                                                    \
        if (check_rc_ != CART_OK) {                                                                \
            fprintf(stderr, "  FAIL %s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #expr,  \
                    check_rc_, cart_status_name(check_rc_), cart_last_error());                    \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* Expects a specific failing status, and a non-empty message. */
#define CHECK_ERR(expr, status)                                                                    \
    do {                                                                                           \
        cart_clear_error();                                                                        \
        int check_rc_ = (expr);                                                                    \
        if (check_rc_ != (status) || cart_last_error()[0] == '\0') {                               \
            fprintf(stderr, "  FAIL %s:%d: %s returned %d (%s), expected %s; message '%s'\n",      \
                    __FILE__, __LINE__, #expr, check_rc_, cart_status_name(check_rc_), #status,   \
                    cart_last_error());                                                            \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* Expects the last error message to contain `needle`. */
#define CHECK_ERROR_MENTIONS(needle)                                                               \
    do {                                                                                           \
        if (!strstr(cart_last_error(), (needle))) {                                                \
            fprintf(stderr, "  FAIL %s:%d: error '%s' does not mention '%s'\n", __FILE__,          \
                    __LINE__, cart_last_error(), (needle));                                        \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* |a - b| <= tol, printing the difference and the tolerance either way. */
#define CHECK_NEAR(what, a, b, tol)                                                                \
    do {                                                                                           \
        double check_d_ = fabs((double)(a) - (double)(b));                                         \
        int check_bad_ = !(check_d_ <= (double)(tol));                                             \
        fprintf(check_bad_ ? stderr : stdout, "  %s %s: max diff %.3g (tolerance %.3g)\n",         \
                check_bad_ ? "FAIL" : "ok  ", (what), check_d_, (double)(tol));                    \
        if (check_bad_) {                                                                          \
            check_failures++;                                                                      \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* Reports a maximum difference already computed over many values. */
#define CHECK_MAXDIFF(what, maxdiff, tol) CHECK_NEAR(what, (maxdiff), 0.0, (tol))

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        check_current = #fn;                                                                       \
        check_case_failed = 0;                                                                     \
        check_cases++;                                                                             \
        fn();                                                                                      \
        printf("%s %s\n", check_case_failed ? "FAILED" : "passed", check_current);                 \
        fflush(stdout);                                                                            \
    } while (0)

/* ctest runs the computing tests once per ISA level of the build, with
 * CART_ISA set (tests/c/CMakeLists.txt). On a CPU without that level there is
 * nothing to test: skip (77) before main, saying why, rather than fail. */
__attribute__((constructor)) static void check_isa_or_skip(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log as they are printed */
    const char *want = getenv("CART_ISA");
    int32_t isa;
    if (!want || !*want || cart_isa_parse(&isa, want) != CART_OK) return;
    if (!cart_isa_supported(isa)) {
        printf("skipped: CART_ISA=%s, and this machine cannot run it (%s)\n", want,
               cart_cpu_features());
        exit(77);
    }
}

static int check_finish(const char *suite) {
    printf("%s: %d cases, %d failed checks\n", suite, check_cases, check_failures);
    return check_failures ? 1 : 0;
}

/* Exit code ctest treats as "skipped" (SKIP_RETURN_CODE 77). */
enum { CHECK_SKIP = 77 };

#endif
