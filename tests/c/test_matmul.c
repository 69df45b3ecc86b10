/*
 * test_matmul.c - cart_matmul_forward / _backward against naive double
 * references for every dtype the engine multiplies, on shapes that hit the
 * kernels' edges, plus thread-count independence, widening and errors.
 * Block types go through cart_matmul_forward_exact here (dequantized
 * weights, f32 activations: the training forward); test_qdot.c holds the
 * integer products of cart_matmul_forward to their contract.
 *
 * Tolerance. The reference is exact up to double rounding: it uses the weights
 * as cart_to_f32 dequantizes them and the activations rounded as matmul.h
 * says (f16 for f16 weights, bf16 for bf16). What is left is the engine's f32
 * summation: a sum of K exactly-rounded (fused) products done in f32 with any
 * order of additions is off by at most K * 2^-24 * sum|terms| (first order:
 * each of at most K roundings contributes at most 2^-24 of a partial sum,
 * which is at most sum|terms|). The check therefore reports
 *   max |got - ref| / ((K + 2) * 2^-24 * sum_k |x_k w_k|)
 * against a tolerance of 1: a worst-case bound, loose by about sqrt(K) in
 * practice, but one that no correct kernel can exceed and that a wrong
 * rounding of the activations (2^-11 relative per term) or a dropped term
 * breaks at once.
 */
#include <stdint.h>

#include "check.h"
#include "random_weights.h"
#include "dtype.h"
#include "matmul.h"
#include "pool.h"

/* Worst error over an output, as a fraction of the bound in the header. */
typedef struct errstat {
    double worst; /* max |got - ref| / ((K + 2) 2^-24 sum|terms|) */
    double rel;   /* max |got - ref| / sum|terms| */
} errstat;

static void note_error(errstat *e, double got, double ref, double mag, int64_t k) {
    double d = fabs(got - ref);
    double bound = (double)(k + 2) * 0x1p-24 * mag + 1e-30;
    if (!(d / bound <= e->worst)) e->worst = d / bound; /* NaN propagates */
    if (mag > 0 && d / mag > e->rel) e->rel = d / mag;
}

typedef struct shape {
    int64_t n, rows, cols;
} shape;

/* cols are rounded up to the block size; plain types get 5 more so that the
 * reduction has a ragged tail. */
static const shape shapes[] = {
    {1, 1, 4096},    {1, 1000, 256}, {2, 33, 512},   {3, 40, 1024}, {7, 33, 4096},
    {8, 70, 96},     {9, 45, 256},   {13, 70, 1024}, {16, 20, 300}, {17, 50, 512},
    {64, 1000, 512}, {513, 33, 256}, {100, 97, 800},
};

static int64_t shape_cols(const shape *s, int32_t dtype) {
    int64_t bs = block_size_of(dtype);
    int64_t c = (s->cols + bs - 1) / bs * bs;
    return bs == 1 ? c + 5 : c;
}

static const int32_t all_dtypes[] = {
    CART_F32,  CART_F16,    CART_BF16,   CART_Q4_0, CART_Q4_1, CART_Q5_0,
    CART_Q5_1, CART_Q8_0,   CART_Q2_K,   CART_Q3_K, CART_Q4_K, CART_Q5_K,
    CART_Q6_K, CART_IQ4_NL, CART_IQ4_XS, CART_Q8_K, CART_F64, /* not in GGUF linear layers, but
                                                                 multiplied through cart_to_f32 */
};

/* Runs forward and backward on one shape with pools of 1, 2 and 3 threads,
 * checks the outputs are bitwise equal, and scores them against the
 * reference. */
static void run_shape(int32_t dtype, const shape *s, uint64_t *seed, cart_pool *pools[3],
                      errstat *fwd, errstat *bwd, int *mismatch) {
    const int64_t n = s->n, rows = s->rows, cols = shape_cols(s, dtype);
    const int64_t ldx = cols + 3, ldy = rows + 5;
    float *wf;
    void *data = random_weight(dtype, rows, cols, seed, &wf);
    cart_weight w;
    CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));

    float *x = malloc(sizeof(float) * (size_t)(n * ldx));
    float *dy = malloc(sizeof(float) * (size_t)(n * ldy));
    float *dx0 = malloc(sizeof(float) * (size_t)(n * ldx));
    for (int64_t i = 0; i < n * ldx; i++) x[i] = lcg_uniform(seed);
    for (int64_t i = 0; i < n * ldy; i++) dy[i] = lcg_uniform(seed);
    for (int64_t i = 0; i < n * ldx; i++) dx0[i] = lcg_uniform(seed);

    float *y[3], *dx[3];
    for (int p = 0; p < 3; p++) {
        y[p] = malloc(sizeof(float) * (size_t)(n * ldy));
        for (int64_t i = 0; i < n * ldy; i++) y[p][i] = -7.0f; /* padding sentinel */
        CHECK_OK(cart_matmul_forward_exact(y[p], ldy, x, ldx, &w, n, pools[p]));
        dx[p] = malloc(sizeof(float) * (size_t)(n * ldx));
        memcpy(dx[p], dx0, sizeof(float) * (size_t)(n * ldx));
        CHECK_OK(cart_matmul_backward(dx[p], ldx, dy, ldy, &w, n, pools[p]));
    }
    for (int p = 1; p < 3; p++) {
        if (memcmp(y[0], y[p], sizeof(float) * (size_t)(n * ldy)) != 0) *mismatch = 1;
        if (memcmp(dx[0], dx[p], sizeof(float) * (size_t)(n * ldx)) != 0) *mismatch = 1;
    }

    float *xr = malloc(sizeof(float) * (size_t)cols);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t c = 0; c < cols; c++) xr[c] = contract_round(x[i * ldx + c], dtype);
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0, mag = 0;
            const float *wr = wf + r * cols;
            for (int64_t c = 0; c < cols; c++) {
                acc += (double)xr[c] * wr[c];
                mag += fabs((double)xr[c] * wr[c]);
            }
            note_error(fwd, y[0][i * ldy + r], acc, mag, cols);
        }
        for (int64_t r = rows; r < ldy; r++)
            if (y[0][i * ldy + r] != -7.0f) *mismatch = 1; /* wrote into the padding */
    }
    for (int64_t i = 0; i < n; i++) {
        for (int64_t c = 0; c < cols; c++) {
            double acc = dx0[i * ldx + c], mag = fabs(acc);
            for (int64_t r = 0; r < rows; r++) {
                double t = (double)dy[i * ldy + r] * wf[r * cols + c];
                acc += t;
                mag += fabs(t);
            }
            note_error(bwd, dx[0][i * ldx + c], acc, mag, rows + 1);
        }
        for (int64_t c = cols; c < ldx; c++)
            if (dx[0][i * ldx + c] != dx0[i * ldx + c]) *mismatch = 1;
    }
    free(xr);
    for (int p = 0; p < 3; p++) free(y[p]), free(dx[p]);
    free(x), free(dy), free(dx0), free(wf), free(data);
}

static void test_every_dtype_matches_a_double_reference_on_every_thread_count(void) {
    cart_pool *pools[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++) CHECK_OK(cart_pool_new(&pools[p], p + 1));
    uint64_t seed = 42;
    for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++) {
        const int32_t dtype = all_dtypes[d];
        errstat fwd = {0, 0}, bwd = {0, 0};
        int mismatch = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            run_shape(dtype, &shapes[s], &seed, pools, &fwd, &bwd, &mismatch);
        char what[160];
        snprintf(what, sizeof what, "%-6s forward  err / ((K+2) 2^-24 sum|xw|) [max rel err %.2g]",
                 cart_dtype_name(dtype), fwd.rel);
        CHECK_MAXDIFF(what, fwd.worst, 1.0);
        snprintf(what, sizeof what,
                 "%-6s backward err / ((K+2) 2^-24 sum|terms|) [max rel err %.2g]",
                 cart_dtype_name(dtype), bwd.rel);
        CHECK_MAXDIFF(what, bwd.worst, 1.0);
        CHECK_MSG(!mismatch, "%s: results differ between 1, 2 and 3 threads or padding was written",
                  cart_dtype_name(dtype));
    }
    for (int p = 0; p < 3; p++) cart_pool_free(pools[p]);
}

/* The f16 / bf16 contract: activations are rounded first, so rounding them
 * beforehand changes nothing, bit for bit. */
static void test_activations_are_rounded_to_the_weight_type_first(void) {
    const int32_t dtypes[] = {CART_F16, CART_BF16};
    const int64_t ns[] = {1, 5, 40};
    uint64_t seed = 7;
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            const int64_t n = ns[k], rows = 50, cols = 300;
            float *wf;
            void *data = random_weight(dtypes[d], rows, cols, &seed, &wf);
            cart_weight w;
            CHECK_OK(cart_weight_init(&w, dtypes[d], data, rows, cols));
            float *x = malloc(sizeof(float) * (size_t)(n * cols));
            float *xr = malloc(sizeof(float) * (size_t)(n * cols));
            for (int64_t i = 0; i < n * cols; i++) {
                x[i] = lcg_uniform(&seed) * 3.0f;
                xr[i] = contract_round(x[i], dtypes[d]);
            }
            float *y = malloc(sizeof(float) * (size_t)(n * rows));
            float *yr = malloc(sizeof(float) * (size_t)(n * rows));
            CHECK_OK(cart_matmul_forward(y, rows, x, cols, &w, n, NULL));
            CHECK_OK(cart_matmul_forward(yr, rows, xr, cols, &w, n, NULL));
            CHECK_MSG(memcmp(y, yr, sizeof(float) * (size_t)(n * rows)) == 0,
                      "%s, n %lld: pre-rounded activations give different results",
                      cart_dtype_name(dtypes[d]), (long long)n);
            free(x), free(xr), free(y), free(yr), free(wf), free(data);
        }
}

/* cart_weight_widen: the copy equals cart_to_f32, and multiplying by it gives
 * the same bits as multiplying by the original (block types are dequantized
 * exactly, also by the kernels' own vector dequantizers, which this checks on
 * random bytes too; for f16 / bf16 the activations are pre-rounded, see
 * above). */
static void test_widened_weights_multiply_bit_for_bit_like_the_originals(void) {
    uint64_t seed = 99;
    const int64_t ns[] = {1, 3, 9, 16, 17, 70};
    for (size_t d = 0; d < 2 * (sizeof all_dtypes / sizeof all_dtypes[0]); d++) {
        const int32_t dtype = all_dtypes[d / 2];
        const int raw = (int)(d % 2); /* quantized floats, then random bytes */
        if (raw && !scales_of(dtype)) continue;
        const int64_t rows = 37, cols = block_size_of(dtype) == 1 ? 517 : 512;
        float *wf;
        void *data = random_weight_raw(dtype, rows, cols, &seed, &wf, raw);
        cart_weight w, wide;
        CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
        CHECK_OK(cart_weight_widen(&wide, &w, NULL));
        CHECK(wide.dtype == CART_F32 && wide.rows == rows && wide.cols == cols);
        CHECK(wide.row_bytes == (uint64_t)cols * 4 && ((uintptr_t)wide.data & 63) == 0);
        CHECK_MSG(memcmp(wide.data, wf, sizeof(float) * (size_t)(rows * cols)) == 0,
                  "%s: widened copy differs from cart_to_f32", cart_dtype_name(dtype));
        int differ = 0;
        for (int k = 0; k < 6; k++) {
            const int64_t n = ns[k];
            float *x = malloc(sizeof(float) * (size_t)(n * cols));
            for (int64_t i = 0; i < n * cols; i++) x[i] = contract_round(lcg_uniform(&seed), dtype);
            float *y = malloc(sizeof(float) * (size_t)(n * rows));
            float *yw = malloc(sizeof(float) * (size_t)(n * rows));
            CHECK_OK(cart_matmul_forward_exact(y, rows, x, cols, &w, n, NULL));
            CHECK_OK(cart_matmul_forward_exact(yw, rows, x, cols, &wide, n, NULL));
            differ |= memcmp(y, yw, sizeof(float) * (size_t)(n * rows)) != 0;
            float *dy = malloc(sizeof(float) * (size_t)(n * rows));
            for (int64_t i = 0; i < n * rows; i++) dy[i] = lcg_uniform(&seed);
            float *dx = calloc((size_t)(n * cols), sizeof(float));
            float *dxw = calloc((size_t)(n * cols), sizeof(float));
            CHECK_OK(cart_matmul_backward(dx, cols, dy, rows, &w, n, NULL));
            CHECK_OK(cart_matmul_backward(dxw, cols, dy, rows, &wide, n, NULL));
            differ |= memcmp(dx, dxw, sizeof(float) * (size_t)(n * cols)) != 0;
            free(x), free(y), free(yw), free(dy), free(dx), free(dxw);
        }
        CHECK_MSG(!differ, "%s: products with the widened copy differ", cart_dtype_name(dtype));
        cart_weight_free_data(&wide);
        CHECK(wide.data == NULL);
        free(wf), free(data);
    }
    cart_weight_free_data(NULL);
}

/* Sets every f16 scale of a random-bytes weight (random_weight_raw's fields)
 * to random finite f16 bits: subnormals, negatives, up to 65504. */
static void wild_scales(uint8_t *data, int32_t dtype, int64_t rows, int64_t cols, uint64_t *seed) {
    const scale_fields *sf = scales_of(dtype);
    const uint64_t blocks = row_bytes_of(dtype, cols) * (uint64_t)rows / (uint64_t)sf->block_bytes;
    for (uint64_t b = 0; b < blocks; b++)
        for (int f = 0; f < 2; f++) {
            if (sf->at[f] < 0) continue;
            uint16_t h = (uint16_t)lcg_bits(seed);
            if ((h & 0x7c00) == 0x7c00) h &= 0xbfff; /* no inf or NaN: clear an exponent bit */
            memcpy(data + b * (uint64_t)sf->block_bytes + sf->at[f], &h, 2);
        }
}

/* The GEMV path reads the common block types in registers
 * (kernels/generic.h): the q8_0 / q4_0 / q4_1 / q5_0 / q5_1 families and
 * q4_K / q5_K / q6_K. kernels.h's contract is that this gives the bits of
 * dequantizing each row first (cart_to_f32) and multiplying the f32 values,
 * which is what the widened copy takes through the same GEMV. Checked bit for
 * bit on gemma-4-26B-A4B's expert widths (704, 2816), 1 to 16 tokens (every
 * GEMV pass of every level, with partial row tiles: 37 rows), 1, 2 and 3
 * threads, for quantized values, random bytes (every quant and sub-block
 * scale) and random finite f16 scales (subnormal to 65504); and against a
 * float64 reference with test_every_dtype's bound. */
static void test_gemv_of_block_types_gives_the_dequantized_rows_bits(void) {
    const int32_t dtypes[] = {CART_Q8_0, CART_Q4_0, CART_Q4_1, CART_Q5_0,
                              CART_Q5_1, CART_Q4_K, CART_Q5_K, CART_Q6_K};
    const int64_t ns[] = {1, 2, 3, 4, 5, 7, 8, 16}, rows = 37;
    cart_pool *pools[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++) CHECK_OK(cart_pool_new(&pools[p], p + 1));
    uint64_t seed = 704;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        const int32_t dtype = dtypes[d];
        const int64_t colset[] = {block_size_of(dtype) == 32 ? 704 : 256, 2816};
        double bits = 0;
        errstat ref = {0, 0};
        for (int c = 0; c < 2; c++)
            for (int kind = 0; kind < 3; kind++) { /* quantized, random bytes, wild scales */
                const int64_t cols = colset[c];
                float *wf;
                uint8_t *data = random_weight_raw(dtype, rows, cols, &seed, &wf, kind > 0);
                if (kind == 2) {
                    wild_scales(data, dtype, rows, cols, &seed);
                    CHECK_OK(cart_to_f32(wf, dtype, data, rows * cols));
                }
                cart_weight w, wide;
                CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
                CHECK_OK(cart_weight_widen(&wide, &w, NULL));
                const int64_t nmax = 16, ldx = cols + 3, ldy = rows + 2;
                float *x = malloc(sizeof(float) * (size_t)(nmax * ldx));
                float *want = malloc(sizeof(float) * (size_t)(nmax * ldy));
                float *got = malloc(sizeof(float) * (size_t)(nmax * ldy));
                for (int64_t i = 0; i < nmax * ldx; i++) x[i] = lcg_uniform(&seed);
                for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                    const int64_t n = ns[k];
                    CHECK_OK(cart_matmul_forward_path(want, ldy, x, ldx, &wide, n, CART_MM_GEMV,
                                                      pools[0]));
                    for (int p = 0; p < 3; p++) {
                        CHECK_OK(cart_matmul_forward_exact(got, ldy, x, ldx, &w, n, pools[p]));
                        for (int64_t i = 0; i < n; i++)
                            for (int64_t r = 0; r < rows; r++) {
                                const float a = got[i * ldy + r], b = want[i * ldy + r];
                                if (memcmp(&a, &b, 4) == 0) continue;
                                double diff = fabs((double)a - (double)b);
                                if (!(diff > 0)) diff = INFINITY; /* NaN, or -0 against +0 */
                                if (diff > bits) bits = diff;
                            }
                    }
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t r = 0; r < rows; r++) {
                            double acc = 0, mag = 0;
                            for (int64_t j = 0; j < cols; j++) {
                                const double t = (double)x[i * ldx + j] * wf[r * cols + j];
                                acc += t, mag += fabs(t);
                            }
                            note_error(&ref, got[i * ldy + r], acc, mag, cols);
                        }
                }
                cart_weight_free_data(&wide);
                free(x), free(want), free(got), free(wf), free(data);
            }
        char what[160];
        snprintf(what, sizeof what, "%-6s GEMV vs the dequantized rows' GEMV, bitwise",
                 cart_dtype_name(dtype));
        CHECK_MAXDIFF(what, bits, 0.0);
        snprintf(what, sizeof what, "%-6s GEMV err / ((K+2) 2^-24 sum|xw|) [max rel err %.2g]",
                 cart_dtype_name(dtype), ref.rel);
        CHECK_MAXDIFF(what, ref.worst, 1.0);
    }
    for (int p = 0; p < 3; p++) cart_pool_free(pools[p]);
}

/* Within each of the two forward regimes a token's outputs do not depend on
 * the other tokens of the call: up to 16 tokens (GEMV) every token gives the
 * bits it gives alone, and from 17 tokens on (GEMM, every ISA level) the first
 * 17 tokens of a longer call give the bits of a call with just those 17.
 * (Between the regimes results differ by f32 rounding: the summation orders
 * differ.) A fixed path (cart_matmul_forward_path) keeps each token's bits
 * whatever the count. */
static void test_forward_of_a_token_does_not_depend_on_its_batch(void) {
    const int32_t dtypes[] = {CART_F32, CART_F16, CART_BF16, CART_Q4_K};
    uint64_t seed = 11;
    for (int d = 0; d < 4; d++) {
        /* 71 rows: GEMV row groups with an odd last one; 1100 columns: three
         * depth blocks of the blocked GEMV and a tail */
        const int64_t rows = 71, cols = dtypes[d] == CART_Q4_K ? 1280 : 1100, n = 40;
        float *wf;
        void *data = random_weight(dtypes[d], rows, cols, &seed, &wf);
        cart_weight w;
        CHECK_OK(cart_weight_init(&w, dtypes[d], data, rows, cols));
        float *x = malloc(sizeof(float) * (size_t)(n * cols));
        float *y = malloc(sizeof(float) * (size_t)(n * rows));
        float *part = malloc(sizeof(float) * (size_t)(n * rows));
        for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed);
        CHECK_OK(cart_matmul_forward(y, rows, x, cols, &w, 16, NULL));
        int differ = 0;
        for (int64_t i = 0; i < 16; i++) {
            CHECK_OK(cart_matmul_forward(part, rows, x + i * cols, cols, &w, 1, NULL));
            differ |= memcmp(part, y + i * rows, sizeof(float) * (size_t)rows) != 0;
        }
        CHECK_OK(cart_matmul_forward(y, rows, x, cols, &w, n, NULL));
        CHECK_OK(cart_matmul_forward(part, rows, x, cols, &w, 17, NULL));
        differ |= memcmp(part, y, sizeof(float) * (size_t)(17 * rows)) != 0;
        /* a fixed path gives each token what that path gives it alone: GEMV
         * over all 40 tokens (three passes) as one token at a time, GEMM over
         * 3 tokens as the first 3 of the GEMM over 40 above */
        CHECK(cart_matmul_path_for(16) == CART_MM_GEMV && cart_matmul_path_for(17) == CART_MM_GEMM);
        CHECK_OK(cart_matmul_forward_path(part, rows, x, cols, &w, 3, CART_MM_GEMM, NULL));
        differ |= memcmp(part, y, sizeof(float) * (size_t)(3 * rows)) != 0;
        float *y2 = malloc(sizeof(float) * (size_t)(n * rows));
        CHECK_OK(cart_matmul_forward_path(y, rows, x, cols, &w, n, CART_MM_GEMV, NULL));
        for (int64_t i = 0; i < n; i++) {
            CHECK_OK(cart_matmul_forward(part, rows, x + i * cols, cols, &w, 1, NULL));
            differ |= memcmp(part, y + i * rows, sizeof(float) * (size_t)rows) != 0;
        }
        /* and _many on a fixed path is one call per weight, bit for bit */
        float *ys[2] = {part, y2};
        const int64_t lds[2] = {rows, rows};
        const cart_weight *ws[2] = {&w, &w};
        for (int32_t path = CART_MM_GEMV; path <= CART_MM_GEMM; path++) {
            CHECK_OK(cart_matmul_forward_many_path(2, ys, lds, x, cols, ws, n, path, NULL));
            CHECK_OK(cart_matmul_forward_path(y, rows, x, cols, &w, n, path, NULL));
            differ |= memcmp(part, y, sizeof(float) * (size_t)(n * rows)) != 0;
            differ |= memcmp(y2, y, sizeof(float) * (size_t)(n * rows)) != 0;
        }
        CHECK_ERR(cart_matmul_forward_path(y, rows, x, cols, &w, n, 3, NULL), CART_E_ARG);
        CHECK_MSG(!differ, "%s: a token's outputs depend on the rest of its batch",
                  cart_dtype_name(dtypes[d]));
        free(x), free(y), free(y2), free(part), free(wf), free(data);
    }
}

/* L(x) = sum dy * forward(x); dL/dx must be what backward adds to zeros. */
static void test_backward_matches_finite_differences_of_forward(void) {
    const int32_t dtypes[] = {CART_F32, CART_Q4_K};
    uint64_t seed = 5;
    for (int d = 0; d < 2; d++) {
        const int64_t n = 3, rows = 20, cols = 256;
        float *wf;
        void *data = random_weight(dtypes[d], rows, cols, &seed, &wf);
        cart_weight w;
        CHECK_OK(cart_weight_init(&w, dtypes[d], data, rows, cols));
        float *x = malloc(sizeof(float) * (size_t)(n * cols));
        float *dy = malloc(sizeof(float) * (size_t)(n * rows));
        float *y = malloc(sizeof(float) * (size_t)(n * rows));
        float *dx = calloc((size_t)(n * cols), sizeof(float));
        for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed);
        for (int64_t i = 0; i < n * rows; i++) dy[i] = lcg_uniform(&seed);
        CHECK_OK(cart_matmul_backward(dx, cols, dy, rows, &w, n, NULL));
        double worst = 0;
        const float h = 0.25f; /* L is linear in x: the central difference is exact but for
                                  f32 rounding, which a larger step makes relatively smaller */
        for (int probe = 0; probe < 12; probe++) {
            int64_t at = (int64_t)(lcg_bits(&seed) % (uint32_t)(n * cols));
            double l[2];
            for (int side = 0; side < 2; side++) {
                float keep = x[at];
                x[at] = keep + (side ? -h : h);
                /* the exact forward: the backward's own function (matmul.h) */
                CHECK_OK(cart_matmul_forward_exact(y, rows, x, cols, &w, n, NULL));
                x[at] = keep;
                l[side] = 0;
                for (int64_t i = 0; i < n * rows; i++) l[side] += (double)dy[i] * y[i];
            }
            double fd = (l[0] - l[1]) / (2.0 * h);
            double diff = fabs(fd - dx[at]);
            if (diff > worst) worst = diff;
        }
        char what[96];
        snprintf(what, sizeof what, "%s backward vs central differences",
                 cart_dtype_name(dtypes[d]));
        CHECK_MAXDIFF(what, worst, 1e-4); /* |y| ~ 10: f32 rounding of L ~ 1e-6, / 2h */
        free(x), free(dy), free(y), free(dx), free(wf), free(data);
    }
}

static void test_empty_shapes_write_nothing_or_zeros(void) {
    float w32[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y[8];
    cart_weight w;
    CHECK_OK(cart_weight_init(&w, CART_F32, w32, 2, 4));
    for (int i = 0; i < 8; i++) y[i] = 3.0f;
    CHECK_OK(cart_matmul_forward(y, 2, x, 4, &w, 0, NULL)); /* n = 0 */
    CHECK(y[0] == 3.0f);
    CHECK_OK(cart_matmul_backward(x, 4, y, 2, &w, 0, NULL));
    CHECK(x[0] == 1.0f);
    CHECK_OK(cart_weight_init(&w, CART_F32, w32, 2, 0)); /* cols = 0: empty sums are 0 */
    CHECK_OK(cart_matmul_forward(y, 2, x, 0, &w, 3, NULL));
    CHECK(y[0] == 0.0f && y[5] == 0.0f && y[6] == 3.0f);
    CHECK_OK(cart_weight_init(&w, CART_F32, NULL, 0, 4)); /* rows = 0 */
    CHECK_OK(cart_matmul_forward(y, 0, x, 4, &w, 2, NULL));
    CHECK_OK(cart_matmul_backward(x, 4, y, 0, &w, 2, NULL));
    CHECK(x[0] == 1.0f);
    CHECK_OK(cart_weight_init(&w, CART_F32, w32, 2, 4));
    CHECK_OK(cart_matmul_forward(y, 2, x, 4, &w, 1, NULL));
    CHECK(y[0] == 10.0f && y[1] == 26.0f);
}

static void test_bad_arguments_fail_with_a_message(void) {
    float buf[64] = {0};
    uint8_t q[144 * 2] = {0};
    cart_weight w;
    CHECK_ERR(cart_weight_init(&w, CART_Q4_K, q, 2, 100), CART_E_ARG); /* not whole blocks */
    CHECK_ERROR_MENTIONS("blocks");
    CHECK_ERR(cart_weight_init(&w, CART_Q8_0, q, 2, 48), CART_E_ARG);
    CHECK_ERR(cart_weight_init(&w, CART_F32, buf, -1, 4), CART_E_ARG);
    CHECK_ERR(cart_weight_init(&w, CART_F32, buf, 4, -4), CART_E_ARG);
    CHECK_ERR(cart_weight_init(&w, CART_IQ2_XXS, q, 1, 256), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("iq2_xxs");
    CHECK_ERR(cart_weight_init(&w, 77, q, 1, 32), CART_E_ARG); /* unknown id */
    CHECK_ERR(cart_weight_init(&w, CART_F32, NULL, 2, 2), CART_E_ARG);
    CHECK_ERR(cart_weight_init(NULL, CART_F32, buf, 2, 2), CART_E_ARG);

    CHECK_OK(cart_weight_init(&w, CART_F32, buf, 4, 8)); /* 4 x 8 */
    float x[32] = {0}, y[32] = {0};
    CHECK_ERR(cart_matmul_forward(y, 4, x, 8, &w, -1, NULL), CART_E_ARG);
    CHECK_ERR(cart_matmul_forward(y, 4, x, 7, &w, 2, NULL), CART_E_ARG); /* ldx < cols */
    CHECK_ERROR_MENTIONS("pitch");
    CHECK_ERR(cart_matmul_forward(y, 3, x, 8, &w, 2, NULL), CART_E_ARG); /* ldy < rows */
    CHECK_ERR(cart_matmul_forward(NULL, 4, x, 8, &w, 2, NULL), CART_E_ARG);
    CHECK_ERR(cart_matmul_forward(y, 4, x, 8, NULL, 2, NULL), CART_E_ARG);
    CHECK_ERR(cart_matmul_forward(x + 4, 4, x, 8, &w, 2, NULL), CART_E_ARG); /* overlap */
    CHECK_ERROR_MENTIONS("overlaps");
    CHECK_ERR(cart_matmul_backward(x, 7, y, 4, &w, 2, NULL), CART_E_ARG); /* ldx < cols */
    CHECK_ERR(cart_matmul_backward(x, 8, y, 3, &w, 2, NULL), CART_E_ARG); /* ldy < rows */
    CHECK_ERR(cart_matmul_backward(x, 8, x, 4, &w, 2, NULL), CART_E_ARG); /* overlap */
    CHECK_ERR(cart_matmul_backward(x, 8, y, 4, &w, -3, NULL), CART_E_ARG);

    cart_weight bad = w;
    bad.row_bytes = 8; /* two floats for a row of 8 */
    CHECK_ERR(cart_matmul_forward(y, 4, x, 8, &bad, 1, NULL), CART_E_ARG);
    bad = w;
    bad.dtype = CART_IQ1_S;
    bad.cols = 256;
    CHECK_ERR(cart_matmul_forward(y, 4, x, 256, &bad, 0, NULL), CART_E_UNSUPPORTED);
    bad = w;
    bad.reserved = 1;
    CHECK_ERR(cart_matmul_backward(x, 8, y, 4, &bad, 1, NULL), CART_E_ARG);
    bad = w;
    bad.cols = 9;
    bad.dtype = CART_Q8_0;
    CHECK_ERR(cart_weight_widen(&w, &bad, NULL), CART_E_ARG);
    CHECK_ERR(cart_weight_widen(NULL, &w, NULL), CART_E_ARG);
}

/* A weight whose rows are further apart than their bytes (row_bytes as a
 * pitch) multiplies like the packed one. */
static void test_row_pitch_larger_than_a_row_is_respected(void) {
    const int64_t rows = 30, cols = 64, n = 20;
    uint64_t seed = 3;
    float *wf;
    void *data = random_weight(CART_F16, rows, cols, &seed, &wf);
    const uint64_t rb = row_bytes_of(CART_F16, cols), pitch = rb + 40;
    uint8_t *spread = malloc(pitch * rows);
    for (int64_t r = 0; r < rows; r++) memcpy(spread + r * pitch, (uint8_t *)data + r * rb, rb);
    cart_weight w, ws;
    CHECK_OK(cart_weight_init(&w, CART_F16, data, rows, cols));
    ws = w;
    ws.data = spread;
    ws.row_bytes = pitch;
    float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows),
          *ys = malloc(sizeof(float) * n * rows);
    for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed);
    for (int64_t nn = 1; nn <= n; nn += 19) {
        CHECK_OK(cart_matmul_forward(y, rows, x, cols, &w, nn, NULL));
        CHECK_OK(cart_matmul_forward(ys, rows, x, cols, &ws, nn, NULL));
        CHECK(memcmp(y, ys, sizeof(float) * nn * rows) == 0);
    }
    free(x), free(y), free(ys), free(spread), free(wf), free(data);
}


static void test_forward_many_equals_one_call_per_weight(void) {
    int32_t dtypes[] = {CART_F32, CART_F16, CART_BF16, CART_Q8_0};
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
        const int64_t cols = 256, rows[3] = {96, 40, 40};
        cart_weight ws[3];
        void *data[3];
        uint64_t seed = 99;
        for (int k = 0; k < 3; k++) {
            float *f = malloc(sizeof(float) * (size_t)(rows[k] * cols));
            for (int64_t i = 0; i < rows[k] * cols; i++) {
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                f[i] = (float)((double)(seed >> 40) / (double)(1ULL << 24)) - 0.5f;
            }
            uint64_t nb = 0;
            cart_dtype_nbytes(&nb, dtypes[di], rows[k] * cols);
            data[k] = malloc(nb);
            cart_from_f32(data[k], dtypes[di], f, rows[k] * cols);
            free(f);
            CHECK_OK(cart_weight_init(&ws[k], dtypes[di], data[k], rows[k], cols));
        }
        for (int64_t n = 1; n <= 20; n += 19) {
            float x[20 * 256], one[3][20 * 96], many[3][20 * 96];
            for (int i = 0; i < 20 * 256; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            float *ys[3] = {many[0], many[1], many[2]};
            int64_t lds[3] = {96, 40, 40};
            const cart_weight *wp[3] = {&ws[0], &ws[1], &ws[2]};
            for (int k = 0; k < 3; k++) CHECK_OK(cart_matmul_forward(one[k], lds[k], x, cols, &ws[k], n, NULL));
            CHECK_OK(cart_matmul_forward_many(3, ys, lds, x, cols, wp, n, NULL));
            int same = 1;
            for (int k = 0; k < 3; k++) same &= memcmp(one[k], many[k], sizeof(float) * (size_t)(n * lds[k])) == 0;
            CHECK_MSG(same, "forward_many differs from separate calls (dtype %d, n %lld)", dtypes[di], (long long)n);
        }
        for (int k = 0; k < 3; k++) free(data[k]);
    }
}

int main(void) {
    RUN(test_forward_many_equals_one_call_per_weight);
    RUN(test_every_dtype_matches_a_double_reference_on_every_thread_count);
    RUN(test_activations_are_rounded_to_the_weight_type_first);
    RUN(test_widened_weights_multiply_bit_for_bit_like_the_originals);
    RUN(test_gemv_of_block_types_gives_the_dequantized_rows_bits);
    RUN(test_forward_of_a_token_does_not_depend_on_its_batch);
    RUN(test_backward_matches_finite_differences_of_forward);
    RUN(test_empty_shapes_write_nothing_or_zeros);
    RUN(test_bad_arguments_fail_with_a_message);
    RUN(test_row_pitch_larger_than_a_row_is_respected);
    return check_finish("matmul");
}
