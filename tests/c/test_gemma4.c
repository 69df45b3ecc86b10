/*
 * test_gemma4.c - the gemma4 forward pass: the random-weight models the build
 * writes (models/gemma4, recipes/make_model.lua --arch gemma4) against
 * llama.cpp's greedy continuations of them (tests/fixtures/gemma4, made by
 * tools/greedy_fixtures.mjs --set gemma4 with node-llama-cpp
 * 3.22.1), dense and MoE, at
 * f32, f16 and q8_0, prompts longer than the sliding window; the batch
 * invariance the equivalence gate relies on, through sliding windows and
 * expert routing; the q8_0 x q8_0 product; the loader's refusals; the
 * trainer's backward into the cartridge rows through sliding windows,
 * soft-capping, per-layer inputs and the MoE against finite differences,
 * and the sliding layers' rule for the prefix.
 */
#include <unistd.h>

#include "check.h"
#include "gguf_mutant.h"
#include "reference_check.h"
#include "dtype.h"
#include "gguf.h"
#include "matmul.h"
#include "model.h"
#include "rng.h"
#include "train.h"
#include "train_problem.h"

#define MODELS CART_SOURCE_DIR "/models/gemma4/"
#define FIXTURES CART_SOURCE_DIR "/tests/fixtures/gemma4/"

/* llama.cpp disagrees with itself (reference_check.h): GGML's GELU rounds
 * its input to f16 for a table lookup, f16 weights round the activations
 * to f16, q8_0 weights quantize them, and the MoE's top-k picks experts;
 * each turns a difference of one f32 rounding into a step, so kernels that
 * sum in another order land up to a few thousandths apart on f32 weights,
 * a few hundredths on f16, and -- once a q8_0 activation or an expert
 * choice flips -- tenths on q8_0 (llama.cpp's flash attention against its
 * plain attention: up to 4 logits). The fixtures record both. */
static void check_gemma4(const char *name, double tol) { check_fixture(MODELS, FIXTURES, name, tol); }

static void test_dense_f32_matches_llama_cpp(void) { check_gemma4("tiny-dense-f32", 1e-3); }
static void test_dense_f16_matches_llama_cpp(void) { check_gemma4("tiny-dense-f16", 1e-2); }
static void test_dense_q8_0_matches_llama_cpp(void) { check_gemma4("tiny-dense-q8_0", 1e-2); }
static void test_moe_f32_matches_llama_cpp(void) { check_gemma4("tiny-moe-f32", 1e-3); }
static void test_moe_f16_matches_llama_cpp(void) { check_gemma4("tiny-moe-f16", 1e-2); }
static void test_moe_q8_0_matches_llama_cpp(void) { check_gemma4("tiny-moe-q8_0", 1e-2); }

/* 100 tokens, three times the window: passes of more than 16 tokens give
 * every token the same bits wherever it sits (what the equivalence gate
 * relies on), through the sliding layers and the experts' routing. */
static void check_shapes(const char *name) {
    char path[512];
    snprintf(path, sizeof path, MODELS "%s.gguf", name);
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, path, NULL));
    if (!m) return;
    const int64_t V = cart_model_get_config(m)->n_vocab, N = 100;
    int32_t toks[100];
    cart_rng rng;
    cart_rng_seed(&rng, 5);
    for (int i = 0; i < N; i++) toks[i] = 8 + (int32_t)(cart_rng_next(&rng) % (uint64_t)(V - 8));
    float *one = malloc(sizeof(float) * (size_t)(N * V)), *parts = malloc(sizeof(float) * (size_t)(N * V));
    logits_in_chunks(m, toks, N, N, CART_F32, one);
    logits_in_chunks(m, toks, N, 50, CART_F32, parts);
    printf("  %s:\n", name);
    CHECK_MAXDIFF("two passes of 50 vs one of 100 (bitwise)", max_diff(one, parts, N * V), 0.0);
    logits_in_chunks(m, toks, N, 20, CART_F32, parts);
    CHECK_MAXDIFF("passes of 20 vs one of 100 (bitwise)", max_diff(one, parts, N * V), 0.0);
    /* a few tokens a call take the GEMV kernels, whose sums round
     * differently; the f16 GELU table turns that into up to ~1e-2 on f32
     * weights (llama.cpp does the same to itself, reference_check.h); the
     * q8_0 product is the same bits on both paths */
    logits_in_chunks(m, toks, N, 3, CART_F32, parts);
    CHECK_MAXDIFF("passes of 3 vs one of 100", max_diff(one, parts, N * V), 5e-2);
    free(one);
    free(parts);
    cart_model_free(m);
}

static void test_chunked_prefill_gives_the_bits_of_one_pass(void) {
    check_shapes("tiny-dense-f32");
    check_shapes("tiny-moe-f32");
    check_shapes("tiny-moe-q8_0");
}

/* Streams decoding together (and one beside a prefill) get the bits each
 * gets alone: the experts of a batch are routed and run stream by stream. */
static void test_a_stream_gets_the_same_bits_in_any_group(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, MODELS "tiny-moe-f32.gguf", NULL));
    if (!m) return;
    const int64_t V = cart_model_get_config(m)->n_vocab;
    enum { B = 5, P = 40 };
    cart_kv *kv[B], *solo[B];
    int32_t prompts[B][P];
    cart_rng rng;
    cart_rng_seed(&rng, 9);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < P; i++) prompts[b][i] = 8 + (int32_t)(cart_rng_next(&rng) % (uint64_t)(V - 8));
    float *alone = malloc(sizeof(float) * (size_t)(B * V)), *group = malloc(sizeof(float) * (size_t)(B * V));
    int64_t lens[B];
    /* streams 1..B-1 prefill alone first; stream 0 prefills inside the group */
    for (int b = 0; b < B; b++) {
        CHECK_OK(cart_model_new_kv(&kv[b], m, P + 8, CART_F32));
        CHECK_OK(cart_model_new_kv(&solo[b], m, P + 8, CART_F32));
        int64_t n = b == 0 ? P : P - 1 - b, last = n - 1;
        CHECK_OK(cart_model_forward(m, &solo[b], 1, prompts[b], &n, &last, 1, alone + b * V));
        if (b > 0) CHECK_OK(cart_model_forward(m, &kv[b], 1, prompts[b], &n, NULL, 0, NULL));
        lens[b] = n;
    }
    /* the group: stream 0's whole prompt beside one decode token each */
    int32_t toks[P + B];
    int64_t counts[B], rows[B], at = 0;
    for (int b = 0; b < B; b++) {
        counts[b] = b == 0 ? P : 1;
        for (int64_t i = 0; i < counts[b]; i++) toks[at + i] = b == 0 ? prompts[0][i] : prompts[b][lens[b]];
        rows[b] = at + counts[b] - 1;
        at += counts[b];
    }
    CHECK_OK(cart_model_forward(m, kv, B, toks, counts, rows, B, group));
    double worst = max_diff(alone, group, V); /* stream 0: the prefill */
    for (int b = 1; b < B; b++) {
        int64_t one = 1, last = 0;
        CHECK_OK(cart_model_forward(m, &solo[b], 1, &prompts[b][lens[b]], &one, &last, 1, alone + b * V));
        worst = fmax(worst, max_diff(alone + b * V, group + b * V, V));
    }
    CHECK_MAXDIFF("a prefill and 4 decodes in one MoE pass vs each alone", worst, 0.0);
    for (int b = 0; b < B; b++) cart_kv_free(kv[b]), cart_kv_free(solo[b]);
    free(alone);
    free(group);
    cart_model_free(m);
}

/* The q8_0 product against the same sums in double, and each row the same
 * bits whatever the batch. */
static void test_q8_product_quantizes_activations_as_ggml_does(void) {
    enum { ROWS = 40, COLS = 96, N = 7 };
    float wf[ROWS * COLS], x[N * COLS], y[N * ROWS], y1[ROWS];
    cart_rng rng;
    cart_rng_seed(&rng, 3);
    cart_rng_fill_normal(&rng, wf, ROWS * COLS, 0.0f, 0.3f);
    cart_rng_fill_normal(&rng, x, N * COLS, 0.0f, 1.0f);
    x[5] = 0.0f; /* an exact zero and a block of zeros */
    for (int i = 0; i < 32; i++) x[COLS + 32 + i] = 0.0f;
    uint64_t bytes = 0;
    CHECK_OK(cart_dtype_nbytes(&bytes, CART_Q8_0, ROWS * COLS));
    uint8_t *wq = malloc((size_t)bytes);
    CHECK_OK(cart_from_f32(wq, CART_Q8_0, wf, ROWS * COLS));
    cart_weight w;
    CHECK_OK(cart_weight_init(&w, CART_Q8_0, wq, ROWS, COLS));
    CHECK_OK(cart_matmul_forward(y, ROWS, x, COLS, &w, N, NULL));
    /* the reference: x quantized as GGML does, then exact sums */
    double worst = 0, worst_batch = 0;
    float wd[ROWS * COLS];
    CHECK_OK(cart_to_f32(wd, CART_Q8_0, wq, ROWS * COLS));
    for (int i = 0; i < N; i++) {
        float xq[COLS];
        for (int b = 0; b < COLS / 32; b++) {
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[i * COLS + b * 32 + k]));
            float d = cart_f16_to_f32(cart_f32_to_f16(amax / 127.0f)), id = amax ? 127.0f / amax : 0.0f;
            for (int k = 0; k < 32; k++) xq[b * 32 + k] = nearbyintf(x[i * COLS + b * 32 + k] * id) * d;
        }
        for (int r = 0; r < ROWS; r++) {
            double s = 0;
            for (int k = 0; k < COLS; k++) s += (double)wd[r * COLS + k] * xq[k];
            worst = fmax(worst, fabs(s - y[i * ROWS + r]) / (fabs(s) + 1e-3));
        }
        CHECK_OK(cart_matmul_forward(y1, ROWS, x + i * COLS, COLS, &w, 1, NULL));
        worst_batch = fmax(worst_batch, max_diff(y1, y + i * ROWS, ROWS));
    }
    CHECK_MAXDIFF("q8_0 x q8_0 vs the quantized sums in double (relative)", worst, 1e-5);
    CHECK_MAXDIFF("one row alone vs in a batch of 7", worst_batch, 0.0);
    free(wq);
}

/* A copy of tiny-dense-f32 with one change, for the loader's refusals. */
static void write_mutant(const char *out, mutation what, const char *target, uint32_t value) {
    write_mutant_of(MODELS "tiny-dense-f32.gguf", out, what, target, value);
}

static void test_loading_refuses_what_it_cannot_honour_by_name(void) {
    static const struct {
        mutation what;
        const char *target;
        uint32_t value;
        int status;
        const char *message;
    } cases[] = {
        {SET_U32, "gemma4.attention.shared_kv_layers", 2, CART_E_UNSUPPORTED, "gemma4.attention.shared_kv_layers' = 2"},
        {SET_U32, "gemma4.attention.logit_softcapping_swa", 50, CART_E_UNSUPPORTED,
         "'gemma4.attention.logit_softcapping_swa' is set"},
        {SET_U32, "gemma4.expert_gating_func", 2, CART_E_UNSUPPORTED, "gemma4.expert_gating_func"},
        {SET_U32, "gemma4.block_count", 4000, CART_E_FORMAT, "4000 layers, but the file holds only"},
        {DROP_TENSOR, "rope_freqs.weight", 0, CART_E_FORMAT, "missing tensor 'rope_freqs.weight'"},
        {DROP_TENSOR, "blk.2.post_ffw_norm.weight", 0, CART_E_FORMAT, "missing tensor 'blk.2.post_ffw_norm.weight'"},
        {ADD_TENSOR, "blk.1.attn_qkv.scale", 0, CART_E_UNSUPPORTED,
         "tensor 'blk.1.attn_qkv.scale' is not part of the gemma4 architecture"},
    };
    char path[64];
    snprintf(path, sizeof path, "/tmp/cart_test_gemma4_mutant.%d.gguf", (int)getpid());
    cart_model *m = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_mutant(path, cases[i].what, cases[i].target, cases[i].value);
        CHECK_ERR(cart_model_load(&m, path, NULL), cases[i].status);
        CHECK_ERROR_MENTIONS(cases[i].message);
    }
    CHECK(m == NULL);
    remove(path);
}

/* tiny-moe-f32 with each layer's ffn_gate_exps and ffn_up_exps merged into
 * one ffn_gate_up_exps (each expert's gate rows, then its up rows), as the
 * converters write gemma4: the same model, so the same bits. */
static void test_merged_gate_up_experts_give_the_same_logits(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/cart_test_gemma4_merged.%d.gguf", (int)getpid());
    cart_gguf *g = NULL;
    CHECK_OK(cart_gguf_open(&g, MODELS "tiny-moe-f32.gguf"));
    if (!g) return;
    cart_gguf_writer *w = NULL;
    CHECK_OK(cart_gguf_writer_new(&w));
    copy_gguf_metadata(w, g, NULL);
    uint8_t *merged[8] = {0};
    int n_merged = 0;
    for (int64_t i = 0; i < cart_gguf_tensor_count(g); i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        char *at = strstr(name, "ffn_gate_exps.weight");
        if (strstr(name, "ffn_up_exps.weight")) continue;
        if (!at) {
            CHECK_OK(cart_gguf_writer_add_tensor(w, name, t->dtype, t->n_dims, t->ne, t->data));
            continue;
        }
        char up_name[128], out_name[128];
        snprintf(up_name, sizeof up_name, "%.*sffn_up_exps.weight", (int)(at - name), name);
        snprintf(out_name, sizeof out_name, "%.*sffn_gate_up_exps.weight", (int)(at - name), name);
        const cart_gguf_tensor_info *u = cart_gguf_find_tensor(g, up_name);
        CHECK(u != NULL && n_merged < 8);
        if (!u || n_merged >= 8) break;
        const size_t slice = (size_t)t->nbytes / (size_t)t->ne[2];
        uint8_t *both = malloc(2 * (size_t)t->nbytes);
        for (int64_t e = 0; e < t->ne[2]; e++) {
            memcpy(both + 2 * e * slice, (const uint8_t *)t->data + e * slice, slice);
            memcpy(both + (2 * e + 1) * slice, (const uint8_t *)u->data + e * slice, slice);
        }
        int64_t ne[4] = {t->ne[0], 2 * t->ne[1], t->ne[2], 1};
        CHECK_OK(cart_gguf_writer_add_tensor(w, out_name, t->dtype, 3, ne, both));
        merged[n_merged++] = both;
    }
    CHECK_OK(cart_gguf_writer_write(w, path));
    cart_gguf_writer_free(w);
    cart_gguf_close(g);
    for (int i = 0; i < n_merged; i++) free(merged[i]);
    CHECK(n_merged == 4);
    cart_model *a = NULL, *b = NULL;
    CHECK_OK(cart_model_load(&a, MODELS "tiny-moe-f32.gguf", NULL));
    CHECK_OK(cart_model_load(&b, path, NULL));
    if (a && b) {
        const int64_t V = cart_model_get_config(a)->n_vocab, N = 40;
        int32_t toks[40];
        for (int i = 0; i < N; i++) toks[i] = 8 + (i * 37) % (int32_t)(V - 8);
        float *la = malloc(sizeof(float) * (size_t)(N * V)), *lb = malloc(sizeof(float) * (size_t)(N * V));
        logits_in_chunks(a, toks, N, N, CART_F32, la);
        logits_in_chunks(b, toks, N, N, CART_F32, lb);
        CHECK_MAXDIFF("merged ffn_gate_up_exps vs separate gate and up (bitwise)", max_diff(la, lb, N * V), 0.0);
        free(la);
        free(lb);
    }
    cart_model_free(a);
    cart_model_free(b);
    remove(path);
}

static void test_layers_report_their_own_geometry(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, MODELS "tiny-dense-f32.gguf", NULL));
    if (!m) return;
    const cart_model_config *c = cart_model_get_config(m);
    CHECK(c->arch == CART_ARCH_GEMMA4 && c->n_layer == 4 && c->n_swa == 32 && !c->uniform_kv);
    CHECK(c->n_embd_per_layer == 32 && c->final_softcap == 30.0f && c->embd_scale == 8.0f);
    cart_layer_config g;
    CHECK_OK(cart_model_layer(m, 0, &g));
    CHECK(g.window == 32 && g.head_dim == 16 && g.n_head_kv == 2 && g.rope_theta == 1e4f && g.attn_scale == 1.0f);
    CHECK_OK(cart_model_layer(m, 2, &g));
    CHECK(g.window == 0 && g.head_dim == 32 && g.n_head_kv == 1 && g.rope_theta == 1e6f && g.n_rot == 32);
    CHECK_ERR(cart_model_layer(m, 4, &g), CART_E_ARG);
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 10, CART_F16));
    CHECK(cart_kv_layer_heads(kv, 2) == 1 && cart_kv_layer_head_dim(kv, 2) == 32);
    CHECK(cart_kv_layer_heads(kv, 3) == 2 && cart_kv_layer_head_dim(kv, 3) == 16);
    /* a uniform cache of the wrong shape is refused, naming the layer */
    cart_kv *flat = NULL;
    CHECK_OK(cart_kv_new(&flat, 4, 2, 16, 10, CART_F16));
    int32_t tok = 10;
    int64_t one = 1;
    CHECK_ERR(cart_model_forward(m, &flat, 1, &tok, &one, NULL, 0, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("(layer 2), the model needs 4 x 1 x 32");
    cart_kv_free(flat);
    cart_kv_free(kv);
    cart_model_free(m);
}

/* The prefix of 24 rows and segments of 20 and 12 tokens put the segments'
 * queries at positions 24..43, so the window of 32 cuts through the prefix
 * on the sliding layers. */
static const int64_t stack_lens[2] = {20, 12};

static void test_dense_gradients_match_finite_differences(void) {
    /* sliding windows through the prefix, proportional RoPE, value norm,
     * post-norms, GEGLU, per-layer inputs, output scales, soft-capping */
    check_stack_gradients(MODELS "tiny-dense-f32.gguf", "tiny-dense-f32", stack_lens, 2, 24, 1e-2f, 3e-2);
}

static void test_moe_gradients_match_finite_differences(void) {
    /* the experts' choice is constant; a step small enough not to flip it */
    check_stack_gradients(MODELS "tiny-moe-f32.gguf", "tiny-moe-f32", stack_lens, 2, 24, 2e-3f, 3e-2);
    check_stack_gradients(MODELS "tiny-moe-q8_0.gguf", "tiny-moe-q8_0", stack_lens, 2, 24, 2e-3f, 3e-2);
}

/* A query at position P of a sliding layer sees positions P - 31 .. P: with
 * p = 40 rows and 5 tokens at positions 40..44, prefix rows 0..8 lie outside
 * every window on the sliding layers (no gradient, no influence) and inside
 * on the full layer. */
static void test_sliding_layers_see_the_prefix_only_within_their_window(void) {
    problem pb;
    const int64_t lens[1] = {5};
    make_problem(&pb, MODELS "tiny-dense-f32.gguf", lens, 1, 40, 1, 0, 23);
    if (!pb.m) return;
    cart_cartridge_zero_grad(pb.c);
    double loss = 0;
    CHECK_OK(cart_trainer_distill(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, &pb.tg, 1, 1.0f, 1, &loss));
    for (int32_t l = 0; l < 4; l++) {
        cart_layer_config g;
        CHECK_OK(cart_model_layer(pb.m, l, &g));
        const int64_t row = (int64_t)g.n_head_kv * g.head_dim;
        double outside = 0, inside = 0;
        for (int32_t which = 0; which < 2; which++) {
            const float *gr = cart_cartridge_grad(pb.c, l, which);
            for (int64_t i = row; i < 9 * row; i++) outside = fmax(outside, fabs(gr[i])); /* rows 1..8 */
            for (int64_t i = 9 * row; i < 40 * row; i++) inside = fmax(inside, fabs(gr[i]));
        }
        printf("  layer %d (%s): |grad| up to %.3g on rows 1..8, %.3g on rows 9..39\n", l,
               g.window ? "sliding" : "full", outside, inside);
        CHECK(inside > 0);
        if (g.window) CHECK(outside == 0.0);
        else CHECK(outside > 0);
    }
    /* and the rows outside the window change nothing: layer 0 slides */
    float *k0 = cart_cartridge_rows(pb.c, 0, 0);
    k0[5 * 32 + 3] += 1.0f;
    CHECK(loss_of(&pb) == loss);
    free_problem(&pb);
}

static void test_recompute_gives_bitwise_equal_loss_and_gradients(void) {
    const int64_t lens[2] = {18, 9};
    check_recompute_is_bitwise(MODELS "tiny-moe-f32.gguf", lens, 2, 20, 31);
}

static void test_adam_lowers_the_loss_through_the_experts(void) {
    const int64_t lens[2] = {20, 12};
    check_adam_lowers_the_loss(MODELS "tiny-moe-f32.gguf", lens, 2, 24, 61, 2e-2f);
}

/* Packed segments give each segment what it gets alone (the trainer's
 * forward), through windows and experts. */
static void test_packed_segments_match_one_at_a_time(void) {
    problem pb;
    const int64_t lens[3] = {15, 22, 9};
    make_problem(&pb, MODELS "tiny-moe-f32.gguf", lens, 3, 12, 1, 0, 5);
    if (!pb.m) return;
    const int32_t V = cart_model_get_config(pb.m)->n_vocab;
    int64_t rows[46];
    for (int64_t i = 0; i < pb.n; i++) rows[i] = i;
    float *packed = malloc(sizeof(float) * (size_t)(pb.n * V)), *alone = malloc(sizeof(float) * (size_t)(pb.n * V));
    CHECK_OK(cart_trainer_logits(pb.t, pb.c, pb.tokens, pb.n, pb.seg, pb.n_seg, rows, pb.n, packed));
    int64_t at = 0;
    for (int32_t s = 0; s < pb.n_seg; s++) {
        CHECK_OK(cart_trainer_logits(pb.t, pb.c, pb.tokens + at, pb.seg[s], &pb.seg[s], 1, rows, pb.seg[s],
                                     alone + at * V));
        at += pb.seg[s];
    }
    /* alone, the 9-token segment takes the GEMV path, packed the GEMM: f32
     * round-off, which the post-norms carry through the four layers */
    CHECK_MAXDIFF("three packed segments vs each alone", max_diff(packed, alone, pb.n * V), 1e-3);
    free(packed);
    free(alone);
    free_problem(&pb);
}

int main(void) {
    FILE *fp = fopen(MODELS "tiny-moe-q8_0.gguf", "rb");
    if (!fp) {
        printf("skipping: %s not found (the build writes it: cmake --build build)\n", MODELS "tiny-moe-q8_0.gguf");
        return CHECK_SKIP;
    }
    fclose(fp);
    RUN(test_dense_f32_matches_llama_cpp);
    RUN(test_dense_f16_matches_llama_cpp);
    RUN(test_dense_q8_0_matches_llama_cpp);
    RUN(test_moe_f32_matches_llama_cpp);
    RUN(test_moe_f16_matches_llama_cpp);
    RUN(test_moe_q8_0_matches_llama_cpp);
    RUN(test_chunked_prefill_gives_the_bits_of_one_pass);
    RUN(test_a_stream_gets_the_same_bits_in_any_group);
    RUN(test_q8_product_quantizes_activations_as_ggml_does);
    RUN(test_loading_refuses_what_it_cannot_honour_by_name);
    RUN(test_layers_report_their_own_geometry);
    RUN(test_merged_gate_up_experts_give_the_same_logits);
    RUN(test_dense_gradients_match_finite_differences);
    RUN(test_moe_gradients_match_finite_differences);
    RUN(test_sliding_layers_see_the_prefix_only_within_their_window);
    RUN(test_recompute_gives_bitwise_equal_loss_and_gradients);
    RUN(test_packed_segments_match_one_at_a_time);
    RUN(test_adam_lowers_the_loss_through_the_experts);
    return check_finish("gemma4");
}
