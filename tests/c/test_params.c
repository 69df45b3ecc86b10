/*
 * test_params.c - training a model's weights: finite-difference checks of the
 * gradient of every tensor (each linear layer, the embedding tied and untied,
 * the output head, every RMSNorm and the q/k norms), with and without a
 * cartridge in front; tensor selection; AdamW; writing the trained model as a
 * GGUF that loads again with the same logits.
 *
 * Models are generated here (tiny_model.h), so nothing depends on ../shared.
 */
#include <unistd.h>

#include "adam.h"
#include "check.h"
#include "model.h"
#include "params.h"
#include "rng.h"
#include "tiny_model.h"
#include "train.h"

static char QWEN_PATH[64], LLAMA_PATH[64], OUT_PATH[64];

typedef struct problem {
    cart_model *m;
    cart_trainer *t;
    cart_params *p;
    cart_cartridge *c; /* NULL: the weights alone */
    int32_t tokens[32];
    int64_t seg[2];
    int64_t n;
    int64_t pos[128];
    int32_t tok[128];
    float lp[128];
    cart_distill_targets tg;
} problem;

static const cart_model_options WIDE = {.widen_f32 = 1};

/* Two segments of random tokens; at every position that does not start a
 * segment, the next token with logprob 0 (the language-model loss) and one
 * more entry of a soft target. */
static int make_problem(problem *pb, const char *path, int with_cartridge, uint64_t seed) {
    memset(pb, 0, sizeof *pb);
    CHECK_OK(cart_model_load(&pb->m, path, &WIDE));
    if (!pb->m) return 0;
    CHECK_OK(cart_trainer_new(&pb->t, pb->m, NULL));
    CHECK_OK(cart_params_new(&pb->p, pb->m, NULL, 0));
    CHECK_OK(cart_trainer_set_params(pb->t, pb->p));
    if (with_cartridge) {
        CHECK_OK(cart_cartridge_new_for(&pb->c, pb->m, 3, 1));
        cart_cartridge_init_random(pb->c, seed, 0.7f);
    }
    cart_rng r;
    cart_rng_seed(&r, seed + 1);
    int32_t V = cart_model_get_config(pb->m)->n_vocab;
    const int64_t lens[2] = {6, 5};
    int64_t at = 0, e = 0;
    for (int s = 0; s < 2; s++) {
        pb->seg[s] = lens[s];
        for (int64_t i = 0; i < lens[s]; i++, at++) {
            pb->tokens[at] = (int32_t)cart_rng_below(&r, (uint64_t)V);
            if (i == 0) continue;
            pb->pos[e] = at, pb->tok[e] = pb->tokens[at], pb->lp[e] = 0.0f, e++;
            pb->pos[e] = at, pb->tok[e] = (pb->tokens[at] + 5) % V, pb->lp[e] = -1.5f, e++;
        }
    }
    pb->n = at;
    pb->tg = (cart_distill_targets){pb->pos, pb->tok, pb->lp, e};
    return 1;
}

static void free_problem(problem *pb) {
    cart_cartridge_free(pb->c);
    cart_trainer_free(pb->t);
    cart_params_free(pb->p);
    cart_model_free(pb->m);
}

static double loss_of(problem *pb) {
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb->t, pb->c, pb->tokens, pb->n, pb->seg, 2, &pb->tg, 1, 1.0f, 0, &loss));
    return loss;
}

/* Every tensor: 6 coordinates against central differences of the loss. */
static void check_weight_gradients(const char *path, int with_cartridge, const char *label) {
    problem pb;
    if (!make_problem(&pb, path, with_cartridge, 7)) return;
    cart_params_zero_grad(pb.p);
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, 2, &pb.tg, 1, 1.0f, 1, &loss));
    CHECK(loss > 0);
    cart_rng r;
    cart_rng_seed(&r, 1234);
    double worst = 0;
    int checked = 0, tensors = 0;
    const char *worst_name = "";
    for (int32_t i = 0; i < cart_params_count(pb.p); i++) {
        float *x = cart_params_data(pb.p, i), *g = cart_params_grad(pb.p, i);
        int64_t n = cart_params_numel(pb.p, i);
        double tensor_worst = 0, gmax = 0;
        for (int64_t j = 0; j < n; j++) gmax = fmax(gmax, fabs(g[j]));
        CHECK_MSG(gmax > 0, "%s: no gradient reached %s", label, cart_params_name(pb.p, i));
        for (int k = 0; k < 6; k++) {
            /* half the probes where the gradient is largest-ish: a row the tokens used */
            int64_t j = (int64_t)cart_rng_below(&r, (uint64_t)n);
            if (k % 2 == 0)
                for (int tries = 0; tries < 64 && fabs(g[j]) < 0.25 * gmax; tries++)
                    j = (int64_t)cart_rng_below(&r, (uint64_t)n);
            float keep = x[j], h = 1e-2f;
            x[j] = keep + h;
            double up = loss_of(&pb);
            x[j] = keep - h;
            double down = loss_of(&pb);
            x[j] = keep;
            double fd = (up - down) / (2 * h);
            double err = fabs(g[j] - fd) / fmax(fabs(fd), 1e-2);
            if (err > tensor_worst) tensor_worst = err;
            checked++;
        }
        if (tensor_worst > worst) worst = tensor_worst, worst_name = cart_params_name(pb.p, i);
        tensors++;
    }
    printf("  %s: %d tensors, %d coordinates; worst %s\n", label, tensors, checked, worst_name);
    CHECK_MAXDIFF("weight gradients vs finite differences (relative)", worst, 1e-2);
    if (pb.c) {
        /* the cartridge rows still get theirs in the same pass */
        float *cg = cart_cartridge_grad(pb.c, 0, 0);
        int64_t row = (int64_t)cart_cartridge_kv_heads(pb.c) * cart_cartridge_head_dim(pb.c);
        double most = 0;
        for (int64_t j = row; j < 3 * row; j++) most = fmax(most, fabs(cg[j]));
        CHECK_MSG(most > 0, "the cartridge rows got no gradient next to the weights");
    }
    free_problem(&pb);
}

static void test_qwen3_weight_gradients_match_finite_differences(void) {
    check_weight_gradients(QWEN_PATH, 0, "qwen3, tied head, q/k norms, no prefix");
}

static void test_llama_weight_gradients_match_finite_differences(void) {
    check_weight_gradients(LLAMA_PATH, 0, "llama, untied head, no prefix");
}

static void test_weight_gradients_behind_a_cartridge(void) {
    check_weight_gradients(QWEN_PATH, 1, "qwen3 behind a 3-row cartridge");
}

static void test_patterns_choose_the_tensors_that_train(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, LLAMA_PATH, &WIDE));
    if (!m) return;
    cart_params *all = NULL, *some = NULL, *bad = NULL;
    CHECK_OK(cart_params_new(&all, m, NULL, 0));
    /* llama-tiny: embedding, output, final norm + 9 per layer x 2 layers */
    CHECK(cart_params_count(all) == 3 + 2 * 9);
    const char *pats[] = {"blk.*.attn_q.weight", "*norm*"};
    CHECK_OK(cart_params_new(&some, m, pats, 2));
    CHECK(cart_params_count(some) == 2 + 2 * 2 + 1);
    for (int32_t i = 0; i < cart_params_count(some); i++) {
        const char *name = cart_params_name(some, i);
        CHECK_MSG(strstr(name, "attn_q.weight") || strstr(name, "norm"), "unexpected tensor %s", name);
        if (strstr(name, "norm")) CHECK(cart_params_rank(some, i) == 1);
        else CHECK(cart_params_rank(some, i) == 2 && cart_params_dim(some, i, 1) == 32);
    }
    const char *nothing[] = {"blk.*.attn_qq.weight"};
    CHECK_ERR(cart_params_new(&bad, m, nothing, 1), CART_E_ARG);
    CHECK_ERROR_MENTIONS("blk.*.attn_qq.weight");
    /* only the chosen tensors receive gradients */
    cart_trainer *t = NULL;
    CHECK_OK(cart_trainer_new(&t, m, NULL));
    CHECK_OK(cart_trainer_set_params(t, some));
    int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
    int64_t seg = 6, pos[5] = {1, 2, 3, 4, 5};
    int32_t tok[5] = {2, 3, 4, 5, 6};
    float lp[5] = {0, 0, 0, 0, 0};
    cart_distill_targets tg = {pos, tok, lp, 5};
    CHECK_OK(cart_trainer_distill(t, NULL, tokens, 6, &seg, 1, &tg, 1, 1.0f, 1, NULL));
    CHECK(cart_params_grad_norm(some) > 0);
    CHECK(cart_params_grad_norm(all) == 0);
    cart_trainer_free(t);
    cart_params_free(some);
    cart_params_free(all);
    cart_model_free(m);
    /* a model whose matrices are its file's own cannot train */
    CHECK_OK(cart_model_load(&m, LLAMA_PATH, NULL));
    CHECK_ERR(cart_params_new(&bad, m, NULL, 0), CART_E_STATE);
    CHECK_ERROR_MENTIONS("widen_f32");
    cart_model_free(m);
}

static void test_adamw_decays_matrices_only_and_lowers_the_loss(void) {
    problem pb;
    if (!make_problem(&pb, QWEN_PATH, 0, 17)) return;
    cart_adam_params ap;
    cart_adam_default_params(&ap);
    ap.lr = 1e-2f, ap.weight_decay = 0.1f, ap.decoupled = 1;
    cart_adam *a = NULL;
    CHECK_OK(cart_adam_new(&a, &ap, cart_params_total(pb.p)));
    /* with zero gradients, one step scales each matrix by 1 - lr * wd exactly and leaves norms alone */
    int32_t mat = -1, vec = -1;
    for (int32_t i = 0; i < cart_params_count(pb.p); i++) {
        if (cart_params_rank(pb.p, i) == 2 && mat < 0) mat = i;
        if (cart_params_rank(pb.p, i) == 1 && vec < 0) vec = i;
    }
    float m0 = cart_params_data(pb.p, mat)[3], v0 = cart_params_data(pb.p, vec)[2];
    cart_params_zero_grad(pb.p);
    CHECK_OK(cart_params_adam_step(pb.p, a));
    CHECK(cart_params_data(pb.p, mat)[3] == m0 * (float)(1.0 - 1e-2 * 0.1));
    CHECK(cart_params_data(pb.p, vec)[2] == v0);
    double first = loss_of(&pb), last = first;
    for (int step = 0; step < 20; step++) {
        cart_params_zero_grad(pb.p);
        CHECK_OK(cart_trainer_distill(pb.t, NULL, pb.tokens, pb.n, pb.seg, 2, &pb.tg, 1, 1.0f, 1, &last));
        double norm = cart_params_grad_norm(pb.p);
        if (norm > 1.0) cart_params_scale_grad(pb.p, (float)(1.0 / norm));
        CHECK(cart_params_grad_norm(pb.p) <= 1.0 + 1e-6);
        CHECK_OK(cart_params_check_finite(pb.p, 1));
        CHECK_OK(cart_params_adam_step(pb.p, a));
    }
    last = loss_of(&pb);
    printf("  20 AdamW steps on the weights: loss %.4f -> %.4f\n", first, last);
    CHECK(last < 0.5 * first);
    cart_params_data(pb.p, vec)[0] = NAN;
    CHECK_ERR(cart_params_check_finite(pb.p, 0), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("nan");
    cart_adam_free(a);
    free_problem(&pb);
}

static void test_a_trained_model_is_written_and_loads_with_the_same_logits(void) {
    problem pb;
    if (!make_problem(&pb, LLAMA_PATH, 0, 23)) return;
    /* change every tensor, so that the file must carry the new values */
    for (int32_t i = 0; i < cart_params_count(pb.p); i++) cart_params_data(pb.p, i)[1] += 0.25f;
    CHECK_OK(cart_model_write_gguf(pb.m, OUT_PATH, CART_F32, "trained"));
    cart_model *back = NULL;
    CHECK_OK(cart_model_load(&back, OUT_PATH, NULL));
    if (!back) return free_problem(&pb);
    int32_t V = cart_model_get_config(pb.m)->n_vocab;
    cart_kv *k1 = NULL, *k2 = NULL;
    CHECK_OK(cart_model_new_kv(&k1, pb.m, 16, CART_F32));
    CHECK_OK(cart_model_new_kv(&k2, back, 16, CART_F32));
    int64_t n = 6, last = 5;
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    CHECK_OK(cart_model_forward(pb.m, &k1, 1, pb.tokens, &n, &last, 1, a));
    CHECK_OK(cart_model_forward(back, &k2, 1, pb.tokens, &n, &last, 1, b));
    double worst = 0;
    for (int32_t v = 0; v < V; v++) worst = fmax(worst, fabs(a[v] - b[v]));
    CHECK_MAXDIFF("logits of the model in memory vs the GGUF it wrote (f32)", worst, 0);
    cart_str nm = {0};
    CHECK_OK(cart_gguf_get_str(&nm, cart_model_gguf(back), "general.name"));
    CHECK(nm.len == 7 && memcmp(nm.data, "trained", 7) == 0);
    cart_kv_free(k2);
    cart_model_free(back);
    /* f16 matrices: loads, and the logits agree to f16 rounding */
    CHECK_OK(cart_model_write_gguf(pb.m, OUT_PATH, CART_F16, NULL));
    CHECK_OK(cart_model_load(&back, OUT_PATH, NULL));
    CHECK_OK(cart_model_new_kv(&k2, back, 16, CART_F32));
    CHECK_OK(cart_model_forward(back, &k2, 1, pb.tokens, &n, &last, 1, b));
    worst = 0;
    for (int32_t v = 0; v < V; v++) worst = fmax(worst, fabs(a[v] - b[v]));
    CHECK_MAXDIFF("logits of the model in memory vs its f16 GGUF", worst, 5e-2);
    CHECK_ERR(cart_model_write_gguf(pb.m, OUT_PATH, CART_Q8_0, NULL), CART_E_ARG);
    cart_kv_free(k1);
    cart_kv_free(k2);
    cart_model_free(back);
    free(a);
    free(b);
    free_problem(&pb);
    remove(OUT_PATH);
}

int main(void) {
    tiny_shape q = {.qwen3 = 1, .layers = 2, .embd = 32, .heads = 4, .kv_heads = 2, .head_dim = 16,
                    .ff = 48, .vocab = 40, .dtype = CART_F32, .tied = 1, .seed = 5};
    tiny_shape l = q;
    l.qwen3 = 0, l.tied = 0, l.seed = 6, l.head_dim = 8;
    snprintf(QWEN_PATH, sizeof QWEN_PATH, "/tmp/cart_test_params_qwen3.%d.gguf", (int)getpid());
    snprintf(LLAMA_PATH, sizeof LLAMA_PATH, "/tmp/cart_test_params_llama.%d.gguf", (int)getpid());
    snprintf(OUT_PATH, sizeof OUT_PATH, "/tmp/cart_test_params_out.%d.gguf", (int)getpid());
    if (write_tiny_model(QWEN_PATH, &q) || write_tiny_model(LLAMA_PATH, &l)) {
        printf("cannot write the test models: %s\n", cart_last_error());
        return 1;
    }
    RUN(test_qwen3_weight_gradients_match_finite_differences);
    RUN(test_llama_weight_gradients_match_finite_differences);
    RUN(test_weight_gradients_behind_a_cartridge);
    RUN(test_patterns_choose_the_tensors_that_train);
    RUN(test_adamw_decays_matrices_only_and_lowers_the_loss);
    RUN(test_a_trained_model_is_written_and_loads_with_the_same_logits);
    remove(QWEN_PATH);
    remove(LLAMA_PATH);
    return check_finish("params");
}
