/*
 * bench_levels.c - two ISA levels' block-type products side by side, on a
 * noisy machine: the calls of the two levels are taken in turn in one
 * process, and each level's best call is kept, so that a slow spell of the
 * machine falls on both. Not a test: run it by hand (a ctest runs it once at
 * a tiny shape so that it cannot silently break).
 *
 *   bench_levels [--levels avx512vnni,amx] [--dtypes q4_K,q5_K,q6_K,q8_0]
 *                [--rows 3072] [--cols 1024] [--tokens 16,64,256] [--reps 15]
 *
 * One thread. Prints, per dtype and token count, each level's GOP/s
 * (2 * tokens * rows * cols per call) and the second over the first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cpu.h"
#include "dtype.h"
#include "matmul.h"
#include "pool.h"

/* A failed call ends the run with its message. */
static void must_ok(int rc, const char *what) {
    if (rc == CART_OK) return;
    fprintf(stderr, "bench_levels: %s failed: %s\n", what, cart_last_error());
    exit(1);
}
#define CHECK_OK(expr) must_ok((expr), #expr)
#include "random_weights.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Splits a comma list in place; returns the count (at most max). */
static int split(char *s, char **items, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) items[n++] = tok;
    return n;
}

/* The best seconds per call of each level over reps rounds. */
static void race(const int32_t level[2], float *y, const float *x, const cart_weight *w, int64_t n, int reps,
                 cart_pool *pool, double best[2]) {
    const int calls = n >= 256 ? 2 : n >= 64 ? 6 : 20;
    best[0] = best[1] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int l = 0; l < 2; l++) {
            CHECK_OK(cart_isa_set(level[l]));
            const double t0 = now();
            for (int c = 0; c < calls; c++) CHECK_OK(cart_matmul_forward(y, w->rows, x, w->cols, w, n, pool));
            const double dt = (now() - t0) / calls;
            if (dt < best[l]) best[l] = dt;
        }
}

int main(int argc, char **argv) {
    char levels_arg[128] = "avx512vnni,amx", dtypes_arg[128] = "q4_K,q5_K,q6_K,q8_0", tokens_arg[128] = "16,64,256";
    int64_t rows = 3072, cols = 1024;
    int reps = 15;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--levels")) snprintf(levels_arg, sizeof levels_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--dtypes")) snprintf(dtypes_arg, sizeof dtypes_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) snprintf(tokens_arg, sizeof tokens_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_levels: unknown option %s (see the file's header)\n", argv[i]);
            return 2;
        }
    }
    char *lv[2], *dt[16], *tk[16];
    int32_t level[2];
    if (split(levels_arg, lv, 2) != 2 || rows < 1 || cols < 1 || reps < 1) {
        fprintf(stderr, "bench_levels: --levels takes two levels; --rows, --cols, --reps at least 1\n");
        return 2;
    }
    for (int l = 0; l < 2; l++) {
        CHECK_OK(cart_isa_parse(&level[l], lv[l]));
        if (!cart_isa_supported(level[l])) {
            printf("bench_levels: SKIP: this CPU has no %s level (%s)\n", lv[l], cart_cpu_features());
            return 0;
        }
    }
    const int ndt = split(dtypes_arg, dt, 16), ntk = split(tokens_arg, tk, 16);
    cart_pool *pool;
    CHECK_OK(cart_pool_new(&pool, 1));
    printf("%s against %s, %lld x %lld, one thread, best of %d calls each (%s)\n", lv[1], lv[0], (long long)rows,
           (long long)cols, reps, cart_cpu_features());
    for (int d = 0; d < ndt; d++) {
        const int32_t dtype = cart_dtype_from_name(dt[d]);
        if (dtype == CART_DTYPE_INVALID) {
            fprintf(stderr, "bench_levels: unknown dtype '%s'\n", dt[d]);
            return 2;
        }
        uint64_t seed = 7;
        float *wf;
        void *data = random_weight_raw(dtype, rows, cols, &seed, &wf, 0);
        cart_weight w;
        CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
        CHECK_OK(cart_weight_repack(&w, NULL, NULL));
        for (int k = 0; k < ntk; k++) {
            const int64_t n = atoll(tk[k]);
            if (n < 1) continue;
            float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * rows));
            for (int64_t i = 0; i < n * cols; i++) x[i] = (float)((uint32_t)(i * 2654435761u) % 1000u) / 500.0f - 1.0f;
            double best[2];
            race(level, y, x, &w, n, reps, pool, best);
            const double gop = 2.0 * (double)n * (double)rows * (double)cols * 1e-9;
            printf("%-6s %4lld tokens: %s %7.1f GOP/s, %s %7.1f GOP/s: %.2fx\n", dt[d], (long long)n, lv[0],
                   gop / best[0], lv[1], gop / best[1], best[0] / best[1]);
            free(x), free(y);
        }
        cart_weight_free_packed(&w);
        free(wf), free(data);
    }
    cart_pool_free(pool);
    return 0;
}
