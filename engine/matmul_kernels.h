/*
 * matmul_kernels.h - the AVX-512 kernels behind matmul.c; not part of the API.
 *
 * matmul.c validates arguments, allocates scratch and splits work over the
 * pool; the functions here do the arithmetic for one part. They exist only in
 * builds whose compiler targets AVX-512 (F, BW, VL, DQ); other builds use the
 * portable code in matmul.c.
 *
 * Every output element of the GEMM kernels is one chain of fused multiply-adds
 * over the reduction index in increasing order, starting from 0 (forward) or
 * from the old value (backward): c = fma(a[k], b[k], c). Tiling, blocking and
 * the split over threads therefore never change a result. The GEMV kernels
 * keep 16 lane sums per output, each a chain of fused multiply-adds over
 * k = lane, lane + 16, ..., added together in one fixed tree at the end.
 */
#ifndef CART_MATMUL_KERNELS_H
#define CART_MATMUL_KERNELS_H

#include <stdint.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define MM_HAVE_AVX512 1
#else
#define MM_HAVE_AVX512 0
#endif

#pragma GCC visibility push(hidden)

enum {
    MM_U = 12,        /* tokens per micro-tile: the broadcast operand, 12 x 2 zmm accumulators */
    MM_V = 32,        /* weight rows (forward) or columns (backward) per micro-tile: two zmm */
    MM_KC = 256,      /* reduction depth of one packed weight panel (32 KiB, in L1d); a multiple of
                         every block size so a panel never splits a quantization block */
    MM_FWD_ROWS = 64, /* weight rows per forward task (two micro-panels) */
    MM_BWD_COLS = 64, /* weight columns per backward task for plain dtypes */
    MM_BWD_BLOCK = 32768, /* floats of weight one backward task packs at a time (128 KiB,
                             in L2): 512 rows of 64 columns */
    MM_DEPTH = 4096,      /* reduction elements per packed activation block: 8.6 MiB for 528
                             tokens; longer reductions run in several blocks */
    MM_GEMV_T = 8,        /* most tokens one GEMV pass applies a weight row to */
    MM_GEMV_KB = 1024,    /* elements per dequantized chunk of a weight row in the GEMV */
    MM_GEMV_MAXR = 8,     /* most weight rows one GEMV pass reads at once */
};

/* How the activations are rounded before the product (matmul.h's contract). */
typedef enum mm_round { MM_ROUND_NONE = 0, MM_ROUND_F16 = 1, MM_ROUND_BF16 = 2 } mm_round;

/* How the kernels read weight elements: straight from the matrix for the
 * three float types; everything else is dequantized into scratch first (by
 * vector code for q8_0 q4_0 q4_K q6_K, by cart_to_f32 for the rest). */
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
} mm_src;

/* The kernels' scratch differs by path. */
typedef enum mm_path { MM_PATH_FORWARD = 0, MM_PATH_BACKWARD = 1, MM_PATH_GEMV = 2 } mm_path;

/* Floats of per-thread scratch the kernels of `path` need (64-byte aligned). */
int64_t mm_scratch_floats(const mm_src *w, int32_t path);

/* Columns one backward task covers: MM_BWD_COLS, or a whole block for
 * 256-element block types; and the weight rows it packs at a time. */
int64_t mm_bwd_cols(const mm_src *w);
int64_t mm_bwd_kc(const mm_src *w);

#if MM_HAVE_AVX512

/* Packs activation rows for the GEMM kernels, rounded as `round` says:
 * x is (ntok, depth) with pitch ldx; xp receives ceil(ntok / MM_U) panels of
 * depth * MM_U floats, panel p holding tokens p*MM_U.. as xp[p][k][u] (missing
 * tokens are zeros). Handles panels [p0, p1). */
void mm512_pack_act(float *xp, const float *x, int64_t ldx, int64_t ntok, int64_t depth,
                    int32_t round, int64_t p0, int64_t p1);

/* Rounds rows of x (n, cols; pitch ldx) into xr (n, cols; pitch cols) as `round`
 * says. Handles rows [i0, i1). */
void mm512_round_rows(float *xr, const float *x, int64_t ldx, int64_t cols, int32_t round,
                      int64_t i0, int64_t i1);

/* Forward GEMM for weight rows [r0, r1) over the reduction block [d0, d0 +
 * depth): y[i, r] = (d0 > 0 ? y[i, r] : 0) + sum_k xp(i, k) * W[r, d0 + k] for
 * the ntok tokens packed in xp (mm512_pack_act of x's columns d0..). */
void mm512_forward_rows(const mm_src *w, float *y, int64_t ldy, const float *xp, int64_t ntok,
                        int64_t d0, int64_t depth, int64_t r0, int64_t r1, float *scratch);

/* Backward GEMM for weight columns [c0, c1) over weight rows [d0, d0 + depth):
 * dx[i, c] += sum_k dyp(i, k) * W[d0 + k, c] for the ntok tokens packed in dyp
 * (mm512_pack_act of dy's columns d0..). */
void mm512_backward_cols(const mm_src *w, float *dx, int64_t ldx, const float *dyp, int64_t ntok,
                         int64_t d0, int64_t depth, int64_t c0, int64_t c1, float *scratch);

/* Forward GEMV for few tokens, weight rows [r0, r1): each weight row is read
 * once per MM_GEMV_T tokens. x is (n, cols) with pitch ldx, already rounded. */
void mm512_gemv_rows(const mm_src *w, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t n,
                     int64_t r0, int64_t r1, float *scratch);

#endif

#pragma GCC visibility pop

#endif
