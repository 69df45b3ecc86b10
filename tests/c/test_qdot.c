/*
 * test_qdot.c - the integer block products (matmul.h, kernels/qdot.h)
 * against this file's own reading of the contract.
 *
 * The reference below quantizes each activation row by the contract's rules
 * (written here with nearbyintf, which rounds ties to even in the default
 * rounding mode) and reads every weight field from the GGUF bytes by its
 * own reading of GGML's layouts, then takes the integer sums and applies the
 * scales in the contract's order. cart_matmul_forward must give exactly its
 * bits for every covered type, token count (1 to 300: several passes and
 * tiles), row count (partial groups of 16), thread count and layout (GGUF
 * rows and cart_weight_repack's copy); ctest runs this once per ISA level,
 * so every level is held to the same bits. A float64 bound against the
 * dequantized weights times the unquantized activations checks that the
 * contract is the product it claims to be.
 */
#include <fenv.h>
#include <stdint.h>

#include "check.h"
#include "random_weights.h"
#include "dtype.h"
#include "kernels/qdot.h"
#include "matmul.h"
#include "pool.h"

static const int32_t qtypes[] = {CART_Q4_0, CART_Q4_1, CART_Q5_0, CART_Q5_1, CART_Q8_0, CART_IQ4_NL,
                                 CART_Q2_K, CART_Q3_K, CART_Q4_K, CART_Q5_K, CART_Q6_K, CART_IQ4_XS};
enum { NQ = sizeof qtypes / sizeof qtypes[0] };

static const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- the reference: activations ------------------------------------------- */

typedef struct ref_act {
    int8_t *q;
    float *d;     /* per 32 or per 256 */
    int32_t *s;   /* per 32 (q8_0 / q8_1) or per 16 (q8_K) */
    float *sf;    /* per 32, q8_1 */
} ref_act;

static int big(int32_t dtype) {
    return block_size_of(dtype) == 256;
}

static int with_m(int32_t dtype) {
    return dtype == CART_Q4_1 || dtype == CART_Q5_1;
}

static int rne_int(float v) {
    return isnan(v) ? 0 : (int)nearbyintf(v);
}

static void ref_quantize(ref_act *a, int32_t dtype, const float *x, int64_t cols) {
    if (!big(dtype)) {
        for (int64_t b = 0; b < cols / 32; b++) {
            float amax = 0.0f;
            for (int k = 0; k < 32; k++) {
                float v = fabsf(x[32 * b + k]);
                if (isnan(v) || v > amax) amax = isnan(amax) ? amax : v;
            }
            const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int k = 0; k < 32; k++) sum += a->q[32 * b + k] = (int8_t)rne_int(x[32 * b + k] * id);
            a->d[b] = cart_f16_to_f32(cart_f32_to_f16(d));
            a->s[b] = sum;
            a->sf[b] = cart_f16_to_f32(cart_f32_to_f16((float)sum * d));
        }
        return;
    }
    for (int64_t b = 0; b < cols / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = 0.0f, max = 0.0f;
        for (int k = 0; k < 256; k++)
            if (fabsf(xb[k]) > amax || (isnan(xb[k]) && !isnan(amax))) amax = fabsf(xb[k]), max = xb[k];
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        for (int k = 0; k < 256; k++) {
            int v = amax != 0.0f ? rne_int(iscale * xb[k]) : 0;
            a->q[256 * b + k] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < 16; j++) {
            int32_t sum = 0;
            for (int k = 0; k < 16; k++) sum += a->q[256 * b + 16 * j + k];
            a->s[16 * b + j] = sum;
        }
        a->d[b] = amax != 0.0f ? 1.0f / iscale : 0.0f;
    }
}

/* ---- the reference: weight fields, read from the GGUF bytes --------------- */

static uint16_t u16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static float h2f(const uint8_t *p) {
    return cart_f16_to_f32(u16(p));
}

/* The signed value element e of a block stands for, times one (no scale):
 * for the types with mins, the unsigned field. */
static int value(int32_t dtype, const uint8_t *b, int e) {
    switch (dtype) {
    case CART_Q8_0:
        return (int8_t)b[2 + e];
    case CART_Q4_0: case CART_Q4_1: case CART_IQ4_NL: {
        const uint8_t *qs = b + (dtype == CART_Q4_1 ? 4 : 2);
        const int n = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
        return dtype == CART_IQ4_NL ? levels[n] : dtype == CART_Q4_0 ? n - 8 : n;
    }
    case CART_Q5_0: case CART_Q5_1: {
        const int o = dtype == CART_Q5_1 ? 2 : 0;
        const uint32_t qh = (uint32_t)u16(b + 2 + o) | (uint32_t)u16(b + 4 + o) << 16;
        const uint8_t *qs = b + 6 + o;
        const int n = (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | (int)((qh >> e) & 1) << 4;
        return dtype == CART_Q5_0 ? n - 16 : n;
    }
    case CART_Q4_K: case CART_Q5_K: {
        const int c = e / 64, h = (e / 32) % 2, m = e % 32;
        const uint8_t *qs = b + (dtype == CART_Q4_K ? 16 : 48);
        int n = (qs[32 * c + m] >> (4 * h)) & 15;
        if (dtype == CART_Q5_K) n |= ((b[16 + m] >> (2 * c + h)) & 1) << 4;
        return n;
    }
    case CART_Q6_K: {
        const int h = e / 128, g = (e / 32) % 4, l = e % 32;
        const int lo = (b[64 * h + 32 * (g & 1) + l] >> (g < 2 ? 0 : 4)) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
        return (lo | hi << 4) - 32;
    }
    case CART_Q3_K: {
        const int h = e / 128, j = (e / 32) % 4, m = e % 32;
        const int lo = (b[32 + 32 * h + m] >> (2 * j)) & 3;
        return lo - (((b[m] >> (4 * h + j)) & 1) ? 0 : 4);
    }
    case CART_Q2_K: {
        const int h = e / 128, j = (e / 32) % 4, m = e % 32;
        return (b[16 + 32 * h + m] >> (2 * j)) & 3;
    }
    default: { /* iq4_xs */
        const uint8_t *qs = b + 8 + 16 * (e / 32);
        const int l = e % 32;
        return levels[l < 16 ? qs[l] & 15 : qs[l - 16] >> 4];
    }
    }
}

/* The integer scale of sub-block j and, for q4_K q5_K q2_K, its min. */
static int sub_scale(int32_t dtype, const uint8_t *b, int j, int *min) {
    *min = 0;
    switch (dtype) {
    case CART_Q4_K: case CART_Q5_K: {
        const uint8_t *s = b + 4;
        if (j < 4) {
            *min = s[j + 4] & 63;
            return s[j] & 63;
        }
        *min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        return (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    }
    case CART_Q6_K:
        return (int8_t)b[192 + j];
    case CART_Q3_K: {
        const uint8_t *s = b + 96;
        const int low = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
        return (low | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
    }
    case CART_Q2_K:
        *min = b[j] >> 4;
        return b[j] & 15;
    default: { /* iq4_xs */
        const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((u16(b + 2) >> (2 * j)) & 3) << 4;
        return ls - 32;
    }
    }
}

/* One output: row `row` of `dtype` (nb blocks) against one quantized row. */
static float ref_output(int32_t dtype, const uint8_t *row, const ref_act *a, int64_t cols) {
    cart_dtype_info info;
    cart_dtype_get_info(&info, dtype);
    float acc = 0.0f;
    if (!big(dtype)) {
        for (int64_t bi = 0; bi < cols / 32; bi++) {
            const uint8_t *b = row + bi * info.type_size;
            int32_t isum = 0;
            for (int e = 0; e < 32; e++) isum += value(dtype, b, e) * a->q[32 * bi + e];
            const float p = (float)isum * (h2f(b) * a->d[bi]);
            acc = with_m(dtype) ? acc + (p + h2f(b + 2) * a->sf[bi]) : acc + p;
        }
        return acc;
    }
    const int sub = dtype == CART_Q6_K || dtype == CART_Q3_K || dtype == CART_Q2_K ? 16 : 32;
    for (int64_t bi = 0; bi < cols / 256; bi++) {
        const uint8_t *b = row + bi * info.type_size;
        int32_t A = 0, B = 0;
        for (int j = 0; j < 256 / sub; j++) {
            int mn;
            const int sc = sub_scale(dtype, b, j, &mn);
            int32_t dot = 0, xs = 0;
            for (int e = sub * j; e < sub * (j + 1); e++) {
                dot += value(dtype, b, e) * a->q[256 * bi + e];
                xs += a->q[256 * bi + e];
            }
            A += sc * dot;
            B += mn * xs;
        }
        const float dw = dtype == CART_Q6_K ? h2f(b + 208) : dtype == CART_Q3_K ? h2f(b + 108)
                         : dtype == CART_Q2_K ? h2f(b + 80) : h2f(b);
        const float dmin = dtype == CART_Q2_K ? h2f(b + 82) : h2f(b + 2);
        acc = acc + (float)A * (dw * a->d[bi]);
        if (dtype == CART_Q4_K || dtype == CART_Q5_K || dtype == CART_Q2_K) acc = acc - (float)B * (dmin * a->d[bi]);
    }
    return acc;
}

static void ref_product(float *y, int64_t ldy, const float *x, int64_t ldx, int32_t dtype, const uint8_t *data,
                        int64_t rows, int64_t cols, int64_t n) {
    ref_act a = {malloc((size_t)cols), malloc(sizeof(float) * (size_t)(cols / 32 + 1)),
                 malloc(sizeof(int32_t) * (size_t)(cols / 16 + 1)), malloc(sizeof(float) * (size_t)(cols / 32 + 1))};
    const uint64_t rb = row_bytes_of(dtype, cols);
    for (int64_t i = 0; i < n; i++) {
        ref_quantize(&a, dtype, x + i * ldx, cols);
        for (int64_t r = 0; r < rows; r++) y[i * ldy + r] = ref_output(dtype, data + (uint64_t)r * rb, &a, cols);
    }
    free(a.q), free(a.d), free(a.s), free(a.sf);
}

/* ---- the checks ------------------------------------------------------------- */

static int same_bits(const float *a, const float *b, int64_t n, int64_t rows, int64_t ld) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i * ld, b + i * ld, sizeof(float) * (size_t)rows) != 0) return 0;
    return 1;
}

/* Sets every f16 scale of a random-bytes weight to random finite bits. */
static void wild_scales(uint8_t *data, int32_t dtype, int64_t rows, int64_t cols, uint64_t *seed) {
    const scale_fields *sf = scales_of(dtype);
    const uint64_t blocks = row_bytes_of(dtype, cols) * (uint64_t)rows / (uint64_t)sf->block_bytes;
    for (uint64_t b = 0; b < blocks; b++)
        for (int f = 0; f < 2; f++) {
            if (sf->at[f] < 0) continue;
            uint16_t h = (uint16_t)lcg_bits(seed);
            if ((h & 0x7c00) == 0x7c00) h &= 0xbfff;
            memcpy(data + b * (uint64_t)sf->block_bytes + sf->at[f], &h, 2);
        }
}

static void test_every_block_type_gives_the_contracts_bits(void) {
    const int64_t rowset[] = {1, 16, 17, 37}, ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64};
    cart_pool *pools[3] = {NULL, NULL, NULL};
    for (int p = 0; p < 3; p++) CHECK_OK(cart_pool_new(&pools[p], p + 1));
    uint64_t seed = 2026;
    for (int d = 0; d < NQ; d++) {
        const int32_t dtype = qtypes[d];
        const int64_t bs = block_size_of(dtype), colset[] = {bs, 3 * bs};
        int64_t outputs = 0, wrong = 0;
        for (int ri = 0; ri < 4; ri++)
            for (int ci = 0; ci < 2; ci++)
                for (int kind = 0; kind < 3; kind++) { /* quantized, random bytes, wild f16 scales */
                    const int64_t rows = rowset[ri], cols = colset[ci], nmax = 64, ldx = cols + 5, ldy = rows + 3;
                    float *wf;
                    uint8_t *data = random_weight_raw(dtype, rows, cols, &seed, &wf, kind > 0);
                    if (kind == 2) wild_scales(data, dtype, rows, cols, &seed);
                    cart_weight w, wp;
                    CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
                    wp = w;
                    uint64_t packed = 0;
                    CHECK_OK(cart_weight_repack(&wp, &packed, NULL));
                    CHECK(wp.packed != NULL && packed == qk_group_bytes(dtype, cols) * (uint64_t)((rows + 15) / 16));
                    float *x = malloc(sizeof(float) * (size_t)(nmax * ldx));
                    for (int64_t i = 0; i < nmax * ldx; i++) x[i] = lcg_uniform(&seed) * (i % 7 == 0 ? 4.0f : 1.0f);
                    float *want = malloc(sizeof(float) * (size_t)(nmax * ldy));
                    float *got = malloc(sizeof(float) * (size_t)(nmax * ldy));
                    ref_product(want, ldy, x, ldx, dtype, data, rows, cols, nmax);
                    for (int k = 0; k < (int)(sizeof ns / sizeof ns[0]); k++)
                        for (int p = 0; p < 3; p++)
                            for (int layout = 0; layout < 2; layout++) {
                                if ((k + p + layout) % 2 && ns[k] > 8) continue; /* enough combinations */
                                const int64_t n = ns[k];
                                for (int64_t i = 0; i < n * ldy; i++) got[i] = -7.0f;
                                CHECK_OK(cart_matmul_forward(got, ldy, x, ldx, layout ? &wp : &w, n, pools[p]));
                                outputs += n * rows;
                                if (!same_bits(got, want, n, rows, ldy)) wrong++;
                                for (int64_t i = 0; i < n; i++)
                                    for (int64_t r = rows; r < ldy; r++)
                                        if (got[i * ldy + r] != -7.0f) wrong++; /* wrote past the rows */
                            }
                    cart_weight_free_packed(&wp);
                    CHECK(wp.packed == NULL);
                    free(x), free(want), free(got), free(wf), free(data);
                }
        printf("  %-6s %lld outputs over 1-64 tokens, 1-3 threads, GGUF rows and repacked: %lld calls differ\n",
               cart_dtype_name(dtype), (long long)outputs, (long long)wrong);
        CHECK_MSG(wrong == 0, "%s: %lld calls differ from the contract's bits", cart_dtype_name(dtype),
                  (long long)wrong);
    }
    for (int p = 0; p < 3; p++) cart_pool_free(pools[p]);
}

/* Many tokens (passes of 256), many rows, a _many call sharing the
 * quantized activations: the same bits. */
static void test_long_batches_and_shared_inputs_give_the_same_bits(void) {
    uint64_t seed = 3;
    const int64_t n = 300, cols = 512, rows = 40;
    const int32_t pairs[][2] = {{CART_Q4_K, CART_Q6_K}, {CART_Q8_0, CART_Q4_0}, {CART_Q4_1, CART_Q5_1}};
    float *x = malloc(sizeof(float) * (size_t)(n * cols));
    for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed);
    float *want = malloc(sizeof(float) * (size_t)(n * rows)), *got[2];
    for (int k = 0; k < 2; k++) got[k] = malloc(sizeof(float) * (size_t)(n * rows));
    for (int p = 0; p < 3; p++) {
        uint8_t *data[2];
        cart_weight w[2];
        float *wf[2];
        for (int k = 0; k < 2; k++) {
            data[k] = random_weight(pairs[p][k], rows, cols, &seed, &wf[k]);
            CHECK_OK(cart_weight_init(&w[k], pairs[p][k], data[k], rows, cols));
            if (k) CHECK_OK(cart_weight_repack(&w[k], NULL, NULL));
        }
        const cart_weight *ws[2] = {&w[0], &w[1]};
        const int64_t lds[2] = {rows, rows};
        CHECK_OK(cart_matmul_forward_many(2, got, lds, x, cols, ws, n, NULL));
        for (int k = 0; k < 2; k++) {
            ref_product(want, rows, x, cols, pairs[p][k], data[k], rows, cols, n);
            CHECK_MSG(same_bits(got[k], want, n, rows, rows), "%s beside %s, %lld tokens: not the contract's bits",
                      cart_dtype_name(pairs[p][k]), cart_dtype_name(pairs[p][1 - k]), (long long)n);
            cart_weight_free_packed(&w[k]);
            free(data[k]), free(wf[k]);
        }
    }
    free(x), free(want), free(got[0]), free(got[1]);
}

/* The product is the dequantized weights times the activations up to the
 * activations' rounding: |y - sum w x| <= sum |w| e + (K + 2) 2^-22 sum |w x q|,
 * e the rounding bound of each activation (0.57 d of its block for q8_0 /
 * q8_1: half a step and the f16 rounding of d; 0.51 d for q8_K). */
static void test_the_contract_is_the_product_up_to_the_activations_rounding(void) {
    uint64_t seed = 17;
    const int64_t rows = 33, n = 5;
    for (int d = 0; d < NQ; d++) {
        const int32_t dtype = qtypes[d];
        const int64_t cols = 4 * block_size_of(dtype);
        float *wf;
        uint8_t *data = random_weight(dtype, rows, cols, &seed, &wf);
        cart_weight w;
        CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
        float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * rows));
        for (int64_t i = 0; i < n * cols; i++) x[i] = lcg_uniform(&seed);
        CHECK_OK(cart_matmul_forward(y, rows, x, cols, &w, n, NULL));
        double worst = 0;
        const int64_t blk = big(dtype) ? 256 : 32;
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < rows; r++) {
                double acc = 0, err = 0, mag = 0;
                for (int64_t b = 0; b < cols / blk; b++) {
                    double amax = 0;
                    for (int64_t k = 0; k < blk; k++) amax = fmax(amax, fabs(x[i * cols + b * blk + k]));
                    const double e = amax / 127.0 * (big(dtype) ? 0.51 : 0.57);
                    for (int64_t k = b * blk; k < (b + 1) * blk; k++) {
                        const double t = (double)wf[r * cols + k] * x[i * cols + k];
                        acc += t;
                        err += fabs(wf[r * cols + k]) * e;
                        mag += fabs(t) + fabs(wf[r * cols + k]) * e;
                    }
                }
                const double bound = err + (double)(cols + 2) * 0x1p-22 * mag + 1e-30;
                worst = fmax(worst, fabs(y[i * rows + r] - acc) / bound);
            }
        char what[96];
        snprintf(what, sizeof what, "%-6s |y - w.x| / (activation rounding + f32 bound)", cart_dtype_name(dtype));
        CHECK_MAXDIFF(what, worst, 1.0);
        free(x), free(y), free(wf), free(data);
    }
}

/* The activation quantizer: the reference's bytes, and for q8_K GGML's own
 * reference quantizer's (cart_from_f32 follows it bit for bit), on values
 * with ties, zeros, a block of zeros, negatives as the largest, and
 * non-finite values (a NaN block quantizes to zeros with a NaN scale). */
static void check_activation_kinds(const float *x, int nonfinite);

static void test_activations_are_quantized_by_the_contracts_rules(void) {
    enum { COLS = 1024 };
    uint64_t seed = 8;
    float x[COLS];
    for (int i = 0; i < COLS; i++) x[i] = lcg_uniform(&seed) * 2.0f;
    for (int i = 0; i < 32; i++) x[64 + i] = 0.0f;              /* a zero block */
    for (int i = 0; i < 32; i++) x[128 + i] = (float)(i - 16) * 0.5f; /* ties: 127 / 8 steps */
    x[200] = -3.0f;                                               /* the largest is negative */
    x[300] = NAN;                                                 /* a NaN block */
    x[700] = INFINITY;
    for (int pass = 0; pass < 2; pass++) {
        /* the second pass without the non-finite values: a level may take
         * another road for finite rows (avx512's vector quantizer) */
        if (pass == 1) x[300] = 0.75f, x[700] = -1.25f;
        check_activation_kinds(x, pass == 0);
    }
}

/* q8_0, q8_1 and q8_K activations of x against the reference. */
static void check_activation_kinds(const float *x, int nonfinite) {
    enum { COLS = 1024 };
    for (int kind = 0; kind < 3; kind++) {
        const int32_t dtype = kind == 0 ? CART_Q8_0 : kind == 1 ? CART_Q4_1 : CART_Q4_K;
        const int32_t ak = qk_act_kind_of(dtype);
        void *buf = malloc(qk_act_bytes(ak, 1, COLS));
        qk_act a;
        qk_act_init(&a, buf, ak, 1, COLS);
        qk_quantize(&a, x, COLS, 0, 1);
        ref_act r = {malloc(COLS), malloc(sizeof(float) * 32), malloc(sizeof(int32_t) * 64), malloc(sizeof(float) * 32)};
        ref_quantize(&r, dtype, x, COLS);
        const int nd = big(dtype) ? COLS / 256 : COLS / 32, ns = big(dtype) ? COLS / 16 : COLS / 32;
        int bad = memcmp(a.q, r.q, COLS) != 0;
        for (int b = 0; b < nd; b++) bad |= memcmp(&a.d[b], &r.d[b], 4) != 0 && !(isnan(a.d[b]) && isnan(r.d[b]));
        for (int b = 0; b < ns; b++) bad |= a.s[b] != r.s[b];
        if (ak == QK_ACT_Q8_K) /* the sums of 32 the AMX level reads */
            for (int u = 0; u < COLS / 32; u++) bad |= a.u[u] != r.s[2 * u] + r.s[2 * u + 1];
        if (ak == QK_ACT_Q8_1)
            for (int b = 0; b < nd; b++) bad |= memcmp(&a.sf[b], &r.sf[b], 4) != 0 && !(isnan(a.sf[b]) && isnan(r.sf[b]));
        CHECK_MSG(!bad, "%s activations differ from the reference", kind == 0 ? "q8_0" : kind == 1 ? "q8_1" : "q8_K");
        if (ak == QK_ACT_Q8_0 && nonfinite) CHECK(isnan(a.d[300 / 32]) && a.q[300] == 0 && a.d[2] == 0.0f);
        if (ak == QK_ACT_Q8_K) {
            /* GGML's reference q8_K of the finite part: the same q, d and sums */
            uint8_t ggml[292];
            CHECK_OK(cart_from_f32(ggml, CART_Q8_K, x + 768, 256));
            float gd;
            memcpy(&gd, ggml, 4);
            int same = memcmp(ggml + 4, a.q + 768, 256) == 0 && memcmp(&gd, &a.d[3], 4) == 0;
            for (int j = 0; j < 16; j++) same &= (int16_t)u16(ggml + 260 + 2 * j) == a.s[48 + j];
            CHECK_MSG(same, "q8_K differs from GGML's reference quantizer");
        }
        free(buf), free(r.q), free(r.d), free(r.s), free(r.sf);
    }
}

static void test_repack_refuses_what_init_refuses_and_skips_other_types(void) {
    uint8_t data[2 * 144] = {0};
    cart_weight w;
    CHECK_OK(cart_weight_init(&w, CART_Q4_K, data, 2, 256));
    w.row_bytes = 100; /* shorter than a row: a truncated view */
    CHECK_ERR(cart_weight_repack(&w, NULL, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("row_bytes 100");
    CHECK(w.packed == NULL);
    w.row_bytes = 144;
    w.dtype = 77;
    CHECK_ERR(cart_weight_repack(&w, NULL, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("unknown dtype");
    CHECK_ERR(cart_weight_init(&w, CART_Q4_K, data, 2, 100), CART_E_ARG);
    CHECK_ERROR_MENTIONS("not a whole number of q4_K blocks");
    float f[8] = {0};
    uint64_t bytes = 1;
    CHECK_OK(cart_weight_init(&w, CART_F32, f, 2, 4));
    CHECK_OK(cart_weight_repack(&w, &bytes, NULL));
    CHECK(w.packed == NULL && bytes == 0);
    CHECK_OK(cart_weight_init(&w, CART_Q8_K, data, 1, 256));
    CHECK_OK(cart_weight_repack(&w, &bytes, NULL));
    CHECK(w.packed == NULL && bytes == 0);
}

/* The largest sums a product can reach: every quant byte 0xff (every field
 * at its maximum, every sub-block scale and min at 63), activations all +1
 * or all -1 (so every q is +127 or -127), 16 rows, 1-16 tokens and 32, 48, 64
 * (the amx level's tiles, its folded scales from 32 on). The
 * 16-bit partial sums of the byte-product levels must not overflow here
 * (qgeneric.h's QK_RUN): the bits are still the contract's. */
static void test_the_largest_sums_give_the_contracts_bits(void) {
    for (int d = 0; d < NQ; d++) {
        const int32_t dtype = qtypes[d];
        const scale_fields *sf = scales_of(dtype);
        const int64_t rows = 16, cols = 2 * block_size_of(dtype), ldy = rows, n = 64;
        const uint64_t rb = row_bytes_of(dtype, cols);
        uint8_t *data = malloc(rb * (uint64_t)rows);
        memset(data, 0xff, rb * (uint64_t)rows);
        const uint16_t one = cart_f32_to_f16(1.0f / 1024);
        for (uint64_t b = 0; b < rb * (uint64_t)rows / (uint64_t)sf->block_bytes; b++)
            for (int f = 0; f < 2; f++)
                if (sf->at[f] >= 0) memcpy(data + b * (uint64_t)sf->block_bytes + sf->at[f], &one, 2);
        cart_weight w, wp;
        CHECK_OK(cart_weight_init(&w, dtype, data, rows, cols));
        wp = w;
        CHECK_OK(cart_weight_repack(&wp, NULL, NULL));
        float *x = malloc(sizeof(float) * (size_t)(n * cols));
        float *want = malloc(sizeof(float) * (size_t)(n * ldy)), *got = malloc(sizeof(float) * (size_t)(n * ldy));
        int64_t wrong = 0;
        for (int sign = -1; sign <= 1; sign += 2) {
            for (int64_t i = 0; i < n * cols; i++) x[i] = (float)sign;
            ref_product(want, ldy, x, cols, dtype, data, rows, cols, n);
            for (int64_t k = 1; k <= n; k += k < 16 ? 1 : 16) /* 1-16 tokens, then whole tiles to 64 */
                for (int layout = 0; layout < 2; layout++) {
                    CHECK_OK(cart_matmul_forward(got, ldy, x, cols, layout ? &wp : &w, k, NULL));
                    if (!same_bits(got, want, k, rows, ldy)) wrong++;
                }
        }
        printf("  %-6s all fields at their maximum, activations +-127: %lld calls differ (want 0)\n",
               cart_dtype_name(dtype), (long long)wrong);
        CHECK_MSG(wrong == 0, "%s: %lld calls differ at the largest sums", cart_dtype_name(dtype), (long long)wrong);
        cart_weight_free_packed(&wp);
        free(x), free(want), free(got), free(data);
    }
}

int main(void) {
    CHECK(fegetround() == FE_TONEAREST);
    RUN(test_activations_are_quantized_by_the_contracts_rules);
    RUN(test_every_block_type_gives_the_contracts_bits);
    RUN(test_long_batches_and_shared_inputs_give_the_same_bits);
    RUN(test_the_largest_sums_give_the_contracts_bits);
    RUN(test_the_contract_is_the_product_up_to_the_activations_rounding);
    RUN(test_repack_refuses_what_init_refuses_and_skips_other_types);
    return check_finish("qdot");
}
