/*
 * qdot.h - integer dot products of GGML block weights with quantized
 * activations: the activation formats, the packed weight layout the kernels
 * read, and the table entry each level fills. Not part of the API
 * (matmul.h states the contract users see).
 *
 * Which types: q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl (blocks of 32) and q2_K q3_K
 * q4_K q5_K q6_K iq4_xs (blocks of 256). The activations of a product with
 * such a weight are quantized first, as GGML's CPU backend does for that
 * type (its vec_dot_type): q8_1 for q4_1 and q5_1, q8_0 for the other
 * 32-blocks, q8_K for the 256-blocks.
 *
 * ---- activation quantization (qk_quantize: the same bits on every level) --
 * Rounding is to nearest, ties to even, everywhere (GGML's x86 rule for
 * q8_0 / q8_1 and its only rule for q8_K; GGML's plain-C q8_0 rounds ties
 * away from zero).
 *   q8_0 / q8_1, per 32: amax = max |x| (a NaN counts as the largest);
 *     d = f16(amax / 127), kept widened; id = amax != 0 ? 127 / amax : 0;
 *     q = rne(x * id), 0 where x * id is NaN; sum = sum of q (int);
 *     q8_1 also sf = f16(float(sum) * (amax / 127)) widened (GGML's s).
 *   q8_K, per 256: amax = max |x| (NaN counts as largest), max = the first
 *     x with |x| = amax; amax = 0: d = 0, every q and sum 0; else
 *     iscale = -127 / max, q = min(127, rne(iscale * x)) (0 for NaN),
 *     d = 1 / iscale; sums of q per 16 elements.
 *
 * ---- the products (the arithmetic is the contract) ------------------------
 * u is a weight's unsigned field as stored, w the signed value it stands
 * for, x the activation's q. Every sum of integer products below is exact
 * in int32 (at most 2^29 in magnitude), so any order gives the same sum.
 * Float steps, in this order, starting from acc = 0 and going through the
 * blocks of the row in order (each * and + one IEEE f32 rounding, never
 * fused, as GGML's plain-C dot products write them; cvt: int32 to f32):
 *   32-blocks, per block b: isum = sum w x over the block, with
 *     q4_0 w = u - 8, q5_0 w = u - 16, q8_0 w = the byte, iq4_nl w =
 *     level[u] (GGML's kvalues_iq4nl), q4_1 / q5_1 w = u;
 *     acc = acc + cvt(isum) * (dw * xd);
 *     q4_1, q5_1 instead acc = acc + (cvt(isum) * (dw * xd) + mw * xsf).
 *   q4_K q5_K (sub-blocks j of 32, 6-bit scale sc_j and min m_j), q2_K
 *     (sub-blocks of 16, 4-bit scale and min), per block:
 *     A = sum_j sc_j * sum_j(u x); B = sum_j m_j * (sum of x over j);
 *     acc = acc + cvt(A) * (dw * xd); acc = acc - cvt(B) * (dmin * xd).
 *   q6_K (w = u - 32), q3_K (w = u - 4), sub-blocks of 16 with a signed
 *     scale; iq4_xs (w = level[u]), sub-blocks of 32 with scale - 32:
 *     A = sum_j sc_j * sum_j(w x); acc = acc + cvt(A) * (dw * xd).
 * dw, dmin, mw: the weight's f16 fields widened; xd: the activation
 * block's d (q8_K: f32). y = acc after the last block.
 *
 * ---- the packed layout (qk_pack; the same bytes for every level) ---------
 * Rows go in groups of QK_ROWS = 16 (the last group padded with zero rows,
 * whose outputs are 0 and dropped). A group holds, for its nb blocks, first
 * every block's quant vectors (qk_qbytes each, a multiple of 64), then
 * every block's scales (qk_sbytes each); the group takes qk_group_bytes, a
 * multiple of 64, and groups follow one another.
 *   A quad vector QV(g) is 64 bytes: byte 4r + i is the field of element
 *   4g + i of row r (r < 16), so 16 lanes of 4 consecutive elements.
 *   A unit is 32 elements (8 quads); a 256-block has 8 units.
 *   4-bit fields (q4_0 q4_1 iq4_nl q4_K iq4_xs, and the low 4 of q5 / q6):
 *     per unit 4 vectors N(p), p < 4: low nibbles QV(p), high QV(p + 4).
 *   q5: then per unit a vector H: bit g of byte k is bit 4 of QV(g) byte k.
 *   q6_K: then per unit two vectors H2(h): bits 2(g - 4h)..+1 of byte k
 *     are bits 4-5 of QV(g) byte k, for g in 4h .. 4h + 3.
 *   q2_K: per unit two vectors L(h) of 2-bit fields laid out as H2.
 *   q3_K: per unit two vectors L(h) (the low 2 bits), then the units'
 *     vectors H of the third bit, as q5's.
 *   q8_0: per unit QV(0) .. QV(7), the signed bytes as they are.
 *   Units follow one another, and then (q5, q6_K, q3_K) the extra planes
 *   of every unit, in unit order.
 * Scales, 16 lanes each (lane = row): 32-blocks d f16[16], then q4_1 / q5_1
 * m f16[16]; q4_K q5_K d f16[16], dmin f16[16], scale u8[8][16], min
 * u8[8][16]; q6_K and q3_K d f16[16], scale i8[16][16] (q3_K's already
 * minus 32); q2_K d f16[16], dmin f16[16], u8[16][16] (scale | min << 4);
 * iq4_xs d f16[16], scale i8[8][16] (minus 32).
 */
#ifndef CART_QDOT_H
#define CART_QDOT_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#pragma GCC visibility push(hidden)

enum { QK_ROWS = 16 };

typedef enum qk_act_kind { QK_ACT_Q8_0 = 0, QK_ACT_Q8_1 = 1, QK_ACT_Q8_K = 2 } qk_act_kind;

/* n quantized activation rows of `cols` elements. */
typedef struct qk_act {
    int32_t kind; /* qk_act_kind */
    int32_t reserved;
    int64_t n, cols;
    int8_t *q;  /* [n][cols] */
    float *d;   /* [n][cols / 32] (q8_0, q8_1) or [n][cols / 256] (q8_K) */
    int32_t *s; /* q8_0: [n][cols / 32] sums of q; q8_K: [n][cols / 16] sums of 16 */
    float *sf;  /* q8_1: [n][cols / 32] GGML's s */
    int16_t *u; /* q8_K: [n][cols / 32] sums of 32 (at most 32 x 127), from s by qk_quantize */
} qk_act;

/* A packed weight as the kernels read it. */
typedef struct qk_src {
    const uint8_t *data; /* groups * group_bytes bytes */
    int32_t dtype;
    int32_t reserved;
    int64_t rows, cols;
    int64_t nb;          /* blocks per row */
    int64_t groups;      /* ceil(rows / 16) */
    uint64_t group_bytes;
    int64_t qbytes, sbytes; /* per block of a group */
} qk_src;

/* Bits of a stored weight field: 2, 3, 4, 5, 6 or 8 (a qk_supported type;
 * inline, so that a kernel specialized on its type folds it). */
static inline int qk_field_bits(int32_t dtype) {
    switch (dtype) {
    case CART_Q2_K: return 2;
    case CART_Q3_K: return 3;
    case CART_Q5_0: case CART_Q5_1: case CART_Q5_K: return 5;
    case CART_Q6_K: return 6;
    case CART_Q8_0: return 8;
    default: return 4;
    }
}

/* 1 when the integer path covers `dtype`. */
int qk_supported(int32_t dtype);
/* The activation kind GGML uses with `dtype` (a qk_supported type). */
int32_t qk_act_kind_of(int32_t dtype);
/* Elements per block of `dtype` (32 or 256); quant and scale bytes per
 * block of a group; bytes of one group of a row of `cols`. */
int64_t qk_block_size(int32_t dtype);
int64_t qk_qbytes(int32_t dtype);
int64_t qk_sbytes(int32_t dtype);
uint64_t qk_group_bytes(int32_t dtype, int64_t cols);

/* Fills *s for packed data of a rows x cols weight. */
void qk_src_init(qk_src *s, int32_t dtype, const void *packed, int64_t rows, int64_t cols);

/* Packs groups [g0, g1) of the GGUF rows (rows of row_bytes at `rows_data`)
 * into dst, which receives (g1 - g0) * group_bytes bytes. */
void qk_pack_groups(uint8_t *dst, int32_t dtype, const uint8_t *rows_data, uint64_t row_bytes,
                    int64_t rows, int64_t cols, int64_t g0, int64_t g1);

/* Bytes of n quantized rows of `kind` (any alignment of the parts is 64). */
size_t qk_act_bytes(int32_t kind, int64_t n, int64_t cols);
/* Lays *a out over buf (qk_act_bytes of it). */
void qk_act_init(qk_act *a, void *buf, int32_t kind, int64_t n, int64_t cols);
/* Fills a->u from a->s for rows [i0, i1) (q8_K; nothing for another kind). */
void qk_unit_sums(qk_act *a, int64_t i0, int64_t i1);
/* Quantizes rows [i0, i1) of x (pitch ldx) into a: the level's kernel
 * (cart_kernels.qk_quantize) where it has one, else qk_quantize_rows_c,
 * the rules above in plain C. Every level gives the same bytes. */
void qk_quantize(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1);
void qk_quantize_rows_c(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1);
/* The quantizers' shared steps: block b of row i of q8_0 / q8_1 gets its
 * scale d (rounded through f16), the sum of its q and q8_1's d times that
 * sum; block b of a q8_K row whose inputs are all zero gets zeros. */
void qk_act_put32(const qk_act *a, int64_t i, int64_t b, float d, int32_t sum);
void qk_act_zero256(const qk_act *a, int64_t i, int64_t b);
/* A level quantizer's loop over rows [i0, i1): a row that `finite` finds
 * holding a NaN or an infinity takes qk_quantize_rows_c, whose rules for
 * them are the contract's; the others the level's row32 or row256. */
static inline __attribute__((always_inline)) void
qk_quantize_rows_by(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1,
                    int (*finite)(const float *, int64_t), void (*row32)(qk_act *, const float *, int64_t),
                    void (*row256)(qk_act *, const float *, int64_t)) {
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = x + i * ldx;
        if (!finite(xr, a->cols)) qk_quantize_rows_c(a, x, ldx, i, i + 1);
        else if (a->kind == QK_ACT_Q8_K) row256(a, xr, i);
        else row32(a, xr, i);
    }
}
typedef void (*qk_quantize_fn)(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1);

/* y[t, 16 g + r] for tokens [t0, t1) and groups [g0, g1) of w (rows past
 * w->rows are not written): the contract's arithmetic. A level's entry. */
typedef void (*qk_groups_fn)(const qk_src *w, const qk_act *a, int64_t t0, int64_t t1, int64_t g0,
                             int64_t g1, float *y, int64_t ldy);

/* GGML's kvalues_iq4nl: the 16 levels of iq4_nl and iq4_xs. */
extern const int8_t qk_iq4_levels[16];

#pragma GCC visibility pop

#endif
