/*
 * test_model.c - the forward pass against llama.cpp's reference outputs
 * (the greedy.json files in ../shared/reference, see its README): identical greedy ids
 * for 48 steps (a divergence is accepted only where the reference margin is
 * below our logit error), top-10 logits within the README's tolerances, and
 * the full last-prompt logits row where the file has one. Also: batched
 * streams and chunked prefill give the same logits as one stream, bad input
 * fails cleanly, and the KV cache operations behave. The content hash
 * (against a recomputation from cart_st_checksum) runs on a model written
 * here, without ../shared.
 */
#include <unistd.h>

#include "check.h"
#include "gguf_mutant.h"
#include "reference_check.h"
#include "dtype.h"
#include "internal.h"
#include "model.h"
#include "model_internal.h"
#include "pool.h"
#include "safetensors.h"
#include "sampler.h"
#include "tiny_model.h"

static int shared_present(void) {
    FILE *fp = fopen(CART_SHARED_DIR "/reference/README.md", "rb");
    if (fp) fclose(fp);
    return fp != NULL;
}

static void test_stories260K_continues_like_llama_cpp(void) {
    check_reference(CART_SHARED_DIR "/models/stories260K.gguf",
                    CART_SHARED_DIR "/reference/stories260K.greedy.json", 1e-3, 48 * 3);
}

static void test_qwen3_tiny_f32_matches_llama_cpp(void) {
    check_reference(CART_SHARED_DIR "/reference/qwen3-tiny-f32.gguf",
                    CART_SHARED_DIR "/reference/qwen3-tiny-f32.greedy.json", 1e-3, 48 * 3);
}

static void test_qwen3_tiny_f16_matches_llama_cpp(void) {
    check_reference(CART_SHARED_DIR "/reference/qwen3-tiny-f16.gguf",
                    CART_SHARED_DIR "/reference/qwen3-tiny-f16.greedy.json", 1e-2, 48 * 3);
}

static void test_qwen3_realvocab_f16_matches_llama_cpp(void) {
    check_reference(CART_SHARED_DIR "/reference/qwen3-tiny-realvocab-f16.gguf",
                    CART_SHARED_DIR "/reference/qwen3-tiny-realvocab-f16.greedy.json", 1e-2, 48 * 3);
}


static const int32_t story[] = {1, 403, 407, 261, 378, 282, 395, 317, 309, 284, 261, 342,
                                427, 268, 314, 492, 372, 306, 271, 321, 266, 325, 388, 270};
enum { STORY_LEN = sizeof story / sizeof story[0] };

static void test_chunked_prefill_and_decode_give_the_logits_of_one_pass(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/models/stories260K.gguf", NULL));
    if (!m) return;
    int64_t V = cart_model_get_config(m)->n_vocab;
    float *one = malloc(sizeof(float) * STORY_LEN * V), *parts = malloc(sizeof(float) * STORY_LEN * V);
    logits_in_chunks(m, story, STORY_LEN, STORY_LEN, CART_F32, one);
    /* a few tokens per call take the memory-bound GEMV kernels, whose
     * summation order differs from the GEMM's: f32 round-off on logits of
     * magnitude ~15 */
    logits_in_chunks(m, story, STORY_LEN, 1, CART_F32, parts);
    CHECK_MAXDIFF("token-by-token vs one pass (f32 cache)", max_diff(one, parts, STORY_LEN * V), 1e-4);
    logits_in_chunks(m, story, STORY_LEN, 5, CART_F32, parts);
    CHECK_MAXDIFF("chunks of 5 vs one pass (f32 cache)", max_diff(one, parts, STORY_LEN * V), 1e-4);
    /* calls of GEMM size (more than 16 tokens, matmul.h) give every token the
     * same bits wherever it sits in the batch: what the equivalence gate
     * relies on. Two passes of 24 against one of 48. */
    int32_t twice[2 * STORY_LEN];
    for (int i = 0; i < 2 * STORY_LEN; i++) twice[i] = story[i % STORY_LEN];
    float *one48 = malloc(sizeof(float) * 2 * STORY_LEN * V), *two24 = malloc(sizeof(float) * 2 * STORY_LEN * V);
    logits_in_chunks(m, twice, 2 * STORY_LEN, 2 * STORY_LEN, CART_F32, one48);
    logits_in_chunks(m, twice, 2 * STORY_LEN, STORY_LEN, CART_F32, two24);
    CHECK_MAXDIFF("two passes of 24 vs one of 48 (f32 cache, bitwise)",
                  max_diff(one48, two24, 2 * STORY_LEN * V), 0.0);
    free(one48), free(two24);
    /* f16 rounds every cached K/V value (relative error up to 2^-11); through
     * 5 layers that moves logits of magnitude ~15 by a few hundredths */
    logits_in_chunks(m, story, STORY_LEN, STORY_LEN, CART_F16, parts);
    CHECK_MAXDIFF("f16 cache vs f32 cache", max_diff(one, parts, STORY_LEN * V), 5e-2);
    free(one), free(parts);
    cart_model_free(m);
}

static void test_lockstep_streams_match_running_them_alone(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/models/stories260K.gguf", NULL));
    if (!m) return;
    int64_t V = cart_model_get_config(m)->n_vocab;
    /* three streams of different lengths and histories, one of them idle */
    cart_kv *kv[4];
    for (int i = 0; i < 4; i++) CHECK_OK(cart_model_new_kv(&kv[i], m, 64, CART_F32));
    int64_t pre[4] = {3, 7, 0, 11};
    int32_t flat[32];
    int64_t at = 0;
    for (int i = 0; i < 4; i++)
        for (int64_t j = 0; j < pre[i]; j++) flat[at++] = story[(i * 5 + j) % STORY_LEN];
    CHECK_OK(cart_model_forward(m, kv, 4, flat, pre, NULL, 0, NULL));
    /* one batched step: streams 0, 1, 3 get one token, stream 2 two */
    int64_t step[4] = {1, 1, 2, 1};
    int32_t next[5] = {300, 301, 302, 303, 304};
    int64_t rows[5] = {0, 1, 2, 3, 4};
    float *batched = malloc(sizeof(float) * 5 * V);
    CHECK_OK(cart_model_forward(m, kv, 4, next, step, rows, 5, batched));
    /* the same, one stream at a time, from fresh caches */
    double worst = 0;
    int64_t token = 0;
    for (int i = 0; i < 4; i++) {
        cart_kv *solo = NULL;
        CHECK_OK(cart_model_new_kv(&solo, m, 64, CART_F32));
        int32_t seq[32];
        int64_t n = 0;
        for (int64_t j = 0; j < pre[i]; j++) seq[n++] = story[(i * 5 + j) % STORY_LEN];
        for (int64_t j = 0; j < step[i]; j++) seq[n++] = next[token + j];
        float *alone = malloc(sizeof(float) * (size_t)n * V);
        int64_t all[32];
        for (int64_t j = 0; j < n; j++) all[j] = j;
        CHECK_OK(cart_model_forward(m, &solo, 1, seq, &n, all, n, alone));
        for (int64_t j = 0; j < step[i]; j++)
            worst = fmax(worst, max_diff(batched + (token + j) * V,
                                         alone + (pre[i] + j) * V, V));
        token += step[i];
        CHECK(cart_kv_len(kv[i]) == n);
        free(alone);
        cart_kv_free(solo);
    }
    /* the batched prefill holds 21 tokens, more than the GEMV path takes, but
     * each stream's tokens run on the path of its own count (matmul.h): the
     * same bits as alone */
    CHECK_MAXDIFF("4 lockstep streams vs each alone", worst, 0.0);
    free(batched);
    for (int i = 0; i < 4; i++) cart_kv_free(kv[i]);
    cart_model_free(m);
}

/* A lockstep group whose streams mix long and short prompts and then decode
 * 20 at a time (more tokens per step than one GEMV pass): every stream's
 * logits are the bits it gets alone, so a self-study conversation does not
 * depend on which group, or which process, made it. */
static void test_a_stream_gets_the_same_bits_in_any_group(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/models/stories260K.gguf", NULL));
    if (!m) return;
    const int32_t B = 20;
    int64_t V = cart_model_get_config(m)->n_vocab;
    cart_kv *kv[20];
    int64_t pre[20];
    int32_t flat[20 * 40];
    int64_t at = 0;
    for (int32_t b = 0; b < B; b++) {
        CHECK_OK(cart_model_new_kv(&kv[b], m, 64, CART_F32));
        pre[b] = b % 3 == 0 ? 30 + b % 7 : 2 + b % 13; /* long (GEMM) and short (GEMV) prompts */
        for (int64_t j = 0; j < pre[b]; j++) flat[at++] = story[(b * 3 + j) % STORY_LEN];
    }
    int64_t last[20];
    for (int32_t b = 0, t = 0; b < B; t += (int32_t)pre[b], b++) last[b] = t + pre[b] - 1;
    float *group = malloc(sizeof(float) * (size_t)(B * 3) * V);
    CHECK_OK(cart_model_forward(m, kv, B, flat, pre, last, B, group));
    int64_t one[20], rows[20];
    int32_t next[20];
    for (int32_t step = 1; step < 3; step++) {
        for (int32_t b = 0; b < B; b++) one[b] = 1, rows[b] = b, next[b] = 300 + b + step;
        CHECK_OK(cart_model_forward(m, kv, B, next, one, rows, B, group + (int64_t)step * B * V));
    }
    double worst = 0;
    at = 0;
    for (int32_t b = 0; b < B; b++) {
        cart_kv *solo = NULL;
        CHECK_OK(cart_model_new_kv(&solo, m, 64, CART_F32));
        float *alone = malloc(sizeof(float) * V);
        int64_t r = pre[b] - 1;
        CHECK_OK(cart_model_forward(m, &solo, 1, flat + at, &pre[b], &r, 1, alone));
        worst = fmax(worst, max_diff(group + (int64_t)b * V, alone, V));
        for (int32_t step = 1; step < 3; step++) {
            int64_t n1 = 1, r0 = 0;
            int32_t tok = 300 + b + step;
            CHECK_OK(cart_model_forward(m, &solo, 1, &tok, &n1, &r0, 1, alone));
            worst = fmax(worst, max_diff(group + ((int64_t)step * B + b) * V, alone, V));
        }
        at += pre[b];
        free(alone);
        cart_kv_free(solo);
        cart_kv_free(kv[b]);
    }
    CHECK_MAXDIFF("20 streams of mixed prompts, decoding together, vs each alone", worst, 0.0);
    free(group);
    cart_model_free(m);
}

/* The final hidden states are what the output head turns into the logits:
 * hidden . W_out[v] (in double) gives logit v, for every row of a prompt;
 * a row's hidden state is the same bits alone and beside another stream. */
static void test_final_hidden_states_give_the_logits_through_the_head(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/models/stories260K.gguf", NULL));
    if (!m) return;
    const cart_model_config *c = cart_model_get_config(m);
    int64_t V = c->n_vocab, E = c->n_embd, n = 9;
    cart_kv *a = NULL, *b = NULL;
    CHECK_OK(cart_model_new_kv(&a, m, 32, CART_F32));
    CHECK_OK(cart_model_new_kv(&b, m, 32, CART_F32));
    int64_t rows[9];
    for (int64_t j = 0; j < n; j++) rows[j] = j;
    float *hidden = malloc(sizeof(float) * (size_t)(n * E)), *logits = malloc(sizeof(float) * (size_t)(n * V));
    CHECK_OK(cart_model_forward_hidden(m, &a, 1, story, &n, rows, n, hidden));
    CHECK(cart_kv_len(a) == n);
    CHECK_OK(cart_model_forward(m, &b, 1, story, &n, rows, n, logits));
    const cart_weight *w = &m->output;
    float *wrow = malloc(sizeof(float) * (size_t)E);
    double worst = 0, scale = 0;
    for (int64_t v = 0; v < V; v++) {
        cart_to_f32(wrow, w->dtype, (const uint8_t *)w->data + (size_t)v * w->row_bytes, E);
        for (int64_t j = 0; j < n; j++) {
            double dot = 0;
            for (int64_t e = 0; e < E; e++) dot += (double)hidden[j * E + e] * wrow[e];
            worst = fmax(worst, fabs(dot - logits[j * V + v]));
            scale = fmax(scale, fabs(dot));
        }
    }
    printf("  %lld rows x %lld logits, |logit| up to %.3g\n", (long long)n, (long long)V, scale);
    CHECK_MAXDIFF("hidden . W_out vs the forward's logits", worst, 1e-4);
    /* beside another stream, in one pass: the same bits */
    cart_kv *kvs[2] = {NULL, NULL};
    CHECK_OK(cart_model_new_kv(&kvs[0], m, 32, CART_F32));
    CHECK_OK(cart_model_new_kv(&kvs[1], m, 32, CART_F32));
    int32_t both[9 + 4];
    memcpy(both, story + 3, 4 * sizeof(int32_t));
    memcpy(both + 4, story, (size_t)n * sizeof(int32_t));
    int64_t counts[2] = {4, n}, last[2] = {3, 4 + n - 1};
    float pair[2 * 512];
    CHECK(E <= 512);
    CHECK_OK(cart_model_forward_hidden(m, kvs, 2, both, counts, last, 2, pair));
    CHECK(memcmp(pair + E, hidden + (n - 1) * E, sizeof(float) * (size_t)E) == 0);
    int64_t beyond = n; /* a row past the pass's tokens: refused before the cache changes */
    CHECK_ERR(cart_model_forward_hidden(m, &a, 1, story, &n, &beyond, 1, hidden), CART_E_ARG);
    CHECK(cart_kv_len(a) == n);
    free(wrow);
    free(hidden);
    free(logits);
    cart_kv_free(a);
    cart_kv_free(b);
    cart_kv_free(kvs[0]);
    cart_kv_free(kvs[1]);
    cart_model_free(m);
}

static void test_bad_forward_input_fails_and_leaves_caches_alone(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/models/stories260K.gguf", NULL));
    if (!m) return;
    cart_kv *kv = NULL, *other = NULL;
    CHECK_OK(cart_model_new_kv(&kv, m, 8, CART_F32));
    int64_t n = 4, last = 3;
    float logits[512];
    CHECK_OK(cart_model_forward(m, &kv, 1, story, &n, &last, 1, logits));
    int32_t bad[2] = {5, 512};
    n = 2;
    CHECK_ERR(cart_model_forward(m, &kv, 1, bad, &n, NULL, 0, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("outside the vocabulary of 512");
    n = 5; /* 4 cached + 5 > 8: a prompt longer than the context */
    CHECK_ERR(cart_model_forward(m, &kv, 1, story, &n, NULL, 0, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("do not fit its context of 8");
    CHECK(cart_kv_len(kv) == 4);
    n = 1;
    int64_t row = 1;
    CHECK_ERR(cart_model_forward(m, &kv, 1, story, &n, &row, 1, logits), CART_E_ARG);
    CHECK_OK(cart_kv_new(&other, 5, 4, 16, 8, CART_F32));
    CHECK_ERR(cart_model_forward(m, &other, 1, story, &n, NULL, 0, NULL), CART_E_ARG);
    CHECK_ERROR_MENTIONS("the model needs 5 x 4 x 8");
    cart_kv_free(other);
    cart_kv_free(kv);
    cart_model_free(m);
}

/* A copy of stories260K with one change, for the loader's errors. */
static void write_mutant(const char *out, mutation what, const char *target) {
    write_mutant_of(CART_SHARED_DIR "/models/stories260K.gguf", out, what, target, 0);
}

static void test_loading_names_the_tensor_or_key_that_is_wrong(void) {
    char path[64]; /* per process: ctest runs this program once per ISA level, in parallel */
    snprintf(path, sizeof path, "/tmp/cart_test_model_mutant.%d.gguf", (int)getpid());
    cart_model *m = NULL;
    write_mutant(path, DROP_TENSOR, "blk.3.ffn_up.weight");
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("missing tensor 'blk.3.ffn_up.weight'");
    write_mutant(path, RESHAPE_TENSOR, "blk.0.attn_k.weight");
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("'blk.0.attn_k.weight' has shape [64, 33");
    write_mutant(path, RETYPE_TENSOR, "blk.1.attn_v.weight");
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("'blk.1.attn_v.weight' has type i32");
    write_mutant(path, ADD_KEY, "llama.rope.scaling.type");
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("llama.rope.scaling.type");
    /* a header whose layer count no table could hold (fuzz_model's finding:
     * 2^30 layers were allocated before any tensor was looked up) */
    write_mutant_of(CART_SHARED_DIR "/models/stories260K.gguf", path, SET_U32, "llama.block_count", 1u << 30);
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_FORMAT);
    CHECK_ERROR_MENTIONS("'llama.block_count' = 1073741824 layers, but the file holds only");
    write_mutant(path, CHANGE_ARCH, "gemma2");
    CHECK_ERR(cart_model_load(&m, path, NULL), CART_E_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("supported: qwen3, qwen2, llama, gemma4");
    CHECK(m == NULL);
    remove(path);
}

static void test_kv_cache_rows_round_trip_and_copy(void) {
    cart_kv *a = NULL, *b = NULL;
    CHECK_OK(cart_kv_new(&a, 2, 2, 4, 10, CART_F16));
    CHECK_OK(cart_kv_new(&b, 2, 2, 4, 10, CART_F32));
    float k[3 * 8], v[3 * 8], back[3 * 8];
    for (int i = 0; i < 24; i++) k[i] = 0.25f * i, v[i] = -0.5f * i;
    CHECK_OK(cart_kv_write(a, 1, 2, 3, k, v));
    CHECK_OK(cart_kv_set_len(a, 5));
    CHECK_OK(cart_kv_read(a, 1, 2, 3, back, NULL));
    CHECK_MAXDIFF("f16 cache round trip (exact for these values)", max_diff(k, back, 24), 0.0);
    CHECK_OK(cart_kv_copy(b, a, 5));
    CHECK(cart_kv_len(b) == 5);
    CHECK_OK(cart_kv_read(b, 1, 2, 3, NULL, back));
    CHECK_MAXDIFF("f16 -> f32 copy", max_diff(v, back, 24), 0.0);
    CHECK_OK(cart_kv_truncate(b, 2));
    CHECK_ERR(cart_kv_truncate(b, 3), CART_E_ARG);
    CHECK_ERR(cart_kv_write(a, 2, 0, 1, k, v), CART_E_ARG);
    CHECK_ERR(cart_kv_write(a, 0, 8, 3, k, v), CART_E_ARG);
    cart_kv *bad = NULL;
    CHECK_ERR(cart_kv_new(&bad, 2, 2, 4, 10, CART_Q8_0), CART_E_ARG);
    cart_kv_free(a);
    cart_kv_free(b);
}

/* What speculative decoding relies on: a span of up to 16 tokens gives every
 * token the bits one-token steps give it (GEMV kernels, matmul.h; attention
 * per query whether the f16 rows are read directly or through a tile). */
static void test_short_spans_match_one_token_steps_bit_for_bit(void) {
    cart_model *m = NULL;
    CHECK_OK(cart_model_load(&m, CART_SHARED_DIR "/reference/qwen3-tiny-f32.gguf", NULL));
    if (!m) return;
    int64_t V = cart_model_get_config(m)->n_vocab;
    int32_t toks[24];
    for (int i = 0; i < 24; i++) toks[i] = (i * 13 + 5) % 290;
    for (int dt = 0; dt < 2; dt++) {
        int32_t dtype = dt ? CART_F16 : CART_F32;
        float *a = malloc(sizeof(float) * 24 * V), *b = malloc(sizeof(float) * 24 * V);
        logits_in_chunks(m, toks, 24, 1, dtype, a);
        logits_in_chunks(m, toks, 24, 8, dtype, b);
        CHECK_MAXDIFF(dt ? "spans of 8 vs one-token steps (f16 cache, bitwise)"
                         : "spans of 8 vs one-token steps (f32 cache, bitwise)",
                      max_diff(a, b, 24 * V), 0.0);
        free(a), free(b);
    }
    cart_model_free(m);
}

/* ---- the content hash ------------------------------------------------------ */

static uint64_t cs64_of(const void *data, uint64_t n) {
    char text[22];
    cart_st_checksum(data, n, text);
    return strtoull(text + 5, NULL, 16);
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* cart_model_content_hash as model.h defines it, one piece after another. */
static uint64_t content_hash_by_hand(const cart_model *m) {
    const cart_gguf *g = cart_model_gguf(m);
    const int64_t n_tensors = cart_gguf_tensor_count(g);
    uint64_t words = 2;
    for (int64_t i = 0; i < n_tensors; i++)
        words += 1 + (cart_gguf_tensor_at(g, i)->nbytes + CART_MODEL_HASH_PIECE - 1) /
                         CART_MODEL_HASH_PIECE;
    uint8_t *buf = malloc(8 * words), *at = buf;
    put_le64(at, cart_model_fingerprint(m)), at += 8;
    put_le64(at, (uint64_t)n_tensors), at += 8;
    for (int64_t i = 0; i < n_tensors; i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(g, i);
        put_le64(at, t->nbytes), at += 8;
        for (uint64_t off = 0; off < t->nbytes; off += CART_MODEL_HASH_PIECE, at += 8) {
            uint64_t n =
                t->nbytes - off < CART_MODEL_HASH_PIECE ? t->nbytes - off : CART_MODEL_HASH_PIECE;
            put_le64(at, cs64_of((const uint8_t *)t->data + off, n));
        }
    }
    uint64_t h = cs64_of(buf, 8 * words);
    free(buf);
    return h;
}

static cart_model *model_in_memory(const uint8_t *bytes, uint64_t size) {
    cart_gguf *g = NULL;
    cart_model *m = NULL;
    CHECK_OK(cart_gguf_open_memory(&g, bytes, size, "hash test model"));
    if (g) CHECK_OK(cart_model_load_gguf(&m, g, NULL));
    return m;
}

static uint64_t content_hash(const cart_model *m) {
    uint64_t h = 0;
    CHECK_OK(cart_model_content_hash(m, &h));
    return h;
}

/* Every thread count and ISA level gives the value recomputed by hand; one
 * flipped byte in the middle of a tensor of three pieces, which the
 * fingerprint does not see, changes it, and so does one in its last, short
 * piece. */
static void test_the_content_hash_reads_every_weight_byte(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/cart_test_model_hash.%d.gguf", (int)getpid());
    /* token_embd: 10000 x 256 f32 = 10,240,000 bytes, pieces 4 MiB + 4 MiB + 1.77 MiB */
    tiny_shape s = {.qwen3 = 1, .layers = 2, .embd = 256, .heads = 4, .kv_heads = 2, .head_dim = 64,
                    .ff = 384, .vocab = 10000, .dtype = CART_F32, .tied = 1, .seed = 11};
    CHECK_OK(write_tiny_model(path, &s));
    cart_mapping file = {0};
    CHECK_OK(cart_map_file(&file, path));
    remove(path);
    if (!file.data) return;
    const uint64_t size = file.size;
    uint8_t *bytes = malloc(size), *flipped = malloc(size);
    memcpy(bytes, file.data, size);
    cart_unmap_file(&file);
    cart_model *m = model_in_memory(bytes, size);
    if (!m) return;
    const cart_gguf_tensor_info *embd =
        cart_gguf_find_tensor(cart_model_gguf(m), "token_embd.weight");
    CHECK(embd && embd->nbytes == 10240000);
    if (!embd) return;
    const uint64_t want = content_hash_by_hand(m);
    printf("  content hash %016llx, fingerprint %016llx, %llu weight bytes\n",
           (unsigned long long)want, (unsigned long long)cart_model_fingerprint(m),
           (unsigned long long)cart_model_weight_bytes(m));

    const int32_t threads0 = cart_threads(), isa0 = cart_isa_active();
    const int32_t thread_counts[] = {1, 2, 3, 8};
    for (int32_t isa = 0; isa < CART_ISA_COUNT; isa++) {
        if (!cart_isa_supported(isa)) continue;
        CHECK_OK(cart_isa_set(isa));
        int same = 1;
        for (size_t i = 0; i < sizeof thread_counts / sizeof *thread_counts; i++) {
            CHECK_OK(cart_set_threads(thread_counts[i]));
            uint64_t got = content_hash(m);
            if (got != want)
                fprintf(stderr, "  FAIL %s, %d threads: %016llx, by hand %016llx\n",
                        cart_isa_name(isa), thread_counts[i], (unsigned long long)got,
                        (unsigned long long)want);
            CHECK(got == want);
            same &= got == want;
        }
        if (same) printf("  %s: threads 1, 2, 3, 8 give the value by hand\n", cart_isa_name(isa));
    }
    CHECK_OK(cart_isa_set(isa0));
    CHECK_OK(cart_set_threads(threads0));

    const uint64_t at_data = (uint64_t)((const uint8_t *)embd->data - bytes);
    const uint64_t spots[] = {embd->nbytes / 2, embd->nbytes - 100000};
    for (int i = 0; i < 2; i++) {
        memcpy(flipped, bytes, size);
        flipped[at_data + spots[i]] ^= 0x10;
        cart_model *other = model_in_memory(flipped, size);
        if (!other) break;
        uint64_t h = content_hash(other);
        printf("  byte %llu of token_embd flipped: fingerprint %s, content hash %016llx (by hand "
               "%016llx)\n",
               (unsigned long long)spots[i],
               cart_model_fingerprint(other) == cart_model_fingerprint(m) ? "the same" : "differs",
               (unsigned long long)h, (unsigned long long)content_hash_by_hand(other));
        CHECK(cart_model_fingerprint(other) ==
              cart_model_fingerprint(m)); /* the gap the hash closes */
        CHECK(h != want);
        CHECK(h == content_hash_by_hand(other));
        cart_model_free(other);
    }
    uint64_t unused;
    CHECK_ERR(cart_model_content_hash(NULL, &unused), CART_E_ARG);
    cart_model_free(m);
    free(bytes);
    free(flipped);
}

int main(void) {
    RUN(test_the_content_hash_reads_every_weight_byte);
    if (!shared_present()) {
        printf("skipping the rest: %s not found (the ../shared fixtures are absent)\n",
               CART_SHARED_DIR "/reference/README.md");
        return check_failures ? check_finish("model") : CHECK_SKIP;
    }
    RUN(test_stories260K_continues_like_llama_cpp);
    RUN(test_qwen3_tiny_f32_matches_llama_cpp);
    RUN(test_qwen3_tiny_f16_matches_llama_cpp);
    RUN(test_qwen3_realvocab_f16_matches_llama_cpp);
    RUN(test_chunked_prefill_and_decode_give_the_logits_of_one_pass);
    RUN(test_lockstep_streams_match_running_them_alone);
    RUN(test_a_stream_gets_the_same_bits_in_any_group);
    RUN(test_short_spans_match_one_token_steps_bit_for_bit);
    RUN(test_final_hidden_states_give_the_logits_through_the_head);
    RUN(test_bad_forward_input_fails_and_leaves_caches_alone);
    RUN(test_loading_names_the_tensor_or_key_that_is_wrong);
    RUN(test_kv_cache_rows_round_trip_and_copy);
    return check_finish("model");
}
