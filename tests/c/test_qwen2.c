/*
 * test_qwen2.c - the qwen2 architecture (Qwen2 / Qwen2.5: biases on q, k
 * and v, NEOX RoPE, no q/k norms): the random-weight models the build
 * writes (models/qwen2, recipes/make_model.lua --preset qwen2-tiny) against
 * llama.cpp's greedy continuations of them (tests/fixtures/qwen2, made by
 * tools/greedy_fixtures.mjs --set qwen2 with node-llama-cpp 3.22.1) at f32,
 * f16 and q8_0; chunked prefill against one pass; a captured cartridge
 * scoring the same through the training and the inference forward; the
 * trainer's gradient into the cartridge rows against finite differences,
 * Adam lowering the loss; and a file without its biases refused by name.
 */
#include <unistd.h>

#include "check.h"
#include "gguf_mutant.h"
#include "reference_check.h"
#include "model.h"
#include "params.h"
#include "train.h"
#include "train_problem.h"

#define MODELS CART_SOURCE_DIR "/models/qwen2/"
#define FIXTURES CART_SOURCE_DIR "/tests/fixtures/qwen2/"

static void check_qwen2(const char *name, double tol) { check_fixture(MODELS, FIXTURES, name, tol); }

static void test_f32_matches_llama_cpp(void) { check_qwen2("qwen2-tiny-f32", 1e-3); }
static void test_f16_matches_llama_cpp(void) { check_qwen2("qwen2-tiny-f16", 1e-2); }
static void test_q8_0_matches_llama_cpp(void) { check_qwen2("qwen2-tiny-q8_0", 1e-2); }

/* Passes of more than 16 tokens give every token the bits of one pass (the
 * equivalence gate relies on it); one-token steps land within rounding. */
static void test_chunked_prefill_gives_the_logits_of_one_pass(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, MODELS "qwen2-tiny-f32.gguf", NULL));
    if (!m) return;
    const int64_t V = cart_model_get_config(m)->n_vocab, N = 96;
    int32_t toks[96];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 37 + 11) % 256);
    float *one = malloc(sizeof(float) * (size_t)(N * V)), *parts = malloc(sizeof(float) * (size_t)(N * V));
    logits_in_chunks(m, toks, N, N, CART_F32, one);
    logits_in_chunks(m, toks, N, 48, CART_F32, parts);
    CHECK_MAXDIFF("two passes of 48 vs one of 96 (bitwise)", max_diff(one, parts, N * V), 0.0);
    logits_in_chunks(m, toks, N, 1, CART_F32, parts);
    CHECK_MAXDIFF("one-token steps vs one pass of 96", max_diff(one, parts, N * V), 1e-4);
    free(one);
    free(parts);
    cart_model_free(m);
}

/* The biases reach both forwards: a captured cartridge and a tail score the
 * same through the trainer, through a cache behind the cartridge, and as the
 * tail of the whole sequence. */
static void test_a_captured_cartridge_scores_alike_in_both_forwards(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, MODELS "qwen2-tiny-f32.gguf", NULL));
    if (!m) return;
    cart_trainer *t = NULL;
    CHECK_OK(cart_trainer_new(&t, m, NULL));
    const int32_t V = cart_model_get_config(m)->n_vocab;
    int32_t toks[30];
    for (int i = 0; i < 30; i++) toks[i] = (int32_t)((i * 53 + 7) % 256);
    cart_cartridge *c = NULL;
    CHECK_OK(cart_cartridge_new_for(&c, m, 20, 1));
    CHECK_OK(cart_cartridge_capture(c, m, toks, 20, CART_F32));
    float *full = malloc(sizeof(float) * 10 * (size_t)V), *tail = malloc(sizeof(float) * 10 * (size_t)V);
    float *inf = malloc(sizeof(float) * 10 * (size_t)V);
    int64_t rows_full[10], rows_tail[10], n_full = 30, n_tail = 10;
    for (int i = 0; i < 10; i++) rows_full[i] = 20 + i, rows_tail[i] = i;
    CHECK_OK(cart_trainer_logits(t, NULL, toks, 30, &n_full, 1, rows_full, 10, full));
    CHECK_OK(cart_trainer_logits(t, c, toks + 20, 10, &n_tail, 1, rows_tail, 10, tail));
    CHECK_MAXDIFF("captured cartridge + tail vs the whole sequence (training forward)",
                  max_diff(full, tail, 10 * (int64_t)V), 1e-5);
    cart_kv *kv = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 32, CART_F32));
    CHECK_OK(cart_cartridge_append_to_kv(c, kv));
    CHECK_OK(cart_model_forward(m, &kv, 1, toks + 20, &n_tail, rows_tail, 10, inf));
    CHECK_MAXDIFF("inference behind the cartridge vs the training forward", max_diff(inf, tail, 10 * (int64_t)V),
                  1e-5);
    cart_kv_free(kv);
    free(full);
    free(tail);
    free(inf);
    cart_cartridge_free(c);
    cart_trainer_free(t);
    cart_model_free(m);
}

static void test_gradients_match_finite_differences(void) {
    const int64_t lens[2] = {14, 9};
    check_stack_gradients(MODELS "qwen2-tiny-f32.gguf", "qwen2-tiny-f32", lens, 2, 8, 1e-2f, 2e-2);
    check_stack_gradients(MODELS "qwen2-tiny-q8_0.gguf", "qwen2-tiny-q8_0", lens, 2, 8, 1e-2f, 2e-2);
}

static void test_recompute_gives_bitwise_equal_loss_and_gradients(void) {
    const int64_t lens[2] = {11, 7};
    check_recompute_is_bitwise(MODELS "qwen2-tiny-f32.gguf", lens, 2, 6, 17);
}

static void test_adam_lowers_the_loss(void) {
    const int64_t lens[2] = {14, 9};
    check_adam_lowers_the_loss(MODELS "qwen2-tiny-f32.gguf", lens, 2, 8, 23, 2e-2f);
}

/* Its weights do not train (no gradient for the biases): refused by name,
 * not trained with the biases silently frozen. */
static void test_weight_training_is_refused_by_name(void) {
    cart_model *m = NULL;
    cart_model_options o = {.widen_f32 = 1};
    CHECK_OK(cart_model_load(&m, MODELS "qwen2-tiny-f32.gguf", &o));
    if (!m) return;
    cart_params *p = NULL;
    CHECK_ERR(cart_params_new(&p, m, NULL, 0), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("qwen2 model's weights");
    CHECK(p == NULL);
    cart_model_free(m);
}

/* Every bias is required, as llama.cpp requires it; a file without one
 * names the tensor. */
static void test_a_missing_bias_is_named(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/cart_test_qwen2_mutant.%d.gguf", (int)getpid());
    cart_model *m = NULL;
    write_mutant_of(MODELS "qwen2-tiny-f32.gguf", path, DROP_TENSOR, "blk.1.attn_k.bias", 0);
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("blk.1.attn_k.bias");
    CHECK(m == NULL);
    remove(path);
}

int main(void) {
    FILE *fp = fopen(MODELS "qwen2-tiny-q8_0.gguf", "rb");
    if (!fp) {
        printf("skipping: %s not found (the build writes it: cmake --build build)\n", MODELS "qwen2-tiny-q8_0.gguf");
        return CHECK_SKIP;
    }
    fclose(fp);
    RUN(test_f32_matches_llama_cpp);
    RUN(test_f16_matches_llama_cpp);
    RUN(test_q8_0_matches_llama_cpp);
    RUN(test_chunked_prefill_gives_the_logits_of_one_pass);
    RUN(test_a_captured_cartridge_scores_alike_in_both_forwards);
    RUN(test_gradients_match_finite_differences);
    RUN(test_recompute_gives_bitwise_equal_loss_and_gradients);
    RUN(test_adam_lowers_the_loss);
    RUN(test_weight_training_is_refused_by_name);
    RUN(test_a_missing_bias_is_named);
    return check_finish("qwen2");
}
