/*
 * compact.h - KV compaction: n cached rows of one KV head made p rows that
 * attend like them, in a second and without training. The untrained
 * baselines a cartridge is measured against (recipes/compare.lua) and a
 * start for self-study (selfstudy.lua --init evict|compact).
 *
 * Given reference queries (the queries the cache will meet, or a stand-in
 * for them: lua/cartridge/compact.lua takes the model re-reading the
 * document after it) and the head's keys K and values V:
 *
 *   A = softmax(scale * Q K^T)        [m, n], each query over the n rows
 *   w_j = sum_i A[i, j]               the attention row j receives
 *
 * The p rows kept are the first keep_first (the sink: BOS, the template's
 * opening) and then the p - keep_first others with the largest w, in
 * position order. What they hold:
 *
 * - eviction (fit_values 0, SnapKV/H2O-style): the kept rows' own keys and
 *   values; the rest are dropped;
 * - attention matching (fit_values 1; Zweiger et al., "Fast KV Compaction
 *   via Attention Matching"): the kept keys, and values fitted by least
 *   squares so that each query's attention output over the p rows matches
 *   its output over all n:  B = softmax(scale * Q K_p^T) [m, p],
 *   Y = A V [m, D],  V_p = argmin |B V_p - Y|^2 + lambda |V_p|^2,
 *   lambda = ridge * trace(B^T B) / p, solved in double by Cholesky.
 *
 * The method's per-row attention bias (which also matches the mass the
 * prefix takes from the tokens after it) has no place in the engine's
 * caches, so it is left out: the outputs are matched as a share of the
 * prefix's attention only.
 *
 * Everything is in double where it sums; the result is the same on every
 * ISA level (no SIMD kernels here: n x m x D per head is small).
 */
#ifndef CART_COMPACT_H
#define CART_COMPACT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t p;          /* rows to keep, 1 <= p <= n */
    int64_t keep_first; /* rows 0 .. keep_first - 1 are always kept, 0 <= keep_first <= p */
    int32_t fit_values; /* 0: eviction (the kept rows' values); 1: attention matching */
    double ridge;       /* fit_values: the Tikhonov term's weight (1e-3 is a fair start) */
} cart_compact_options;

/* Compacts one KV head. q: m query rows, each `rep` heads of head_dim floats
 * one after the other (a GQA group: query row i, head r at q + i * q_ld +
 * r * head_dim), all m * rep of them reference queries. k, v: n rows of
 * head_dim floats, kv_ld apart (the head's slice of a cache's rows).
 * Writes idx[0 .. p-1] (the kept rows, ascending) and v_out (p rows,
 * v_ld apart: the kept values, or the fitted ones). err, when not NULL,
 * receives the relative error of the compacted head's attention outputs,
 * |B V_p - A V|_F / |A V|_F over the reference queries.
 * CART_E_ARG for a bad shape or option, CART_E_NOMEM. */
int cart_compact_head(const float *q, int64_t m, int32_t rep, int64_t q_ld, const float *k, const float *v,
                      int64_t n, int64_t kv_ld, int32_t head_dim, float scale, const cart_compact_options *o,
                      int64_t *idx, float *v_out, int64_t v_ld, double *err);

#ifdef __cplusplus
}
#endif

#endif
