/*
 * test_train.c - the cartridge mechanism: finite-difference checks of every
 * backward piece and of the whole stack into the cartridge rows, the fused
 * loss against the unfused one, packing, recompute, capture, Adam, targets.
 *
 * Models are generated here (tiny_model.h), so nothing depends on ../shared.
 */
#include "adam.h"
#include <unistd.h>

#include "check.h"
#include "train_problem.h"
#include "model.h"
#include "ops.h"
#include "rng.h"
#include "tiny_model.h"
#include "train.h"

/* per process: ctest runs this program once per ISA level, in parallel */
static char QWEN_PATH[64], LLAMA_PATH[64], Q8_PATH[64], Q4K_PATH[64];

static double rel_err(double a, double b) {
    double scale = fmax(fmax(fabs(a), fabs(b)), 1e-3);
    return fabs(a - b) / scale;
}

/* ---- pieces ----------------------------------------------------------------- */

static void fill(cart_rng *r, float *x, int64_t n, float std) {
    cart_rng_fill_normal(r, x, n, 0.0f, std);
}

/* sum(dy * f(x)) for a few pieces, in double, so central differences of it
 * check the backward of f against dy. */
static double probe_rmsnorm(const float *x, const float *w, const float *dy, int64_t dim) {
    float y[64], rstd;
    rmsnorm_forward_keep(y, &rstd, x, w, 1, dim, 1e-6f);
    double s = 0;
    for (int64_t i = 0; i < dim; i++) s += (double)dy[i] * y[i];
    return s;
}

static void test_rmsnorm_backward_matches_finite_differences(void) {
    cart_rng r;
    cart_rng_seed(&r, 1);
    enum { N = 24 };
    float x[N], w[N], dy[N], dx[N] = {0}, y[N], rstd;
    fill(&r, x, N, 1.0f), fill(&r, w, N, 1.0f), fill(&r, dy, N, 1.0f);
    rmsnorm_forward_keep(y, &rstd, x, w, 1, N, 1e-6f);
    rmsnorm_backward(dx, dy, x, &rstd, w, 1, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        float keep = x[i], h = 1e-2f;
        x[i] = keep + h;
        double up = probe_rmsnorm(x, w, dy, N);
        x[i] = keep - h;
        double down = probe_rmsnorm(x, w, dy, N);
        x[i] = keep;
        worst = fmax(worst, rel_err(dx[i], (up - down) / (2 * h)));
    }
    CHECK_MAXDIFF("rmsnorm backward vs finite differences (relative)", worst, 2e-3);
}

static void test_swiglu_backward_matches_finite_differences(void) {
    cart_rng r;
    cart_rng_seed(&r, 2);
    enum { N = 32 };
    float g[N], u[N], dh[N], dg[N] = {0}, du[N] = {0};
    fill(&r, g, N, 2.0f), fill(&r, u, N, 1.0f), fill(&r, dh, N, 1.0f);
    swiglu_backward(dg, du, dh, g, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double h = 1e-3;
        double gp = g[i] + h, gm = g[i] - h;
        double fp = gp / (1 + exp(-gp)) * u[i], fm = gm / (1 + exp(-gm)) * u[i];
        worst = fmax(worst, rel_err(dg[i], dh[i] * (fp - fm) / (2 * h)));
        double silu = g[i] / (1 + exp(-(double)g[i]));
        worst = fmax(worst, rel_err(du[i], dh[i] * silu));
    }
    CHECK_MAXDIFF("swiglu backward vs finite differences (relative)", worst, 1e-4);
}

static void test_rope_backward_is_the_inverse_rotation(void) {
    cart_rng r;
    cart_rng_seed(&r, 3);
    float cs[16], x[2 * 16], y[2 * 16], dy[2 * 16];
    for (int neox = 0; neox < 2; neox++) {
        rope_angles(cs, 37, 16, 10000.0f);
        fill(&r, x, 32, 1.0f);
        memcpy(y, x, sizeof x);
        rope_forward(y, cs, 2, 16, 16, neox);
        /* the rotation is orthogonal: its backward (transpose) undoes it, and
         * <dy, R x> = <R^T dy, x> */
        fill(&r, dy, 32, 1.0f);
        double lhs = 0, rhs = 0;
        for (int i = 0; i < 32; i++) lhs += (double)dy[i] * y[i];
        rope_backward(dy, cs, 2, 16, 16, neox);
        for (int i = 0; i < 32; i++) rhs += (double)dy[i] * x[i];
        CHECK_NEAR(neox ? "rope (neox) <dy, Rx> = <R^T dy, x>" : "rope (normal) <dy, Rx> = <R^T dy, x>",
                   lhs, rhs, 1e-5);
        rope_backward(y, cs, 2, 16, 16, neox);
        double back = 0;
        for (int i = 0; i < 32; i++) back = fmax(back, fabs(y[i] - x[i]));
        CHECK_MAXDIFF("rope backward undoes the rotation", back, 1e-6);
    }
}

enum { AD = 8, NA = 5, NB = 4, ASTRIDE = 16 }; /* head_dim, prefix rows, own rows, row pitch */

static double probe_attention(const float *q, const float *ka, const float *va, const float *kb,
                              const float *vb, const float *dout) {
    float out[AD], lse;
    attention_head_forward(out, &lse, q, ka, va, NA, ASTRIDE, kb, vb, NB, ASTRIDE, AD, 0.35f);
    double s = 0;
    for (int d = 0; d < AD; d++) s += (double)dout[d] * out[d];
    return s;
}

static void test_attention_backward_matches_finite_differences(void) {
    cart_rng r;
    cart_rng_seed(&r, 4);
    float q[AD], ka[NA * ASTRIDE], va[NA * ASTRIDE], kb[NB * ASTRIDE], vb[NB * ASTRIDE], dout[AD];
    fill(&r, q, AD, 1.0f), fill(&r, ka, NA * ASTRIDE, 1.0f), fill(&r, va, NA * ASTRIDE, 1.0f);
    fill(&r, kb, NB * ASTRIDE, 1.0f), fill(&r, vb, NB * ASTRIDE, 1.0f), fill(&r, dout, AD, 1.0f);
    float out[AD], lse, dq[AD] = {0};
    float dka[NA * ASTRIDE] = {0}, dva[NA * ASTRIDE] = {0}, dkb[NB * ASTRIDE] = {0},
          dvb[NB * ASTRIDE] = {0};
    attention_head_forward(out, &lse, q, ka, va, NA, ASTRIDE, kb, vb, NB, ASTRIDE, AD, 0.35f);
    attention_head_backward(dq, dka, dva, 1, dkb, dvb, dout, out, lse, q, ka, va, NA, ASTRIDE, kb,
                            vb, NB, ASTRIDE, AD, 0.35f);
    struct {
        float *x, *g;
        int n, stride, skip;
        const char *what;
    } parts[] = {{q, dq, 1, AD, 0, "q"},     {ka, dka, NA, ASTRIDE, 1, "prefix k"},
                 {va, dva, NA, ASTRIDE, 1, "prefix v"}, {kb, dkb, NB, ASTRIDE, 0, "own k"},
                 {vb, dvb, NB, ASTRIDE, 0, "own v"}};
    double worst = 0;
    for (size_t part = 0; part < sizeof parts / sizeof parts[0]; part++)
        for (int j = 0; j < parts[part].n; j++)
            for (int d = 0; d < AD; d++) {
                float *x = parts[part].x + j * parts[part].stride + d;
                float keep = *x, h = 1e-2f;
                *x = keep + h;
                double up = probe_attention(q, ka, va, kb, vb, dout);
                *x = keep - h;
                double down = probe_attention(q, ka, va, kb, vb, dout);
                *x = keep;
                double fd = (up - down) / (2 * h);
                float g = parts[part].g[j * parts[part].stride + d];
                if (j < parts[part].skip) CHECK(g == 0.0f); /* the frozen row gets nothing */
                else worst = fmax(worst, fabs(g - fd) / fmax(fabs(fd), 1e-2));
            }
    /* central differences of an f32 forward with h = 1e-2: truncation of
     * order h^2 and round-off of order 1e-7 / h, about 1e-3 of a gradient of
     * order 0.1 at worst */
    CHECK_MAXDIFF("attention backward (q, prefix k/v, own k/v) vs finite differences (relative)",
                  worst, 1e-2);
}

/* ---- the whole stack ------------------------------------------------------- */

static const int64_t stack_lens[2] = {6, 5};

static void test_qwen3_stack_gradients_match_finite_differences(void) {
    check_stack_gradients(QWEN_PATH, "qwen3 (q/k norm, NeoX RoPE, GQA 2)", stack_lens, 2, 5, 1e-2f, 3e-2);
}

static void test_llama_stack_gradients_match_finite_differences(void) {
    check_stack_gradients(LLAMA_PATH, "llama (adjacent-pair RoPE, GQA 2)", stack_lens, 2, 5, 1e-2f, 3e-2);
}

/* Block-type weights: the training forward multiplies f32 activations by
 * the exactly dequantized weights (matmul.h: cart_matmul_forward_exact),
 * so its backward holds to finite differences as at f32. */
static void test_quantized_stack_gradients_match_finite_differences(void) {
    check_stack_gradients(Q8_PATH, "qwen3 at q8_0 (256 wide)", stack_lens, 2, 5, 1e-2f, 3e-2);
    check_stack_gradients(Q4K_PATH, "qwen3 at q4_K (256 wide)", stack_lens, 2, 5, 1e-2f, 3e-2);
}

static void test_fused_loss_equals_the_unfused_computation(void) {
    problem pb;
    const int64_t lens[2] = {7, 6};
    make_problem(&pb, QWEN_PATH, lens, 2, 4, 1, 0, 21);
    if (!pb.m) return;
    int32_t V = cart_model_get_config(pb.m)->n_vocab;
    int64_t rows[64];
    for (int64_t i = 0; i < pb.n; i++) rows[i] = i;
    float *logits = malloc(sizeof(float) * (size_t)(pb.n * V));
    CHECK_OK(cart_trainer_logits(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, rows, pb.n, logits));
    double unfused = 0;
    for (int64_t e = 0; e < pb.tg.n; e++) {
        const float *lr = logits + (pb.pos[e] - 1) * V;
        double max = lr[0], sum = 0;
        for (int32_t v = 1; v < V; v++) max = fmax(max, lr[v]);
        for (int32_t v = 0; v < V; v++) sum += exp(lr[v] - max);
        unfused += -exp((double)pb.lp[e]) * (lr[pb.tok[e]] - max - log(sum));
    }
    unfused /= (double)pb.tg.n;
    double fused = loss_of(&pb);
    printf("  loss: fused %.9f, unfused %.9f\n", fused, unfused);
    CHECK_NEAR("fused vs unfused distillation loss (relative)", rel_err(fused, unfused), 0, 1e-6);
    free(logits);
    free_problem(&pb);
}

/* Gradients and loss of the packed pass vs one segment at a time with
 * reduction sum and loss_scale 1 / total entries. */
static void test_packed_segments_match_one_at_a_time(void) {
    problem pb;
    const int64_t lens[3] = {5, 7, 4};
    make_problem(&pb, QWEN_PATH, lens, 3, 6, 1, 0, 31);
    if (!pb.m) return;
    cart_cartridge_zero_grad(pb.c);
    double packed = 0;
    CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f,
                                  1, &packed));
    int32_t L = cart_cartridge_n_layer(pb.c);
    int64_t per = cart_cartridge_p(pb.c) * cart_cartridge_kv_heads(pb.c) * cart_cartridge_head_dim(pb.c);
    float *g_packed = malloc(sizeof(float) * (size_t)(2 * L * per));
    for (int32_t l = 0; l < L; l++)
        for (int32_t w = 0; w < 2; w++)
            memcpy(g_packed + (2 * l + w) * per, cart_cartridge_grad(pb.c, l, w), sizeof(float) * (size_t)per);
    cart_cartridge_zero_grad(pb.c);
    double separate = 0;
    int64_t start = 0, e0 = 0;
    for (int32_t s = 0; s < pb.n_seg; s++) {
        int64_t e1 = e0;
        int64_t shifted[256];
        while (e1 < pb.tg.n && pb.pos[e1] < start + pb.seg[s]) {
            shifted[e1 - e0] = pb.pos[e1] - start;
            e1++;
        }
        cart_distill_targets one = {shifted, pb.tok + e0, pb.lp + e0, e1 - e0};
        double part = 0;
        CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens + start, pb.seg[s], &pb.seg[s], 1, &one,
                                      0, 1.0f / (float)pb.tg.n, 1, &part));
        separate += part;
        start += pb.seg[s];
        e0 = e1;
    }
    double worst = 0, scale = 0;
    for (int32_t l = 0; l < L; l++)
        for (int32_t w = 0; w < 2; w++) {
            const float *g = cart_cartridge_grad(pb.c, l, w);
            for (int64_t i = 0; i < per; i++) {
                worst = fmax(worst, fabs(g[i] - g_packed[(2 * l + w) * per + i]));
                scale = fmax(scale, fabs(g_packed[(2 * l + w) * per + i]));
            }
        }
    CHECK_NEAR("packed vs one-at-a-time loss", packed, separate, 1e-6);
    CHECK_MAXDIFF("packed vs one-at-a-time gradients (relative to the largest)", worst / scale, 1e-5);
    free(g_packed);
    free_problem(&pb);
}

/* The trainable rows' gradient as one vector in Adam's order, and back;
 * the frozen rows' gradient stays zero. */
static void test_gradient_exports_in_the_optimizer_order_and_imports_back(void) {
    cart_cartridge *c;
    CHECK_OK(cart_cartridge_new(&c, 2, 2, 3, 5, 2));
    const int64_t per = 5 * 6, skip = 2 * 6, n = cart_cartridge_trainable_count(c);
    CHECK(n == 2 * 2 * (5 - 2) * 6);
    for (int32_t l = 0; l < 2; l++)
        for (int32_t w = 0; w < 2; w++) {
            float *g = cart_cartridge_grad(c, l, w);
            for (int64_t i = skip; i < per; i++) g[i] = (float)(1000 * l + 100 * w + i);
        }
    float *v = malloc(sizeof(float) * (size_t)n);
    cart_cartridge_grad_export(c, v);
    int64_t at = 0, bad = 0;
    for (int32_t l = 0; l < 2; l++)
        for (int32_t w = 0; w < 2; w++)
            for (int64_t i = skip; i < per; i++) bad += v[at++] != (float)(1000 * l + 100 * w + i);
    CHECK(at == n && bad == 0);
    for (int64_t i = 0; i < n; i++) v[i] = -v[i];
    cart_cartridge_zero_grad(c);
    cart_cartridge_grad_import(c, v);
    for (int32_t l = 0; l < 2; l++)
        for (int32_t w = 0; w < 2; w++) {
            const float *g = cart_cartridge_grad(c, l, w);
            for (int64_t i = 0; i < per; i++)
                bad += g[i] != (i < skip ? 0.0f : -(float)(1000 * l + 100 * w + i));
        }
    CHECK(bad == 0);
    free(v);
    cart_cartridge_free(c);
}

static void test_recompute_gives_bitwise_equal_loss_and_gradients(void) {
    const int64_t lens[2] = {9, 6};
    check_recompute_is_bitwise(QWEN_PATH, lens, 2, 6, 41);
}

static void test_a_captured_cartridge_continues_like_the_full_sequence(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    if (!m) return;
    cart_trainer *t = NULL;
    CHECK_OK(cart_trainer_new(&t, m, NULL));
    int32_t toks[12] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3};
    cart_cartridge *c = NULL;
    CHECK_OK(cart_cartridge_new_for(&c, m, 7, 1));
    CHECK_OK(cart_cartridge_capture(c, m, toks, 7, CART_F32));
    int32_t V = cart_model_get_config(m)->n_vocab;
    float full[12 * 64], tail[5 * 64];
    int64_t rows_full[5] = {7, 8, 9, 10, 11}, rows_tail[5] = {0, 1, 2, 3, 4};
    int64_t n_full = 12, n_tail = 5;
    CHECK_OK(cart_trainer_logits(t, NULL, toks, 12, &n_full, 1, rows_full, 5, full));
    CHECK_OK(cart_trainer_logits(t, c, toks + 7, 5, &n_tail, 1, rows_tail, 5, tail));
    double worst = 0;
    for (int i = 0; i < 5 * V; i++) worst = fmax(worst, fabs(full[i] - tail[i]));
    CHECK_MAXDIFF("captured cartridge + tail vs the whole sequence (training path)", worst, 1e-5);
    /* and through the inference path, into a cache */
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 16, CART_F32));
    CHECK_OK(cart_cartridge_append_to_kv(c, kv));
    CHECK(cart_kv_len(kv) == 7);
    float inf[5 * 64];
    CHECK_OK(cart_model_forward(m, &kv, 1, toks + 7, &n_tail, rows_tail, 5, inf));
    worst = 0;
    for (int i = 0; i < 5 * V; i++) worst = fmax(worst, fabs(inf[i] - tail[i]));
    CHECK_MAXDIFF("inference behind the cartridge vs the training path", worst, 1e-5);
    cart_kv_free(kv);
    cart_cartridge_free(c);
    cart_trainer_free(t);
    cart_model_free(m);
}

/* A capture of 10 tokens split into parts of 4 and 6 rows (positions kept)
 * and composed again scores the next tokens bitwise like the whole capture,
 * through the cache and through the training path; the composition writes
 * into a cache the same rows as its parts appended one after the other. */
static void test_a_split_capture_composes_back_bitwise(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, QWEN_PATH, NULL));
    if (!m) return;
    cart_trainer *t = NULL;
    CHECK_OK(cart_trainer_new(&t, m, NULL));
    int32_t toks[14] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 31};
    cart_cartridge *whole = NULL, *a = NULL, *b = NULL, *ab = NULL;
    CHECK_OK(cart_cartridge_new_for(&whole, m, 10, 1));
    CHECK_OK(cart_cartridge_capture(whole, m, toks, 10, CART_F32));
    CHECK_OK(cart_cartridge_new_for(&a, m, 4, 1));
    CHECK_OK(cart_cartridge_new_for(&b, m, 6, 1));
    CHECK_OK(cart_cartridge_copy_rows(a, 0, whole, 0, 4));
    CHECK_OK(cart_cartridge_copy_rows(b, 0, whole, 4, 6));
    const cart_cartridge *parts[2] = {a, b};
    CHECK_OK(cart_cartridge_compose(&ab, parts, 2));
    CHECK(cart_cartridge_p(ab) == 10 && cart_cartridge_frozen(ab) == 1);
    int32_t V = cart_model_get_config(m)->n_vocab;
    int64_t n_tail = 4, rows_tail[4] = {0, 1, 2, 3};
    float ref[4 * 64], got[4 * 64];
    CHECK_OK(cart_trainer_logits(t, whole, toks + 10, 4, &n_tail, 1, rows_tail, 4, ref));
    CHECK_OK(cart_trainer_logits(t, ab, toks + 10, 4, &n_tail, 1, rows_tail, 4, got));
    double worst = 0;
    for (int i = 0; i < 4 * V; i++) worst = fmax(worst, fabs(ref[i] - got[i]));
    CHECK_MAXDIFF("composed parts vs the whole capture (training path)", worst, 0.0);
    cart_kv *k1 = NULL, *k2 = NULL;
    CHECK_OK(cart_model_new_kv(&k1, m, 16, CART_F16));
    CHECK_OK(cart_model_new_kv(&k2, m, 16, CART_F16));
    CHECK_OK(cart_cartridge_append_to_kv(ab, k1));
    CHECK_OK(cart_cartridge_append_to_kv(a, k2));
    CHECK_OK(cart_cartridge_append_to_kv(b, k2));
    CHECK(cart_kv_len(k1) == 10 && cart_kv_len(k2) == 10);
    float inf1[4 * 64], inf2[4 * 64];
    CHECK_OK(cart_model_forward(m, &k1, 1, toks + 10, &n_tail, rows_tail, 4, inf1));
    CHECK_OK(cart_model_forward(m, &k2, 1, toks + 10, &n_tail, rows_tail, 4, inf2));
    CHECK(memcmp(inf1, inf2, sizeof(float) * (size_t)(4 * V)) == 0);
    cart_kv_free(k1);
    cart_kv_free(k2);
    /* a part of another geometry is refused, naming both */
    cart_cartridge *odd = NULL;
    CHECK_OK(cart_cartridge_new(&odd, 3, 2, 16, 4, 1));
    const cart_cartridge *bad[2] = {a, odd};
    cart_cartridge_free(ab);
    CHECK_ERR(cart_cartridge_compose(&ab, bad, 2), CART_E_ARG);
    CHECK_ERROR_MENTIONS("part 1 is 3 layers (layer 0: 2 KV heads x 16), part 0 is 2 layers (layer 0: 2 x 16)");
    CHECK(ab == NULL);
    CHECK_ERR(cart_cartridge_copy_rows(a, 0, whole, 8, 4), CART_E_ARG);
    cart_cartridge_free(odd);
    cart_cartridge_free(a);
    cart_cartridge_free(b);
    cart_cartridge_free(whole);
    cart_trainer_free(t);
    cart_model_free(m);
}

/* Training through a composition of two random parts reaches both: the
 * gradient composed back into each part matches central differences of the
 * composed loss in that part's rows, and each part's sink rows get none. */
static void test_gradients_through_a_composition_reach_every_part(void) {
    problem pb;
    const int64_t lens[2] = {6, 5};
    make_problem(&pb, QWEN_PATH, lens, 2, 5, 1, 0, 31);
    if (!pb.m) return;
    cart_cartridge *second = NULL, *comp = NULL;
    CHECK_OK(cart_cartridge_new_for(&second, pb.m, 4, 2));
    cart_cartridge_init_random(second, 32, 0.7f);
    cart_cartridge *parts[2] = {pb.c, second};
    CHECK_OK(cart_cartridge_compose(&comp, (const cart_cartridge *const *)parts, 2));
    cart_cartridge_zero_grad(comp);
    cart_cartridge_zero_grad(pb.c);
    cart_cartridge_zero_grad(second);
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb.t, comp, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f, 1, &loss));
    CHECK_OK(cart_cartridge_compose_grad(comp, parts, 2));
    cart_cartridge_free(comp);
    int64_t row = (int64_t)cart_cartridge_kv_heads(pb.c) * cart_cartridge_head_dim(pb.c);
    double worst = 0, reach[2] = {0, 0};
    cart_rng r;
    cart_rng_seed(&r, 77);
    for (int part = 0; part < 2; part++) {
        cart_cartridge *c = parts[part];
        int64_t frozen = cart_cartridge_frozen(c), p = cart_cartridge_p(c);
        for (int32_t l = 0; l < cart_cartridge_n_layer(c); l++)
            for (int32_t which = 0; which < 2; which++) {
                float *x = cart_cartridge_rows(c, l, which);
                const float *g = cart_cartridge_grad(c, l, which);
                for (int64_t i = 0; i < frozen * row; i++) CHECK(g[i] == 0.0f);
                for (int k = 0; k < 6; k++) {
                    int64_t i = frozen * row + (int64_t)cart_rng_below(&r, (uint64_t)((p - frozen) * row));
                    float keep = x[i], h = 1e-2f;
                    double lo, hi;
                    x[i] = keep + h;
                    CHECK_OK(cart_cartridge_compose(&comp, (const cart_cartridge *const *)parts, 2));
                    CHECK_OK(cart_trainer_distill(pb.t, comp, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f, 0,
                                                  &hi));
                    cart_cartridge_free(comp);
                    x[i] = keep - h;
                    CHECK_OK(cart_cartridge_compose(&comp, (const cart_cartridge *const *)parts, 2));
                    CHECK_OK(cart_trainer_distill(pb.t, comp, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f, 0,
                                                  &lo));
                    cart_cartridge_free(comp);
                    x[i] = keep;
                    double fd = (hi - lo) / (2 * h);
                    worst = fmax(worst, fabs(g[i] - fd) / fmax(fabs(fd), 1e-2));
                    reach[part] = fmax(reach[part], fabs(g[i]));
                }
            }
    }
    printf("  composed p = 5 + 4 (frozen 1 and 2): |grad| up to %.3g in part 0, %.3g in part 1\n", reach[0],
           reach[1]);
    CHECK_MSG(reach[0] > 1e-4 && reach[1] > 1e-4, "a part of the composition got no gradient");
    CHECK_MAXDIFF("gradient through a composition vs finite differences (relative)", worst, 3e-2);
    cart_cartridge *wrong[1] = {second};
    CHECK_OK(cart_cartridge_compose(&comp, (const cart_cartridge *const *)parts, 2));
    CHECK_ERR(cart_cartridge_compose_grad(comp, wrong, 1), CART_E_ARG);
    cart_cartridge_free(comp);
    cart_cartridge_free(second);
    free_problem(&pb);
}

static void test_adam_follows_torch_and_lowers_the_loss(void) {
    /* two hand-computed steps of torch.optim.Adam(lr=0.1) on p = [1, -2] */
    cart_adam_params ap;
    cart_adam_default_params(&ap);
    ap.lr = 0.1f;
    cart_adam *a = NULL;
    CHECK_OK(cart_adam_new(&a, &ap, 2));
    float p[2] = {1.0f, -2.0f};
    const float g1[2] = {0.5f, -0.25f}, g2[2] = {-1.0f, 0.75f};
    cart_adam_begin_step(a);
    CHECK_OK(cart_adam_update(a, p, g1, 0, 2));
    /* step 1: m = 0.1 g, v = 0.001 g^2, mhat/sqrt(vhat) = sign(g) -> p -= 0.1 sign(g) */
    CHECK_NEAR("adam step 1, p[0]", p[0], 0.9, 1e-6);
    CHECK_NEAR("adam step 1, p[1]", p[1], -1.9, 1e-6);
    cart_adam_begin_step(a);
    CHECK_OK(cart_adam_update(a, p, g2, 0, 2));
    double m0 = 0.9 * 0.05 + 0.1 * -1.0, v0 = 0.999 * 0.00025 + 0.001 * 1.0;
    double want0 = 0.9 - 0.1 / (1 - 0.81) * m0 / (sqrt(v0) / sqrt(1 - 0.998001) + 1e-8);
    CHECK_NEAR("adam step 2, p[0] (torch formula)", p[0], want0, 1e-6);
    CHECK(cart_adam_steps(a) == 2);
    cart_adam_free(a);

    /* a few steps on the tiny model lower the loss and never move the sink */
    const int64_t lens[2] = {8, 8};
    check_adam_lowers_the_loss(QWEN_PATH, lens, 2, 6, 51, 2e-2f);
}

static void test_topk_targets_keep_entries_up_to_the_mass(void) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 (+ tiny): 0.99 needs all four */
    float logits[6] = {logf(0.15f), logf(0.5f), -30.0f, logf(0.3f), logf(0.05f), -30.0f};
    int32_t ids[6], n = 0;
    float lp[6];
    CHECK_OK(cart_topk_targets(ids, lp, &n, logits, 6, 6, 0.99f));
    CHECK(n == 4 && ids[0] == 1 && ids[1] == 3 && ids[2] == 0 && ids[3] == 4);
    CHECK_NEAR("top logprob", lp[0], log(0.5), 1e-6);
    CHECK_OK(cart_topk_targets(ids, lp, &n, logits, 6, 6, 0.7f));
    CHECK(n == 2); /* 0.5 + 0.3 reaches 0.7: the crossing entry is kept */
    CHECK_OK(cart_topk_targets(ids, lp, &n, logits, 6, 1, 0.99f));
    CHECK(n == 1 && ids[0] == 1);
    float ties[4] = {1, 2, 2, 1};
    CHECK_OK(cart_topk_targets(ids, lp, &n, ties, 4, 3, 1.0f));
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 2 && ids[2] == 0); /* ties to the lower id */
}

static void test_target_lists_append_shift_and_view(void) {
    float logits[6] = {logf(0.15f), logf(0.5f), -30.0f, logf(0.3f), logf(0.05f), -30.0f};
    cart_target_list *a = NULL, *b = NULL;
    CHECK_OK(cart_target_list_new(&a));
    CHECK_OK(cart_target_list_new(&b));
    int32_t got = -1;
    CHECK_OK(cart_target_list_append_topk(a, 3, logits, 6, 6, 0.99f, &got));
    CHECK(got == 4 && cart_target_list_count(a) == 4);
    CHECK_OK(cart_target_list_append_topk(a, 4, logits, 6, 1, 0.99f, NULL));
    CHECK(cart_target_list_count(a) == 5);
    int64_t pos = 0;
    int32_t tok = 0;
    float lp = 0;
    CHECK_OK(cart_target_list_get(a, 4, &pos, &tok, &lp));
    CHECK(pos == 4 && tok == 1);
    CHECK_NEAR("entry logprob", lp, log(0.5), 1e-6);
    /* the same entries as cart_topk_targets writes */
    int32_t ids[6], n = 0;
    float lps[6];
    CHECK_OK(cart_topk_targets(ids, lps, &n, logits, 6, 6, 0.99f));
    for (int32_t i = 0; i < n; i++) {
        CHECK_OK(cart_target_list_get(a, i, &pos, &tok, &lp));
        CHECK(pos == 3 && tok == ids[i] && lp == lps[i]);
    }
    /* appending shifts positions; a list can append itself; growth past the first block */
    CHECK_OK(cart_target_list_push(b, 0, 7, -0.25f));
    CHECK_OK(cart_target_list_append(b, a, 10));
    CHECK_OK(cart_target_list_append(b, b, 100));
    CHECK(cart_target_list_count(b) == 12);
    CHECK_OK(cart_target_list_get(b, 6, &pos, &tok, NULL));
    CHECK(pos == 100 && tok == 7);
    CHECK_OK(cart_target_list_get(b, 11, &pos, NULL, NULL));
    CHECK(pos == 114);
    for (int i = 0; i < 1000; i++) CHECK_OK(cart_target_list_push(b, i, i % 5, -1.0f));
    cart_distill_targets view;
    cart_target_list_view(b, &view);
    CHECK(view.n == 1012 && view.position[1011] == 999 && view.token[1011] == 4);
    CHECK_OK(cart_target_list_truncate(b, 6));
    CHECK(cart_target_list_count(b) == 6);
    CHECK_ERR(cart_target_list_truncate(b, 7), CART_E_ARG);
    CHECK_ERR(cart_target_list_get(b, 6, NULL, NULL, NULL), CART_E_ARG);
    CHECK_ERR(cart_target_list_append_topk(b, 0, logits, 6, 0, 0.99f, NULL), CART_E_ARG);
    cart_target_list_free(a);
    cart_target_list_free(b);
}

static void test_bad_targets_and_segments_are_refused(void) {
    problem pb;
    const int64_t lens[2] = {4, 4};
    make_problem(&pb, QWEN_PATH, lens, 2, 3, 1, 0, 61);
    if (!pb.m) return;
    int64_t pos = 4; /* the first token of segment 2: its prediction would cross segments */
    int32_t tok = 1;
    float lp = -0.5f;
    cart_distill_targets tg = {&pos, &tok, &lp, 1};
    CHECK_ERR(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, 2, &tg, 1, 1, 0, NULL),
              CART_E_ARG);
    pos = 0;
    CHECK_ERR(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, 2, &tg, 1, 1, 0, NULL),
              CART_E_ARG);
    pos = 2, tok = 100000;
    CHECK_ERR(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, 2, &tg, 1, 1, 0, NULL),
              CART_E_ARG);
    tok = 1;
    int64_t bad[2] = {4, 3};
    CHECK_ERR(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, bad, 2, &tg, 1, 1, 0, NULL),
              CART_E_ARG);
    CHECK_ERROR_MENTIONS("hold 7 tokens, the pass has 8");
    cart_cartridge *other = NULL;
    CHECK_OK(cart_cartridge_new(&other, 3, 2, 8, 4, 1));
    CHECK_ERR(cart_trainer_distill(pb.t, other, pb.tokens, pb.n, pb.seg, 2, &tg, 1, 1, 0, NULL),
              CART_E_ARG);
    cart_cartridge_free(other);
    CHECK_ERR(cart_cartridge_new(&other, 2, 2, 8, 4, 4), CART_E_ARG);
    CHECK(other == NULL);
    free_problem(&pb);
}

int main(void) {
    /* head_dim 16 takes the level's attention kernels, 8 the plain C ones */
    tiny_shape q = {.qwen3 = 1, .layers = 2, .embd = 32, .heads = 4, .kv_heads = 2, .head_dim = 16,
                    .ff = 48, .vocab = 40, .dtype = CART_F32, .tied = 1, .seed = 5};
    tiny_shape l = q;
    l.qwen3 = 0, l.tied = 0, l.seed = 6, l.head_dim = 8;
    snprintf(QWEN_PATH, sizeof QWEN_PATH, "/tmp/cart_test_train_qwen3.%d.gguf", (int)getpid());
    snprintf(LLAMA_PATH, sizeof LLAMA_PATH, "/tmp/cart_test_train_llama.%d.gguf", (int)getpid());
    tiny_shape k = q; /* block types: every row a whole number of 256-blocks */
    k.embd = 256, k.head_dim = 64, k.ff = 256, k.seed = 7, k.dtype = CART_Q8_0;
    tiny_shape k4 = k;
    k4.dtype = CART_Q4_K, k4.seed = 8;
    snprintf(Q8_PATH, sizeof Q8_PATH, "/tmp/cart_test_train_q8_0.%d.gguf", (int)getpid());
    snprintf(Q4K_PATH, sizeof Q4K_PATH, "/tmp/cart_test_train_q4_K.%d.gguf", (int)getpid());
    if (write_tiny_model(QWEN_PATH, &q) || write_tiny_model(LLAMA_PATH, &l) || write_tiny_model(Q8_PATH, &k) ||
        write_tiny_model(Q4K_PATH, &k4)) {
        printf("cannot write the test models: %s\n", cart_last_error());
        return 1;
    }
    RUN(test_rmsnorm_backward_matches_finite_differences);
    RUN(test_swiglu_backward_matches_finite_differences);
    RUN(test_rope_backward_is_the_inverse_rotation);
    RUN(test_attention_backward_matches_finite_differences);
    RUN(test_qwen3_stack_gradients_match_finite_differences);
    RUN(test_llama_stack_gradients_match_finite_differences);
    RUN(test_quantized_stack_gradients_match_finite_differences);
    RUN(test_fused_loss_equals_the_unfused_computation);
    RUN(test_packed_segments_match_one_at_a_time);
    RUN(test_gradient_exports_in_the_optimizer_order_and_imports_back);
    RUN(test_recompute_gives_bitwise_equal_loss_and_gradients);
    RUN(test_a_captured_cartridge_continues_like_the_full_sequence);
    RUN(test_a_split_capture_composes_back_bitwise);
    RUN(test_gradients_through_a_composition_reach_every_part);
    RUN(test_adam_follows_torch_and_lowers_the_loss);
    RUN(test_topk_targets_keep_entries_up_to_the_mass);
    RUN(test_target_lists_append_shift_and_view);
    RUN(test_bad_targets_and_segments_are_refused);
    remove(QWEN_PATH);
    remove(LLAMA_PATH);
    remove(Q8_PATH);
    remove(Q4K_PATH);
    return check_finish("train");
}
