/*
 * probe.c - machine yardsticks (probe.h).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "blas.h"
#include "common.h"
#include "dtype.h"
#include "matmul.h"
#include "probe.h"

typedef struct read_job {
    const uint64_t *data;
    int64_t words;
    int32_t parts;
    uint64_t sums[64];
} read_job;

/* Part `begin` of the buffer: eight independent integer sums, so the loads,
 * not the adds, set the pace. */
static void read_part(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    read_job *j = ctx;
    for (int64_t p = begin; p < end; p++) {
        const int64_t per = j->words / j->parts;
        const uint64_t *w = j->data + p * per;
        uint64_t s[8] = {0};
        for (int64_t i = 0; i + 8 <= per; i += 8)
            for (int l = 0; l < 8; l++) s[l] += w[i + l];
        j->sums[p % 64] += s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    }
}

double cart_probe_read_bandwidth(int64_t bytes, int32_t reps, cart_pool *pool) {
    if (bytes <= 0 || reps <= 0) return 0;
    if (!pool) pool = cart_default_pool();
    bytes = (bytes + 4095) & ~(int64_t)4095;
    uint64_t *data = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) return 0;
    memset(data, 1, (size_t)bytes); /* fault every page in before timing */
    read_job j = {.data = data, .words = bytes / 8, .parts = cart_pool_size(pool)};
    double best = 0;
    for (int32_t r = 0; r < reps; r++) {
        double t0 = cart_now_seconds();
        cart_pool_for(pool, j.parts, 1, read_part, &j);
        double dt = cart_now_seconds() - t0;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    volatile uint64_t keep = j.sums[0]; /* the sums are used */
    (void)keep;
    munmap(data, (size_t)bytes);
    return best;
}

/* a, b: n x n f32 with small values; NULL on failure. */
static float *square(int64_t n, float base) {
    float *m = malloc(sizeof(float) * (size_t)(n * n));
    if (!m) return NULL;
    for (int64_t i = 0; i < n * n; i++) m[i] = base + (float)(i % 13) * 0.01f;
    return m;
}

double cart_probe_blas_gemm(int64_t n, int32_t reps) {
    if (n <= 0 || reps <= 0) return 0;
    float *a = square(n, 0.5f), *b = square(n, 0.25f), *c = square(n, 0.0f);
    double best = 0;
    for (int32_t r = 0; a && b && c && r < reps; r++) {
        double t0 = cart_now_seconds();
        if (cart_gemm(c, n, a, n, 0, b, n, 0, n, n, n, 1.0f, 0.0f) != CART_OK) break;
        double dt = cart_now_seconds() - t0;
        if (dt > 0 && 2.0 * (double)n * n * n / dt > best) best = 2.0 * (double)n * n * n / dt;
    }
    free(a), free(b), free(c);
    return best;
}

double cart_probe_engine_gemm(int64_t n, int32_t reps, cart_pool *pool) {
    if (n <= 0 || reps <= 0) return 0;
    float *a = square(n, 0.5f), *b = square(n, 0.25f), *c = square(n, 0.0f);
    cart_weight w;
    double best = 0;
    if (a && b && c && cart_weight_init(&w, CART_F32, b, n, n) == CART_OK)
        for (int32_t r = 0; r < reps; r++) {
            double t0 = cart_now_seconds();
            if (cart_matmul_forward(c, n, a, n, &w, n, pool) != CART_OK) break;
            double dt = cart_now_seconds() - t0;
            if (dt > 0 && 2.0 * (double)n * n * n / dt > best) best = 2.0 * (double)n * n * n / dt;
        }
    free(a), free(b), free(c);
    return best;
}
