/*
 * bench_matmul.c - speed of cart_matmul_forward / _backward on Qwen3-0.6B's
 * linear layers. Not a test: run it by hand on a quiet machine.
 *
 *   bench_matmul [--threads 1,2] [--dtypes f32,f16,bf16,q8_0,q4_K]
 *                [--shapes q,kv,o,gate,down,head] [--seconds 0.3]
 *                [--paths gemm512,gemm64,gemv,gemv16,bwd512]
 *
 * Two more shapes are gemma-4-26B-A4B's experts (hidden 2816, expert width
 * 704): edown [2816 x 704], the down projection llama-quantize leaves at
 * q5_0 (704 is no multiple of 256), and eup [704 x 2816], a gate or up
 * projection. --paths leaves out the columns not named ("-"), and the GEMM
 * peak probe when no GEMM is asked:
 *
 *   bench_matmul --paths gemv --shapes edown,eup --dtypes q5_0 --threads 1,2
 *
 * For each shape, dtype and thread count it prints the best and median of
 * several timed calls:
 *   gemm512, gemm64  forward GFLOP/s (2 * n * rows * cols per call) at n = 512
 *                    and n = 64 tokens, and the fraction of the machine's f32
 *                    FMA peak (PEAK_GFLOPS per core: about 370 GFLOP/s on two
 *                    Zen 5 cores, measured by the project lead);
 *   gemv             forward at n = 1 in GB/s of weight bytes (the file's
 *                    bytes; block types read their repacked copy), and the
 *                    fraction of the read bandwidth measured first at that
 *                    thread count (probe.h). Calls
 *                    cycle through copies of the weight worth >= 256 MiB, so
 *                    each reads its weight from DRAM as decoding does, not
 *                    from the 32 MiB L3; and weight rows per second in
 *                    millions;
 *   bwd512           backward GFLOP/s at n = 512.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "dtype.h"
#include "matmul.h"
#include "pool.h"
#include "probe.h"
#include "blas.h"
#include "cpu.h"

enum { MAX_LIST = 16 };


typedef struct layer {
    const char *name;
    int64_t rows, cols;
} layer;

static const layer layers[] = {
    {"q", 2048, 1024},    {"kv", 1024, 1024},   {"o", 1024, 2048},
    {"gate", 3072, 1024}, {"down", 1024, 3072}, {"head", 151936, 1024},
    {"edown", 2816, 704}, {"eup", 704, 2816},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Splits a comma list into at most MAX_LIST items (the string is modified). */
static int split(char *s, char **items) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < MAX_LIST; tok = strtok(NULL, ",")) items[n++] = tok;
    return n;
}

/* Whether the comma list `list` names `item`. */
static int listed(const char *list, const char *item) {
    const size_t n = strlen(item);
    for (const char *p = list; (p = strstr(p, item)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

typedef struct timing {
    double best, median; /* seconds per call */
} timing;

/* Times calls of forward (backward when `bwd`) until `seconds` have passed
 * (at least 3, at most 50 calls, after one warm-up call). */
static timing time_calls(float *out, int64_t ldo, const float *in, int64_t ldi,
                         const cart_weight *w, int n_copies, int64_t n, cart_pool *pool, int bwd,
                         double seconds) {
    double t[50];
    int reps = 0;
    if (bwd)
        cart_matmul_backward(out, ldo, in, ldi, w, n, pool);
    else
        cart_matmul_forward(out, ldo, in, ldi, w, n, pool);
    double start = now();
    while (reps < 50 && (reps < 3 || now() - start < seconds)) {
        const cart_weight *wc = &w[(reps + 1) % n_copies];
        double t0 = now();
        int rc = bwd ? cart_matmul_backward(out, ldo, in, ldi, wc, n, pool)
                     : cart_matmul_forward(out, ldo, in, ldi, wc, n, pool);
        if (rc != 0) {
            fprintf(stderr, "matmul failed: %s\n", cart_last_error());
            exit(1);
        }
        t[reps++] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    timing r = {t[0], t[reps / 2]};
    return r;
}

int main(int argc, char **argv) {
    char threads_arg[64] = "1,2", dtypes_arg[128] = "f32,f16,bf16,q8_0,q4_K";
    char shapes_arg[128] = "q,kv,o,gate,down,head", paths[128] = "gemm512,gemm64,gemv,gemv16,bwd512";
    double seconds = 0.3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            snprintf(threads_arg, sizeof threads_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--dtypes"))
            snprintf(dtypes_arg, sizeof dtypes_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--shapes"))
            snprintf(shapes_arg, sizeof shapes_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--paths"))
            snprintf(paths, sizeof paths, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char path_list[128], *path_items[MAX_LIST];
    snprintf(path_list, sizeof path_list, "%s", paths);
    for (int p = 0, np = split(path_list, path_items); p < np; p++)
        if (!listed("gemm512,gemm64,gemv,gemv16,bwd512", path_items[p])) {
            fprintf(stderr, "unknown path %s (gemm512, gemm64, gemv, gemv16, bwd512)\n", path_items[p]);
            return 2;
        }
    char *thread_items[MAX_LIST], *dtype_items[MAX_LIST], *shape_items[MAX_LIST];
    int n_threads = split(threads_arg, thread_items), n_dtypes = split(dtypes_arg, dtype_items);
    int n_shapes = split(shapes_arg, shape_items);

    /* the yardsticks per thread count */
    double peak_of[MAX_LIST], gbs_of[MAX_LIST];
    printf("kernels %s (%s)\n", cart_isa_name(cart_isa_active()), cart_cpu_features());
    for (int t = 0; t < n_threads; t++) {
        cart_pool *pool = NULL;
        if (cart_pool_new(&pool, atoi(thread_items[t])) != 0) {
            fprintf(stderr, "%s\n", cart_last_error());
            return 1;
        }
        cart_blas_set_threads(atoi(thread_items[t]));
        double blas = 0, own = 0;
        if (listed(paths, "gemm512") || listed(paths, "gemm64") || listed(paths, "gemv16") ||
            listed(paths, "bwd512"))
            blas = cart_probe_blas_gemm(1536, 3), own = cart_probe_engine_gemm(1536, 3, pool);
        peak_of[t] = (blas > own ? blas : own) * 1e-9;
        gbs_of[t] = cart_probe_read_bandwidth(512 << 20, 5, pool) * 1e-9;
        printf("%s threads: f32 GEMM peak %.0f GFLOP/s (OpenBLAS %.0f, engine %.0f), read %.1f GB/s\n",
               thread_items[t], peak_of[t], blas * 1e-9, own * 1e-9, gbs_of[t]);
        cart_pool_free(pool);
    }
    printf("%-5s %-5s %3s | %-24s | %-24s | %-28s | %-18s\n", "layer", "dtype", "thr",
           "gemm n=512 GF/s (peak)", "gemm n=64 GF/s (peak)", "gemv n=1 GB/s (read) Mrow/s",
           "bwd n=512 GF/s");
    for (int s = 0; s < n_shapes; s++) {
        const layer *l = NULL;
        for (size_t k = 0; k < sizeof layers / sizeof layers[0]; k++)
            if (!strcmp(layers[k].name, shape_items[s])) l = &layers[k];
        if (!l) {
            fprintf(stderr, "unknown shape %s\n", shape_items[s]);
            return 2;
        }
        const int64_t rows = l->rows, cols = l->cols, nmax = 512;
        float *x = malloc(sizeof(float) * (size_t)(nmax * cols));
        float *y = malloc(sizeof(float) * (size_t)(nmax * rows));
        float *dy = malloc(sizeof(float) * (size_t)(nmax * rows));
        float *src = malloc(sizeof(float) * (size_t)cols);
        uint64_t seed = 1;
        for (int64_t i = 0; i < nmax * cols; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
        for (int64_t i = 0; i < nmax * rows; i++)
            dy[i] = (float)((i * 104729) % 2001 - 1000) * 1e-3f;
        for (int d = 0; d < n_dtypes; d++) {
            int32_t dtype = cart_dtype_from_name(dtype_items[d]);
            uint64_t rb;
            if (dtype == CART_DTYPE_INVALID) {
                fprintf(stderr, "unknown dtype %s\n", dtype_items[d]);
                return 2;
            }
            if (cart_dtype_nbytes(&rb, dtype, cols) != 0) {
                printf("%-5s %-5s     | rows of %lld elements are not whole %s blocks\n", l->name,
                       dtype_items[d], (long long)cols, dtype_items[d]);
                continue;
            }
            uint8_t *data = malloc(rb * (uint64_t)rows);
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t c = 0; c < cols; c++) {
                    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                    src[c] = (float)((double)(seed >> 40) / (double)(1 << 24)) * 0.2f - 0.1f;
                }
                cart_from_f32(data + (uint64_t)r * rb, dtype, src, cols);
            }
            /* copies for the GEMV, >= 256 MiB in all, so that no call finds its
             * weight in cache */
            const uint64_t bytes = rb * (uint64_t)rows;
            int n_copies = (int)((256u << 20) / bytes) + 1;
            if (n_copies > 64) n_copies = 64;
            cart_weight w[64];
            for (int c = 0; c < n_copies; c++) {
                uint8_t *copy = data;
                if (c > 0) {
                    copy = malloc(bytes);
                    memcpy(copy, data, bytes);
                }
                /* block types repacked as a model load repacks them */
                if (cart_weight_init(&w[c], dtype, copy, rows, cols) != 0 ||
                    cart_weight_repack(&w[c], NULL, NULL) != 0) {
                    fprintf(stderr, "%s\n", cart_last_error());
                    return 1;
                }
            }
            for (int t = 0; t < n_threads; t++) {
                int threads = atoi(thread_items[t]);
                cart_pool *pool = NULL;
                if (cart_pool_new(&pool, threads) != 0) {
                    fprintf(stderr, "%s\n", cart_last_error());
                    return 1;
                }
                const double peak = peak_of[t];
                const double flop512 = 2.0 * 512 * (double)rows * (double)cols;
                const double flop64 = 2.0 * 64 * (double)rows * (double)cols;
                char c512[40] = "-", c64[40] = "-", cgemv[48] = "-", cbwd[40] = "-";
                if (listed(paths, "gemm512")) {
                    timing g = time_calls(y, rows, x, cols, w, 1, 512, pool, 0, seconds);
                    snprintf(c512, sizeof c512, "%5.0f/%5.0f (%3.0f%%)", flop512 / g.best * 1e-9,
                             flop512 / g.median * 1e-9, 100 * flop512 / g.best * 1e-9 / peak);
                }
                if (listed(paths, "gemm64")) {
                    timing g = time_calls(y, rows, x, cols, w, 1, 64, pool, 0, seconds);
                    snprintf(c64, sizeof c64, "%5.0f/%5.0f (%3.0f%%)", flop64 / g.best * 1e-9,
                             flop64 / g.median * 1e-9, 100 * flop64 / g.best * 1e-9 / peak);
                }
                if (listed(paths, "gemv")) {
                    timing g = time_calls(y, rows, x, cols, w, n_copies, 1, pool, 0, seconds);
                    snprintf(cgemv, sizeof cgemv, "%5.1f/%5.1f (%3.0f%%) %5.1f",
                             (double)bytes / g.best * 1e-9, (double)bytes / g.median * 1e-9,
                             100 * (double)bytes / g.best * 1e-9 / gbs_of[t],
                             (double)rows / g.best * 1e-6);
                }
                if (listed(paths, "gemv16")) { /* lockstep decode of 16 streams */
                    timing g = time_calls(y, rows, x, cols, w, n_copies, 16, pool, 0, seconds);
                    const double flop16 = 2.0 * 16 * (double)rows * (double)cols;
                    printf("%-5s %-5s %3d | gemv n=16: %5.0f/%5.0f GF/s (%3.0f%% of peak)\n", l->name,
                           dtype_items[d], threads, flop16 / g.best * 1e-9, flop16 / g.median * 1e-9,
                           100 * flop16 / g.best * 1e-9 / peak);
                }
                if (listed(paths, "bwd512")) {
                    timing g = time_calls(x, cols, dy, rows, w, 1, 512, pool, 1, seconds);
                    snprintf(cbwd, sizeof cbwd, "%5.0f/%5.0f (%3.0f%%)", flop512 / g.best * 1e-9,
                             flop512 / g.median * 1e-9, 100 * flop512 / g.best * 1e-9 / peak);
                }
                printf("%-5s %-5s %3d | %-24s | %-24s | %-28s | %-18s\n", l->name, dtype_items[d],
                       threads, c512, c64, cgemv, cbwd);
                fflush(stdout);
                cart_pool_free(pool);
            }
            for (int c = 0; c < n_copies; c++) {
                cart_weight_free_packed(&w[c]);
                free((void *)w[c].data);
            }
        }
        free(x), free(y), free(dy), free(src);
    }
    printf("(best/median of timed calls; peak and read bandwidth as measured above)\n");
    return 0;
}
