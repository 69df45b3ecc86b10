/*
 * ops.c - RMSNorm, RoPE, SwiGLU and tiled causal attention (see ops.h).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "dtype.h"
#include "kernels/expf.h"
#include "kernels/kernels.h"
#include "ops.h"

void rmsnorm_forward(float *y, const float *x, const float *w, int64_t rows, int64_t dim,
                     float eps) {
    rmsnorm_forward_keep(y, NULL, x, w, rows, dim, eps);
}

void rope_angles(float *cs, int64_t pos, int32_t n_rot, float base) {
    rope_angles_ff(cs, pos, n_rot, base, NULL);
}

void rope_angles_ff(float *cs, int64_t pos, int32_t n_rot, float base, const float *ff) {
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        float t = ff ? theta / ff[i] : theta;
        cs[2 * i] = cosf(t);
        cs[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

static void rotate(float *x, const float *cs, int32_t n_rot, int32_t neox, float sign) {
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = neox ? i : 2 * i;
        int32_t b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = sign * cs[2 * i + 1];
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void rope_forward(float *x, const float *cs, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                  int32_t neox) {
    for (int32_t h = 0; h < n_heads; h++) rotate(x + (int64_t)h * head_dim, cs, n_rot, neox, 1.0f);
}

void rope_backward(float *dy, const float *cs, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                   int32_t neox) {
    for (int32_t h = 0; h < n_heads; h++)
        rotate(dy + (int64_t)h * head_dim, cs, n_rot, neox, -1.0f);
}

void qk_prepare_forward(float *q, float *k, float *q_rstd, float *k_rstd, const float *q_src,
                        const float *k_src, const float *q_norm, const float *k_norm,
                        const float *cs, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                        int32_t n_rot, int32_t neox, float eps) {
    if (q_norm) {
        rmsnorm_forward_keep(q, q_rstd, q_src, q_norm, n_head, head_dim, eps);
        rmsnorm_forward_keep(k, k_rstd, k_src, k_norm, n_head_kv, head_dim, eps);
    } else {
        if (q != q_src) memcpy(q, q_src, sizeof(float) * (size_t)n_head * (size_t)head_dim);
        if (k != k_src) memcpy(k, k_src, sizeof(float) * (size_t)n_head_kv * (size_t)head_dim);
    }
    rope_forward(q, cs, n_head, head_dim, n_rot, neox);
    rope_forward(k, cs, n_head_kv, head_dim, n_rot, neox);
}

void cart_expf_n(float *y, const float *x, int64_t n) {
    cart_kern()->expf_n(y, x, n);
}

void cart_exp_n(double *y, const double *x, int64_t n) {
    cart_kern()->exp_n(y, x, n);
}

/* e^-x for x[0 .. n), n <= EXP_CHUNK, into e (the level's expf_n). */
enum { EXP_CHUNK = 256 };
static void exp_neg(float *e, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) e[i] = -x[i];
    cart_kern()->expf_n(e, e, n);
}

void swiglu_forward(float *gate, const float *up, int64_t n) {
    float e[EXP_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += EXP_CHUNK) {
        const int64_t m = n - i0 < EXP_CHUNK ? n - i0 : EXP_CHUNK;
        exp_neg(e, gate + i0, m);
        for (int64_t i = 0; i < m; i++) {
            float g = gate[i0 + i];
            gate[i0 + i] = g / (1.0f + e[i]) * up[i0 + i];
        }
    }
}

/* ---- GELU ------------------------------------------------------------------ */

static const float GELU_COEF_A = 0.044715f;
static const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;

float gelu_exact(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

float gelu_exact_grad(float x) {
    /* d/dx 0.5 x (1 + tanh(u)), u = c x (1 + a x^2): 0.5 (1 + t) + 0.5 x (1 - t^2) u' */
    float t = tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x));
    float du = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_COEF_A * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* GGML's table: gelu of every f16 value, rounded to f16, kept widened.
 * GGML's x86 builds contract 1 + a x^2 into a fused multiply-add; with fmaf
 * there all 65,536 entries equal libggml-cpu's ggml_table_gelu_f16 (checked
 * against node-llama-cpp 3.22.1's haswell build). */
static float gelu_table[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) {
        float x = cart_f16_to_f32((uint16_t)i);
        float y = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * fmaf(GELU_COEF_A * x, x, 1.0f)));
        gelu_table[i] = cart_f16_to_f32(cart_f32_to_f16(y));
    }
}

/* gelu(x) as GGML_GELU_FP16 computes it for an f32 x */
static inline float gelu_lookup(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return gelu_table[cart_f32_to_f16(x)];
}

void geglu_forward_table(float *gate, const float *up, int64_t n) {
    pthread_once(&gelu_once, gelu_table_init);
    for (int64_t i = 0; i < n; i++) gate[i] = gelu_lookup(gate[i]) * up[i];
}

void geglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = gelu_exact(gate[i]) * up[i];
}

void geglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                    int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        if (dup) dup[i] += dh[i] * gelu_exact(g);
        dgate[i] += dh[i] * up[i] * gelu_exact_grad(g);
    }
}

void moe_route(int32_t *sel, float *w, float *pr, int32_t n_expert, int32_t k) {
    float max = pr[0];
    for (int32_t e = 1; e < n_expert; e++)
        if (pr[e] > max) max = pr[e];
    double sum = 0.0;
    for (int32_t e = 0; e < n_expert; e++) {
        pr[e] = cart_expf_ref(pr[e] - max);
        sum += (double)pr[e];
    }
    float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < n_expert; e++) pr[e] *= inv;
    int32_t n = 0;
    for (int32_t e = 0; e < n_expert; e++) {
        if (n == k && !(pr[e] > pr[sel[k - 1]])) continue;
        int32_t at = n < k ? n : k - 1;
        while (at > 0 && pr[e] > pr[sel[at - 1]]) {
            sel[at] = sel[at - 1];
            at--;
        }
        sel[at] = e;
        if (n < k) n++;
    }
    float wsum = 0.0f;
    for (int32_t j = 0; j < k; j++) wsum += pr[sel[j]];
    if (wsum < 6.103515625e-5f) wsum = 6.103515625e-5f;
    for (int32_t j = 0; j < k; j++) w[j] = pr[sel[j]] / wsum;
}

void softcap_forward(float *x, int64_t n, float cap) {
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i] * inv) * cap;
}

void softcap_backward(float *dy, const float *y, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) {
        float t = y[i] / cap;
        dy[i] *= 1.0f - t * t;
    }
}

/* ---- attention ----------------------------------------------------------- */

enum { TILE = 64, LANES = 16, MAX_HEAD_DIM = 512, MAX_REP = 16, MAX_QUERIES = CART_ATTN_MAX_QUERIES, MAX_MQ = CART_ATTN_MAX_MQ };
enum { DECODE_HEADS = MAX_QUERIES * MAX_REP }; /* query heads of one decode_f16 call */

/* A dot product with LANES partial sums combined in a fixed order: the
 * compiler vectorizes it without reassociation flags, and the result does not
 * depend on anything but the inputs. */
static float dot(const float *a, const float *b, int32_t n) {
    float part[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int32_t l = 0; l < LANES; l++) part[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    for (int32_t w = LANES / 2; w > 0; w /= 2)
        for (int32_t l = 0; l < w; l++) part[l] += part[l + w];
    return part[0] + tail;
}

/* rows [n, stride] of `dtype` starting at element `offset` of each row ->
 * f32 [n, dim] */
static void load_tile(float *dst, const void *src, int32_t dtype, int64_t first, int64_t n,
                      int64_t stride, int64_t offset, int32_t dim) {
    for (int64_t j = 0; j < n; j++) {
        int64_t at = (first + j) * stride + offset;
        if (dtype == CART_F32) memcpy(dst + j * dim, (const float *)src + at, (size_t)dim * 4);
        else cart_f16_to_f32_n(dst + j * dim, (const uint16_t *)src + at, dim);
    }
}


/* score[i] = q . kt[i] for the keys i < nt of a tile (rows `stride` floats
 * apart). Each score is the same arithmetic whatever the tile, the batch or
 * the level: with head_dim a multiple of 16, the level's kernel (16 lane sums
 * over d, then a fixed tree; kernels.h), else dot() above. */
static void rows_scores(float *score, const float *q, const float *kt, int64_t stride,
                        int32_t head_dim, int64_t nt) {
    if (head_dim % 16 == 0) {
        cart_kern()->scores(score, q, kt, stride, head_dim, nt);
        return;
    }
    for (int64_t i = 0; i < nt; i++) score[i] = dot(q, kt + i * stride, head_dim);
}

static void tile_scores(float *score, const float *q, const float *kt, int32_t head_dim, int64_t nt) {
    rows_scores(score, q, kt, head_dim, head_dim, nt);
}

/* acc[d] += sum over i < nt of p[i] * vt[i][d] (rows `stride` apart), in i
 * order: the level's kernel (one fused chain per output) when head_dim is a
 * multiple of 16, else plain products and sums. */
static void rows_values(float *acc, const float *p, const float *vt, int64_t stride, int64_t nt,
                        int32_t head_dim) {
    if (head_dim % 16 == 0) {
        cart_kern()->values(acc, p, vt, stride, nt, head_dim);
        return;
    }
    for (int64_t i = 0; i < nt; i++) {
        const float *vi = vt + i * stride;
        for (int32_t d = 0; d < head_dim; d++) acc[d] += p[i] * vi[d];
    }
}

static void tile_values(float *acc, const float *p, const float *vt, int64_t nt, int32_t head_dim) {
    rows_values(acc, p, vt, head_dim, nt, head_dim);
}

/* The online softmax of one query over a tile whose scores are in score[0
 * .. nt), up to the sum: scales the scores, rescales out and the running
 * sum to the new running maximum, and leaves e^(score - max) in score
 * (the level's scale_max and expf_shift_n: a maximum is the same whatever
 * the order, kernels.h). */
static void softmax_exp(float *score, int64_t nt, float scale, float *run_max, float *run_sum, float *out,
                        int32_t head_dim) {
    const cart_kernels *kern = cart_kern();
    const float tile_max = kern->scale_max(score, nt, scale);
    float new_max = tile_max > *run_max ? tile_max : *run_max;
    float correction = cart_expf_ref(*run_max - new_max);
    *run_sum *= correction;
    for (int32_t d = 0; d < head_dim; d++) out[d] *= correction;
    kern->expf_shift_n(score, score, nt, new_max);
    *run_max = new_max;
}

/* attention_head_forward's steps between the scores and the values for one
 * query: softmax_exp, then the weights added to the running sum in order,
 * leaving them in score. */
static void softmax_tile(float *score, int64_t nt, float scale, float *run_max, float *run_sum, float *out,
                         int32_t head_dim) {
    softmax_exp(score, nt, scale, run_max, run_sum, out, head_dim);
    for (int64_t j = 0; j < nt; j++) *run_sum += score[j];
}

/* A run of query heads over the same rows [lo, lo + nt) of a tile: scores,
 * online softmax, values, each head the arithmetic of its own pass.
 * slot[i] indexes run_max and run_sum. */
typedef struct head_run {
    int32_t m;
    int64_t lo, nt[MAX_MQ];
    const float *q[MAX_MQ];
    float *acc[MAX_MQ];
    int32_t slot[MAX_MQ];
} head_run;

/* The run over the tile whose rows are k and v, `stride` floats apart. */
static void head_run_flush(head_run *hr, const float *k, const float *v, int64_t stride, int32_t head_dim,
                           float scale, float *run_max, float *run_sum) {
    if (!hr->m) return;
    const cart_kernels *kern = cart_kern();
    float score[MAX_MQ * TILE];
    k += hr->lo * stride, v += hr->lo * stride;
    kern->scores_mq(score, TILE, hr->q, hr->m, k, stride, head_dim, hr->nt);
    float sum[MAX_MQ];
    int64_t fewest = TILE;
    for (int32_t i = 0; i < hr->m; i++) {
        softmax_exp(score + i * TILE, hr->nt[i], scale, run_max + hr->slot[i], run_sum + hr->slot[i], hr->acc[i],
                    head_dim);
        sum[i] = run_sum[hr->slot[i]];
        if (hr->nt[i] < fewest) fewest = hr->nt[i];
    }
    /* each head's sum in its own order (softmax_tile's), the heads side by
     * side so that their chains of adds overlap */
    for (int64_t j = 0; j < fewest; j++)
        for (int32_t i = 0; i < hr->m; i++) sum[i] += score[i * TILE + j];
    for (int32_t i = 0; i < hr->m; i++) {
        for (int64_t j = fewest; j < hr->nt[i]; j++) sum[i] += score[i * TILE + j];
        run_sum[hr->slot[i]] = sum[i];
    }
    kern->values_mq(hr->acc, score, TILE, hr->m, v, stride, hr->nt, head_dim);
    hr->m = 0;
}

/* Adds a head over rows [lo, lo + nt) to the run, first running the run
 * when it starts at another row or is full. */
static void head_run_add(head_run *hr, const float *q, float *acc, int32_t slot, int64_t lo, int64_t nt,
                         const float *k, const float *v, int64_t stride, int32_t head_dim, float scale,
                         float *run_max, float *run_sum) {
    if (hr->m && (hr->m == MAX_MQ || lo != hr->lo))
        head_run_flush(hr, k, v, stride, head_dim, scale, run_max, run_sum);
    hr->lo = lo, hr->nt[hr->m] = nt;
    hr->q[hr->m] = q, hr->acc[hr->m] = acc, hr->slot[hr->m++] = slot;
}

/* The query heads of a block that see the converted tile at t0 (kt, vt: f32
 * rows head_dim apart), in runs of heads over the same rows. run_max and
 * run_sum are [MAX_QUERIES][MAX_REP]. */
static void tile_forward_mq(float *out, const float *q, int64_t q_stride, int32_t nq, int32_t g,
                            int32_t n_rep, const int64_t *first, int64_t n_ctx0, int64_t t0, const float *kt,
                            const float *vt, int32_t head_dim, float scale, float *run_max, float *run_sum) {
    head_run hr;
    hr.m = 0;
    for (int32_t j = 0; j < nq; j++) {
        int64_t n_ctx = n_ctx0 + j; /* query j sees rows first[j] .. n_ctx - 1 */
        if (n_ctx <= t0 || first[j] >= t0 + TILE) continue;
        int64_t lo = first[j] > t0 ? first[j] - t0 : 0;
        int64_t nt = (n_ctx - t0 < TILE ? n_ctx - t0 : TILE) - lo;
        for (int32_t r = 0; r < n_rep; r++) {
            int64_t at = j * q_stride + ((int64_t)g * n_rep + r) * head_dim;
            head_run_add(&hr, q + at, out + at, j * MAX_REP + r, lo, nt, kt, vt, head_dim, head_dim, scale, run_max,
                         run_sum);
        }
    }
    head_run_flush(&hr, kt, vt, head_dim, head_dim, scale, run_max, run_sum);
}

/* Reads one byte of each cache line of rows [r0, r0 + n) (width halves
 * each, rows stride halves apart): a decode step's tile, read whole and in
 * order, so that the hardware's stream prefetch brings it into L2 before
 * its heads read it slice by slice. */
static void touch_rows(const void *p, int64_t r0, int64_t n, int64_t stride, int64_t width) {
    for (int64_t r = r0; r < r0 + n; r++) {
        const volatile char *row = (const volatile char *)p + 2 * r * stride;
        for (int64_t b = 0; b < 2 * width; b += 64) (void)row[b];
    }
}

/* The request decode_f16 sends for kv head g's share of the next tile
 * (rows [t1, t1 + nt1)): its rows [nt1 g / n, nt1 (g + 1) / n), every
 * head's columns, so that the heads' shares together are the tile, each in
 * address order. NULL when the share is empty. */
static const cart_fetch *next_share(cart_fetch *f, const void *rows, int64_t t1, int64_t nt1, int32_t g, int32_t n,
                                    int64_t stride, int32_t head_dim) {
    const int64_t a = nt1 * g / n, b = nt1 * (g + 1) / n;
    if (b <= a) return NULL;
    *f = (cart_fetch){.base = (const char *)rows + 2 * (t1 + a) * stride, .pitch = 2 * stride,
                      .rows = (int32_t)(b - a), .lines = (int32_t)((2 * (int64_t)n * head_dim + 63) / 64)};
    return f;
}

/* One query over an f16 cache (head_dim a multiple of 16), read where the
 * rows are: tiles outer, the kv heads [0, n_head_kv) inner. The first tile
 * is read whole and in order (touch_rows), so that the hardware's stream
 * prefetch brings it into L2 before its heads read it slice by slice; each
 * later tile is requested into L2 while the one before it computes (each kv
 * head's kernels send their share, spread over their rows: next_share). A
 * head at a time over the whole cache read 256-byte slices at a 2 KiB
 * stride, which the hardware prefetchers serve slowly, and requests in
 * bursts or per head slice were slower than the whole-tile reads; the
 * spread requests in address order overlap the reads with the arithmetic
 * (16 streams x 28 layers after 900 cached tokens, 2 threads, the
 * attention alone: 89-90 -> 79-80 ms per step at avx512; one stream after
 * 4096: 35.5 -> 32.1 ms). A kv head's query heads go through the multi-query f16
 * kernels together, which widen each row vector once for all of them (93
 * -> 88 ms at avx512, 110 -> 97 at avx2 in the first case). Each head's
 * tiles, scores, softmax and values are those of attention_forward's other
 * paths: the same bits. */
static void decode_f16(float *out, const float *q, const void *k, const void *v, int64_t first, int64_t n_ctx,
                       int64_t stride, int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale) {
    const cart_kernels *kern = cart_kern();
    const int32_t n_rep = n_head / n_head_kv;
    float score[MAX_REP * TILE], run_max[DECODE_HEADS], run_sum[DECODE_HEADS];
    memset(out, 0, sizeof(float) * (size_t)n_head * (size_t)head_dim);
    for (int32_t h = 0; h < n_head; h++) run_max[h] = -INFINITY, run_sum[h] = 0.0f;
    const int64_t tile0 = first / TILE * TILE;
    for (int64_t t0 = tile0; t0 < n_ctx; t0 += TILE) {
        const int64_t lo = first > t0 ? first - t0 : 0;
        const int64_t nt = (n_ctx - t0 < TILE ? n_ctx - t0 : TILE) - lo;
        const int64_t t1 = t0 + TILE, nt1 = n_ctx - t1 < TILE ? n_ctx - t1 : TILE;
        if (t0 == tile0) {
            touch_rows(k, t0 + lo, nt, stride, (int64_t)n_head_kv * head_dim);
            touch_rows(v, t0 + lo, nt, stride, (int64_t)n_head_kv * head_dim);
        }
        for (int32_t g = 0; g < n_head_kv; g++) {
            const uint16_t *kh = (const uint16_t *)k + (t0 + lo) * stride + (int64_t)g * head_dim;
            const uint16_t *vh = (const uint16_t *)v + (t0 + lo) * stride + (int64_t)g * head_dim;
            const float *qg[MAX_REP];
            float *acc[MAX_REP];
            for (int32_t r = 0; r < n_rep; r++) {
                qg[r] = q + (int64_t)(g * n_rep + r) * head_dim;
                acc[r] = out + (int64_t)(g * n_rep + r) * head_dim;
            }
            cart_fetch fk, fv;
            kern->scores_f16_mq(score, TILE, qg, n_rep, kh, stride, head_dim, nt,
                                next_share(&fk, k, t1, nt1, g, n_head_kv, stride, head_dim));
            for (int32_t r = 0; r < n_rep; r++) {
                const int32_t h = g * n_rep + r;
                softmax_tile(score + r * TILE, nt, scale, &run_max[h], &run_sum[h], acc[r], head_dim);
            }
            kern->values_f16_mq(acc, score, TILE, n_rep, vh, stride, nt, head_dim,
                                next_share(&fv, v, t1, nt1, g, n_head_kv, stride, head_dim));
        }
    }
    for (int32_t h = 0; h < n_head; h++) {
        const float inv = 1.0f / run_sum[h];
        for (int32_t d = 0; d < head_dim; d++) out[(int64_t)h * head_dim + d] *= inv;
    }
}

void attention_forward(float *out, const float *q, int64_t q_stride, int32_t nq, const void *k,
                       const void *v, int32_t dtype, int64_t n_ctx0, int64_t window, int64_t stride,
                       int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale) {
    const int32_t n_rep = n_head / n_head_kv;
    if (nq == 1 && dtype == CART_F16 && head_dim % 16 == 0) { /* decode: kv heads in passes of DECODE_HEADS queries */
        const int32_t per = DECODE_HEADS / n_rep;
        const int64_t first = window > 0 && n_ctx0 > window ? n_ctx0 - window : 0;
        for (int32_t g = 0; g < n_head_kv; g += per) {
            const int32_t n_kv = n_head_kv - g < per ? n_head_kv - g : per;
            const int64_t at = (int64_t)g * n_rep * head_dim;
            decode_f16(out + at, q + at, (const uint16_t *)k + (int64_t)g * head_dim,
                       (const uint16_t *)v + (int64_t)g * head_dim, first, n_ctx0, stride, n_kv * n_rep, n_kv,
                       head_dim, scale);
        }
        return;
    }
    /* the tile's keys and values converted to f32, [TILE][head_dim] each */
    float kt[TILE * MAX_HEAD_DIM], vt[TILE * MAX_HEAD_DIM];
    float score[TILE];
    float run_max[MAX_QUERIES][MAX_REP], run_sum[MAX_QUERIES][MAX_REP];
    const int64_t n_ctx_last = n_ctx0 + nq - 1;
    /* the first row each query sees; tiles start at the multiple of TILE at
     * or below the block's first */
    int64_t first[MAX_QUERIES];
    for (int32_t j = 0; j < nq; j++)
        first[j] = window > 0 && n_ctx0 + j > window ? n_ctx0 + j - window : 0;
    const int64_t tile0 = first[0] / TILE * TILE;

    for (int32_t g = 0; g < n_head_kv; g++) {
        for (int32_t j = 0; j < nq; j++) {
            memset(out + j * q_stride + (int64_t)g * n_rep * head_dim, 0,
                   sizeof(float) * (size_t)n_rep * (size_t)head_dim);
            for (int32_t r = 0; r < n_rep; r++) {
                run_max[j][r] = -INFINITY;
                run_sum[j][r] = 0.0f;
            }
        }
        for (int64_t t0 = tile0; t0 < n_ctx_last; t0 += TILE) {
            int64_t nt_all = n_ctx_last - t0 < TILE ? n_ctx_last - t0 : TILE;
            load_tile(kt, k, dtype, t0, nt_all, stride, (int64_t)g * head_dim, head_dim);
            load_tile(vt, v, dtype, t0, nt_all, stride, (int64_t)g * head_dim, head_dim);
            if (head_dim % 16 == 0) {
                tile_forward_mq(out, q, q_stride, nq, g, n_rep, first, n_ctx0, t0, kt, vt, head_dim, scale,
                                &run_max[0][0], &run_sum[0][0]);
                continue;
            }
            for (int32_t j = 0; j < nq; j++) {
                int64_t n_ctx = n_ctx0 + j; /* query j sees rows first[j] .. n_ctx - 1 */
                if (n_ctx <= t0 || first[j] >= t0 + TILE) continue;
                int64_t lo = first[j] > t0 ? first[j] - t0 : 0;
                int64_t nt = (n_ctx - t0 < TILE ? n_ctx - t0 : TILE) - lo;
                for (int32_t r = 0; r < n_rep; r++) {
                    const float *qh = q + j * q_stride + ((int64_t)g * n_rep + r) * head_dim;
                    float *acc_h = out + j * q_stride + ((int64_t)g * n_rep + r) * head_dim;
                    tile_scores(score, qh, kt + lo * head_dim, head_dim, nt);
                    softmax_tile(score, nt, scale, &run_max[j][r], &run_sum[j][r], acc_h, head_dim);
                    tile_values(acc_h, score, vt + lo * head_dim, nt, head_dim);
                }
            }
        }
        for (int32_t j = 0; j < nq; j++)
            for (int32_t r = 0; r < n_rep; r++) {
                float inv = 1.0f / run_sum[j][r];
                float *acc_h = out + j * q_stride + ((int64_t)g * n_rep + r) * head_dim;
                for (int32_t d = 0; d < head_dim; d++) acc_h[d] *= inv;
            }
    }
}

/* ---- training kernels ----------------------------------------------------- */

enum { NORM_ROWS = 8 }; /* rows whose sums run side by side */

/* s[r] += the sum over i of x[r][i]^2 (rows dim apart), or of dy[r][i] w[i]
 * x[r][i] with DY, for rows r < n <= NORM_ROWS: each row's sum in double
 * and in index order, as a loop over that row alone adds it (the same
 * bits), the rows' chains of adds overlapping. n and DY are constants
 * where it matters (row_sums). */
static inline void row_sums_of(const int64_t n, const int DY, double *s, const float *x, const float *dy,
                               const float *w, int64_t dim) {
    for (int64_t i = 0; i < dim; i++)
        for (int64_t r = 0; r < n; r++) {
            const int64_t at = r * dim + i;
            s[r] += DY ? (double)dy[at] * (w ? w[i] : 1.0f) * x[at] : (double)(x[at] * x[at]);
        }
}

/* sum[r] for rows r < n <= NORM_ROWS (row_sums_of; dy NULL for squares). */
static void row_sums(double *sum, const float *x, const float *dy, const float *w, int64_t n, int64_t dim) {
    double s[NORM_ROWS] = {0};
    if (n == NORM_ROWS && !dy) row_sums_of(NORM_ROWS, 0, s, x, dy, w, dim);
    else if (n == NORM_ROWS) row_sums_of(NORM_ROWS, 1, s, x, dy, w, dim);
    else row_sums_of(n, dy != NULL, s, x, dy, w, dim);
    for (int64_t r = 0; r < n; r++) sum[r] = s[r];
}

void rmsnorm_forward_keep(float *y, float *rstd, const float *x, const float *w, int64_t rows,
                          int64_t dim, float eps) {
    double sum[NORM_ROWS];
    for (int64_t r0 = 0; r0 < rows; r0 += NORM_ROWS) {
        const int64_t n = rows - r0 < NORM_ROWS ? rows - r0 : NORM_ROWS;
        row_sums(sum, x + r0 * dim, NULL, NULL, n, dim);
        for (int64_t r = r0; r < r0 + n; r++) {
            const float *xr = x + r * dim;
            float *yr = y + r * dim;
            float mean = (float)(sum[r - r0] / (double)dim);
            float scale = 1.0f / sqrtf(mean + eps);
            if (rstd) rstd[r] = scale;
            if (w)
                for (int64_t i = 0; i < dim; i++) yr[i] = xr[i] * scale * w[i];
            else
                for (int64_t i = 0; i < dim; i++) yr[i] = xr[i] * scale;
        }
    }
}

void rmsnorm_backward(float *dx, const float *dy, const float *x, const float *rstd,
                      const float *w, int64_t rows, int64_t dim) {
    double dot[NORM_ROWS];
    for (int64_t r0 = 0; r0 < rows; r0 += NORM_ROWS) {
        const int64_t n = rows - r0 < NORM_ROWS ? rows - r0 : NORM_ROWS;
        row_sums(dot, x + r0 * dim, dy + r0 * dim, w, n, dim);
        for (int64_t r = r0; r < r0 + n; r++) {
            const float *dyr = dy + r * dim, *xr = x + r * dim;
            float *dxr = dx + r * dim;
            float s = rstd[r];
            float coef = (float)(dot[r - r0] * (double)s * s * s / (double)dim);
            for (int64_t i = 0; i < dim; i++) dxr[i] += s * dyr[i] * (w ? w[i] : 1.0f) - coef * xr[i];
        }
    }
}

void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                     int64_t n) {
    float e[EXP_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += EXP_CHUNK) {
        const int64_t m = n - i0 < EXP_CHUNK ? n - i0 : EXP_CHUNK;
        exp_neg(e, gate + i0, m);
        for (int64_t j = 0; j < m; j++) {
            const int64_t i = i0 + j;
            float g = gate[i], sig = 1.0f / (1.0f + e[j]);
            dup[i] += dh[i] * g * sig;
            dgate[i] += dh[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
        }
    }
}

static void axpy(float *y, float a, const float *x, int32_t n) {
    for (int32_t i = 0; i < n; i++) y[i] += a * x[i];
}

void attention_head_forward(float *out, float *lse, const float *q, const float *ka,
                            const float *va, int64_t na, int64_t stride_a, const float *kb,
                            const float *vb, int64_t nb, int64_t stride_b, int32_t head_dim,
                            float scale) {
    float score[TILE];
    float run_max = -INFINITY, run_sum = 0.0f;
    memset(out, 0, sizeof(float) * (size_t)head_dim);
    for (int32_t block = 0; block < 2; block++) {
        const float *k = block ? kb : ka, *v = block ? vb : va;
        int64_t n = block ? nb : na, stride = block ? stride_b : stride_a;
        for (int64_t t0 = 0; t0 < n; t0 += TILE) {
            int64_t nt = n - t0 < TILE ? n - t0 : TILE;
            rows_scores(score, q, k + t0 * stride, stride, head_dim, nt);
            float tile_max = -INFINITY;
            for (int64_t j = 0; j < nt; j++) {
                score[j] *= scale;
                if (score[j] > tile_max) tile_max = score[j];
            }
            float new_max = tile_max > run_max ? tile_max : run_max;
            float correction = cart_expf_ref(run_max - new_max);
            run_sum *= correction;
            for (int32_t d = 0; d < head_dim; d++) out[d] *= correction;
            for (int64_t j = 0; j < nt; j++) score[j] -= new_max;
            cart_kern()->expf_n(score, score, nt);
            for (int64_t j = 0; j < nt; j++) run_sum += score[j];
            rows_values(out, score, v + t0 * stride, stride, nt, head_dim);
            run_max = new_max;
        }
    }
    float inv = 1.0f / run_sum;
    for (int32_t d = 0; d < head_dim; d++) out[d] *= inv;
    *lse = run_max + logf(run_sum);
}

void attention_heads_forward(float *const *out, float *const *lse, const float *const *q, int32_t nq,
                             const float *ka, const float *va, int64_t na, int64_t stride_a,
                             const float *kb, const float *vb, const int64_t *nb, int64_t stride_b,
                             int32_t head_dim, float scale) {
    if (head_dim % 16 != 0) {
        for (int32_t a = 0; a < nq; a++)
            attention_head_forward(out[a], lse[a], q[a], ka, va, na, stride_a, kb, vb, nb[a], stride_b,
                                   head_dim, scale);
        return;
    }
    if (nq > MAX_MQ) { /* in groups: each head is its own arithmetic anyway */
        for (int32_t a = 0; a < nq; a += MAX_MQ)
            attention_heads_forward(out + a, lse + a, q + a, nq - a < MAX_MQ ? nq - a : MAX_MQ, ka, va, na, stride_a,
                                    kb, vb, nb + a, stride_b, head_dim, scale);
        return;
    }
    float run_max[MAX_MQ], run_sum[MAX_MQ];
    int64_t n_max = 0;
    for (int32_t a = 0; a < nq; a++) {
        memset(out[a], 0, sizeof(float) * (size_t)head_dim);
        run_max[a] = -INFINITY, run_sum[a] = 0.0f;
        if (nb[a] > n_max) n_max = nb[a];
    }
    head_run hr;
    hr.m = 0;
    for (int32_t block = 0; block < 2; block++) {
        const float *k = block ? kb : ka, *v = block ? vb : va;
        int64_t n = block ? n_max : na, stride = block ? stride_b : stride_a;
        for (int64_t t0 = 0; t0 < n; t0 += TILE) { /* each query over its own rows of the tile */
            const float *kt = k + t0 * stride, *vt = v + t0 * stride;
            for (int32_t a = 0; a < nq; a++) {
                int64_t rows = block ? nb[a] : na, nt = rows - t0 < TILE ? rows - t0 : TILE;
                if (nt > 0) head_run_add(&hr, q[a], out[a], a, 0, nt, kt, vt, stride, head_dim, scale, run_max, run_sum);
            }
            head_run_flush(&hr, kt, vt, stride, head_dim, scale, run_max, run_sum);
        }
    }
    for (int32_t a = 0; a < nq; a++) {
        float inv = 1.0f / run_sum[a];
        for (int32_t d = 0; d < head_dim; d++) out[a][d] *= inv;
        *lse[a] = run_max[a] + logf(run_sum[a]);
    }
}

/* The attention backward's probabilities and score gradients over a tile
 * from the scores (in p) and dout . v (in ds): p = e^(s scale - lse), ds =
 * p (ds - delta) scale. */
static void probs(float *p, float *ds, int64_t nt, float scale, float lse, float delta) {
    for (int64_t j = 0; j < nt; j++) p[j] = p[j] * scale - lse;
    cart_kern()->expf_n(p, p, nt);
    for (int64_t j = 0; j < nt; j++) ds[j] = p[j] * (ds[j] - delta) * scale;
}

void attention_head_backward(float *dq, float *dka, float *dva, int64_t skip_a, float *dkb,
                             float *dvb, const float *dout, const float *out, float lse,
                             const float *q, const float *ka, const float *va, int64_t na,
                             int64_t stride_a, const float *kb, const float *vb, int64_t nb,
                             int64_t stride_b, int32_t head_dim, float scale) {
    /* p_j = exp(s_j - lse); dv_j += p_j dout; ds_j = p_j (dout.v_j - dout.out);
     * dq += ds_j scale k_j; dk_j += ds_j scale q -- a tile of rows at a time */
    float p[TILE], ds[TILE];
    float delta = dot(dout, out, head_dim);
    for (int32_t block = 0; block < 2; block++) {
        const float *k = block ? kb : ka, *v = block ? vb : va;
        float *dk = block ? dkb : dka, *dv = block ? dvb : dva;
        int64_t n = block ? nb : na, stride = block ? stride_b : stride_a;
        int64_t first = block ? 0 : skip_a;
        for (int64_t t0 = 0; t0 < n; t0 += TILE) {
            int64_t nt = n - t0 < TILE ? n - t0 : TILE;
            rows_scores(p, q, k + t0 * stride, stride, head_dim, nt);
            rows_scores(ds, dout, v + t0 * stride, stride, head_dim, nt);
            probs(p, ds, nt, scale, lse, delta);
            rows_values(dq, ds, k + t0 * stride, stride, nt, head_dim);
            if (!dk) continue;
            for (int64_t j = 0; j < nt; j++) {
                if (t0 + j < first) continue;
                axpy(dk + (t0 + j) * stride, ds[j], q, head_dim);
                axpy(dv + (t0 + j) * stride, p[j], dout, head_dim);
            }
        }
    }
}

void attention_tile_backward(float *dq, float *dkt, float *dvt, int64_t skip, const float *dout,
                             float delta, float lse, const float *q, const float *k,
                             const float *v, int64_t stride, int64_t nt, int32_t head_dim,
                             float scale) {
    float p[TILE], ds[TILE];
    rows_scores(p, q, k, stride, head_dim, nt);
    rows_scores(ds, dout, v, stride, head_dim, nt);
    probs(p, ds, nt, scale, lse, delta);
    rows_values(dq, ds, k, stride, nt, head_dim);
    if (!dkt) return;
    if (head_dim % 16 == 0) {
        cart_kern()->outer_add(dkt, dvt, ds, p, TILE, &q, &dout, 1, skip, &nt, head_dim);
        return;
    }
    for (int64_t j = skip; j < nt; j++) {
        axpy(dkt + j * head_dim, ds[j], q, head_dim);
        axpy(dvt + j * head_dim, p[j], dout, head_dim);
    }
}

void attention_tiles_backward(float *const *dq, float *dkt, float *dvt, int64_t skip,
                              const float *const *dout, const float *delta, const float *lse,
                              const float *const *q, const float *k, const float *v, int64_t stride,
                              const int64_t *nt, int32_t nq, int32_t head_dim, float scale) {
    if (head_dim % 16 != 0 || nq > MAX_MQ) {
        for (int32_t a = 0; a < nq; a++)
            attention_tile_backward(dq[a], dkt, dvt, skip, dout[a], delta[a], lse[a], q[a], k, v, stride,
                                    nt[a], head_dim, scale);
        return;
    }
    float p[MAX_MQ * TILE], ds[MAX_MQ * TILE];
    const cart_kernels *kern = cart_kern();
    kern->scores_mq(p, TILE, q, nq, k, stride, head_dim, nt);
    kern->scores_mq(ds, TILE, dout, nq, v, stride, head_dim, nt);
    for (int32_t a = 0; a < nq; a++) probs(p + a * TILE, ds + a * TILE, nt[a], scale, lse[a], delta[a]);
    kern->values_mq(dq, ds, TILE, nq, k, stride, nt, head_dim);
    if (dkt) kern->outer_add(dkt, dvt, ds, p, TILE, q, dout, nq, skip, nt, head_dim);
}

float attention_delta(const float *dout, const float *out, int32_t head_dim) {
    return dot(dout, out, head_dim);
}
