/*
 * generic.h - every kernel of kernels.h, written once over a level's vector
 * primitives. scalar.c, avx2.c and neon.c define the primitives and the
 * tuning below, then include this file once; it defines their table.
 *
 * The including file defines:
 *   GK_TABLE          the table function's name, e.g. cart_kernels_avx2
 *   GK_ISA, GK_NAME   its cart_isa value and name
 *   VW                floats per vector (1, 4 or 8; it divides 16)
 *   vf                the vector type
 *   GK_MU, GK_NV      GEMM micro-tile: GK_MU tokens x GK_NV vectors of outputs
 *                     (GK_MU <= MM_MAX_U; GK_NV * VW divides 64)
 *   GK_GEMV_T         most tokens one GEMV pass applies a weight row to (<= 8)
 *   GK_GEMV_R(t)      weight rows per GEMV pass for t tokens (<= MM_GEMV_MAXR)
 * and these static inline functions (VW lanes each, unaligned pointers):
 *   v_zero() v_set1(x) v_load(p) v_store(p, v)
 *   v_fma(a, b, c)    a * b + c with one rounding
 *   v_mul(a, b)       a * b
 *   v_load_f16(p) v_load_bf16(p)   VW halves widened exactly
 *   v_store_f16(p, v) v_store_bf16(p, v)   rounded to nearest even, NaN quiet
 *   v_round(v, round) v rounded as mm_round says and widened back
 *   v_load_i8(p)      VW signed bytes as floats
 *   v_half(h)         one f16 (a block scale) as a float, as cart_f16_to_f32
 *   v_sub(a, b) v_add(a, b)   a - b, a + b
 *   v_unpack(dtype, blk, q)   1 when it wrote the quants of the block at blk
 *                     to q as gk_unpack does, 0 to leave it to plain C
 *   gk_dequant(w, dst, src, nb)   1 when it dequantized nb blocks of w's
 *                     dtype to cart_to_f32's values, 0 to leave it to cart_to_f32
 * and, optionally:
 *   GK_TREE16, v_tree16(acc), v_tree_score(acc)   gk_tree_gemv's and
 *                     gk_tree_score's additions on vectors
 *   GK_BLOCKED_T      tokens per pass of the blocked GEMV (gk_gemv_blocked)
 *
 * Everything here follows the arithmetic kernels.h fixes, so the table gives
 * the bits of every other level. Tails shorter than a vector go through
 * zero-padded buffers, which keeps the same operations (fma(0, 0, s) for a
 * missing element) without masks.
 */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "expf.h"

#define GK_MV (GK_NV * VW) /* outputs per micro-tile */
#define GK_NA (16 / VW)    /* vectors per 16-lane sum */
#define GK_INLINE static inline __attribute__((always_inline))

GK_INLINE int64_t gk_min(int64_t a, int64_t b) {
    return a < b ? a : b;
}

GK_INLINE float gk_round1(float v, const int round) {
    if (round == MM_ROUND_F16) return cart_f16_to_f32(cart_f32_to_f16(v));
    if (round == MM_ROUND_BF16) return cart_bf16_to_f32(cart_f32_to_bf16(v));
    return v;
}

/* n (< VW, or any n) elements of a float kind at p, widened into dst. */
GK_INLINE void gk_widen(const int kind, float *dst, const uint8_t *p, int64_t n) {
    int64_t i = 0;
    if (kind == MM_W_F32) {
        memcpy(dst, p, (size_t)n * 4);
        return;
    }
    const uint16_t *h = (const uint16_t *)(const void *)p;
    for (; i + VW <= n; i += VW)
        v_store(dst + i, kind == MM_W_F16 ? v_load_f16(h + i) : v_load_bf16(h + i));
    for (; i < n; i++) { /* through memcpy: the bulk conversions take any alignment */
        uint16_t u;
        memcpy(&u, p + 2 * i, 2);
        const float f = kind == MM_W_F16 ? cart_f16_to_f32(u) : cart_bf16_to_f32(u);
        memcpy(dst + i, &f, 4);
    }
}

/* VW weight elements of a float kind at element k of row p. */
GK_INLINE vf gk_load_w(const int kind, const uint8_t *p, int64_t k) {
    if (kind == MM_W_F16) return v_load_f16((const uint16_t *)(const void *)p + k);
    if (kind == MM_W_BF16) return v_load_bf16((const uint16_t *)(const void *)p + k);
    return v_load((const float *)(const void *)p + k);
}

/* ---- dequantization ------------------------------------------------------- */

/* Rows [r0, r0 + nr), elements [k0, k0 + kc) of a block-type weight into dst
 * (pitch ld floats); k0 and kc are whole blocks. */
static void gk_dequant_rows(const mm_src *w, float *dst, int64_t ld, int64_t r0, int64_t nr,
                            int64_t k0, int64_t kc) {
    const uint64_t off = (uint64_t)(k0 / w->block_size) * (uint64_t)w->type_size;
    const int64_t nb = kc / w->block_size;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *src = w->data + (uint64_t)(r0 + r) * w->row_bytes + off;
        if (!gk_dequant(w, dst + r * ld, src, nb)) cart_to_f32(dst + r * ld, w->dtype, src, kc);
    }
}

/* ---- conversions ---------------------------------------------------------- */

static void gk_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    gk_widen(MM_W_F16, dst, (const uint8_t *)src, n);
}

static void gk_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    gk_widen(MM_W_BF16, dst, (const uint8_t *)src, n);
}

/* The tails go through memcpy: the bulk conversions take any alignment. */
GK_INLINE void gk_narrow(const int bf16, uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        if (bf16) v_store_bf16(dst + i, v_load(src + i));
        else v_store_f16(dst + i, v_load(src + i));
    }
    for (; i < n; i++) {
        float f;
        memcpy(&f, src + i, 4);
        const uint16_t h = bf16 ? cart_f32_to_bf16(f) : cart_f32_to_f16(f);
        memcpy(dst + i, &h, 2);
    }
}

static void gk_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
    gk_narrow(0, dst, src, n);
}

static void gk_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    gk_narrow(1, dst, src, n);
}

/* ---- activations ---------------------------------------------------------- */

GK_INLINE void gk_round_span(const int round, float *dst, const float *src, int64_t n) {
    int64_t k = 0;
    for (; k + VW <= n; k += VW) v_store(dst + k, v_round(v_load(src + k), round));
    for (; k < n; k++) dst[k] = gk_round1(src[k], round);
}

static void gk_round_rows(float *xr, const float *x, int64_t ldx, int64_t cols, int32_t round,
                          int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        if (round == MM_ROUND_F16) gk_round_span(MM_ROUND_F16, xr + i * cols, x + i * ldx, cols);
        else if (round == MM_ROUND_BF16)
            gk_round_span(MM_ROUND_BF16, xr + i * cols, x + i * ldx, cols);
        else memcpy(xr + i * cols, x + i * ldx, (size_t)cols * 4);
    }
}

static void gk_pack_act(float *xp, const float *x, int64_t ldx, int64_t ntok, int64_t depth,
                        int32_t round, int64_t p0, int64_t p1) {
    enum { CHUNK = 256 };
    float row[CHUNK];
    for (int64_t p = p0; p < p1; p++) {
        float *dst = xp + p * depth * GK_MU;
        const int64_t i0 = p * GK_MU, nt = gk_min(GK_MU, ntok - i0);
        for (int64_t u = 0; u < GK_MU; u++) {
            if (u >= nt) {
                for (int64_t k = 0; k < depth; k++) dst[k * GK_MU + u] = 0.0f;
                continue;
            }
            const float *src = x + (i0 + u) * ldx;
            for (int64_t k0 = 0; k0 < depth; k0 += CHUNK) {
                const int64_t kn = gk_min(CHUNK, depth - k0);
                gk_round_rows(row, src + k0, 0, kn, round, 0, 1);
                for (int64_t k = 0; k < kn; k++) dst[(k0 + k) * GK_MU + u] = row[k];
            }
        }
    }
}

/* ---- the micro-kernel ----------------------------------------------------- */

/* A whole tile: c[i, 0 .. GK_MV) (pitch ldc) for i < GK_MU, each the fma
 * chain over k < kc of a[k][i] * b[k][v], from c (load) or from 0. */
GK_INLINE void gk_micro_full(int64_t kc, const float *restrict a, const float *restrict b,
                             float *restrict c, int64_t ldc, int load) {
    vf acc[GK_MU][GK_NV];
#pragma GCC unroll 16
    for (int i = 0; i < GK_MU; i++)
#pragma GCC unroll 8
        for (int j = 0; j < GK_NV; j++) acc[i][j] = load ? v_load(c + i * ldc + j * VW) : v_zero();
    for (int64_t k = 0; k < kc; k++) {
        vf bv[GK_NV];
#pragma GCC unroll 8
        for (int j = 0; j < GK_NV; j++) bv[j] = v_load(b + j * VW);
#pragma GCC unroll 16
        for (int i = 0; i < GK_MU; i++) {
            const vf ai = v_set1(a[i]);
#pragma GCC unroll 8
            for (int j = 0; j < GK_NV; j++) acc[i][j] = v_fma(ai, bv[j], acc[i][j]);
        }
        a += GK_MU;
        b += GK_MV;
    }
#pragma GCC unroll 16
    for (int i = 0; i < GK_MU; i++)
#pragma GCC unroll 8
        for (int j = 0; j < GK_NV; j++) v_store(c + i * ldc + j * VW, acc[i][j]);
}

/* u tokens x nv outputs of a tile; edges go through a full tile in a buffer
 * (the padding tokens and outputs are computed and dropped). */
static void gk_micro(int64_t u, int64_t nv, int64_t kc, const float *a, const float *b, float *c,
                     int64_t ldc, int load) {
    if (u == GK_MU && nv == GK_MV) {
        gk_micro_full(kc, a, b, c, ldc, load);
        return;
    }
    float tile[GK_MU * GK_MV];
    memset(tile, 0, sizeof tile);
    if (load)
        for (int64_t i = 0; i < u; i++) memcpy(tile + i * GK_MV, c + i * ldc, (size_t)nv * 4);
    gk_micro_full(kc, a, b, tile, GK_MV, load);
    for (int64_t i = 0; i < u; i++) memcpy(c + i * ldc, tile + i * GK_MV, (size_t)nv * 4);
}

/* ---- forward GEMM --------------------------------------------------------- */

/* panel[k][r] = W[j0 + r, k0 + k] for r < nr, 0 for nr <= r < GK_MV; k < kc;
 * rows at `base`, ld bytes apart, elements of `kind`. */
GK_INLINE void gk_pack_fwd_kind(const int kind, float *panel, const uint8_t *base, uint64_t ld,
                                int64_t nr, int64_t kc) {
    float row[MM_KC];
    for (int64_t r = 0; r < GK_MV; r++) {
        if (r >= nr) {
            for (int64_t k = 0; k < kc; k++) panel[k * GK_MV + r] = 0.0f;
            continue;
        }
        gk_widen(kind, row, base + (uint64_t)r * ld, kc);
        for (int64_t k = 0; k < kc; k++) panel[k * GK_MV + r] = row[k];
    }
}

static void gk_pack_fwd(const mm_src *w, float *panel, float *tmp, int64_t j0, int64_t nr,
                        int64_t k0, int64_t kc) {
    const uint8_t *base = w->data + (uint64_t)j0 * w->row_bytes;
    switch (w->kind) {
    case MM_W_F32:
        gk_pack_fwd_kind(MM_W_F32, panel, base + (uint64_t)k0 * 4, w->row_bytes, nr, kc);
        break;
    case MM_W_F16:
        gk_pack_fwd_kind(MM_W_F16, panel, base + (uint64_t)k0 * 2, w->row_bytes, nr, kc);
        break;
    case MM_W_BF16:
        gk_pack_fwd_kind(MM_W_BF16, panel, base + (uint64_t)k0 * 2, w->row_bytes, nr, kc);
        break;
    default:
        gk_dequant_rows(w, tmp, kc, j0, nr, k0, kc);
        gk_pack_fwd_kind(MM_W_F32, panel, (const uint8_t *)tmp, (uint64_t)kc * 4, nr, kc);
        break;
    }
}

/* Brings the weight bytes of rows [j0, j0 + nr), elements [k0, k0 + kc) into
 * cache ahead of use. */
static void gk_prefetch_panel(const mm_src *w, int64_t j0, int64_t nr, int64_t k0, int64_t kc) {
    const uint64_t from = (uint64_t)(k0 / w->block_size) * (uint64_t)w->type_size;
    const uint64_t bytes = (uint64_t)(kc / w->block_size) * (uint64_t)w->type_size;
    for (int64_t r = 0; r < nr; r++) {
        const char *row = (const char *)w->data + (uint64_t)(j0 + r) * w->row_bytes + from;
        for (uint64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 3);
    }
}

static void gk_forward_rows(const mm_src *w, float *y, int64_t ldy, const float *xp,
                            int64_t ntok, int64_t d0, int64_t depth, int64_t r0, int64_t r1,
                            float *scratch) {
    const int64_t npan = (ntok + GK_MU - 1) / GK_MU;
    float *panel = scratch;                     /* (MM_KC, GK_MV) */
    float *tmp = scratch + (int64_t)MM_KC * GK_MV; /* (GK_MV, MM_KC) dequantized rows */
    for (int64_t k0 = 0; k0 < depth; k0 += MM_KC)
        for (int64_t j0 = r0; j0 < r1; j0 += GK_MV) {
            int64_t nj = j0 + GK_MV, nk = k0; /* the next panel */
            if (nj >= r1) nj = r0, nk += MM_KC;
            if (nk < depth)
                gk_prefetch_panel(w, nj, gk_min(GK_MV, r1 - nj), d0 + nk,
                                  gk_min(MM_KC, depth - nk));
            const int64_t nr = gk_min(GK_MV, r1 - j0), kc = gk_min(MM_KC, depth - k0);
            gk_pack_fwd(w, panel, tmp, j0, nr, d0 + k0, kc);
            for (int64_t p = 0; p < npan; p++)
                gk_micro(gk_min(GK_MU, ntok - p * GK_MU), nr, kc,
                         xp + p * depth * GK_MU + k0 * GK_MU, panel, y + p * GK_MU * ldy + j0, ldy,
                         d0 + k0 > 0);
        }
}

/* ---- backward GEMM -------------------------------------------------------- */

/* panels[jr][k][v] = W[k0 + k, c0 + jr * GK_MV + v] for columns below c0 +
 * nc, else 0; k < kc. */
static void gk_pack_bwd(const mm_src *w, float *panels, float *tmp, int64_t c0, int64_t nc,
                        int64_t k0, int64_t kc) {
    const int64_t npanel = (nc + GK_MV - 1) / GK_MV;
    for (int64_t k = 0; k < kc; k++) {
        const uint8_t *row = w->data + (uint64_t)(k0 + k) * w->row_bytes;
        switch (w->kind) {
        case MM_W_F32:
            gk_widen(MM_W_F32, tmp, row + c0 * 4, nc);
            break;
        case MM_W_F16:
            gk_widen(MM_W_F16, tmp, row + c0 * 2, nc);
            break;
        case MM_W_BF16:
            gk_widen(MM_W_BF16, tmp, row + c0 * 2, nc);
            break;
        default:
            gk_dequant_rows(w, tmp, nc, k0 + k, 1, c0, nc);
            break;
        }
        for (int64_t jr = 0; jr < npanel; jr++) {
            float *dst = panels + jr * kc * GK_MV + k * GK_MV;
            const int64_t have = gk_min(GK_MV, nc - jr * GK_MV);
            memcpy(dst, tmp + jr * GK_MV, (size_t)have * 4);
            for (int64_t v = have; v < GK_MV; v++) dst[v] = 0.0f;
        }
    }
}

static void gk_backward_cols(const mm_src *w, float *dx, int64_t ldx, const float *dyp,
                             int64_t ntok, int64_t d0, int64_t depth, int64_t c0, int64_t c1,
                             float *scratch) {
    const int64_t npan = (ntok + GK_MU - 1) / GK_MU;
    const int64_t nc = c1 - c0;
    const int64_t kcb = mm_bwd_kc(w);
    float *panels = scratch;             /* (nc / GK_MV, kcb, GK_MV) */
    float *tmp = scratch + MM_BWD_BLOCK; /* one widened row segment */
    for (int64_t k0 = 0; k0 < depth; k0 += kcb) {
        const int64_t kc = gk_min(kcb, depth - k0);
        gk_pack_bwd(w, panels, tmp, c0, nc, d0 + k0, kc);
        for (int64_t c = 0; c < nc; c += GK_MV) {
            const float *b = panels + (c / GK_MV) * kc * GK_MV;
            for (int64_t p = 0; p < npan; p++)
                gk_micro(gk_min(GK_MU, ntok - p * GK_MU), gk_min(GK_MV, nc - c), kc,
                         dyp + p * depth * GK_MU + k0 * GK_MU, b, dx + p * GK_MU * ldx + c0 + c,
                         ldx, 1);
        }
    }
}

/* ---- sums of 16 lanes ----------------------------------------------------- */

/* The GEMV tree: s[l] += s[l + 8], then + 4, + 2, + 1 (a level may give
 * the same additions on vectors: v_tree16). */
GK_INLINE float gk_tree_gemv(const vf *acc) {
#ifdef GK_TREE16
    return v_tree16(acc);
#else
    float s[16];
#pragma GCC unroll 16
    for (int a = 0; a < GK_NA; a++) v_store(s + a * VW, acc[a]);
    for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) s[l] += s[l + width];
    return s[0];
#endif
}

/* The score tree: ((s0+s2)+(s1+s3)) per group of four, then (G0+G1)+(G2+G3)
 * (a level may give the same additions on vectors: v_tree_score). */
GK_INLINE float gk_tree_score(const vf *acc) {
#ifdef GK_TREE16
    return v_tree_score(acc);
#else
    float s[16], g[4];
#pragma GCC unroll 16
    for (int a = 0; a < GK_NA; a++) v_store(s + a * VW, acc[a]);
    for (int j = 0; j < 4; j++)
        g[j] = (s[4 * j] + s[4 * j + 2]) + (s[4 * j + 1] + s[4 * j + 3]);
    return (g[0] + g[1]) + (g[2] + g[3]);
#endif
}

/* ---- GEMV ----------------------------------------------------------------- */

/* acc[r][t] += lane-wise products of weight rows wr[r] (elements of `kind`)
 * and token rows x + t * ldx over kn elements, k from 0. */
GK_INLINE void gk_gemv_span(const int R, const int T, const int kind, const uint8_t *const *wr,
                            const float *x, int64_t ldx, int64_t kn, int pf_rows, uint64_t pf_step,
                            vf acc[MM_GEMV_MAXR][8][GK_NA]) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    int64_t k = 0;
    for (; k + 16 <= kn; k += 16) {
        if (pf_rows && ((k * esize) & 63) == 0) /* the next tile's line at this offset */
            for (int r = 0; r < pf_rows; r++) __builtin_prefetch(wr[r] + pf_step + k * esize, 0, 3);
        vf wv[MM_GEMV_MAXR][GK_NA];
        for (int r = 0; r < R; r++)
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++) wv[r][a] = gk_load_w(kind, wr[r], k + a * VW);
        for (int t = 0; t < T; t++)
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++) {
                const vf xv = v_load(x + t * ldx + k + a * VW);
                for (int r = 0; r < R; r++) acc[r][t][a] = v_fma(wv[r][a], xv, acc[r][t][a]);
            }
    }
    if (k < kn) { /* the tail, zero-padded to 16 */
        const int64_t rest = kn - k;
        float wpad[MM_GEMV_MAXR][16], xpad[8][16];
        for (int r = 0; r < R; r++) {
            memset(wpad[r], 0, sizeof wpad[r]);
            gk_widen(kind, wpad[r], wr[r] + k * esize, rest);
        }
        for (int t = 0; t < T; t++) {
            memset(xpad[t], 0, sizeof xpad[t]);
            memcpy(xpad[t], x + t * ldx + k, (size_t)rest * 4);
        }
        for (int t = 0; t < T; t++)
            for (int a = 0; a < GK_NA; a++) {
                const vf xv = v_load(xpad[t] + a * VW);
                for (int r = 0; r < R; r++)
                    acc[r][t][a] = v_fma(v_load(wpad[r] + a * VW), xv, acc[r][t][a]);
            }
    }
}

/* The block types whose weights the GEMV forms in registers, each the value
 * cart_to_f32 gives it (the same operations on the same operands as quant.c,
 * which lists the layouts); GK_GEMV_BLOCKS is their GEMV-only kind. */
enum { GK_GEMV_BLOCKS = 16 };

GK_INLINE int gk_in_registers(int32_t dtype) {
    return dtype == CART_Q8_0 || dtype == CART_Q4_0 || dtype == CART_Q4_1 || dtype == CART_Q5_0 ||
           dtype == CART_Q5_1 || dtype == CART_Q4_K || dtype == CART_Q5_K || dtype == CART_Q6_K;
}

/* q[0 .. 32 or 256) = the quants of the block at blk in element order as
 * signed bytes, the type's offset taken off (v_unpack's values):
 *   q4_0  nibble - 8     q4_1  nibble        q5_0  five bits - 16   q5_1  five bits
 *   q4_K  nibble         q5_K  five bits     q6_K  six bits - 32
 * (q8_0's quants are its bytes: they never come here). */
GK_INLINE void gk_unpack(int32_t dtype, const uint8_t *blk, int8_t *q) {
    if (v_unpack(dtype, blk, q)) return;
    if (dtype == CART_Q6_K) { /* layout as in quant.c's dequantize_q6_K */
        for (int i = 0; i < 2; i++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    const int ql = blk[64 * i + 32 * (g & 1) + l] >> (g < 2 ? 0 : 4);
                    const int qh = blk[128 + 32 * i + l] >> (2 * g);
                    q[128 * i + 32 * g + l] = (int8_t)(((ql & 15) | (qh & 3) << 4) - 32);
                }
    } else if (dtype == CART_Q4_K || dtype == CART_Q5_K) {
        /* element 64c + 32h + l: nibble h of qs[32c + l], bit 2c + h of qh[l] (q5_K) */
        const uint8_t *qs = blk + (dtype == CART_Q4_K ? 16 : 48), *qh = blk + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int hi = dtype == CART_Q5_K ? qh[l] >> (2 * c) : 0;
                q[64 * c + l] = (int8_t)((qs[32 * c + l] & 15) | (hi & 1) << 4);
                q[64 * c + 32 + l] = (int8_t)((qs[32 * c + l] >> 4) | (hi & 2) << 3);
            }
    } else { /* element l < 16: low nibble of qs[l], 16 + l: high; bit l of qh the fifth */
        const int five = dtype == CART_Q5_0 || dtype == CART_Q5_1;
        const int at = (dtype == CART_Q4_1 || dtype == CART_Q5_1 ? 4 : 2) + (five ? 4 : 0);
        const int off = dtype == CART_Q4_0 ? 8 : dtype == CART_Q5_0 ? 16 : 0;
        const uint8_t *qs = blk + at;
        uint32_t qh = 0;
        if (five) memcpy(&qh, blk + at - 4, 4);
        for (int l = 0; l < 16; l++) {
            q[l] = (int8_t)(((qs[l] & 15) | (int)(((qh >> l) & 1) << 4)) - off);
            q[l + 16] = (int8_t)(((qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1) << 4)) - off);
        }
    }
}

/* gk_unpack_span's part for nb blocks of a 32-element type at blk. */
GK_INLINE void gk_unpack_blocks(const int32_t dtype, const uint8_t *blk, int64_t nb, int8_t *buf,
                                float *s, float *m) {
    const int offset = dtype == CART_Q4_1 || dtype == CART_Q5_1;
    const int five = dtype == CART_Q5_0 || dtype == CART_Q5_1;
    const int64_t bytes = 18 + 2 * offset + 4 * five; /* d, [m], [qh], qs[16] */
    for (int64_t i = 0; i < nb; i++, blk += bytes) {
        gk_unpack(dtype, blk, buf + 32 * i);
        uint16_t h;
        memcpy(&h, blk, 2);
        s[2 * i] = s[2 * i + 1] = v_half(h);
        if (offset) {
            memcpy(&h, blk + 2, 2);
            m[2 * i] = m[2 * i + 1] = v_half(h);
        }
    }
}

/* Elements [k0, k0 + n) of a row of w (k0 a multiple of 256, n <= 256 whole
 * blocks): the quants of run u (16 elements) into buf + 16u (gk_unpack), its
 * scale into s[u] and, where the type has one, its min or offset into m[u]:
 *   q4_0 q5_0   w = q * d
 *   q4_1 q5_1   w = q * d + m     (d, m: the block's f16 fields)
 *   q4_K q5_K   w = s * q - m     (s = d * scale, m = dmin * min of the sub-block)
 *   q6_K        w = s * q         (s = d * scales[u]) */
GK_INLINE void gk_unpack_span(const mm_src *w, const uint8_t *row, int64_t k0, int64_t n,
                              int8_t *buf, float *s, float *m) {
    const int32_t dtype = w->dtype;
    const uint8_t *blk = row + (k0 / w->block_size) * w->type_size;
    uint16_t hd, hm;
    if (dtype == CART_Q6_K) {
        gk_unpack(dtype, blk, buf);
        memcpy(&hd, blk + 208, 2);
        const float d = v_half(hd);
        for (int u = 0; u < 16; u++) s[u] = d * (float)(int8_t)blk[192 + u];
    } else if (dtype == CART_Q4_K || dtype == CART_Q5_K) {
        gk_unpack(dtype, blk, buf);
        memcpy(&hd, blk, 2);
        memcpy(&hm, blk + 2, 2);
        const float d = v_half(hd), dmin = v_half(hm);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            cart_scale_min_k4(j, blk + 4, &sc, &mn);
            s[2 * j] = s[2 * j + 1] = d * (float)sc;
            m[2 * j] = m[2 * j + 1] = dmin * (float)mn;
        }
    } else if (dtype == CART_Q4_0) { /* a loop per type: the type known in the loop */
        gk_unpack_blocks(CART_Q4_0, blk, n / 32, buf, s, m);
    } else if (dtype == CART_Q4_1) {
        gk_unpack_blocks(CART_Q4_1, blk, n / 32, buf, s, m);
    } else if (dtype == CART_Q5_0) {
        gk_unpack_blocks(CART_Q5_0, blk, n / 32, buf, s, m);
    } else {
        gk_unpack_blocks(CART_Q5_1, blk, n / 32, buf, s, m);
    }
}

/* acc[t] += wv * the 16 activations of token t at x + t * ldx, lane by lane:
 * one row's weights, applied as soon as they are formed, so that only they
 * are live beside the sums. */
GK_INLINE void gk_gemv_apply1(const int T, const vf *wv, const float *x, int64_t ldx,
                              vf acc[8][GK_NA]) {
    for (int t = 0; t < T; t++)
#pragma GCC unroll 16
        for (int a = 0; a < GK_NA; a++)
            acc[t][a] = v_fma(wv[a], v_load(x + t * ldx + a * VW), acc[t][a]);
}

/* Whole rows of a block type of gk_in_registers. q8_0 is read where it lies,
 * a row's block at a time. The others are unpacked 256 elements of each row
 * at a time to bytes in L1 (a quarter of the floats; done in one go, the
 * bytes are stored well before they are read back), then each row's runs of
 * 16 are formed in registers and applied, one pass over the lanes each. */
GK_INLINE void gk_gemv_span_blocks(const int R, const int T, const mm_src *w,
                                   const uint8_t *const *wr, const float *x, int64_t ldx,
                                   vf acc[MM_GEMV_MAXR][8][GK_NA]) {
    const int64_t depth = w->cols;
    if (w->dtype == CART_Q8_0) { /* w = q * d */
        for (int64_t b = 0; b < depth / 32; b++)
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = wr[r] + b * 34;
                uint16_t hd;
                memcpy(&hd, blk, 2);
                const vf d = v_set1(v_half(hd));
                for (int h = 0; h < 2; h++) {
                    vf wv[GK_NA];
#pragma GCC unroll 16
                    for (int a = 0; a < GK_NA; a++)
                        wv[a] = v_mul(v_load_i8((const int8_t *)(blk + 2 + 16 * h + a * VW)), d);
                    gk_gemv_apply1(T, wv, x + 32 * b + 16 * h, ldx, acc[r]);
                }
            }
        return;
    }
    const int plus = w->dtype == CART_Q4_1 || w->dtype == CART_Q5_1;
    const int minus = w->dtype == CART_Q4_K || w->dtype == CART_Q5_K;
    for (int64_t k0 = 0; k0 < depth; k0 += 256) {
        const int64_t n = gk_min(256, depth - k0);
        int8_t buf[MM_GEMV_MAXR][256];
        float s[MM_GEMV_MAXR][16], m[MM_GEMV_MAXR][16];
        for (int r = 0; r < R; r++) gk_unpack_span(w, wr[r], k0, n, buf[r], s[r], m[r]);
        for (int r = 0; r < R; r++)
            for (int64_t u = 0; u < n / 16; u++) {
                const int8_t *q = buf[r] + 16 * u;
                const vf su = v_set1(s[r][u]);
                vf wv[GK_NA];
#pragma GCC unroll 16
                for (int a = 0; a < GK_NA; a++) {
                    wv[a] = v_mul(su, v_load_i8(q + a * VW));
                    if (plus) wv[a] = v_add(wv[a], v_set1(m[r][u]));
                    if (minus) wv[a] = v_sub(wv[a], v_set1(m[r][u]));
                }
                gk_gemv_apply1(T, wv, x + k0 + 16 * u, ldx, acc[r]);
            }
    }
}

/* y[t, j + r] = W[j + r, :] . x[t, :] for r < nr (<= R), t < T; requests
 * the next pf_rows rows (the next tile): float rows a line per row at a
 * time (gk_gemv_span), block rows all at once before the products. */
GK_INLINE void gk_gemv_tile(const int R, const int T, const int kind, const mm_src *w, int64_t j,
                            int64_t nr, int pf_rows, const float *x, int64_t ldx, float *y,
                            int64_t ldy, float *tmp) {
    vf acc[MM_GEMV_MAXR][8][GK_NA];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            for (int a = 0; a < GK_NA; a++) acc[r][t][a] = v_zero();
    const uint8_t *wr[MM_GEMV_MAXR];
    const int64_t depth = w->cols;
    if (kind == MM_W_DEQUANT || kind == GK_GEMV_BLOCKS) { /* block rows: the next tile's all at once */
        const char *p = (const char *)w->data + (uint64_t)(j + R) * w->row_bytes;
        for (uint64_t b = 0; b < (uint64_t)pf_rows * w->row_bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
    }
    if (kind == MM_W_DEQUANT) {
        for (int r = 0; r < R; r++)
            wr[r] = (const uint8_t *)(tmp + gk_min(r, nr - 1) * MM_GEMV_KB);
        for (int64_t k0 = 0; k0 < depth; k0 += MM_GEMV_KB) {
            const int64_t kn = gk_min(MM_GEMV_KB, depth - k0);
            gk_dequant_rows(w, tmp, MM_GEMV_KB, j, nr, k0, kn);
            gk_gemv_span(R, T, MM_W_F32, wr, x + k0, ldx, kn, 0, 0, acc);
        }
    } else {
        for (int r = 0; r < R; r++)
            wr[r] = w->data + (uint64_t)(j + gk_min(r, nr - 1)) * w->row_bytes;
        if (kind == GK_GEMV_BLOCKS)
            gk_gemv_span_blocks(R, T, w, wr, x, ldx, acc);
        else gk_gemv_span(R, T, kind, wr, x, ldx, depth, pf_rows, (uint64_t)R * w->row_bytes, acc);
    }
    for (int r = 0; r < R; r++)
        if (r < nr)
            for (int t = 0; t < T; t++) y[t * ldy + j + r] = gk_tree_gemv(acc[r][t]);
}

GK_INLINE void gk_gemv_pass(const int R, const int T, const int kind, const mm_src *w, int64_t r0,
                            int64_t r1, const float *x, int64_t ldx, float *y, int64_t ldy,
                            float *tmp) {
    for (int64_t j = r0; j < r1; j += R) {
        /* the next tile's rows are requested while this one computes, a
         * line of each at a time (gk_gemv_span): the rows are read once,
         * from DRAM, and more requests in flight is more bandwidth, but
         * the whole tile requested at once stalled on a full miss queue
         * (f16 decode at avx2 on a Zen 3: 10.9-11.4 -> 13.0-13.6 tok/s) */
        const int pf_rows = j + R < r1 ? (int)gk_min(R, r1 - j - R) : 0;
        gk_gemv_tile(R, T, kind, w, j, gk_min(R, r1 - j), pf_rows, x, ldx, y, ldy, tmp);
    }
}

GK_INLINE void gk_gemv_kind(const int kind, const mm_src *w, int64_t r0, int64_t r1,
                            const float *x, int64_t ldx, int64_t nt, float *y, int64_t ldy,
                            float *tmp) {
    switch (nt) {
    case 1:
        gk_gemv_pass(GK_GEMV_R(1), 1, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
#if GK_GEMV_T >= 2
    case 2:
        gk_gemv_pass(GK_GEMV_R(2), 2, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
#endif
#if GK_GEMV_T >= 3
    case 3:
        gk_gemv_pass(GK_GEMV_R(3), 3, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
#endif
#if GK_GEMV_T >= 4
    case 4:
        gk_gemv_pass(GK_GEMV_R(4), 4, kind, w, r0, r1, x, ldx, y, ldy, tmp);
        break;
#endif
    default:
        break;
    }
}

#ifdef GK_BLOCKED_T
/* The blocked GEMV of float weights for batches of 2 GK_BLOCKED_T tokens
 * or more (lockstep decode of many streams), as the avx512 level has it:
 * rows go GK_BG at a time, every pass of GK_BLOCKED_T tokens over a group
 * before the next group, so a row comes from DRAM once however many passes
 * (the next group requested into L2 a row per pass, the next row of this
 * one into L1); the depth goes in blocks of GK_BKL, the activations packed
 * once. A (row, token)'s 16 lane sums wait in `part` between blocks: each
 * lane is the same chain of fused multiply-adds as in gk_gemv_span (the
 * same zero-padded tail), so a stream's bits do not depend on the batch. */
enum { GK_BG = 32, GK_BKL = 256 };

/* xp[pass][step][token][16] = tokens [0, GK_BLOCKED_T * passes) of x,
 * zero past the depth. */
static void gk_gemv_pack(float *xp, const float *x, int64_t ldx, int64_t depth, int64_t passes) {
    const int64_t steps = (depth + 15) / 16, T = GK_BLOCKED_T;
    for (int64_t t = 0; t < T * passes; t++) {
        float *dst = xp + (t / T) * steps * 16 * T + (t % T) * 16;
        for (int64_t s = 0; s < steps; s++) {
            const int64_t kn = gk_min(16, depth - 16 * s);
            memcpy(dst + s * 16 * T, x + t * ldx + 16 * s, (size_t)kn * 4);
            memset(dst + s * 16 * T + kn, 0, (size_t)(16 - kn) * 4);
        }
    }
}

/* acc[t] += lane-wise products of weight row wr and the pass's packed
 * tokens xs over kn elements from k = 0 (a short last step zero-padded as
 * gk_gemv_span pads it). */
GK_INLINE void gk_span_packed(const int kind, const uint8_t *wr, const float *xs, int64_t kn,
                              vf acc[GK_BLOCKED_T][GK_NA]) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    for (int64_t k = 0; k < kn; k += 16, xs += 16 * GK_BLOCKED_T) {
        vf wv[GK_NA];
        if (k + 16 <= kn) {
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++) wv[a] = gk_load_w(kind, wr, k + a * VW);
        } else {
            float wpad[16];
            memset(wpad, 0, sizeof wpad);
            gk_widen(kind, wpad, wr + k * esize, kn - k);
            for (int a = 0; a < GK_NA; a++) wv[a] = v_load(wpad + a * VW);
        }
        for (int t = 0; t < GK_BLOCKED_T; t++)
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++)
                acc[t][a] = v_fma(wv[a], v_load(xs + 16 * t + a * VW), acc[t][a]);
    }
}

/* Rows [r0, r1) for the first GK_BLOCKED_T * passes of n tokens; returns
 * that count (the rest go to gk_gemv_kind). xp: mm_scratch_floats' room. */
GK_INLINE int64_t gk_gemv_blocked(const int kind, const mm_src *w, int64_t r0, int64_t r1, const float *x,
                                  int64_t ldx, int64_t n, float *y, int64_t ldy, float *xp) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2, depth = w->cols, T = GK_BLOCKED_T;
    const int64_t passes = n / T, steps = (depth + 15) / 16;
    gk_gemv_pack(xp, x, ldx, depth, passes);
    vf part[GK_BG][GK_BLOCKED_T][GK_NA];
    for (int64_t g0 = r0; g0 < r1; g0 += GK_BG) {
        const int64_t gn = gk_min(GK_BG, r1 - g0);
        for (int64_t p = 0; p < passes; p++) {
            for (int64_t j = 0; j < gn; j++)
                for (int t = 0; t < GK_BLOCKED_T; t++)
                    for (int a = 0; a < GK_NA; a++) part[j][t][a] = v_zero();
            for (int64_t k0 = 0; k0 < depth; k0 += GK_BKL) {
                const int64_t kn = gk_min(GK_BKL, depth - k0);
                const float *xs = xp + p * steps * 16 * T + (k0 / 16) * 16 * T;
                for (int64_t j = 0; j < gn; j++) {
                    const uint8_t *wr = w->data + (uint64_t)(g0 + j) * w->row_bytes + (uint64_t)(k0 * esize);
                    if (g0 + GK_BG + j < r1 && j % passes == p) /* the next group's row, into L2 */
                        for (int64_t b = 0; b < kn * esize; b += 64)
                            __builtin_prefetch(wr + (uint64_t)GK_BG * w->row_bytes + b, 0, 2);
                    if (j + 1 < gn) /* the next row's piece, into L1 */
                        for (int64_t b = 0; b < kn * esize; b += 64) __builtin_prefetch(wr + w->row_bytes + b, 0, 3);
                    vf acc[GK_BLOCKED_T][GK_NA]; /* in registers: part may alias xs to the compiler */
                    for (int t = 0; t < GK_BLOCKED_T; t++)
                        for (int a = 0; a < GK_NA; a++) acc[t][a] = part[j][t][a];
                    gk_span_packed(kind, wr, xs, kn, acc);
                    for (int t = 0; t < GK_BLOCKED_T; t++)
                        for (int a = 0; a < GK_NA; a++) part[j][t][a] = acc[t][a];
                }
            }
            for (int64_t j = 0; j < gn; j++)
                for (int t = 0; t < GK_BLOCKED_T; t++) y[(T * p + t) * ldy + g0 + j] = gk_tree_gemv(part[j][t]);
        }
    }
    return T * passes;
}
#endif

static void gk_gemv_rows(const mm_src *w, float *y, int64_t ldy, const float *x, int64_t ldx,
                         int64_t n, int64_t r0, int64_t r1, float *scratch) {
    int64_t first = 0;
#ifdef GK_BLOCKED_T
    if (n >= 2 * GK_BLOCKED_T) {
        if (w->kind == MM_W_F16) first = gk_gemv_blocked(MM_W_F16, w, r0, r1, x, ldx, n, y, ldy, scratch);
        else if (w->kind == MM_W_BF16) first = gk_gemv_blocked(MM_W_BF16, w, r0, r1, x, ldx, n, y, ldy, scratch);
        else if (w->kind == MM_W_F32) first = gk_gemv_blocked(MM_W_F32, w, r0, r1, x, ldx, n, y, ldy, scratch);
    }
#endif
    for (int64_t t0 = first; t0 < n; t0 += GK_GEMV_T) {
        const int64_t nt = gk_min(GK_GEMV_T, n - t0);
        const float *xt = x + t0 * ldx;
        float *yt = y + t0 * ldy;
        switch (w->kind) {
        case MM_W_F32:
            gk_gemv_kind(MM_W_F32, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        case MM_W_F16:
            gk_gemv_kind(MM_W_F16, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        case MM_W_BF16:
            gk_gemv_kind(MM_W_BF16, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        default:
            if (gk_in_registers(w->dtype))
                gk_gemv_kind(GK_GEMV_BLOCKS, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            else gk_gemv_kind(MM_W_DEQUANT, w, r0, r1, xt, ldx, nt, yt, ldy, scratch);
            break;
        }
    }
}

/* ---- attention ------------------------------------------------------------ */

GK_INLINE void gk_scores_kind(const int kind, float *score, const float *q, const uint8_t *k,
                              int64_t stride, int32_t head_dim, int64_t nt) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    for (int64_t i = 0; i < nt; i++) {
        const uint8_t *ki = k + (uint64_t)(i * stride * esize);
        vf acc[GK_NA];
        for (int a = 0; a < GK_NA; a++) acc[a] = v_zero();
        for (int32_t d = 0; d < head_dim; d += 16)
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++)
                acc[a] = v_fma(v_load(q + d + a * VW), gk_load_w(kind, ki, d + a * VW), acc[a]);
        score[i] = gk_tree_score(acc);
    }
}

static void gk_scores(float *score, const float *q, const float *k, int64_t stride,
                      int32_t head_dim, int64_t nt) {
    gk_scores_kind(MM_W_F32, score, q, (const uint8_t *)k, stride, head_dim, nt);
}

static void gk_scores_f16(float *score, const float *q, const uint16_t *k, int64_t stride,
                          int32_t head_dim, int64_t nt) {
    gk_scores_kind(MM_W_F16, score, q, (const uint8_t *)k, stride, head_dim, nt);
}

GK_INLINE void gk_values_kind(const int kind, float *acc, const float *p, const uint8_t *v,
                              int64_t stride, int64_t nt, int32_t head_dim) {
    const int64_t esize = kind == MM_W_F32 ? 4 : 2;
    for (int32_t d0 = 0; d0 < head_dim; d0 += 64) { /* 64 outputs in registers at a time */
        const int32_t nd = head_dim - d0 < 64 ? head_dim - d0 : 64, nvec = nd / VW;
        vf a[64 / VW];
        for (int32_t j = 0; j < nvec; j++) a[j] = v_load(acc + d0 + j * VW);
        for (int64_t i = 0; i < nt; i++) {
            const vf b = v_set1(p[i]);
            const uint8_t *vi = v + (uint64_t)(i * stride * esize);
            for (int32_t j = 0; j < nvec; j++)
                a[j] = v_fma(b, gk_load_w(kind, vi, d0 + j * VW), a[j]);
        }
        for (int32_t j = 0; j < nvec; j++) v_store(acc + d0 + j * VW, a[j]);
    }
}

static void gk_values(float *acc, const float *p, const float *v, int64_t stride, int64_t nt,
                      int32_t head_dim) {
    gk_values_kind(MM_W_F32, acc, p, (const uint8_t *)v, stride, nt, head_dim);
}

static void gk_values_f16(float *acc, const float *p, const uint16_t *v, int64_t stride,
                          int64_t nt, int32_t head_dim) {
    gk_values_kind(MM_W_F16, acc, p, (const uint8_t *)v, stride, nt, head_dim);
}

/* Several queries against the same rows, each score, output and row the
 * one-query arithmetic: two queries by two keys share their loads (the
 * chains and trees of gk_scores_kind), two queries' values share a row's
 * loads, and outer_add keeps two rows' outputs in registers across the
 * queries. A leftover query or key runs alone. */
GK_INLINE void gk_scores_2x2(float *score, int64_t ld, const float *const *q, const float *k, int64_t stride,
                             int32_t head_dim) {
    vf acc[2][2][GK_NA];
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 2; i++)
            for (int l = 0; l < GK_NA; l++) acc[a][i][l] = v_zero();
    for (int32_t d = 0; d < head_dim; d += 16)
#pragma GCC unroll 16
        for (int l = 0; l < GK_NA; l++) {
            const vf k0 = v_load(k + d + l * VW), k1 = v_load(k + stride + d + l * VW);
            for (int a = 0; a < 2; a++) {
                const vf qv = v_load(q[a] + d + l * VW);
                acc[a][0][l] = v_fma(qv, k0, acc[a][0][l]);
                acc[a][1][l] = v_fma(qv, k1, acc[a][1][l]);
            }
        }
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 2; i++) score[a * ld + i] = gk_tree_score(acc[a][i]);
}

static void gk_scores_mq(float *score, int64_t ld, const float *const *q, int32_t nq, const float *k,
                         int64_t stride, int32_t head_dim, const int64_t *nt) {
    int32_t a = 0;
    for (; a + 2 <= nq; a += 2) { /* pairs of keys up to the two's most */
        const int64_t n = nt[a] > nt[a + 1] ? nt[a] : nt[a + 1];
        int64_t i = 0;
        for (; i + 2 <= n; i += 2) gk_scores_2x2(score + a * ld + i, ld, q + a, k + i * stride, stride, head_dim);
        for (int32_t b = a; b < a + 2; b++)
            if (nt[b] > i) gk_scores(score + b * ld + i, q[b], k + i * stride, stride, head_dim, nt[b] - i);
    }
    if (a < nq) gk_scores(score + a * ld, q[a], k, stride, head_dim, nt[a]);
}

GK_INLINE void gk_values_2q(float *const *acc, int32_t d0, int32_t nvec, const float *p, int64_t ld, const float *v,
                            int64_t stride, const int64_t *nt) {
    vf a[2][32 / VW];
    for (int b = 0; b < 2; b++)
        for (int32_t j = 0; j < nvec; j++) a[b][j] = v_load(acc[b] + d0 + j * VW);
    const int64_t both = nt[0] < nt[1] ? nt[0] : nt[1], more = nt[0] < nt[1] ? 1 : 0;
    for (int64_t i = 0; i < both; i++) {
        const vf w0 = v_set1(p[i]), w1 = v_set1(p[ld + i]);
        for (int32_t j = 0; j < nvec; j++) {
            const vf x = v_load(v + i * stride + d0 + j * VW);
            a[0][j] = v_fma(w0, x, a[0][j]);
            a[1][j] = v_fma(w1, x, a[1][j]);
        }
    }
    for (int64_t i = both; i < nt[more]; i++) { /* the one with more rows goes on alone */
        const vf w = v_set1(p[more * ld + i]);
        for (int32_t j = 0; j < nvec; j++) a[more][j] = v_fma(w, v_load(v + i * stride + d0 + j * VW), a[more][j]);
    }
    for (int b = 0; b < 2; b++)
        for (int32_t j = 0; j < nvec; j++) v_store(acc[b] + d0 + j * VW, a[b][j]);
}

static void gk_values_mq(float *const *acc, const float *p, int64_t ld, int32_t nq, const float *v,
                         int64_t stride, const int64_t *nt, int32_t head_dim) {
    int32_t a = 0;
    for (; a + 2 <= nq; a += 2)
        for (int32_t d0 = 0; d0 < head_dim; d0 += 32) {
            const int32_t nd = head_dim - d0 < 32 ? head_dim - d0 : 32;
            if (nd == 32) gk_values_2q(acc + a, d0, 32 / VW, p + a * ld, ld, v, stride, nt + a);
            else gk_values_2q(acc + a, d0, nd / VW, p + a * ld, ld, v, stride, nt + a);
        }
    if (a < nq) gk_values(acc[a], p + a * ld, v, stride, nt[a], head_dim);
}

/* Two queries over the same f16 rows: each row's vectors widened once for
 * both, each score the chain and tree of gk_scores_kind. */
GK_INLINE void gk_scores_f16_2q(float *score, int64_t ld, const float *const *q, const uint8_t *k, int64_t stride,
                                int32_t head_dim, int64_t nt) {
    for (int64_t i = 0; i < nt; i++) {
        const uint8_t *ki = k + (uint64_t)(i * stride * 2);
        vf acc[2][GK_NA];
        for (int b = 0; b < 2; b++)
            for (int a = 0; a < GK_NA; a++) acc[b][a] = v_zero();
        for (int32_t d = 0; d < head_dim; d += 16)
#pragma GCC unroll 16
            for (int a = 0; a < GK_NA; a++) {
                const vf kv = gk_load_w(MM_W_F16, ki, d + a * VW);
                acc[0][a] = v_fma(v_load(q[0] + d + a * VW), kv, acc[0][a]);
                acc[1][a] = v_fma(v_load(q[1] + d + a * VW), kv, acc[1][a]);
            }
        score[i] = gk_tree_score(acc[0]);
        score[ld + i] = gk_tree_score(acc[1]);
    }
}

/* 16 rows at a time, each with its share of `next` requested first. */
static void gk_scores_f16_mq(float *score, int64_t ld, const float *const *q, int32_t nq, const uint16_t *k,
                             int64_t stride, int32_t head_dim, int64_t nt, const cart_fetch *next) {
    for (int64_t i = 0; i < nt; i += 16) {
        const int64_t n = nt - i < 16 ? nt - i : 16;
        const uint16_t *ki = k + i * stride;
        fetch_share(next, i, n, nt);
        int32_t a = 0;
        for (; a + 2 <= nq; a += 2)
            gk_scores_f16_2q(score + a * ld + i, ld, q + a, (const uint8_t *)ki, stride, head_dim, n);
        if (a < nq) gk_scores_f16(score + a * ld + i, q[a], ki, stride, head_dim, n);
    }
}

/* Two queries' outputs d0 .. d0 + nvec VW over the same f16 rows: the
 * chains of gk_values_kind, each row vector widened once for both. */
GK_INLINE void gk_values_f16_2q(float *const *acc, int32_t d0, int32_t nvec, const float *p, int64_t ld,
                                const uint8_t *v, int64_t stride, int64_t nt, const cart_fetch *next) {
    vf a[2][32 / VW];
    for (int b = 0; b < 2; b++)
        for (int32_t j = 0; j < nvec; j++) a[b][j] = v_load(acc[b] + d0 + j * VW);
    for (int64_t i = 0; i < nt; i++) {
        fetch_share(next, i, 1, nt);
        const vf w0 = v_set1(p[i]), w1 = v_set1(p[ld + i]);
        const uint8_t *vi = v + (uint64_t)(i * stride * 2);
        for (int32_t j = 0; j < nvec; j++) {
            const vf x = gk_load_w(MM_W_F16, vi, d0 + j * VW);
            a[0][j] = v_fma(w0, x, a[0][j]);
            a[1][j] = v_fma(w1, x, a[1][j]);
        }
    }
    for (int b = 0; b < 2; b++)
        for (int32_t j = 0; j < nvec; j++) v_store(acc[b] + d0 + j * VW, a[b][j]);
}

/* `next` goes out over the first pass's rows, or 16 rows at a time for a
 * lone query (whose chains go on from the stored sums: the same bits). */
static void gk_values_f16_mq(float *const *acc, const float *p, int64_t ld, int32_t nq, const uint16_t *v,
                             int64_t stride, int64_t nt, int32_t head_dim, const cart_fetch *next) {
    int32_t a = 0;
    for (; a + 2 <= nq; a += 2)
        for (int32_t d0 = 0; d0 < head_dim; d0 += 32, next = NULL) {
            const int32_t nd = head_dim - d0 < 32 ? head_dim - d0 : 32;
            if (nd == 32) gk_values_f16_2q(acc + a, d0, 32 / VW, p + a * ld, ld, (const uint8_t *)v, stride, nt, next);
            else gk_values_f16_2q(acc + a, d0, nd / VW, p + a * ld, ld, (const uint8_t *)v, stride, nt, next);
        }
    if (a == nq) return;
    for (int64_t i = 0; i < nt; i += 16) {
        const int64_t n = nt - i < 16 ? nt - i : 16;
        fetch_share(next, i, n, nt);
        gk_values_f16(acc[a], p + a * ld + i, v + i * stride, stride, n, head_dim);
    }
}

GK_INLINE void gk_outer_rows(const int R, float *dst, const float *coef, int64_t ld, const float *const *x,
                             int32_t nq, const int64_t *nt, int64_t j, int32_t d0, int32_t nvec, int32_t head_dim) {
    vf acc[2][32 / VW];
    for (int r = 0; r < R; r++)
        for (int32_t e = 0; e < nvec; e++) acc[r][e] = v_load(dst + (j + r) * head_dim + d0 + e * VW);
    for (int32_t a = 0; a < nq; a++) {
        if (nt[a] <= j) continue; /* query a sees neither row */
        const int both = R > 1 && nt[a] > j + 1;
        const vf c0 = v_set1(coef[a * ld + j]), c1 = v_set1(both ? coef[a * ld + j + 1] : 0.0f);
        for (int32_t e = 0; e < nvec; e++) { /* the product rounded, then the sum */
            const vf xv = v_load(x[a] + d0 + e * VW);
            acc[0][e] = v_add(acc[0][e], v_mul(c0, xv));
            if (both) acc[1][e] = v_add(acc[1][e], v_mul(c1, xv));
        }
    }
    for (int r = 0; r < R; r++)
        for (int32_t e = 0; e < nvec; e++) v_store(dst + (j + r) * head_dim + d0 + e * VW, acc[r][e]);
}

static void gk_outer_one(float *dst, const float *coef, int64_t ld, const float *const *x, int32_t nq, int64_t skip,
                         const int64_t *nt, int32_t head_dim) {
    int64_t most = 0;
    for (int32_t a = 0; a < nq; a++) most = nt[a] > most ? nt[a] : most;
    for (int32_t d0 = 0; d0 < head_dim; d0 += 32) {
        const int32_t nvec = (head_dim - d0 < 32 ? head_dim - d0 : 32) / VW;
        int64_t j = skip;
        if (nvec == 32 / VW) /* a whole slice: a constant count, so the sums stay in registers */
            for (; j + 2 <= most; j += 2) gk_outer_rows(2, dst, coef, ld, x, nq, nt, j, d0, 32 / VW, head_dim);
        for (; j + 2 <= most; j += 2) gk_outer_rows(2, dst, coef, ld, x, nq, nt, j, d0, nvec, head_dim);
        if (j < most) gk_outer_rows(1, dst, coef, ld, x, nq, nt, j, d0, nvec, head_dim);
    }
}

static void gk_outer_add(float *dk, float *dv, const float *ds, const float *p, int64_t ld,
                         const float *const *q, const float *const *dout, int32_t nq, int64_t skip,
                         const int64_t *nt, int32_t head_dim) {
    gk_outer_one(dk, ds, ld, q, nq, skip, nt, head_dim);
    gk_outer_one(dv, p, ld, dout, nq, skip, nt, head_dim);
}

/* ---- e^x ------------------------------------------------------------------ */

#ifndef GK_EXPF_N /* a level without its own: the definition, one element at a time */
static void gk_expf_n(float *y, const float *x, int64_t n) {
    cart_expf_ref_n(y, x, n);
}
#define GK_EXPF_N gk_expf_n
#endif

#ifndef GK_EXP_N /* a level without its own: the C library's exp */
static void gk_exp_n(double *y, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = exp(x[i]);
}
#define GK_EXP_N gk_exp_n
#endif

static void gk_expf_shift_n(float *y, const float *x, int64_t n, float shift) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] - shift;
    GK_EXPF_N(y, y, n);
}

/* The maximum in lanes of 4, then across them (a NaN is never taken). */
static float gk_scale_max(float *s, int64_t n, float scale) {
    float lane[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int32_t l = 0; l < 4; l++) {
            const float v = s[j + l] * scale;
            s[j + l] = v;
            lane[l] = v > lane[l] ? v : lane[l];
        }
    float m = -INFINITY;
    for (; j < n; j++) {
        s[j] *= scale;
        if (s[j] > m) m = s[j];
    }
    for (int32_t l = 0; l < 4; l++)
        if (lane[l] > m) m = lane[l];
    return m;
}

/* ---- the table ------------------------------------------------------------ */

static const cart_kernels gk_table = {
    .isa = GK_ISA,
    .name = GK_NAME,
    .mu = GK_MU,
    .mv = GK_MV,
    .pack_act = gk_pack_act,
    .round_rows = gk_round_rows,
    .forward_rows = gk_forward_rows,
    .backward_cols = gk_backward_cols,
    .gemv_rows = gk_gemv_rows,
    .scores = gk_scores,
    .scores_f16 = gk_scores_f16,
    .values = gk_values,
    .values_f16 = gk_values_f16,
    .scores_mq = gk_scores_mq,
    .values_mq = gk_values_mq,
    .scores_f16_mq = gk_scores_f16_mq,
    .values_f16_mq = gk_values_f16_mq,
    .outer_add = gk_outer_add,
    .expf_n = GK_EXPF_N,
    .expf_shift_n = gk_expf_shift_n,
    .scale_max = gk_scale_max,
    .exp_n = GK_EXP_N,
#ifdef QK_FN
    .qk_groups = QK_FN,
#endif
#ifdef GK_QK_QUANTIZE
    .qk_quantize = GK_QK_QUANTIZE,
#endif
    .f16_to_f32 = gk_f16_to_f32,
    .f32_to_f16 = gk_f32_to_f16,
    .bf16_to_f32 = gk_bf16_to_f32,
    .f32_to_bf16 = gk_f32_to_bf16,
};

const cart_kernels *GK_TABLE(void) {
    return &gk_table;
}
