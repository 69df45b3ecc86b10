/*
 * test_quant.c - models in the block types people download against
 * llama.cpp: the qwen3 `default` preset the build writes at q8_0, q6_K,
 * q5_K, q4_K and q4_0 (models/quant, recipes/make_model.lua) and llama.cpp's
 * greedy continuations of them (tests/fixtures/quant, made by
 * tools/greedy_fixtures.mjs --set quant with node-llama-cpp 3.22.1),
 * teacher-forced on llama.cpp's tokens: the same greedy ids but for
 * near-ties, every step's top-10 logits within its prompt's bound
 * (reference_check.h).
 *
 * The engine quantizes each activation row as GGML does for the weight
 * type (matmul.h); what is left between the two is the order of float sums
 * (llama.cpp's vector kernels sum a row's blocks in lanes). On these random
 * weights a sum that lands on the other side of an activation's rounding
 * step moves a logit by tenths, and llama.cpp's own two attention kernels
 * land 0.2-0.4 apart for that reason (the fixtures' flash_envelope); its
 * prompt-at-once and one-token-per-call runs often agree to 1e-6 because
 * its own kernels then sum in the same order. So the bound is the flash
 * envelope at every step, with no share of steps required within 2x the
 * self envelope.
 *
 * And the contract is what moves the engine toward llama.cpp: the same
 * model with its matrices widened to f32 (the product without activation
 * quantization, what the engine computed before) lands further away, on
 * average over the steps, than the quantized product.
 * ctest runs it at every ISA level.
 */
#include "check.h"
#include "reference_check.h"

#define MODELS CART_SOURCE_DIR "/models/quant/"
#define FIXTURES CART_SOURCE_DIR "/tests/fixtures/quant/"

static void check_quant(const char *dtype) {
    char model[512], json[512];
    snprintf(model, sizeof model, MODELS "default-%s.gguf", dtype);
    snprintf(json, sizeof json, FIXTURES "default-%s.greedy.json", dtype);
    if (!same_model(model, json)) return;
    ref_stats q, exact;
    reference_run(model, json, 1e-2, NULL, &q);
    reference_verdict(model, &q, 1e-2, 32 * 3, 0.0);
    const cart_model_options widen = {.widen_f32 = 1};
    reference_run(model, json, 1e-2, &widen, &exact);
    const double mq = q.sum / (q.steps ? q.steps : 1), me = exact.sum / (exact.steps ? exact.steps : 1);
    printf("  mean top-10 difference from llama.cpp: %.4f quantized activations, %.4f f32 activations "
           "(max %.4f, %.4f)\n", mq, me, q.worst, exact.worst);
    CHECK_MSG(mq < me, "the quantized product (%.4f) is no closer to llama.cpp than the f32 one (%.4f)", mq, me);
}

static void test_q8_0_matches_llama_cpp(void) { check_quant("q8_0"); }
static void test_q6_K_matches_llama_cpp(void) { check_quant("q6_K"); }
static void test_q5_K_matches_llama_cpp(void) { check_quant("q5_K"); }
static void test_q4_K_matches_llama_cpp(void) { check_quant("q4_K"); }
static void test_q4_0_matches_llama_cpp(void) { check_quant("q4_0"); }

int main(void) {
    FILE *fp = fopen(MODELS "default-q4_0.gguf", "rb");
    if (!fp) {
        printf("skipping: %s not found (the build writes it: cmake --build build)\n", MODELS "default-q4_0.gguf");
        return CHECK_SKIP;
    }
    fclose(fp);
    RUN(test_q8_0_matches_llama_cpp);
    RUN(test_q6_K_matches_llama_cpp);
    RUN(test_q5_K_matches_llama_cpp);
    RUN(test_q4_K_matches_llama_cpp);
    RUN(test_q4_0_matches_llama_cpp);
    return check_finish("quant");
}
