/* compact.c - KV compaction of one head: eviction and attention matching (compact.h). */
#include "compact.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Row i of a [rows, n] matrix of softmax(scale * q_i . k_j) over the keys
 * listed in `keys` (NULL: keys 0..n-1), in double. */
static void softmax_scores(double *a, const float *qi, const float *k, int64_t kv_ld, const int64_t *keys,
                           int64_t n, int32_t D, float scale) {
    double max = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const float *kj = k + (keys ? keys[j] : j) * kv_ld;
        double s = 0;
        for (int32_t d = 0; d < D; d++) s += (double)qi[d] * kj[d];
        a[j] = s * scale;
        if (a[j] > max) max = a[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) sum += (a[j] = exp(a[j] - max));
    for (int64_t j = 0; j < n; j++) a[j] /= sum;
}

/* Query row r of the m * rep reference rows: row r / rep, head r % rep. */
static const float *query_row(const float *q, int64_t r, int32_t rep, int64_t q_ld, int32_t D) {
    return q + (r / rep) * q_ld + (r % rep) * (int64_t)D;
}

/* The kept rows: 0..keep_first-1, then the largest weights (ties: the
 * earlier row), in ascending order. */
static void select_rows(int64_t *idx, const double *w, int64_t n, int64_t p, int64_t keep_first, char *taken) {
    memset(taken, 0, (size_t)n);
    for (int64_t j = 0; j < keep_first; j++) taken[j] = 1;
    for (int64_t r = keep_first; r < p; r++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!taken[j] && (best < 0 || w[j] > w[best])) best = j;
        if (best < 0) break;
        taken[best] = 1;
    }
    for (int64_t j = 0, r = 0; j < n; j++)
        if (taken[j]) idx[r++] = j;
}

/* Solves (G + lambda I) X = R in place (X over R), G [p, p] symmetric
 * positive semi-definite, R [p, D], by Cholesky. Nonzero when G + lambda I
 * is not positive definite. */
static int cholesky_solve(double *G, double *R, int64_t p, int32_t D, double lambda) {
    for (int64_t i = 0; i < p; i++) G[i * p + i] += lambda;
    for (int64_t j = 0; j < p; j++) {
        double d = G[j * p + j];
        for (int64_t t = 0; t < j; t++) d -= G[j * p + t] * G[j * p + t];
        if (!(d > 0)) return 1;
        d = sqrt(d);
        G[j * p + j] = d;
        for (int64_t i = j + 1; i < p; i++) {
            double s = G[i * p + j];
            for (int64_t t = 0; t < j; t++) s -= G[i * p + t] * G[j * p + t];
            G[i * p + j] = s / d;
        }
    }
    for (int32_t c = 0; c < D; c++) { /* L y = r, then L^T x = y, column by column */
        for (int64_t i = 0; i < p; i++) {
            double s = R[i * D + c];
            for (int64_t t = 0; t < i; t++) s -= G[i * p + t] * R[t * D + c];
            R[i * D + c] = s / G[i * p + i];
        }
        for (int64_t i = p - 1; i >= 0; i--) {
            double s = R[i * D + c];
            for (int64_t t = i + 1; t < p; t++) s -= G[t * p + i] * R[t * D + c];
            R[i * D + c] = s / G[i * p + i];
        }
    }
    return 0;
}

/* V_p by least squares: G = B^T B, R = B^T Y, (G + lambda I) V_p = R. */
static int fit_values(double *vp, const double *B, const double *Y, int64_t M, int64_t p, int32_t D,
                      double ridge) {
    double *G = calloc((size_t)(p * p), sizeof(double));
    if (!G) return cart_fail(CART_E_NOMEM, "cart_compact_head: %lld x %lld Gram matrix", (long long)p,
                             (long long)p);
    memset(vp, 0, sizeof(double) * (size_t)(p * D));
    for (int64_t r = 0; r < M; r++) {
        const double *b = B + r * p, *y = Y + r * D;
        for (int64_t i = 0; i < p; i++) {
            if (b[i] == 0) continue;
            for (int64_t j = 0; j <= i; j++) G[i * p + j] += b[i] * b[j];
            for (int32_t d = 0; d < D; d++) vp[i * D + d] += b[i] * y[d];
        }
    }
    double trace = 0;
    for (int64_t i = 0; i < p; i++) {
        trace += G[i * p + i];
        for (int64_t j = 0; j < i; j++) G[j * p + i] = G[i * p + j];
    }
    int bad = cholesky_solve(G, vp, p, D, ridge * trace / (double)p + 1e-12);
    free(G);
    return bad ? cart_fail(CART_E_ARG, "cart_compact_head: the fit is singular; give a larger ridge") : CART_OK;
}

static int check(const float *q, int64_t m, int32_t rep, const float *k, const float *v, int64_t n,
                 int64_t kv_ld, int32_t D, const cart_compact_options *o, int64_t q_ld) {
    if (!q || !k || !v || !o || m < 1 || rep < 1 || n < 1 || D < 1 || kv_ld < D || q_ld < (int64_t)rep * D)
        return cart_fail(CART_E_ARG, "cart_compact_head: bad shape (m %lld, rep %d, n %lld, head_dim %d)",
                         (long long)m, rep, (long long)n, D);
    if (o->p < 1 || o->p > n || o->keep_first < 0 || o->keep_first > o->p || !(o->ridge >= 0))
        return cart_fail(CART_E_ARG, "cart_compact_head: keep %lld rows (the first %lld) of %lld, ridge %g",
                         (long long)o->p, (long long)o->keep_first, (long long)n, o->ridge);
    return CART_OK;
}

int cart_compact_head(const float *q, int64_t m, int32_t rep, int64_t q_ld, const float *k, const float *v,
                      int64_t n, int64_t kv_ld, int32_t D, float scale, const cart_compact_options *o,
                      int64_t *idx, float *v_out, int64_t v_ld, double *err) {
    int rc = check(q, m, rep, k, v, n, kv_ld, D, o, q_ld);
    if (rc) return rc;
    const int64_t M = m * rep, p = o->p;
    double *A = malloc(sizeof(double) * (size_t)n), *w = calloc((size_t)n, sizeof(double));
    double *B = malloc(sizeof(double) * (size_t)(M * p)), *Y = calloc((size_t)(M * D), sizeof(double));
    double *vp = malloc(sizeof(double) * (size_t)(p * D));
    char *taken = malloc((size_t)n);
    if (!A || !w || !B || !Y || !vp || !taken) {
        rc = cart_fail(CART_E_NOMEM, "cart_compact_head: %lld queries x %lld rows", (long long)M, (long long)n);
        goto done;
    }
    for (int64_t r = 0; r < M; r++) {
        double *a = A;
        softmax_scores(a, query_row(q, r, rep, q_ld, D), k, kv_ld, NULL, n, D, scale);
        for (int64_t j = 0; j < n; j++) {
            w[j] += a[j];
            for (int32_t d = 0; d < D; d++) Y[r * D + d] += a[j] * v[j * kv_ld + d];
        }
    }
    select_rows(idx, w, n, p, o->keep_first, taken);
    for (int64_t r = 0; r < M; r++) softmax_scores(B + r * p, query_row(q, r, rep, q_ld, D), k, kv_ld, idx, p, D, scale);
    if (o->fit_values) rc = fit_values(vp, B, Y, M, p, D, o->ridge);
    else
        for (int64_t i = 0; i < p; i++)
            for (int32_t d = 0; d < D; d++) vp[i * D + d] = v[idx[i] * kv_ld + d];
    if (rc) goto done;
    for (int64_t i = 0; i < p; i++)
        for (int32_t d = 0; d < D; d++) v_out[i * v_ld + d] = (float)vp[i * D + d];
    if (err) {
        double num = 0, den = 0;
        for (int64_t r = 0; r < M; r++)
            for (int32_t d = 0; d < D; d++) {
                double o_r = 0;
                for (int64_t i = 0; i < p; i++) o_r += B[r * p + i] * (double)v_out[i * v_ld + d];
                num += (o_r - Y[r * D + d]) * (o_r - Y[r * D + d]);
                den += Y[r * D + d] * Y[r * D + d];
            }
        *err = den > 0 ? sqrt(num / den) : 0;
    }
done:
    free(A), free(w), free(B), free(Y), free(vp), free(taken);
    return rc;
}
