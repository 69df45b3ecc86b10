/*
 * test_kernels.c - every ISA level gives the scalar level's bits.
 *
 * cpu.h promises that each level computes the same arithmetic as plain C
 * (kernels/kernels.h fixes it). This runs the products, the attention
 * kernels and the bulk conversions at the scalar level, then at every other
 * level this machine supports, and compares bit for bit: the tolerance is 0
 * and the max difference is printed. Levels the machine lacks are reported
 * as not run here, never assumed. It also checks the level API itself:
 * names, parsing, refusing a level the machine cannot run.
 *
 * The scalar level is checked against float64 references in test_matmul and
 * test_train; with this test, so is every level.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "random_weights.h"
#include "cpu.h"
#include "dtype.h"
#include "matmul.h"
#include "ops.h"
#include "kernels/expf.h"
#include "kernels/kernels.h"
#include "pool.h"

/* The largest |a - b| over n floats, counting any bit difference (a NaN
 * against a NaN of other bits, -0 against +0) as infinite. */
static double bit_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(a + i, b + i, 4) == 0) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d > 0) || isnan(d)) d = INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

static const int32_t all_dtypes[] = {
    CART_F32,  CART_F16,  CART_BF16, CART_Q4_0,   CART_Q4_1,   CART_Q5_0, CART_Q5_1,
    CART_Q8_0, CART_Q2_K, CART_Q3_K, CART_Q4_K,   CART_Q5_K,   CART_Q6_K, CART_IQ4_NL,
    CART_IQ4_XS,
};

/* n tokens, rows, cols (rounded up to the block; plain types get 3 more for
 * a ragged tail). The set covers both forward regimes (GEMV up to 16
 * tokens), edge micro-tiles, and reductions longer than one packed block. */
typedef struct shape {
    int64_t n, rows, cols;
} shape;

static const shape shapes[] = {
    {1, 37, 512}, {2, 48, 256},   {3, 50, 300},   {5, 33, 1024}, {8, 17, 96},
    {9, 70, 512}, {16, 40, 256},  {17, 65, 512},  {40, 33, 768}, {29, 20, 4352},
    {16, 71, 1100}, /* blocked GEMV: row groups with an odd last one, depth blocks, a tail */
};

static int64_t cols_for(const shape *s, int32_t dtype) {
    cart_dtype_info info;
    cart_dtype_get_info(&info, dtype);
    int64_t c = (s->cols + info.block_size - 1) / info.block_size * info.block_size;
    return info.block_size == 1 ? c + 3 : c;
}

/* The machine's levels other than scalar, in *levels; their count. */
static int other_levels(int32_t *levels) {
    int count = 0;
    for (int32_t isa = 0; isa < CART_ISA_COUNT; isa++) {
        if (isa == CART_ISA_SCALAR) continue;
        if (cart_isa_supported(isa)) levels[count++] = isa;
        else printf("  %s: not run here (%s)\n", cart_isa_name(isa), cart_cpu_features());
    }
    return count;
}

/* ---- products -------------------------------------------------------------- */

typedef struct products {
    float *y, *dx, *many0, *many1;
} products;

/* Forward, backward and forward_many of w on x / dy at the active level. */
static void run_products(products *out, const cart_weight *w, const cart_weight *w2,
                         const float *x, const float *dy, const float *dx0, int64_t n,
                         cart_pool *pool) {
    const int64_t rows = w->rows, cols = w->cols;
    out->y = malloc(sizeof(float) * (size_t)(n * rows));
    out->dx = malloc(sizeof(float) * (size_t)(n * cols));
    out->many0 = malloc(sizeof(float) * (size_t)(n * rows));
    out->many1 = malloc(sizeof(float) * (size_t)(n * w2->rows));
    memcpy(out->dx, dx0, sizeof(float) * (size_t)(n * cols));
    CHECK_OK(cart_matmul_forward(out->y, rows, x, cols, w, n, pool));
    CHECK_OK(cart_matmul_backward(out->dx, cols, dy, rows, w, n, pool));
    float *ys[2] = {out->many0, out->many1};
    const int64_t ldys[2] = {rows, w2->rows};
    const cart_weight *ws[2] = {w, w2};
    CHECK_OK(cart_matmul_forward_many(2, ys, ldys, x, cols, ws, n, pool));
}

static void free_products(products *p) {
    free(p->y), free(p->dx), free(p->many0), free(p->many1);
}

static void test_products_match_scalar_on_every_level(void) {
    int32_t levels[CART_ISA_COUNT];
    const int nlevels = other_levels(levels);
    cart_pool *pool = NULL;
    CHECK_OK(cart_pool_new(&pool, 2));
    uint64_t seed = 2024;
    for (int l = 0; l < nlevels; l++) {
        for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++) {
            const int32_t dtype = all_dtypes[d];
            double fwd = 0, bwd = 0, many = 0;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int64_t n = shapes[s].n, rows = shapes[s].rows;
                const int64_t cols = cols_for(&shapes[s], dtype);
                float *wf, *wf2;
                void *data = random_weight_raw(dtype, rows, cols, &seed, &wf, (int)(s & 1));
                void *data2 = random_weight(dtype, 23, cols, &seed, &wf2);
                cart_weight w, w2;
                CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
                CHECK_OK(cart_weight_init(&w2, dtype, data2, 23, cols));
                float *x = malloc(sizeof(float) * (size_t)(n * cols));
                float *dy = malloc(sizeof(float) * (size_t)(n * rows));
                float *dx0 = malloc(sizeof(float) * (size_t)(n * cols));
                for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed) * 4.0f;
                for (int64_t i = 0; i < n * rows; i++) dy[i] = lcg_uniform(&seed);
                for (int64_t i = 0; i < n * cols; i++) dx0[i] = lcg_uniform(&seed);
                products ref, got;
                CHECK_OK(cart_isa_set(CART_ISA_SCALAR));
                run_products(&ref, &w, &w2, x, dy, dx0, n, pool);
                CHECK_OK(cart_isa_set(levels[l]));
                run_products(&got, &w, &w2, x, dy, dx0, n, pool);
                double f = bit_diff(ref.y, got.y, n * rows), b = bit_diff(ref.dx, got.dx, n * cols);
                double m = fmax(bit_diff(ref.many0, got.many0, n * rows),
                                bit_diff(ref.many1, got.many1, n * 23));
                if (f > 0 || b > 0 || m > 0)
                    printf("    %s %s n %lld rows %lld cols %lld: forward %g backward %g many %g\n",
                           cart_isa_name(levels[l]), cart_dtype_name(dtype), (long long)n,
                           (long long)rows, (long long)cols, f, b, m);
                fwd = fmax(fwd, f), bwd = fmax(bwd, b), many = fmax(many, m);
                free_products(&ref), free_products(&got);
                free(x), free(dy), free(dx0), free(wf), free(wf2), free(data), free(data2);
            }
            char what[128];
            snprintf(what, sizeof what, "%s vs scalar, %-6s forward", cart_isa_name(levels[l]),
                     cart_dtype_name(dtype));
            CHECK_MAXDIFF(what, fwd, 0.0);
            snprintf(what, sizeof what, "%s vs scalar, %-6s backward", cart_isa_name(levels[l]),
                     cart_dtype_name(dtype));
            CHECK_MAXDIFF(what, bwd, 0.0);
            snprintf(what, sizeof what, "%s vs scalar, %-6s forward_many", cart_isa_name(levels[l]),
                     cart_dtype_name(dtype));
            CHECK_MAXDIFF(what, many, 0.0);
        }
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
    cart_pool_free(pool);
}

/* ---- attention ------------------------------------------------------------- */

typedef struct att_case {
    int32_t dtype, nq, n_head, n_head_kv, head_dim;
    int64_t n_ctx0;
    int64_t window; /* sliding window (0: none) */
} att_case;

static const att_case att_cases[] = {
    {CART_F16, 1, 8, 2, 64, 150, 0},  {CART_F16, 5, 4, 4, 128, 70, 0}, {CART_F32, 1, 4, 1, 128, 200, 0},
    {CART_F32, 16, 2, 2, 64, 33, 0},  {CART_F16, 3, 6, 3, 80, 64, 0},  {CART_F16, 2, 2, 1, 8, 20, 0},
    {CART_F16, 1, 4, 2, 64, 150, 40}, {CART_F32, 16, 2, 1, 32, 130, 70}, {CART_F16, 5, 4, 2, 512, 90, 17},
    {CART_F16, 1, 16, 8, 128, 300, 0}, {CART_F16, 1, 12, 4, 128, 77, 0},  {CART_F16, 1, 8, 1, 256, 70, 0},
};

/* attention_forward for one case at the active level into out. */
static void run_attention(float *out, const att_case *c, const float *q, const void *k,
                          const void *v) {
    const int64_t stride = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t q_stride = (int64_t)c->n_head * c->head_dim;
    attention_forward(out, q, q_stride, c->nq, k, v, c->dtype, c->n_ctx0, c->window, stride, c->n_head,
                      c->n_head_kv, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
}

static void test_attention_matches_scalar_on_every_level(void) {
    int32_t levels[CART_ISA_COUNT];
    const int nlevels = other_levels(levels);
    uint64_t seed = 77;
    for (int l = 0; l < nlevels; l++) {
        double worst = 0;
        for (size_t i = 0; i < sizeof att_cases / sizeof att_cases[0]; i++) {
            const att_case *c = &att_cases[i];
            const int64_t rows = c->n_ctx0 + c->nq, stride = (int64_t)c->n_head_kv * c->head_dim;
            const int64_t nqf = (int64_t)c->nq * c->n_head * c->head_dim;
            const size_t esize = c->dtype == CART_F16 ? 2 : 4;
            float *q = malloc(sizeof(float) * (size_t)nqf);
            float *kf = malloc(sizeof(float) * (size_t)(rows * stride));
            float *vf = malloc(sizeof(float) * (size_t)(rows * stride));
            void *k = malloc(esize * (size_t)(rows * stride));
            void *v = malloc(esize * (size_t)(rows * stride));
            for (int64_t j = 0; j < nqf; j++) q[j] = lcg_uniform(&seed) * 2.0f;
            for (int64_t j = 0; j < rows * stride; j++) kf[j] = lcg_uniform(&seed) * 2.0f;
            for (int64_t j = 0; j < rows * stride; j++) vf[j] = lcg_uniform(&seed);
            if (c->dtype == CART_F16) {
                for (int64_t j = 0; j < rows * stride; j++) {
                    ((uint16_t *)k)[j] = cart_f32_to_f16(kf[j]);
                    ((uint16_t *)v)[j] = cart_f32_to_f16(vf[j]);
                }
            } else {
                memcpy(k, kf, 4 * (size_t)(rows * stride));
                memcpy(v, vf, 4 * (size_t)(rows * stride));
            }
            float *ref = malloc(sizeof(float) * (size_t)nqf), *got = malloc(sizeof(float) * (size_t)nqf);
            CHECK_OK(cart_isa_set(CART_ISA_SCALAR));
            run_attention(ref, c, q, k, v);
            /* the training kernels: one head over a prefix block and a segment */
            const int64_t na = c->n_ctx0 / 2, nb = rows - na;
            float out_r[512], out_g[512], lse_r, lse_g;
            float *dq_r = calloc((size_t)c->head_dim, 4), *dq_g = calloc((size_t)c->head_dim, 4);
            float *dk_r = calloc((size_t)(rows * stride), 4), *dk_g = calloc((size_t)(rows * stride), 4);
            float *dv_r = calloc((size_t)(rows * stride), 4), *dv_g = calloc((size_t)(rows * stride), 4);
            const float scale = 0.125f;
            attention_head_forward(out_r, &lse_r, q, kf, vf, na, stride, kf + na * stride,
                                   vf + na * stride, nb, stride, c->head_dim, scale);
            attention_head_backward(dq_r, dk_r, dv_r, 1, dk_r + na * stride, dv_r + na * stride, q,
                                    out_r, lse_r, q, kf, vf, na, stride, kf + na * stride,
                                    vf + na * stride, nb, stride, c->head_dim, scale);
            CHECK_OK(cart_isa_set(levels[l]));
            run_attention(got, c, q, k, v);
            attention_head_forward(out_g, &lse_g, q, kf, vf, na, stride, kf + na * stride,
                                   vf + na * stride, nb, stride, c->head_dim, scale);
            attention_head_backward(dq_g, dk_g, dv_g, 1, dk_g + na * stride, dv_g + na * stride, q,
                                    out_g, lse_g, q, kf, vf, na, stride, kf + na * stride,
                                    vf + na * stride, nb, stride, c->head_dim, scale);
            double d = bit_diff(ref, got, nqf);
            d = fmax(d, bit_diff(out_r, out_g, c->head_dim));
            d = fmax(d, bit_diff(&lse_r, &lse_g, 1));
            d = fmax(d, bit_diff(dq_r, dq_g, c->head_dim));
            d = fmax(d, bit_diff(dk_r, dk_g, rows * stride));
            d = fmax(d, bit_diff(dv_r, dv_g, rows * stride));
            if (d > 0)
                printf("    %s attention case %zu (%s, nq %d, head_dim %d): %g\n",
                       cart_isa_name(levels[l]), i, cart_dtype_name(c->dtype), (int)c->nq,
                       (int)c->head_dim, d);
            worst = fmax(worst, d);
            free(q), free(kf), free(vf), free(k), free(v), free(ref), free(got);
            free(dq_r), free(dq_g), free(dk_r), free(dk_g), free(dv_r), free(dv_g);
        }
        char what[96];
        snprintf(what, sizeof what, "%s vs scalar, attention forward/backward",
                 cart_isa_name(levels[l]));
        CHECK_MAXDIFF(what, worst, 0.0);
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
}

/* The multi-query training kernels (attention_heads_forward,
 * attention_tiles_backward) at every level against the scalar level's
 * one-query ones, query by query: the same bits, for head sizes with
 * and without a specialized kernel (and one that is no multiple of 16),
 * 1..8 queries, key counts around the 4 x 4 blocks, and queries that see
 * different numbers of segment rows and (even query counts: a causal
 * diagonal) of the backward tile's rows. */
static double multi_query_case(int32_t isa, int32_t D, int32_t nq, int64_t na, int64_t nb_max, int64_t skip,
                               uint64_t *seed) {
    enum { MQ = CART_ATTN_MAX_MQ };
    const int64_t stride = 2 * (int64_t)D + 16, rows = na + nb_max; /* rows of a wider cache */
    float *k = malloc(sizeof(float) * (size_t)(rows * stride)), *v = malloc(sizeof(float) * (size_t)(rows * stride));
    float *q = malloc(sizeof(float) * (size_t)(MQ * D)), *dout = malloc(sizeof(float) * (size_t)(MQ * D));
    for (int64_t j = 0; j < rows * stride; j++) k[j] = lcg_uniform(seed) * 2.0f, v[j] = lcg_uniform(seed);
    for (int64_t j = 0; j < MQ * D; j++) q[j] = lcg_uniform(seed) * 2.0f, dout[j] = lcg_uniform(seed);
    float out1[MQ * 512], out2[MQ * 512], lse1[MQ], lse2[MQ];
    float *outp[MQ], *lsep[MQ], *dqp[MQ];
    const float *qp[MQ], *dp[MQ];
    int64_t nb[MQ];
    float delta[MQ], dq1[MQ * 512] = {0}, dq2[MQ * 512] = {0};
    const int64_t nt = na < 64 ? na : 64; /* the backward's tile */
    int64_t nts[MQ]; /* the queries' rows of it: all of them, or one more each (a causal diagonal) */
    for (int32_t a = 0; a < nq; a++) nts[a] = nq % 2 ? nt : nt - (nq - 1 - a) / 2 > 0 ? nt - (nq - 1 - a) / 2 : 1;
    float *dk1 = calloc((size_t)(64 * D), 4), *dv1 = calloc((size_t)(64 * D), 4);
    float *dk2 = calloc((size_t)(64 * D), 4), *dv2 = calloc((size_t)(64 * D), 4);
    CHECK_OK(cart_isa_set(CART_ISA_SCALAR)); /* the reference: one query at a time, plain C */
    for (int32_t a = 0; a < nq; a++) {
        nb[a] = nb_max - (nq - 1 - a) / 2; /* two heads a token, tokens in order */
        if (nb[a] < 1) nb[a] = 1;
        attention_head_forward(out1 + a * D, lse1 + a, q + a * D, k, v, na, stride, k + na * stride,
                               v + na * stride, nb[a], stride, D, 0.125f);
        outp[a] = out2 + a * D, lsep[a] = lse2 + a, qp[a] = q + a * D, dp[a] = dout + a * D, dqp[a] = dq2 + a * D;
        delta[a] = attention_delta(dout + a * D, out1 + a * D, D);
        attention_tile_backward(dq1 + a * D, dk1, dv1, skip, dout + a * D, delta[a], lse1[a], q + a * D, k, v, stride,
                                nts[a], D, 0.125f);
    }
    CHECK_OK(cart_isa_set(isa));
    attention_heads_forward(outp, lsep, qp, nq, k, v, na, stride, k + na * stride, v + na * stride, nb, stride, D,
                            0.125f);
    double d = fmax(bit_diff(out1, out2, (int64_t)nq * D), bit_diff(lse1, lse2, nq));
    attention_tiles_backward(dqp, dk2, dv2, skip, dp, delta, lse1, qp, k, v, stride, nts, nq, D, 0.125f);
    d = fmax(d, bit_diff(dq1, dq2, (int64_t)nq * D));
    d = fmax(d, fmax(bit_diff(dk1, dk2, nt * D), bit_diff(dv1, dv2, nt * D)));
    free(k), free(v), free(q), free(dout), free(dk1), free(dv1), free(dk2), free(dv2);
    return d;
}

static void test_multi_query_attention_is_each_query_alone(void) {
    static const int32_t dims[] = {64, 128, 256, 80, 40};
    static const int64_t nts[] = {1, 3, 4, 5, 63, 64, 70};
    for (int32_t isa = 0; isa < CART_ISA_COUNT; isa++) {
        if (!cart_isa_supported(isa)) continue;
        uint64_t seed = 5;
        double worst = 0;
        int cases = 0;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int32_t nq = 1; nq <= CART_ATTN_MAX_MQ; nq++)
                for (size_t ti = 0; ti < sizeof nts / sizeof nts[0]; ti++, cases++)
                    worst = fmax(worst, multi_query_case(isa, dims[di], nq, nts[ti], nts[(ti + nq) % 7] + 4,
                                                         (int64_t)(nq % 3), &seed));
        char what[128];
        snprintf(what, sizeof what, "%s: %d multi-query cases vs each query alone (forward, backward)",
                 cart_isa_name(isa), cases);
        CHECK_MAXDIFF(what, worst, 0.0);
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
}

/* The decode kernels over an f16 cache (scores_f16_mq, values_f16_mq: a
 * step's query heads of one kv head) at every level against the same
 * level's one-query kernels, query by query: the same bits, for 1..16
 * queries, head sizes with and without a specialized kernel, and row
 * counts around the kernels' blocks. */
static double f16_multi_query_case(const cart_kernels *kern, int32_t D, int32_t nq, int64_t nt, uint64_t *seed) {
    enum { NQ = 16 };
    const int64_t stride = 3 * (int64_t)D + 16; /* rows of a wider cache */
    uint16_t *k = malloc(2 * (size_t)(nt * stride)), *v = malloc(2 * (size_t)(nt * stride));
    for (int64_t j = 0; j < nt * stride; j++)
        k[j] = cart_f32_to_f16(lcg_uniform(seed) * 2.0f), v[j] = cart_f32_to_f16(lcg_uniform(seed));
    float q[NQ * 256], p[NQ * 80], s1[NQ * 80], s2[NQ * 80], acc1[NQ * 256], acc2[NQ * 256];
    const float *qp[NQ];
    float *accp[NQ];
    for (int32_t j = 0; j < NQ * D; j++) q[j] = lcg_uniform(seed) * 2.0f, acc1[j] = acc2[j] = lcg_uniform(seed);
    for (int32_t j = 0; j < NQ * 80; j++) p[j] = lcg_uniform(seed) + 1.0f;
    for (int32_t a = 0; a < nq; a++) {
        qp[a] = q + a * D, accp[a] = acc2 + a * D;
        kern->scores_f16(s1 + a * 80, q + a * D, k, stride, D, nt);
        kern->values_f16(acc1 + a * D, p + a * 80, v, stride, nt, D);
    }
    /* with requests for other rows (they change nothing) on every other case */
    const cart_fetch fetch = {.base = (const char *)v, .pitch = 2 * stride, .rows = (int32_t)nt, .lines = 2};
    const cart_fetch *next = nq % 2 ? &fetch : NULL;
    kern->scores_f16_mq(s2, 80, qp, nq, k, stride, D, nt, next);
    kern->values_f16_mq(accp, p, 80, nq, v, stride, nt, D, next);
    double d = bit_diff(acc1, acc2, (int64_t)nq * D);
    for (int32_t a = 0; a < nq; a++) d = fmax(d, bit_diff(s1 + a * 80, s2 + a * 80, nt));
    free(k), free(v);
    return d;
}

static void test_f16_decode_kernels_are_each_query_alone(void) {
    static const int32_t dims[] = {64, 128, 256, 80, 16};
    static const int64_t nts[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 63, 64};
    for (int32_t isa = 0; isa < CART_ISA_COUNT; isa++) {
        if (!cart_isa_supported(isa)) continue;
        CHECK_OK(cart_isa_set(isa));
        const cart_kernels *kern = cart_kern();
        uint64_t seed = 9;
        double worst = 0;
        int cases = 0;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int32_t nq = 1; nq <= 16; nq++)
                for (size_t ti = 0; ti < sizeof nts / sizeof nts[0]; ti++, cases++)
                    worst = fmax(worst, f16_multi_query_case(kern, dims[di], nq, nts[ti], &seed));
        char what[128];
        snprintf(what, sizeof what, "%s: %d f16 decode multi-query cases vs each query alone (scores, values)",
                 cart_isa_name(isa), cases);
        CHECK_MAXDIFF(what, worst, 0.0);
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
}

/* ---- conversions ----------------------------------------------------------- */

static void test_bulk_conversions_match_scalar_on_every_level(void) {
    int32_t levels[CART_ISA_COUNT];
    const int nlevels = other_levels(levels);
    enum { N = 4099 }; /* odd: every tail length occurs over the offsets below */
    float *f = malloc(sizeof(float) * (N + 1));
    uint16_t *h = malloc(sizeof(uint16_t) * (N + 1));
    uint64_t seed = 5;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65520.0f,
                              6e-8f, 3e-8f, 1e-40f, 0x1.002p0f, 0x1.006p0f, 0x1.00018p0f};
    for (int i = 0; i < N + 1; i++) {
        uint32_t bits = lcg_bits(&seed);
        memcpy(&f[i], &bits, 4); /* every pattern, NaNs with payloads included */
        if (i % 3 == 0) f[i] = lcg_uniform(&seed) * 70000.0f;
        if (i < (int)(sizeof specials / sizeof specials[0])) f[i] = specials[i];
        h[i] = (uint16_t)lcg_bits(&seed);
    }
    for (int l = 0; l < nlevels; l++) {
        int differ = 0;
        for (int off = 0; off < 2; off++) { /* aligned and misaligned starts */
            for (int64_t n = N - 17 - off; n <= N - off; n++) {
                uint16_t a16[N + 1], b16[N + 1];
                float a32[N + 1], b32[N + 1];
                for (int dir = 0; dir < 4; dir++) {
                    CHECK_OK(cart_isa_set(CART_ISA_SCALAR));
                    if (dir == 0) cart_f32_to_f16_n(a16, f + off, n);
                    if (dir == 1) cart_f32_to_bf16_n(a16, f + off, n);
                    if (dir == 2) cart_f16_to_f32_n(a32, h + off, n);
                    if (dir == 3) cart_bf16_to_f32_n(a32, h + off, n);
                    CHECK_OK(cart_isa_set(levels[l]));
                    if (dir == 0) cart_f32_to_f16_n(b16, f + off, n);
                    if (dir == 1) cart_f32_to_bf16_n(b16, f + off, n);
                    if (dir == 2) cart_f16_to_f32_n(b32, h + off, n);
                    if (dir == 3) cart_bf16_to_f32_n(b32, h + off, n);
                    if (dir < 2) differ |= memcmp(a16, b16, 2 * (size_t)n) != 0;
                    else differ |= memcmp(a32, b32, 4 * (size_t)n) != 0;
                }
            }
        }
        CHECK_MSG(!differ, "%s: a bulk f16/bf16 conversion differs from the scalar one",
                  cart_isa_name(levels[l]));
        printf("  %s vs scalar, f16/bf16 bulk conversions of %d values: %s\n",
               cart_isa_name(levels[l]), N, differ ? "DIFFER" : "identical");
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
    free(f), free(h);
}

/* ---- e^x ------------------------------------------------------------------ */

/* Bit patterns for the e^x check: every STRIDE-th of the 2^32 (all of them
 * with CART_EXHAUSTIVE=1), then every pattern within 4096 of each bound of
 * glibc's special cases, of the zeros, of the infinities and of 1.0. */
enum { EXP_BATCH = 1 << 16, EXP_STRIDE = 251 };

static int64_t exp_patterns(uint32_t *out, int64_t at, int exhaustive) {
    const int64_t sweep = exhaustive ? ((int64_t)1 << 32) : ((int64_t)1 << 32) / EXP_STRIDE;
    const float bounds[] = {88.0f, -88.0f, 0x1.62e42ep6f, -0x1.9fe368p6f, -0x1.9d1d9ep6f, 0.0f, -0.0f,
                            INFINITY, -INFINITY, 1.0f, -1.0f};
    const int64_t nb = (int64_t)(sizeof bounds / sizeof bounds[0]);
    int64_t n = 0;
    for (; n < EXP_BATCH && at + n < sweep; n++)
        out[n] = (uint32_t)((at + n) * (exhaustive ? 1 : EXP_STRIDE));
    for (int64_t i = at + n - sweep; n < EXP_BATCH && i >= 0 && i < nb * 8192; n++, i++) {
        uint32_t b;
        memcpy(&b, &bounds[i / 8192], 4);
        out[n] = b + (uint32_t)(i % 8192) - 4096u;
    }
    return n;
}

static void test_expf_is_glibc_bits_on_every_level(void) {
    int32_t levels[CART_ISA_COUNT];
    const int nlevels = other_levels(levels);
    const char *env = getenv("CART_EXHAUSTIVE");
    const int exhaustive = env && strcmp(env, "1") == 0;
#if defined(__GLIBC__) && defined(__x86_64__)
    const int vs_libc = __builtin_cpu_supports("fma"); /* glibc then runs its FMA build */
#elif defined(__GLIBC__) && defined(__aarch64__)
    const int vs_libc = 1;
#else
    const int vs_libc = 0;
#endif
    uint32_t *bits = malloc(sizeof(uint32_t) * EXP_BATCH);
    float *x = malloc(sizeof(float) * (EXP_BATCH + 1)), *ref = malloc(sizeof(float) * EXP_BATCH);
    float *got = malloc(sizeof(float) * (EXP_BATCH + 1));
    int64_t total = 0, libc_differ = 0, level_differ[CART_ISA_COUNT] = {0};
    for (int64_t at = 0;; at += EXP_BATCH) {
        const int64_t n = exp_patterns(bits, at, exhaustive);
        if (n == 0) break;
        const int off = (int)(at / EXP_BATCH % 2); /* aligned and misaligned starts */
        memcpy(x + off, bits, 4 * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            ref[i] = cart_expf_ref(x[off + i]);
            if (vs_libc) {
                const float l = expf(x[off + i]);
                if (memcmp(&l, &ref[i], 4) != 0 && libc_differ++ < 5)
                    fprintf(stderr, "  expf(bits %08x): libc %a, cart_expf_ref %a\n", (unsigned)bits[i], l, ref[i]);
            }
        }
        for (int l = 0; l < nlevels; l++) {
            CHECK_OK(cart_isa_set(levels[l]));
            const int64_t m = n - (at / EXP_BATCH % 17); /* every tail length occurs; every third in place */
            if (at / EXP_BATCH % 3 == 0) {
                memcpy(got + off, x + off, 4 * (size_t)m);
                cart_expf_n(got + off, got + off, m);
            } else {
                cart_expf_n(got + off, x + off, m);
            }
            for (int64_t i = 0; i < m; i++)
                if (memcmp(&got[off + i], &ref[i], 4) != 0 && level_differ[l]++ < 5)
                    fprintf(stderr, "  %s expf_n(bits %08x): %a, the definition %a\n", cart_isa_name(levels[l]),
                            (unsigned)bits[i], got[off + i], ref[i]);
        }
        CHECK_OK(cart_isa_set(CART_ISA_SCALAR));
        cart_expf_n(got, x + off, n);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&got[i], &ref[i], 4) != 0) level_differ[CART_ISA_SCALAR]++;
        total += n;
    }
    CHECK_MSG(libc_differ == 0, "cart_expf_ref differs from the C library's expf on %lld of %lld inputs",
              (long long)libc_differ, (long long)total);
    printf("  cart_expf_ref vs the C library's expf over %lld bit patterns (%s): %s\n", (long long)total,
           exhaustive ? "all 2^32 and the bounds" : "every 251st and the bounds",
           vs_libc ? (libc_differ ? "DIFFER" : "identical") : "not compared (not glibc's FMA build here)");
    CHECK(level_differ[CART_ISA_SCALAR] == 0);
    for (int l = 0; l < nlevels; l++) {
        CHECK_MSG(level_differ[l] == 0, "%s: expf_n differs from the definition on %lld inputs",
                  cart_isa_name(levels[l]), (long long)level_differ[l]);
        printf("  %s vs the definition, expf_n: %s (max difference %s, tolerance 0)\n", cart_isa_name(levels[l]),
               level_differ[l] ? "DIFFER" : "identical", level_differ[l] ? "nonzero" : "0");
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
    free(bits), free(x), free(ref), free(got);
}

/* The online softmax's steps (scale_max, expf_shift_n) at every level
 * against their definitions: every length 0..70 at two offsets, scores with
 * NaNs, infinities, signed zeros and huge values among random ones. The
 * scaled scores and e^(x - shift) must be the same bits; the maximum the
 * same value (+0 and -0 count as equal: kernels.h). */
static void test_softmax_steps_match_the_definition_on_every_level(void) {
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3e38f, -3e38f, 1e-40f};
    uint64_t seed = 31;
    int64_t differ = 0, cases = 0;
    for (int32_t isa = 0; isa < CART_ISA_COUNT; isa++) {
        if (!cart_isa_supported(isa)) continue;
        CHECK_OK(cart_isa_set(isa));
        const cart_kernels *kern = cart_kern();
        for (int64_t n = 0; n <= 70; n++)
            for (int off = 0; off < 2; off++, cases++) {
                float x[72], got[72], want[72], e[72], e_want[72];
                for (int64_t i = 0; i < n; i++) {
                    const uint32_t r = lcg_bits(&seed) % 16;
                    x[off + i] = r < 4 && n % 3 == 0 ? special[r + (n % 2) * 4] : lcg_uniform(&seed) * 40.0f;
                }
                const float scale = n % 2 ? 0.125f : 1.7f;
                float m_want = -INFINITY;
                for (int64_t i = 0; i < n; i++) {
                    want[i] = x[off + i] * scale;
                    if (want[i] > m_want) m_want = want[i];
                }
                memcpy(got + off, x + off, 4 * (size_t)n);
                const float m = kern->scale_max(got + off, n, scale);
                if (memcmp(got + off, want, 4 * (size_t)n) != 0 || !(m == m_want || (isnan(m) && isnan(m_want)))) {
                    if (differ++ < 5) fprintf(stderr, "  %s scale_max n %lld: max %a, want %a\n",
                                              cart_isa_name(isa), (long long)n, m, m_want);
                }
                const float shift = n % 4 == 1 ? -INFINITY : m_want;
                for (int64_t i = 0; i < n; i++) e_want[i] = cart_expf_ref(want[i] - shift);
                if (n % 2) kern->expf_shift_n(e + off, want, n, shift);
                else memcpy(e + off, want, 4 * (size_t)n), kern->expf_shift_n(e + off, e + off, n, shift);
                if (memcmp(e + off, e_want, 4 * (size_t)n) != 0 && differ++ < 5)
                    fprintf(stderr, "  %s expf_shift_n n %lld differs\n", cart_isa_name(isa), (long long)n);
            }
    }
    CHECK_MSG(differ == 0, "softmax steps differ from their definitions in %lld of %lld cases", (long long)differ,
              (long long)cases);
    printf("  scale_max and expf_shift_n at every level vs their definitions, %lld cases: %lld differ (tolerance 0)\n",
           (long long)cases, (long long)differ);
    CHECK_OK(cart_isa_set(cart_isa_best()));
}

/* Every level's exp_n against the C library's exp: random doubles of every
 * magnitude either sign (the main path, its bounds at 2^-54 and 512, the
 * overflow and underflow sides), random bit patterns (NaNs, infinities and
 * subnormals among them) and the log-sum-exp range (-60, 0]: 12.6 million
 * inputs, 629 million with CART_EXHAUSTIVE=1. */
static void test_exp_is_libc_bits_on_every_level(void) {
    int32_t levels[CART_ISA_COUNT];
    const int nlevels = other_levels(levels);
    enum { N = 1 << 20 };
    const char *env = getenv("CART_EXHAUSTIVE"); /* then 50 times the inputs */
    const int ROUNDS = env && strcmp(env, "1") == 0 ? 600 : 12;
    double *x = malloc(sizeof(double) * (N + 1)), *ref = malloc(sizeof(double) * N);
    double *got = malloc(sizeof(double) * (N + 1));
    uint64_t seed = 17;
    int64_t differ[CART_ISA_COUNT] = {0}, total = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int64_t i = 0; i < N; i++) {
            const uint64_t b = (uint64_t)lcg_bits(&seed) << 32 | lcg_bits(&seed);
            const double u = (double)(b >> 11) * 0x1p-53; /* [0, 1) */
            double v;
            switch ((round + i) % 4) {
            case 0: v = ldexp(u + 0.5, (int)(lcg_bits(&seed) % 80) - 64); break;   /* 2^-65 .. 2^15 */
            case 1: v = -60.0 * u; break;                                           /* log-sum-exp terms */
            case 2: v = (u - 0.5) * 2 * (i % 3 == 0 ? 1100.0 : 520.0); break;        /* both bounds */
            default: memcpy(&v, &b, 8); break;                                      /* any pattern */
            }
            if (lcg_bits(&seed) % 2) v = -v;
            x[i + round % 2] = v;
        }
        const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 0x1p-54, -0x1p-54, 0x1p-55, 512.0,
                                   -512.0, 0x1.fffffffffffffp8, 709.78, 709.79, -708.4, -745.2, -745.1, 1024.0};
        for (int k = 0; k < (int)(sizeof specials / sizeof specials[0]); k++) x[round % 2 + k] = specials[k];
        const double *xr = x + round % 2;
        for (int64_t i = 0; i < N; i++) ref[i] = exp(xr[i]);
        for (int l = 0; l < nlevels; l++) {
            CHECK_OK(cart_isa_set(levels[l]));
            const int64_t m = N - round; /* several tail lengths; every other round in place */
            if (round % 3 == 0) {
                memcpy(got + round % 2, xr, 8 * (size_t)m);
                cart_exp_n(got + round % 2, got + round % 2, m);
            } else {
                cart_exp_n(got + round % 2, xr, m);
            }
            for (int64_t i = 0; i < m; i++)
                if (memcmp(&got[round % 2 + i], &ref[i], 8) != 0 && differ[l]++ < 5)
                    fprintf(stderr, "  %s exp_n(%a): %a, the C library %a\n", cart_isa_name(levels[l]), xr[i],
                            got[round % 2 + i], ref[i]);
        }
        total += N;
    }
    for (int l = 0; l < nlevels; l++) {
        CHECK_MSG(differ[l] == 0, "%s: exp_n differs from the C library's exp on %lld inputs",
                  cart_isa_name(levels[l]), (long long)differ[l]);
        printf("  %s vs the C library's exp over %lld inputs: %s (max difference %s, tolerance 0)\n",
               cart_isa_name(levels[l]), (long long)total, differ[l] ? "DIFFER" : "identical",
               differ[l] ? "nonzero" : "0");
    }
    CHECK_OK(cart_isa_set(cart_isa_best()));
    free(x), free(ref), free(got);
}

/* ---- the level API --------------------------------------------------------- */

static void test_levels_are_named_parsed_and_refused_when_missing(void) {
    int32_t isa = -1;
    for (int32_t i = 0; i < CART_ISA_COUNT; i++) {
        CHECK_OK(cart_isa_parse(&isa, cart_isa_name(i)));
        CHECK(isa == i);
    }
    CHECK_ERR(cart_isa_parse(&isa, "sse9"), CART_E_ARG);
    CHECK_ERROR_MENTIONS("sse9");
    CHECK_ERROR_MENTIONS("avx2");
    CHECK(strcmp(cart_isa_name(99), "unknown") == 0);
    CHECK(cart_isa_supported(CART_ISA_SCALAR));
    CHECK(cart_isa_supported(cart_isa_best()));
    CHECK(!cart_isa_supported(-1) && !cart_isa_supported(CART_ISA_COUNT));
    /* x86 builds have no NEON level and AArch64 builds no AVX ones */
    const int32_t absent = cart_isa_supported(CART_ISA_NEON) ? CART_ISA_AVX2 : CART_ISA_NEON;
    CHECK(!cart_isa_supported(absent));
    CHECK_ERR(cart_isa_set(absent), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS(cart_isa_name(absent));
    CHECK_ERROR_MENTIONS("scalar");
    CHECK_OK(cart_isa_init()); /* ctest sets CART_ISA only to levels it then skips if missing */
    printf("  best level here: %s; active: %s; cpu: %s\n", cart_isa_name(cart_isa_best()),
           cart_isa_name(cart_isa_active()), cart_cpu_features());
}

int main(void) {
    RUN(test_levels_are_named_parsed_and_refused_when_missing);
    RUN(test_bulk_conversions_match_scalar_on_every_level);
    RUN(test_expf_is_glibc_bits_on_every_level);
    RUN(test_exp_is_libc_bits_on_every_level);
    RUN(test_softmax_steps_match_the_definition_on_every_level);
    RUN(test_attention_matches_scalar_on_every_level);
    RUN(test_multi_query_attention_is_each_query_alone);
    RUN(test_f16_decode_kernels_are_each_query_alone);
    RUN(test_products_match_scalar_on_every_level);
    return check_finish("kernels");
}
