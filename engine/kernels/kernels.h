/*
 * kernels.h - the table of per-ISA kernels; not part of the API.
 *
 * Each instruction-set level is one file in this folder that fills one
 * cart_kernels table: scalar.c (plain C, the definition), avx2.c, avx512.c,
 * neon.c. scalar.c, avx2.c and neon.c write their vector primitives (a dozen
 * one-line functions) and include generic.h, which builds every kernel from
 * them; avx512.c is written out by hand. cpu.c picks the table once
 * (cpu.h); matmul.c, ops.c and dtype.c call through cart_kern(). Adding a
 * level is adding a file and a line in cpu.c.
 *
 * The arithmetic is part of the contract, so that every level gives the same
 * bits (cpu.h):
 *   GEMM (forward_rows, backward_cols): each output element is one chain of
 *     fused multiply-adds over the reduction index in increasing order,
 *     starting from 0 (forward, first depth block) or from the value in the
 *     output (backward, later depth blocks): c = fma(a[k], b[k], c).
 *   GEMV (gemv_rows): 16 lane sums per output, lane l a chain of fused
 *     multiply-adds over k = l, l + 16, ... (a missing tail element counts as
 *     fma(0, 0, s)), then the tree s[l] += s[l + 8], then + 4, + 2, + 1.
 *   scores: 16 lane sums over d in the same way (head_dim a multiple of 16),
 *     then the tree ((s0+s2)+(s1+s3)) per group of four, groups added as
 *     (G0+G1)+(G2+G3).
 *   values: acc[d] = fma(p[i], v[i][d], acc[d]) for i in order.
 *   Activations are rounded to f16 / bf16 to nearest even (NaN stays a quiet
 *   NaN); f16 / bf16 weights are widened exactly; block types are dequantized
 *   to exactly cart_to_f32's values.
 */
#ifndef CART_KERNELS_H
#define CART_KERNELS_H

#include <stdint.h>

#include "qdot.h"

#pragma GCC visibility push(hidden)

enum {
    MM_KC = 256,          /* reduction depth of one packed weight panel; a multiple of
                             every block size, so a panel never splits a quantization block */
    MM_FWD_ROWS = 64,     /* weight rows per forward task; a multiple of every level's mv */
    MM_BWD_COLS = 256,    /* weight columns per backward task for plain dtypes: a row's
                             piece is 512 bytes of f16, not the 128 of 64 columns, which
                             the packing waited on one row (a page) apart */
    MM_BWD_BLOCK = 32768, /* floats of weight one backward task packs at a time (128 KiB,
                             in L2): 128 rows of 256 columns */
    MM_DEPTH = 4096,      /* reduction elements per packed activation block; longer
                             reductions run in several blocks */
    MM_GEMV_KB = 1024,    /* elements per dequantized chunk of a weight row in the GEMV */
    MM_GEMV_MAXR = 8,     /* most weight rows one GEMV pass reads at once */
    MM_MAX_U = 16,        /* the largest micro-tile token count of any level */
};

/* How the activations are rounded before the product (matmul.h's contract). */
typedef enum mm_round { MM_ROUND_NONE = 0, MM_ROUND_F16 = 1, MM_ROUND_BF16 = 2 } mm_round;

/* How the kernels read weight elements: straight from the matrix for the
 * three float types; everything else is dequantized first. */
typedef enum mm_wkind { MM_W_F32 = 0, MM_W_F16 = 1, MM_W_BF16 = 2, MM_W_DEQUANT = 3 } mm_wkind;

/* A validated weight as the kernels see it. */
typedef struct mm_src {
    const uint8_t *data; /* rows * row_bytes bytes */
    uint64_t row_bytes;
    int32_t dtype;
    int32_t kind;       /* mm_wkind */
    int32_t block_size; /* elements per block (1 for plain types) */
    int32_t type_size;  /* bytes per block */
    int64_t rows, cols;
    const uint8_t *packed; /* the qdot.h layout, or NULL */
} mm_src;

/* The kernels' scratch differs by path. */
typedef enum mm_path { MM_PATH_FORWARD = 0, MM_PATH_BACKWARD = 1, MM_PATH_GEMV = 2 } mm_path;

/* Floats of per-thread scratch the kernels of `path` need for w with weight
 * panels mv wide (64-byte aligned): forward, a packed panel and, for block
 * types, the rows it came from; backward, packed panels for a block of rows
 * and one widened row; GEMV over n tokens, dequantized chunks of the rows of
 * one pass, or for float kinds the n tokens' activations packed. */
int64_t mm_scratch_floats(const mm_src *w, int32_t path, int64_t mv, int64_t n);

/* Cache rows a decode kernel requests into L2 while it works (the next
 * tile of an f16 cache): `rows` rows `pitch` bytes apart, the first `lines`
 * 64-byte lines of each. The kernel spreads the requests over its own rows
 * (fetch_share), so that they go out while it computes, in address order,
 * which the L2's stream prefetcher then follows. */
typedef struct cart_fetch {
    const char *base;
    int64_t pitch;
    int32_t rows, lines;
} cart_fetch;

/* Requests the share of f's lines that belongs to rows [i, i + n) of the
 * kernel's nt (nothing when f is NULL). Always inlined: GCC 12 takes a
 * function whose only effect is __builtin_prefetch for one without effects
 * and drops its calls. */
static inline __attribute__((always_inline)) void fetch_share(const cart_fetch *f, int64_t i, int64_t n,
                                                              int64_t nt) {
    if (!f) return;
    const int64_t total = (int64_t)f->rows * f->lines, end = total * (i + n) / nt;
    int64_t l = total * i / nt, r = l / f->lines, c = l % f->lines;
    for (; l < end; l++) {
        __builtin_prefetch(f->base + r * f->pitch + 64 * c, 0, 2);
        if (++c == f->lines) c = 0, r++;
    }
}

/* Columns one backward task covers: MM_BWD_COLS, or a whole block for
 * 256-element block types; and the weight rows it packs at a time. */
static inline int64_t mm_bwd_cols(const mm_src *w) {
    return w->block_size > MM_BWD_COLS ? w->block_size : MM_BWD_COLS;
}
static inline int64_t mm_bwd_kc(const mm_src *w) { return MM_BWD_BLOCK / mm_bwd_cols(w); }

/* Scale and min (6 bits each) of sub-block j (< 8) of a q4_K / q5_K block
 * from its 12 scale bytes s: j < 4: s[j] & 63 and s[j + 4] & 63; j >= 4: the
 * low nibbles of s[j + 4] carry the low four bits, and the top two bits of
 * s[j - 4] (scale) and s[j] (min) the high two. Inline: the kernels call it
 * per sub-block of every row. */
static inline void cart_scale_min_k4(int j, const uint8_t *s, int *scale, int *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

typedef struct cart_kernels {
    int32_t isa;      /* cart_isa */
    const char *name; /* cart_isa_name */
    int32_t mu;       /* tokens per GEMM micro-tile: a packed activation panel's width */
    int32_t mv;       /* outputs per GEMM micro-tile: a packed weight panel's width */

    /* Packs activation rows for the GEMM kernels, rounded as `round` says: x
     * is (ntok, depth) with pitch ldx; xp receives ceil(ntok / mu) panels of
     * depth * mu floats, panel p holding tokens p*mu.. as xp[p][k][u] (missing
     * tokens are zeros). Handles panels [p0, p1). */
    void (*pack_act)(float *xp, const float *x, int64_t ldx, int64_t ntok, int64_t depth,
                     int32_t round, int64_t p0, int64_t p1);

    /* Rounds rows [i0, i1) of x (pitch ldx) into xr (pitch cols). */
    void (*round_rows)(float *xr, const float *x, int64_t ldx, int64_t cols, int32_t round,
                       int64_t i0, int64_t i1);

    /* Forward GEMM for weight rows [r0, r1) over the reduction block [d0, d0 +
     * depth): y[i, r] = (d0 > 0 ? y[i, r] : 0) + sum_k xp(i, k) * W[r, d0 + k]
     * for the ntok tokens packed in xp (pack_act of x's columns d0..). */
    void (*forward_rows)(const mm_src *w, float *y, int64_t ldy, const float *xp, int64_t ntok,
                         int64_t d0, int64_t depth, int64_t r0, int64_t r1, float *scratch);

    /* Backward GEMM for weight columns [c0, c1) over weight rows [d0, d0 +
     * depth): dx[i, c] += sum_k dyp(i, k) * W[d0 + k, c] for the ntok tokens
     * packed in dyp (pack_act of dy's columns d0..). */
    void (*backward_cols)(const mm_src *w, float *dx, int64_t ldx, const float *dyp,
                          int64_t ntok, int64_t d0, int64_t depth, int64_t c0, int64_t c1,
                          float *scratch);

    /* Forward GEMV for few tokens, weight rows [r0, r1). x is (n, cols) with
     * pitch ldx, already rounded. */
    void (*gemv_rows)(const mm_src *w, float *y, int64_t ldy, const float *x, int64_t ldx,
                      int64_t n, int64_t r0, int64_t r1, float *scratch);

    /* score[i] = q . k[i] for i < nt, rows `stride` floats (or halves) apart;
     * head_dim a multiple of 16. */
    void (*scores)(float *score, const float *q, const float *k, int64_t stride,
                   int32_t head_dim, int64_t nt);
    void (*scores_f16)(float *score, const float *q, const uint16_t *k, int64_t stride,
                       int32_t head_dim, int64_t nt);

    /* acc[d] += sum over i < nt of p[i] * v[i][d], in i order; head_dim a
     * multiple of 16 and at most 512. */
    void (*values)(float *acc, const float *p, const float *v, int64_t stride, int64_t nt,
                   int32_t head_dim);
    void (*values_f16)(float *acc, const float *p, const uint16_t *v, int64_t stride, int64_t nt,
                       int32_t head_dim);

    /* Several queries against the same rows, each query's results the bits
     * of the one-query kernel above (the rows are read once for all), query
     * a over its own first nt[a] rows (a causal block's queries see
     * different numbers): scores_mq: score[a * ld + i] = scores of q[a]
     * against k[i], a < nq, i < nt[a] (entries up to the largest nt may be
     * written too; rows up to it must be readable); values_mq: acc[a][d] +=
     * sum over i < nt[a] of p[a * ld + i] * v[i][d], in i order (p past
     * nt[a] is not used). f32 rows, head_dim a multiple of 16, <= 512. */
    void (*scores_mq)(float *score, int64_t ld, const float *const *q, int32_t nq, const float *k,
                      int64_t stride, int32_t head_dim, const int64_t *nt);
    void (*values_mq)(float *const *acc, const float *p, int64_t ld, int32_t nq, const float *v,
                      int64_t stride, const int64_t *nt, int32_t head_dim);
    /* scores_mq and values_mq over f16 rows, every query over the same nt
     * rows (a decode step's query heads of one kv head), each result the
     * bits of scores_f16 / values_f16 for that query alone; meanwhile they
     * request `next` (may be NULL) spread over the rows (fetch_share). */
    void (*scores_f16_mq)(float *score, int64_t ld, const float *const *q, int32_t nq, const uint16_t *k,
                          int64_t stride, int32_t head_dim, int64_t nt, const cart_fetch *next);
    void (*values_f16_mq)(float *const *acc, const float *p, int64_t ld, int32_t nq, const uint16_t *v,
                          int64_t stride, int64_t nt, int32_t head_dim, const cart_fetch *next);
    /* The attention backward's row gradients of a tile: for rows j >= skip
     * and the queries a < nq with j < nt[a] in that order, dk[j][d] +=
     * ds[a * ld + j] * q[a][d] and dv[j][d] += p[a * ld + j] * dout[a][d],
     * the product rounded, then the sum (no fused multiply-add); dk and dv
     * hold rows of head_dim floats, contiguous, up to the largest nt. */
    void (*outer_add)(float *dk, float *dv, const float *ds, const float *p, int64_t ld,
                      const float *const *q, const float *const *dout, int32_t nq, int64_t skip,
                      const int64_t *nt, int32_t head_dim);

    /* Integer products of packed block weights and quantized activations
     * (qdot.h): the contract's arithmetic for every qk_supported type. */
    qk_groups_fn qk_groups;
    /* The activations' quantization (qdot.h); NULL: qk_quantize_rows_c. */
    qk_quantize_fn qk_quantize;

    /* y[i] = e^x[i] for i < n (y may be x), the bits of expf.h's
     * cart_expf_ref. */
    void (*expf_n)(float *y, const float *x, int64_t n);
    /* y[i] = e^(x[i] - shift) for i < n (y may be x), the difference
     * rounded to f32 first: expf_n's bits of the differences. */
    void (*expf_shift_n)(float *y, const float *x, int64_t n, float shift);
    /* s[i] *= scale for i < n, in place; returns the largest product that
     * is not a NaN (-INFINITY when there is none). A maximum is the same
     * value in any order (of +0 and -0 either may come back: online
     * softmax subtracts it and takes e^, which gives the same bits). */
    float (*scale_max)(float *s, int64_t n, float scale);
    /* y[i] = e^x[i] in double for i < n (y may be x), the bits of the C
     * library's exp (exp.h). */
    void (*exp_n)(double *y, const double *x, int64_t n);

    /* Bulk conversions (any alignment), as the scalar functions of dtype.h. */
    void (*f16_to_f32)(float *dst, const uint16_t *src, int64_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, int64_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, int64_t n);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, int64_t n);
} cart_kernels;

/* The table in use (cpu.c). When CART_ISA named a level that cannot run
 * here, cart_isa_init() reports that to whoever asks (model loads, the
 * matmul entry points, the host at start) and this returns the scalar table,
 * which gives the same bits, for callers that have no status to return. */
const cart_kernels *cart_kern(void);

/* Each level's table; NULL when the build lacks it. */
const cart_kernels *cart_kernels_scalar(void);
const cart_kernels *cart_kernels_avx2(void);
const cart_kernels *cart_kernels_avx512(void);
const cart_kernels *cart_kernels_avx512vnni(void);
const cart_kernels *cart_kernels_amx(void);
const cart_kernels *cart_kernels_neon(void);
const cart_kernels *cart_kernels_neondot(void);

#pragma GCC visibility pop

#endif
