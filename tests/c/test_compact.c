/* test_compact.c - KV compaction (compact.h) against a float64 reference, and
 * the two model calls it rests on: each layer's queries
 * (cart_model_forward_queries) and moving cached keys along RoPE
 * (cart_model_rope_shift), on a tiny random qwen3 written here. */
#include <unistd.h>

#include "check.h"
#include "compact.h"
#include "model.h"
#include "ops.h"
#include "tiny_model.h"

enum { D = 8, N = 40, QROWS = 30, REP = 2 };

/* Random queries [QROWS, REP * D], keys and values [N, D]. */
static void problem(float *q, float *k, float *v, uint64_t seed) {
    cart_rng r;
    cart_rng_seed(&r, seed);
    cart_rng_fill_normal(&r, q, QROWS * REP * D, 0.0f, 1.0f);
    cart_rng_fill_normal(&r, k, N * D, 0.0f, 1.0f);
    cart_rng_fill_normal(&r, v, N * D, 0.0f, 1.0f);
}

/* The compacted head's attention output for query row r, head h, in double. */
static void output(double *o, const float *qi, const float *k, const float *v, const int64_t *idx, int64_t p,
                   const float *vp) {
    double s[N], max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < p; j++) {
        double d = 0;
        for (int c = 0; c < D; c++) d += (double)qi[c] * k[(idx ? idx[j] : j) * D + c];
        s[j] = d / sqrt((double)D);
        if (s[j] > max) max = s[j];
    }
    for (int64_t j = 0; j < p; j++) sum += (s[j] = exp(s[j] - max));
    for (int c = 0; c < D; c++) {
        o[c] = 0;
        for (int64_t j = 0; j < p; j++) o[c] += s[j] / sum * (vp ? vp[j * D + c] : v[(idx ? idx[j] : j) * D + c]);
    }
}

/* Relative error of the compacted outputs against the full head's, by hand. */
static double error_by_hand(const float *q, const float *k, const float *v, const int64_t *idx, int64_t p,
                            const float *vp) {
    double num = 0, den = 0, full[D], part[D];
    for (int r = 0; r < QROWS * REP; r++) {
        const float *qi = q + r * D;
        output(full, qi, k, v, NULL, N, NULL);
        output(part, qi, k, v, idx, p, vp);
        for (int c = 0; c < D; c++) num += (part[c] - full[c]) * (part[c] - full[c]), den += full[c] * full[c];
    }
    return sqrt(num / den);
}

static void test_keeping_every_row_is_exact(void) {
    float q[QROWS * REP * D], k[N * D], v[N * D], vp[N * D];
    int64_t idx[N];
    problem(q, k, v, 1);
    for (int fit = 0; fit <= 1; fit++) {
        cart_compact_options o = {.p = N, .keep_first = 1, .fit_values = fit, .ridge = 1e-9};
        double err = -1;
        CHECK_OK(cart_compact_head(q, QROWS, REP, REP * D, k, v, N, D, D, 1.0f / sqrtf(D), &o, idx, vp, D, &err));
        int ascending = 1;
        for (int j = 0; j < N; j++) ascending &= idx[j] == j;
        CHECK(ascending);
        CHECK_NEAR(fit ? "fitted, every row kept: output error" : "evicted nothing: output error", err, 0.0, fit ? 1e-4 : 1e-12);
    }
}

static void test_eviction_keeps_the_rows_with_the_most_attention(void) {
    float q[QROWS * REP * D], k[N * D], v[N * D], vp[N * D];
    int64_t idx[N];
    problem(q, k, v, 2);
    /* the attention each row receives, by hand */
    double w[N] = {0};
    for (int r = 0; r < QROWS * REP; r++) {
        double s[N], max = -INFINITY, sum = 0;
        for (int j = 0; j < N; j++) {
            double d = 0;
            for (int c = 0; c < D; c++) d += (double)q[r * D + c] * k[j * D + c];
            s[j] = d / sqrt((double)D);
            if (s[j] > max) max = s[j];
        }
        for (int j = 0; j < N; j++) sum += (s[j] = exp(s[j] - max));
        for (int j = 0; j < N; j++) w[j] += s[j] / sum;
    }
    const int64_t p = 10, first = 2;
    cart_compact_options o = {.p = p, .keep_first = first, .fit_values = 0};
    double err = -1;
    CHECK_OK(cart_compact_head(q, QROWS, REP, REP * D, k, v, N, D, D, 1.0f / sqrtf(D), &o, idx, vp, D, &err));
    CHECK(idx[0] == 0 && idx[1] == 1);
    /* every kept row (past the first two) outweighs every dropped one */
    char kept[N] = {0};
    for (int64_t j = 0; j < p; j++) kept[idx[j]] = 1;
    for (int64_t j = 1; j < p; j++) CHECK(idx[j] > idx[j - 1]);
    double least_kept = INFINITY, most_dropped = 0;
    for (int j = (int)first; j < N; j++) {
        if (kept[j] && w[j] < least_kept) least_kept = w[j];
        if (!kept[j] && w[j] > most_dropped) most_dropped = w[j];
    }
    printf("  least kept weight %.4f >= most dropped %.4f\n", least_kept, most_dropped);
    CHECK(least_kept >= most_dropped);
    int same = 1;
    for (int64_t j = 0; j < p; j++)
        for (int c = 0; c < D; c++) same &= vp[j * D + c] == v[idx[j] * D + c];
    CHECK(same);
    CHECK_NEAR("eviction: reported error - by hand", err, error_by_hand(q, k, v, idx, p, vp), 1e-6);
}

/* The fitted values solve the normal equations: perturbing any of them
 * raises the objective, and they beat eviction's on the same rows. */
static void test_fitted_values_minimize_the_output_error(void) {
    float q[QROWS * REP * D], k[N * D], v[N * D], vp[N * D], ve[N * D];
    int64_t idx[N], idx_e[N];
    problem(q, k, v, 3);
    const int64_t p = 8;
    cart_compact_options o = {.p = p, .keep_first = 1, .fit_values = 1, .ridge = 0};
    double err = -1, err_e = -1;
    CHECK_OK(cart_compact_head(q, QROWS, REP, REP * D, k, v, N, D, D, 1.0f / sqrtf(D), &o, idx, vp, D, &err));
    o.fit_values = 0;
    CHECK_OK(cart_compact_head(q, QROWS, REP, REP * D, k, v, N, D, D, 1.0f / sqrtf(D), &o, idx_e, ve, D, &err_e));
    CHECK(memcmp(idx, idx_e, sizeof(int64_t) * p) == 0);
    printf("  output error: fitted %.4f, evicted %.4f\n", err, err_e);
    CHECK(err < err_e);
    CHECK_NEAR("fit: reported error - by hand", err, error_by_hand(q, k, v, idx, p, vp), 1e-6);
    double worst = INFINITY;
    for (int64_t j = 0; j < p; j++)
        for (int c = 0; c < D; c++)
            for (int sign = -1; sign <= 1; sign += 2) {
                float keep = vp[j * D + c];
                vp[j * D + c] = keep + sign * 1e-2f;
                double e = error_by_hand(q, k, v, idx, p, vp);
                if (e - err < worst) worst = e - err;
                vp[j * D + c] = keep;
            }
    printf("  smallest rise of the error under a 1e-2 nudge: %.3g (must be > 0)\n", worst);
    CHECK(worst > 0);
}

static void test_bad_options_are_refused(void) {
    float q[QROWS * REP * D], k[N * D], v[N * D], vp[N * D];
    int64_t idx[N];
    problem(q, k, v, 4);
    cart_compact_options bad[] = {{.p = 0}, {.p = N + 1}, {.p = 4, .keep_first = 5}, {.p = 4, .ridge = -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(cart_compact_head(q, QROWS, REP, REP * D, k, v, N, D, D, 1.0f, &bad[i], idx, vp, D, NULL) ==
              CART_E_ARG);
    cart_compact_options ok = {.p = 4};
    CHECK(cart_compact_head(q, QROWS, REP, D, k, v, N, D, D, 1.0f, &ok, idx, vp, D, NULL) == CART_E_ARG);
}

/* A tiny qwen3: layer 0's queries and keys depend on the token and its
 * position only, so the same token at positions P and P + delta gives
 * queries and keys that RoPE turns into each other. */
static void test_queries_and_shifted_keys_follow_rope(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/cart_test_compact.%d.gguf", (int)getpid());
    tiny_shape s = {.qwen3 = 1, .layers = 2, .embd = 64, .heads = 4, .kv_heads = 2, .head_dim = 16,
                    .ff = 96, .vocab = 100, .dtype = CART_F32, .tied = 1, .seed = 5};
    CHECK_OK(write_tiny_model(path, &s));
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, path, NULL));
    remove(path);
    if (!m) return;
    const int64_t HD = 4 * 16, KD = 2 * 16, delta = 7;
    CHECK(cart_model_query_floats(m, 3) == 3 * 2 * HD);
    int32_t a[2] = {1, 42}, b[2 + delta];
    b[0] = 1;
    for (int i = 1; i <= delta; i++) b[i] = 3 + i;
    b[1 + delta] = 42;
    cart_kv *ka = NULL, *kb = NULL;
    CHECK_OK(cart_model_new_kv(&ka, m, 16, CART_F32));
    CHECK_OK(cart_model_new_kv(&kb, m, 16, CART_F32));
    float qa[2 * 2 * HD], qb[2 * 2 * HD], k1[2 * KD], k2[(2 + delta) * KD], v[(2 + delta) * KD];
    int64_t na = 2, nb = 2 + delta, ra[2] = {0, 1}, rb[2] = {0, 1 + delta};
    CHECK_OK(cart_model_forward_queries(m, &ka, 1, a, &na, ra, 2, qa));
    CHECK_OK(cart_model_forward_queries(m, &kb, 1, b, &nb, rb, 2, qb));
    CHECK(cart_kv_len(ka) == 2 && cart_kv_len(kb) == 2 + delta);
    CHECK_OK(cart_kv_read(ka, 0, 0, 2, k1, v));
    CHECK_OK(cart_kv_read(kb, 0, 0, 2 + delta, k2, v));
    /* queries: layer 0, token 42 at position 1 turned by delta = at 1 + delta */
    float cs[16];
    rope_angles(cs, delta, 16, 1000000.0f);
    float q1[HD];
    memcpy(q1, qa + 1 * HD, sizeof q1);
    rope_forward(q1, cs, 4, 16, 16, 1);
    double dq = 0, dk = 0;
    for (int i = 0; i < HD; i++) dq = fmax(dq, fabs(q1[i] - qb[1 * HD + i]));
    CHECK_OK(cart_model_rope_shift(m, 0, k1 + KD, 1, KD, delta));
    for (int i = 0; i < KD; i++) dk = fmax(dk, fabs(k1[KD + i] - k2[(1 + delta) * KD + i]));
    CHECK_NEAR("layer 0 query at P turned by delta - at P + delta", dq, 0.0, 1e-4);
    CHECK_NEAR("layer 0 key at P shifted by delta - at P + delta", dk, 0.0, 1e-4);
    /* and back */
    CHECK_OK(cart_model_rope_shift(m, 0, k1 + KD, 1, KD, -delta));
    float k0[2 * KD];
    CHECK_OK(cart_kv_read(ka, 0, 0, 2, k0, v));
    double back = 0;
    for (int i = 0; i < KD; i++) back = fmax(back, fabs(k1[KD + i] - k0[KD + i]));
    CHECK_NEAR("key shifted by delta and back - as cached", back, 0.0, 1e-5);
    CHECK(cart_model_rope_shift(m, 2, k1, 1, KD, 1) == CART_E_ARG);
    cart_kv_free(ka);
    cart_kv_free(kb);
    cart_model_free(m);
}

int main(void) {
    RUN(test_keeping_every_row_is_exact);
    RUN(test_eviction_keeps_the_rows_with_the_most_attention);
    RUN(test_fitted_values_minimize_the_output_error);
    RUN(test_bad_options_are_refused);
    RUN(test_queries_and_shifted_keys_follow_rope);
    return check_finish("compact");
}
