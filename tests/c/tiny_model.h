/*
 * tiny_model.h - writes small random-weight qwen3 / llama GGUFs for tests
 * that must not depend on ../shared. Weights are N(0, 1/cols) (embeddings
 * too), norm weights 1 + N(0, 0.01 * 10), all from the project's PRNG.
 */
#ifndef CART_TEST_TINY_MODEL_H
#define CART_TEST_TINY_MODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtype.h"
#include "gguf.h"
#include "rng.h"

typedef struct tiny_shape {
    int qwen3; /* 1: qwen3 (q/k norm, NeoX RoPE), 0: llama */
    int layers, embd, heads, kv_heads, head_dim, ff, vocab;
    int32_t dtype; /* matrices; norms are f32 */
    int tied;
    uint64_t seed;
} tiny_shape;

static void tiny_add(cart_gguf_writer *w, cart_rng *rng, const char *name, int64_t rows,
                     int64_t cols, int32_t dtype, int norm, void **keep, int *n_keep) {
    float *f = malloc(sizeof(float) * (size_t)(rows * cols));
    if (norm) cart_rng_fill_normal(rng, f, rows * cols, 1.0f, 0.1f);
    else cart_rng_fill_normal(rng, f, rows * cols, 0.0f, 1.0f / sqrtf((float)cols));
    void *data = f;
    if (!norm && dtype != CART_F32) {
        uint64_t bytes = 0;
        cart_dtype_nbytes(&bytes, dtype, rows * cols);
        data = malloc((size_t)bytes);
        cart_from_f32(data, dtype, f, rows * cols);
        free(f);
    }
    int64_t ne[2] = {cols, rows};
    cart_gguf_writer_add_tensor(w, name, norm ? CART_F32 : dtype, rows == 1 ? 1 : 2, ne, data);
    keep[(*n_keep)++] = data;
}

/* Returns CART_OK or the writer's error. */
static int write_tiny_model(const char *path, const tiny_shape *s) {
    const char *arch = s->qwen3 ? "qwen3" : "llama";
    char key[128];
    cart_gguf_writer *w = NULL;
    int rc = cart_gguf_writer_new(&w);
    if (rc) return rc;
    cart_gguf_writer_set_str(w, "general.architecture", arch);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    cart_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)s->layers);
    cart_gguf_writer_set_u32(w, KEY("context_length"), 4096);
    cart_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)s->embd);
    cart_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)s->ff);
    cart_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)s->heads);
    cart_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->kv_heads);
    cart_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim);
    cart_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)s->head_dim);
    cart_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->qwen3 ? 1e6f : 1e4f);
    cart_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
#undef KEY
    cart_rng rng;
    cart_rng_seed(&rng, s->seed);
    void *keep[512];
    int n_keep = 0;
    int64_t E = s->embd, HD = (int64_t)s->heads * s->head_dim, KD = (int64_t)s->kv_heads * s->head_dim;
    tiny_add(w, &rng, "token_embd.weight", s->vocab, E, s->dtype, 0, keep, &n_keep);
    tiny_add(w, &rng, "output_norm.weight", 1, E, CART_F32, 1, keep, &n_keep);
    if (!s->tied) tiny_add(w, &rng, "output.weight", s->vocab, E, s->dtype, 0, keep, &n_keep);
    char name[96];
    for (int l = 0; l < s->layers; l++) {
#define T(part) (snprintf(name, sizeof name, "blk.%d." part, l), name)
        tiny_add(w, &rng, T("attn_norm.weight"), 1, E, CART_F32, 1, keep, &n_keep);
        tiny_add(w, &rng, T("attn_q.weight"), HD, E, s->dtype, 0, keep, &n_keep);
        tiny_add(w, &rng, T("attn_k.weight"), KD, E, s->dtype, 0, keep, &n_keep);
        tiny_add(w, &rng, T("attn_v.weight"), KD, E, s->dtype, 0, keep, &n_keep);
        tiny_add(w, &rng, T("attn_output.weight"), E, HD, s->dtype, 0, keep, &n_keep);
        if (s->qwen3) {
            tiny_add(w, &rng, T("attn_q_norm.weight"), 1, s->head_dim, CART_F32, 1, keep, &n_keep);
            tiny_add(w, &rng, T("attn_k_norm.weight"), 1, s->head_dim, CART_F32, 1, keep, &n_keep);
        }
        tiny_add(w, &rng, T("ffn_norm.weight"), 1, E, CART_F32, 1, keep, &n_keep);
        tiny_add(w, &rng, T("ffn_gate.weight"), s->ff, E, s->dtype, 0, keep, &n_keep);
        tiny_add(w, &rng, T("ffn_up.weight"), s->ff, E, s->dtype, 0, keep, &n_keep);
        tiny_add(w, &rng, T("ffn_down.weight"), E, s->ff, s->dtype, 0, keep, &n_keep);
#undef T
    }
    rc = cart_gguf_writer_write(w, path);
    cart_gguf_writer_free(w);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
    return rc;
}

#endif
