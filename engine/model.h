/*
 * model.h - a transformer loaded from GGUF, and its forward pass.
 *
 * Architectures: "qwen3" (pre-norm RMSNorm, per-head q/k RMSNorm, NeoX RoPE,
 * GQA, SwiGLU, output tied to token_embd when output.weight is absent),
 * "llama" (the same without q/k norm, RoPE on adjacent pairs as llama.cpp's
 * "normal" mode; GGUF stores llama Q/K permuted for it) and "gemma4" as
 * llama.cpp's src/models/gemma4.cpp computes it: embeddings scaled by
 * sqrt(n_embd); sliding-window and full-attention layers from
 * attention.sliding_window_pattern, each kind with its own head size, KV
 * heads, RoPE base and rotated dims, the full layers' RoPE divided by the
 * rope_freqs factors; q/k RMSNorm and a weightless RMSNorm of the values;
 * attention scale 1; RMSNorms after attention and after the FFN; a GELU-gated
 * FFN; MoE layers (a router over the normed residual with its scale, softmax,
 * top-k, the weights renormalized, per-expert output scales) beside the dense
 * FFN as a shared expert, with their extra norms; per-layer token embeddings
 * and projections when embedding_length_per_layer_input > 0; the layer
 * output scale; final logit soft-capping. KV-shared layers
 * (attention.shared_kv_layers > 0, gemma4 E2B/E4B) are refused.
 *
 * Hyperparameters come from the GGUF keys llama.cpp uses:
 * <arch>.block_count, .embedding_length, .feed_forward_length,
 * .attention.head_count, .attention.head_count_kv, .attention.key_length,
 * .attention.layer_norm_rms_epsilon, .rope.freq_base, .rope.dimension_count,
 * .context_length (gemma4 reads its own keys, listed in model.c). A key the
 * engine cannot honour (rope scaling, sliding window on qwen3, ...) is an
 * error, as are missing tensors and wrong shapes, each naming the key or
 * tensor.
 *
 * Weights stay in the file's dtype and in the file's mapping (any dtype
 * cart_to_f32 handles); block-type matrices are also repacked at load for
 * the integer products (cart_model_packed_bytes says what that costs;
 * options.no_repack skips it). options.widen_f32 converts the matrices to f32
 * once at load instead (cart_model_widened_bytes says what that costs).
 *
 * Numerics mirror GGML's CPU backend (see matmul.h for the products):
 * RMSNorm sums in double; RoPE angles are built as GGML does (theta = pos,
 * then multiplied by base^(-2/n_rot) per pair, in f32); softmax in f32 with a
 * double sum; SiLU x / (1 + exp(-x)); GELU through GGML's f16 table (ops.h);
 * block-type weights multiply activations quantized as GGML quantizes them
 * (matmul.h).
 *
 * A model may serve many caches, but forward calls on one model must not run
 * concurrently (they share the thread pool).
 */
#ifndef CART_MODEL_H
#define CART_MODEL_H

#include <stdint.h>
#include "gguf.h"
#include "kv.h"
#include "matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_arch {
    CART_ARCH_LLAMA = 1,
    CART_ARCH_QWEN3 = 2,
    CART_ARCH_GEMMA4 = 3,
    CART_ARCH_QWEN2 = 4
} cart_arch;

/* The architecture's name as GGUF's general.architecture writes it
 * ("llama", "qwen3", "gemma4", "qwen2"); NULL for a value not in cart_arch. */
const char *cart_arch_name(int32_t arch);

/* The model's hyperparameters. Where gemma4's layers differ (head_dim,
 * n_head_kv, n_rot, rope_theta, n_ff), the fields hold the full-attention
 * layers' values as the GGUF keys name them; cart_model_layer gives each
 * layer's own. */
typedef struct cart_model_config {
    int32_t arch;        /* cart_arch */
    int32_t n_layer;
    int32_t n_embd;      /* hidden size */
    int32_t n_ff;        /* feed-forward size */
    int32_t n_head;      /* query heads */
    int32_t n_head_kv;   /* key/value heads (GQA: n_head % n_head_kv == 0) */
    int32_t head_dim;
    int32_t n_rot;       /* leading dims of each head that RoPE rotates */
    int32_t n_vocab;     /* rows of token_embd */
    int32_t n_ctx_train; /* <arch>.context_length */
    int32_t rope_neox;   /* 1: pairs (i, i + n_rot/2); 0: pairs (2i, 2i + 1) */
    int32_t qk_norm;     /* 1 when q/k RMSNorm weights are present */
    int32_t tied_output; /* 1 when the head reuses token_embd */
    int32_t reserved;    /* 0 */
    float rms_eps;
    float rope_theta;
    /* gemma4 (0 for the other architectures) */
    int32_t n_swa;            /* the sliding layers' window, in positions */
    int32_t n_expert;         /* experts of the MoE layers (0: none) */
    int32_t n_expert_used;    /* experts each token runs */
    int32_t n_ff_exp;         /* an expert's feed-forward size */
    int32_t n_embd_per_layer; /* per-layer input size (0: none) */
    int32_t uniform_kv;       /* 1 when every layer's KV rows share one shape (all archs) */
    float final_softcap;      /* final logit soft-capping (0: none) */
    float embd_scale;         /* multiplies the token embeddings (1, or sqrt(n_embd)) */
} cart_model_config;

/* One layer's shape and attention. */
typedef struct cart_layer_config {
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_rot;      /* leading dims of each head that RoPE rotates */
    int32_t n_ff;       /* the dense FFN's size (the shared expert's on an MoE layer) */
    int32_t window;     /* sliding window in positions: a query at position P sees
                           the keys at P - window + 1 .. P; 0: every earlier position */
    int32_t moe;        /* 1: an MoE block runs beside the dense FFN */
    int32_t reserved;   /* 0 */
    float rope_theta;   /* RoPE base */
    float attn_scale;   /* multiplies the attention scores (1/sqrt(head_dim), or 1) */
} cart_layer_config;

typedef struct cart_model_options {
    int32_t widen_f32; /* 1: keep f32 copies of all matrices (faster prefill, more memory) */
    int32_t no_repack; /* 1: multiply block-type matrices from the file's rows (the same bits,
                          slower; for comparison) instead of repacked copies (matmul.h) */
} cart_model_options;

typedef struct cart_model cart_model;

/* Loads a model: maps the file, reads the config, checks every tensor's
 * presence, dtype and shape. opts may be NULL. Free with cart_model_free. */
int cart_model_load(cart_model **out, const char *path, const cart_model_options *opts);

/* The same over an opened GGUF (cart_gguf_open or _open_memory), which the
 * model then owns: cart_model_free closes it, and so does a failure here. */
int cart_model_load_gguf(cart_model **out, cart_gguf *g, const cart_model_options *opts);
void cart_model_free(cart_model *m);

/* The config (borrowed, lives with m) and the underlying GGUF (borrowed; for
 * the tokenizer and metadata). */
const cart_model_config *cart_model_get_config(const cart_model *m);
const cart_gguf *cart_model_gguf(const cart_model *m);

/* Layer `layer`'s config into *out. CART_E_ARG for a layer out of range. */
int cart_model_layer(const cart_model *m, int32_t layer, cart_layer_config *out);

/* Bytes of weight data as stored in the file, and extra bytes held by f32
 * copies (0 unless widen_f32). */
uint64_t cart_model_weight_bytes(const cart_model *m);
uint64_t cart_model_widened_bytes(const cart_model *m);

/* Bytes of the repacked copies of block-type matrices the load made
 * (cart_weight_repack; 0 with no_repack or without such matrices), and the
 * seconds repacking took. The file's own rows stay mapped beside them, for
 * the training passes and writers. */
uint64_t cart_model_packed_bytes(const cart_model *m);
double cart_model_repack_seconds(const cart_model *m);

/* A 64-bit fingerprint of the model: FNV-1a over the config, every tensor's
 * name, dtype and dims, and up to 4 KiB from the start and the end of each
 * tensor's data. Two files with the same weights give the same value; a
 * cartridge records it to refuse a model it was not trained on. */
uint64_t cart_model_fingerprint(const cart_model *m);

/* The piece of tensor data cart_model_content_hash hashes as one unit. */
enum { CART_MODEL_HASH_PIECE = 4194304 };

/* A 64-bit hash of every byte of every tensor's data, and of what the
 * fingerprint covers, into *out: a changed weight byte anywhere changes it,
 * where the fingerprint only samples each tensor's ends. For processes that
 * must hold the same weights (the ranks of a job, cartridge/dist.lua).
 *
 * Each tensor's data is cut into pieces of CART_MODEL_HASH_PIECE bytes (the
 * last one shorter), and each piece hashed alone with cs64 (the value of
 * cart_st_checksum, safetensors.h, as a number). The pieces run in parallel
 * on the default pool; the result is cs64 over these 64-bit values, each as
 * 8 little-endian bytes: the fingerprint, the tensor count, then for every
 * tensor in file order its byte count and its pieces' hashes in order. So
 * it depends only on the bytes: the same on every ISA and thread count.
 * One read of the weights (about as long as reading them from the page
 * cache). CART_E_NOMEM when the list of pieces cannot be allocated. */
int cart_model_content_hash(const cart_model *m, uint64_t *out);

/* A new empty KV cache shaped for m, layer by layer (dtype CART_F16 or
 * CART_F32). A sliding-window layer keeps every row too (its attention reads
 * only the window). */
int cart_model_new_kv(cart_kv **out, const cart_model *m, int64_t capacity, int32_t dtype);

/* Runs tokens through the model, appending their K/V rows to the caches.
 *
 * n_streams independent streams run in one weight pass: stream b owns the
 * n_tokens[b] consecutive entries of `tokens` after those of streams 0..b-1,
 * which sit at positions len(kvs[b]), len(kvs[b]) + 1, ... and attend to
 * rows 0..their own position of kvs[b] (causal). Every cache grows by its
 * stream's count; a stream with 0 tokens is left alone. Caches must differ.
 *
 * Batch invariance: each stream's tokens run the weight products on the
 * path its own token count takes (matmul.h), and its logit rows on the path
 * of its own count of logit rows, so a stream's logits and cache rows are
 * bit for bit what the stream computed alone gives, whatever else is in the
 * batch (a lockstep group of any size, a prefill beside decodes).
 *
 * logit_rows lists indices into the concatenated tokens (0..total-1) whose
 * logits are wanted; row j of `logits` ([n_logit_rows, n_vocab]) receives
 * those of token logit_rows[j]. Only those rows pay for the output head.
 *
 * Errors: CART_E_ARG for a token id outside the vocabulary, a cache that is
 * too small for its new tokens (the message gives the numbers: a prompt
 * longer than the context is this error), a cache of another geometry. On an
 * error no cache has been changed. */
int cart_model_forward(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                       const int32_t *tokens, const int64_t *n_tokens, const int64_t *logit_rows,
                       int64_t n_logit_rows, float *logits);

/* The same pass as cart_model_forward (the same checks, the caches grow
 * the same way), returning final hidden states instead of logits: row j of
 * `hidden` ([n_rows, n_embd]) is token rows[j]'s residual stream after the
 * last block and the output norm, the vector the output head would turn
 * into its logits. Each row is normed on its own, so it is the same bits in
 * any batch. For embeddings (a fleet's retrieval index). */
int cart_model_forward_hidden(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                              const int32_t *tokens, const int64_t *n_tokens, const int64_t *rows,
                              int64_t n_rows, float *hidden);

/* The same pass as cart_model_forward (the same checks, the caches grow
 * the same way), returning the attention queries instead of logits: for
 * each layer in order, n_rows rows of n_head x head_dim floats (that
 * layer's), the queries of tokens rows[j] (indices into the concatenated
 * tokens) after the q norm and RoPE, as the attention multiplies them with
 * the keys. `queries` holds cart_model_query_floats(m, n_rows) floats. For
 * KV compaction (compact.h), which needs the queries a cache will meet. */
int cart_model_forward_queries(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                               const int32_t *tokens, const int64_t *n_tokens, const int64_t *rows,
                               int64_t n_rows, float *queries);
int64_t cart_model_query_floats(const cart_model *m, int64_t n_rows);

/* Moves n_rows cached keys of `layer` (rows `ld` floats apart, each
 * n_head_kv x head_dim, after RoPE) by `delta` positions: each rotated pair
 * turns by delta times its frequency (backwards for a negative delta), the
 * layer's own RoPE table. A key computed at position P then scores as one
 * at P + delta, up to f32 rounding: a compacted cache keeps its rows'
 * distances to the queries that follow it. */
int cart_model_rope_shift(const cart_model *m, int32_t layer, float *k, int64_t n_rows, int64_t ld,
                          int64_t delta);

#ifdef __cplusplus
}
#endif

#endif
