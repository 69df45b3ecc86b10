/*
 * model.c - loading a GGUF through its architecture (models/models.h), the
 * KV caches, and the batched forward pass.
 */
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "cpu.h"
#include "internal.h"
#include "model.h"
#include "model_internal.h"
#include "models/models.h"
#include "ops.h"
#include "pool.h"


/* ---- loading -------------------------------------------------------------- */

/* The architecture, then its config (and, for every architecture, each
 * layer's geometry in m->layers). */
static int read_model_config(model_loader *ld, cart_model *m) {
    cart_model_config *c = &m->cfg;
    memset(c, 0, sizeof *c);
    cart_str arch;
    int rc = cart_gguf_get_str(&arch, ld->g, "general.architecture");
    if (rc == CART_E_NOT_FOUND)
        return cart_fail(CART_E_FORMAT, "%s: no 'general.architecture' key", ld->path);
    if (rc) return rc;
    const arch_ops *ops = arch_by_name(arch.data, arch.len);
    if (!ops)
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: architecture '%.*s' is not supported (supported: qwen3, qwen2, llama, gemma4)",
                         ld->path, (int)(arch.len > 64 ? 64 : arch.len), arch.data);
    c->arch = ops->arch;
    ld->arch = ops->name;
    rc = ops->read_config(ld, m);
    if (rc) return rc;
    c->uniform_kv = 1;
    for (int32_t l = 1; l < c->n_layer; l++)
        if (m->layers[l].g.n_head_kv != m->layers[0].g.n_head_kv ||
            m->layers[l].g.head_dim != m->layers[0].g.head_dim)
            c->uniform_kv = 0;
    return CART_OK;
}

/* Every tensor in the file must be one the model uses (llama.cpp refuses
 * extra tensors too: they mean a different architecture variant). */
static int check_no_extra_tensors(model_loader *ld) {
    for (int64_t i = 0; i < cart_gguf_tensor_count(ld->g); i++) {
        if (ld->claimed[i]) continue;
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(ld->g, i);
        return cart_fail(CART_E_UNSUPPORTED, "%s: tensor '%.*s' is not part of the %s "
                         "architecture this engine implements", ld->path,
                         (int)(t->name.len > 128 ? 128 : t->name.len), t->name.data, ld->arch);
    }
    return CART_OK;
}

/* Every matrix of layer L (NULL slots for those it lacks), for widening and
 * freeing: up to 7 + 3 + 3 * n_expert. Returns the count. */
static int32_t layer_matrices(layer_weights *L, int32_t n_expert, cart_weight **ws) {
    int32_t n = 0;
    cart_weight *fixed[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown,
                            &L->pl_gate, &L->pl_proj, &L->router};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i]->rows > 0) ws[n++] = fixed[i];
    for (int32_t e = 0; L->exp_gate && e < n_expert; e++) {
        ws[n++] = &L->exp_gate[e];
        ws[n++] = &L->exp_up[e];
        ws[n++] = &L->exp_down[e];
    }
    return n;
}

static void free_layers(cart_model *m) {
    if (!m->layers) return;
    cart_weight **ws = malloc(sizeof *ws * (size_t)(10 + 3 * m->cfg.n_expert));
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        layer_weights *L = &m->layers[l];
        free(L->attn_norm);
        free(L->ffn_norm);
        free(L->q_norm);
        free(L->k_norm);
        free(L->bq);
        free(L->bk);
        free(L->bv);
        if (ws) {
            int32_t n = layer_matrices(L, m->cfg.n_expert, ws);
            for (int32_t i = 0; i < n; i++) {
                cart_weight_free_packed(ws[i]);
                if (m->widened) cart_weight_free_data(ws[i]);
            }
        }
        gemma4_free_layer(L);
    }
    free(ws);
    free(m->layers);
    m->layers = NULL;
}

void cart_model_free(cart_model *m) {
    if (!m) return;
    free_layers(m);
    cart_weight_free_packed(&m->output);
    cart_weight_free_packed(&m->pl_model_proj);
    free(m->output_norm);
    free(m->rope_freqs);
    free(m->pl_proj_norm);
    if (m->widened) {
        if (!m->cfg.tied_output) cart_weight_free_data(&m->output);
        cart_weight_free_data(&m->tok_embd);
        cart_weight_free_data(&m->pl_model_proj);
    }
    cart_gguf_close(m->gguf);
    free(m);
#ifdef __GLIBC__
    /* The repacked copies are thousands of blocks (a MoE model's experts
     * one by one); once blocks allocated later sit above them, glibc keeps
     * their pages. Give them back, so that a freed 14 GiB model is 14 GiB
     * the system has again. */
    malloc_trim(0);
#endif
}

/* Replaces *w by an f32 copy, counting the bytes. */
static int widen(cart_weight *w, uint64_t *bytes) {
    cart_weight wide;
    int rc = cart_weight_widen(&wide, w, cart_default_pool());
    if (rc) return rc;
    *w = wide;
    *bytes += (uint64_t)wide.rows * (uint64_t)wide.cols * 4;
    return CART_OK;
}

/* Repacks every block-type matrix the forward multiplies (matmul.h), not
 * the embedding tables, which are read by row. */
static int repack_all(cart_model *m) {
    const double t0 = cart_now_seconds();
    cart_weight **ws = malloc(sizeof *ws * (size_t)(12 + 3 * m->cfg.n_expert));
    if (!ws) return cart_fail(CART_E_NOMEM, "out of memory repacking the model");
    int rc = CART_OK;
    for (int32_t l = -1; l < m->cfg.n_layer && !rc; l++) {
        int32_t n = 0;
        if (l < 0) {
            ws[n++] = &m->output;
            if (m->pl_model_proj.rows > 0) ws[n++] = &m->pl_model_proj;
        } else {
            n = layer_matrices(&m->layers[l], m->cfg.n_expert, ws);
        }
        for (int32_t i = 0; i < n && !rc; i++) {
            uint64_t bytes = 0;
            rc = cart_weight_repack(ws[i], &bytes, cart_default_pool());
            m->packed_bytes += bytes;
        }
    }
    free(ws);
    m->repack_seconds = cart_now_seconds() - t0;
    return rc;
}

static int load_weights(cart_model *m, model_loader *ld, const cart_model_options *opts) {
    const cart_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    uint64_t *bytes = &m->weight_bytes;
    int rc;

    const cart_gguf_tensor_info *emb = cart_gguf_find_tensor(ld->g, "token_embd.weight");
    if (!emb) return cart_fail(CART_E_FORMAT, "%s: missing tensor 'token_embd.weight'", ld->path);
    if (emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return cart_fail(CART_E_FORMAT, "%s: token_embd.weight has %lld rows", ld->path,
                         (long long)emb->ne[1]);
    m->cfg.n_vocab = (int32_t)emb->ne[1];
    if ((rc = model_load_weight(ld, "token_embd.weight", E, c->n_vocab, &m->tok_embd, bytes))) return rc;
    if ((rc = model_load_vector(ld, "output_norm.weight", E, &m->output_norm, bytes))) return rc;
    if (cart_gguf_find_tensor(ld->g, "output.weight")) {
        if ((rc = model_load_weight(ld, "output.weight", E, c->n_vocab, &m->output, bytes))) return rc;
    } else {
        m->cfg.tied_output = 1;
        m->output = m->tok_embd;
    }

    if ((rc = arch_of(c->arch)->load_layers(m, ld))) return rc;
    if ((rc = check_no_extra_tensors(ld))) return rc;

    if (opts && opts->widen_f32) {
        m->widened = 1;
        uint64_t *wb = &m->widened_bytes;
        if ((rc = widen(&m->tok_embd, wb))) return rc;
        if (m->cfg.tied_output) m->output = m->tok_embd;
        else if ((rc = widen(&m->output, wb))) return rc;
        if (m->pl_model_proj.rows > 0 && (rc = widen(&m->pl_model_proj, wb))) return rc;
        cart_weight **ws = malloc(sizeof *ws * (size_t)(10 + 3 * c->n_expert));
        if (!ws) return cart_fail(CART_E_NOMEM, "out of memory widening the model");
        for (int32_t l = 0; l < c->n_layer && !rc; l++) {
            int32_t n = layer_matrices(&m->layers[l], c->n_expert, ws);
            for (int32_t i = 0; i < n && !rc; i++) rc = widen(ws[i], wb);
        }
        free(ws);
        if (rc) return rc;
    }
    if (!(opts && opts->no_repack)) return repack_all(m);
    return CART_OK;
}

int cart_model_load(cart_model **out, const char *path, const cart_model_options *opts) {
    *out = NULL;
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", path);
    cart_gguf *g = NULL;
    int rc = cart_gguf_open(&g, path);
    if (rc) return rc;
    return cart_model_load_gguf(out, g, opts);
}

int cart_model_load_gguf(cart_model **out, cart_gguf *g, const cart_model_options *opts) {
    *out = NULL;
    const char *path = cart_gguf_path(g);
    if (cart_isa_init() != CART_OK) {
        int rc = cart_fail_context(cart_last_status(), "%s", path);
        cart_gguf_close(g);
        return rc;
    }
    cart_model *m = cart_calloc(1, sizeof *m, "model");
    if (!m) {
        cart_gguf_close(g);
        return CART_E_NOMEM;
    }
    m->gguf = g;
    model_loader ld = {.g = g, .path = path};
    int64_t n_tensors = cart_gguf_tensor_count(g);
    ld.claimed = cart_calloc((size_t)(n_tensors > 0 ? n_tensors : 1), 1, "tensor table");
    int rc = ld.claimed ? CART_OK : CART_E_NOMEM;
    if (rc || (rc = read_model_config(&ld, m)) || (rc = load_weights(m, &ld, opts))) {
        free(ld.claimed);
        cart_model_free(m);
        return rc;
    }
    free(ld.claimed);
    *out = m;
    return CART_OK;
}

int cart_model_layer(const cart_model *m, int32_t layer, cart_layer_config *out) {
    if (layer < 0 || layer >= m->cfg.n_layer)
        return cart_fail(CART_E_ARG, "cart_model_layer: layer %d is outside 0..%d", layer,
                         m->cfg.n_layer - 1);
    *out = m->layers[layer].g;
    return CART_OK;
}

model_widths cart_model_widths(const cart_model *m) {
    model_widths w = {0};
    for (int32_t l = 0; l < m->cfg.n_layer; l++) {
        const cart_layer_config *g = &m->layers[l].g;
        int64_t hd = (int64_t)g->n_head * g->head_dim, kd = (int64_t)g->n_head_kv * g->head_dim;
        if (hd > w.hd) w.hd = hd;
        if (kd > w.kd) w.kd = kd;
        if (g->n_ff > w.ff) w.ff = g->n_ff;
        if (g->head_dim > w.head_dim) w.head_dim = g->head_dim;
        if (g->n_head > w.n_head) w.n_head = g->n_head;
        if (g->n_head_kv > w.n_head_kv) w.n_head_kv = g->n_head_kv;
        if (g->n_rot > w.n_rot) w.n_rot = g->n_rot;
    }
    if (m->cfg.n_ff_exp > w.ff) w.ff = m->cfg.n_ff_exp;
    return w;
}

const cart_model_config *cart_model_get_config(const cart_model *m) {
    return &m->cfg;
}

const cart_gguf *cart_model_gguf(const cart_model *m) {
    return m->gguf;
}

uint64_t cart_model_weight_bytes(const cart_model *m) {
    return m->weight_bytes;
}

uint64_t cart_model_widened_bytes(const cart_model *m) {
    return m->widened_bytes;
}

uint64_t cart_model_packed_bytes(const cart_model *m) {
    return m->packed_bytes;
}

double cart_model_repack_seconds(const cart_model *m) {
    return m->repack_seconds;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t cart_model_fingerprint(const cart_model *m) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const cart_model_config *c = &m->cfg;
    int32_t dims[] = {c->arch, c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_head_kv,
                      c->head_dim, c->n_rot, c->n_vocab, c->rope_neox, c->qk_norm, c->tied_output};
    h = fnv1a(h, dims, sizeof dims);
    h = fnv1a(h, &c->rms_eps, sizeof c->rms_eps);
    h = fnv1a(h, &c->rope_theta, sizeof c->rope_theta);
    if (c->arch == CART_ARCH_GEMMA4) { /* the others keep the fingerprints they always had */
        int32_t more[] = {c->n_swa, c->n_expert, c->n_expert_used, c->n_ff_exp, c->n_embd_per_layer};
        h = fnv1a(h, more, sizeof more);
        h = fnv1a(h, &c->final_softcap, sizeof c->final_softcap);
        for (int32_t l = 0; l < c->n_layer; l++) h = fnv1a(h, &m->layers[l].g, sizeof m->layers[l].g);
    }
    for (int64_t i = 0; i < cart_gguf_tensor_count(m->gguf); i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(m->gguf, i);
        h = fnv1a(h, t->name.data, (size_t)t->name.len);
        h = fnv1a(h, &t->dtype, sizeof t->dtype);
        h = fnv1a(h, t->ne, sizeof t->ne);
        size_t n = (size_t)t->nbytes, edge = n < 4096 ? n : 4096;
        h = fnv1a(h, t->data, edge);
        if (n > edge) h = fnv1a(h, (const uint8_t *)t->data + n - edge, edge);
    }
    return h;
}

typedef struct hash_piece {
    const uint8_t *data;
    uint64_t n;
    uint64_t hash;
} hash_piece;

static void hash_pieces(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    hash_piece *pieces = ctx;
    for (int64_t i = begin; i < end; i++) {
        cart_cs64 c;
        cart_cs64_init(&c);
        cart_cs64_update(&c, pieces[i].data, pieces[i].n);
        pieces[i].hash = cart_cs64_final(&c);
    }
}

static uint64_t piece_count(uint64_t nbytes) {
    return (nbytes + CART_MODEL_HASH_PIECE - 1) / CART_MODEL_HASH_PIECE;
}

int cart_model_content_hash(const cart_model *m, uint64_t *out) {
    if (!m || !out)
        return cart_fail(CART_E_ARG, "cart_model_content_hash: %s is NULL", !m ? "model" : "out");
    const int64_t n_tensors = cart_gguf_tensor_count(m->gguf);
    uint64_t n = 0;
    for (int64_t i = 0; i < n_tensors; i++)
        n += piece_count(cart_gguf_tensor_at(m->gguf, i)->nbytes);
    hash_piece *pieces = cart_calloc(n ? (size_t)n : 1, sizeof *pieces, "model hash pieces");
    if (!pieces) return CART_E_NOMEM;
    uint64_t k = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(m->gguf, i);
        for (uint64_t at = 0; at < t->nbytes; at += CART_MODEL_HASH_PIECE, k++) {
            pieces[k].data = (const uint8_t *)t->data + at;
            pieces[k].n =
                t->nbytes - at < CART_MODEL_HASH_PIECE ? t->nbytes - at : CART_MODEL_HASH_PIECE;
        }
    }
    cart_pool_for(cart_default_pool(), (int64_t)n, 1, hash_pieces, pieces);
    cart_cs64 c;
    cart_cs64_init(&c);
    cart_cs64_update_u64(&c, cart_model_fingerprint(m));
    cart_cs64_update_u64(&c, (uint64_t)n_tensors);
    k = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        const cart_gguf_tensor_info *t = cart_gguf_tensor_at(m->gguf, i);
        cart_cs64_update_u64(&c, t->nbytes);
        for (uint64_t j = piece_count(t->nbytes); j > 0; j--)
            cart_cs64_update_u64(&c, pieces[k++].hash);
    }
    free(pieces);
    *out = cart_cs64_final(&c);
    return CART_OK;
}

int cart_model_content_hash_once(const cart_model *m, uint64_t *out) {
    cart_model *mm = (cart_model *)m;
    if (m && out && atomic_load(&mm->content_hash_known)) {
        *out = m->content_hash;
        return CART_OK;
    }
    int rc = cart_model_content_hash(m, out);
    if (rc == CART_OK) {
        mm->content_hash = *out;
        atomic_store(&mm->content_hash_known, 1);
    }
    return rc;
}

const char *cart_arch_name(int32_t arch) {
    const arch_ops *ops = arch_of(arch);
    return ops ? ops->name : NULL;
}

int32_t *cart_model_kv_geometry(const cart_model *m) {
    const int32_t n = m->cfg.n_layer;
    int32_t *geom = cart_malloc(sizeof(int32_t) * 2 * (size_t)n, "KV geometry");
    for (int32_t l = 0; geom && l < n; l++) geom[l] = m->layers[l].g.n_head_kv, geom[n + l] = m->layers[l].g.head_dim;
    return geom;
}

int cart_model_new_kv(cart_kv **out, const cart_model *m, int64_t capacity, int32_t dtype) {
    *out = NULL;
    int32_t *geom = cart_model_kv_geometry(m);
    if (!geom) return CART_E_NOMEM;
    int rc = cart_kv_new_layers(out, m->cfg.n_layer, geom, geom + m->cfg.n_layer, capacity, dtype);
    free(geom);
    return rc;
}

/* ---- forward -------------------------------------------------------------- */

/* Per-token sizes below are the widest over the layers (cart_model_widths):
 * HD = n_head * head_dim, KD = n_head_kv * head_dim, F = n_ff or n_ff_exp;
 * each layer uses its own leading part of every row. */
typedef struct forward_state {
    const cart_model *m;
    const cart_model_config *c;
    int64_t T;       /* tokens in the pass */
    float *x;        /* [T, E] residual stream */
    float *xn;       /* [T, E] normed input of a block */
    float *q;        /* [T, HD] */
    float *k;        /* [T, KD] */
    float *v;        /* [T, KD] */
    float *att;      /* [T, HD] attention output */
    float *gate;     /* [T, F] */
    float *up;       /* [T, F] */
    float *tmp;      /* [T, E] */
    float *angles[2]; /* [T, rope_n_rot[i]] cos/sin pairs per token, tables 0 (full) and 1 (sliding) */
    /* gemma4 */
    float *tmp2;     /* [T, E] the MoE branch */
    float *pl_in;    /* [T, n_layer * n_embd_per_layer] per-layer inputs */
    float *pl_h;     /* [T, n_embd_per_layer] */
    float *pl_row;   /* [n_layer * n_embd_per_layer] one token's per-layer embeddings */
    float *logits_r; /* [T, n_expert] router logits, then probabilities */
    int32_t *sel;    /* [T, n_expert_used] the experts each token runs, best first */
    float *sel_w;    /* [T, n_expert_used] their weights */
    float *ys;       /* [T * n_expert_used, E] each slot's expert output */
    int64_t *gather; /* [T] tokens of a run routed to one expert */
    int64_t *pos;    /* [T] position of each token */
    int32_t *stream; /* [T] stream of each token */
    int64_t *block_start; /* attention blocks: up to CART_ATTN_MAX_QUERIES consecutive tokens of one stream */
    int32_t *block_len;
    int64_t n_blocks;
    /* matmul runs: consecutive streams whose token counts take the same
     * path on their own (matmul.h), so each stream gets its own bits */
    int64_t *run_start, *run_len; /* [n_runs] first token and tokens */
    int32_t *run_path;            /* [n_runs] cart_mm_path */
    int32_t n_runs;
    int64_t *stream_logits;       /* [n_streams] logit rows each stream asked for */
    cart_kv *const *kvs;
    const int64_t *n_tokens; /* [n_streams] tokens of each stream in the pass */
    int32_t n_streams;
    int32_t layer;
    cart_pool *pool;
    const int64_t *q_rows; /* cart_model_forward_queries: the tokens whose queries are wanted */
    int64_t n_q_rows;
    float *q_out;          /* ... and where each layer's go, layer after layer */
    float *arena;    /* the allocation behind all of the above */
} forward_state;

/* q/k norm and RoPE (and gemma4's value norm) for tokens [begin, end). */
static void qk_prepare_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    forward_state *s = ctx;
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    const cart_layer_config *g = &L->g;
    const int64_t D = g->head_dim, HD = (int64_t)g->n_head * D, KD = (int64_t)g->n_head_kv * D;
    const int32_t n_rot = s->m->rope_n_rot[L->rope_table];
    for (int64_t t = begin; t < end; t++) {
        float *qt = s->q + t * HD, *kt = s->k + t * KD;
        qk_prepare_forward(qt, kt, NULL, NULL, qt, kt, c->qk_norm ? L->q_norm : NULL,
                           c->qk_norm ? L->k_norm : NULL, s->angles[L->rope_table] + t * n_rot,
                           g->n_head, g->n_head_kv, (int32_t)D, g->n_rot, c->rope_neox, c->rms_eps);
        if (c->arch == CART_ARCH_GEMMA4)
            rmsnorm_forward(s->v + t * KD, s->v + t * KD, NULL, g->n_head_kv, D, c->rms_eps);
    }
}

/* Attention for work items [begin, end): item = block * n_head_kv + kv head,
 * where a block is up to CART_ATTN_MAX_QUERIES consecutive tokens of one
 * stream. */
static void attention_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    forward_state *s = ctx;
    const cart_layer_config *lg = &s->m->layers[s->layer].g;
    int64_t D = lg->head_dim, KV = lg->n_head_kv, rep = lg->n_head / lg->n_head_kv;
    int64_t HD = (int64_t)lg->n_head * D;
    for (int64_t item = begin; item < end;) {
        /* the range's kv heads [g, g + n) of block b in one call: a decode
         * step reads whole cache rows (attention_forward) */
        int64_t b = item / KV, g = item % KV, n = KV - g < end - item ? KV - g : end - item;
        int64_t t = s->block_start[b];
        cart_kv *kv = s->kvs[s->stream[t]];
        int32_t dtype = cart_kv_dtype(kv);
        size_t el = dtype == CART_F16 ? 2 : 4;
        const uint8_t *krows = cart_kv_rows(kv, s->layer, 0);
        const uint8_t *vrows = cart_kv_rows(kv, s->layer, 1);
        attention_forward(s->att + t * HD + g * rep * D, s->q + t * HD + g * rep * D, HD,
                          s->block_len[b], krows + (size_t)(g * D) * el,
                          vrows + (size_t)(g * D) * el, dtype, s->pos[t] + 1, lg->window, KV * D,
                          (int32_t)(rep * n), (int32_t)n, (int32_t)D, lg->attn_scale);
        item += n;
    }
}

/* Checks a pass's arguments before anything touches a cache; sets *T, the
 * tokens of the pass. */
static int forward_check(const cart_model *m, cart_kv *const *kvs, int32_t n_streams, const int32_t *tokens,
                         const int64_t *n_tokens, const int64_t *logit_rows, int64_t n_logit_rows,
                         int64_t *T_out) {
    const cart_model_config *c = &m->cfg;
    if (n_streams < 1)
        return cart_fail(CART_E_ARG, "cart_model_forward: %d streams", (int)n_streams);
    /* validate everything before touching a cache */
    int64_t T = 0;
    for (int32_t b = 0; b < n_streams; b++) {
        cart_kv *kv = kvs[b];
        if (!kv) return cart_fail(CART_E_ARG, "cart_model_forward: stream %d has no cache", b);
        if (cart_kv_n_layer(kv) != c->n_layer)
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d's cache has %d layers, the "
                             "model %d", b, cart_kv_n_layer(kv), c->n_layer);
        for (int32_t l = 0; l < c->n_layer; l++) {
            const cart_layer_config *g = &m->layers[l].g;
            if (cart_kv_layer_heads(kv, l) != g->n_head_kv || cart_kv_layer_head_dim(kv, l) != g->head_dim)
                return cart_fail(CART_E_ARG, "cart_model_forward: stream %d's cache is shaped %d "
                                 "layers x %d heads x %d (layer %d), the model needs %d x %d x %d",
                                 b, cart_kv_n_layer(kv), cart_kv_layer_heads(kv, l),
                                 cart_kv_layer_head_dim(kv, l), l, c->n_layer, g->n_head_kv,
                                 g->head_dim);
        }
        if (n_tokens[b] < 0)
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d has %lld tokens", b,
                             (long long)n_tokens[b]);
        if (n_tokens[b] > cart_kv_capacity(kv) - cart_kv_len(kv))
            return cart_fail(CART_E_ARG, "cart_model_forward: stream %d: %lld new tokens after "
                             "%lld cached do not fit its context of %lld", b,
                             (long long)n_tokens[b], (long long)cart_kv_len(kv),
                             (long long)cart_kv_capacity(kv));
        for (int32_t o = 0; o < b; o++)
            if (kvs[o] == kv && n_tokens[b] > 0 && n_tokens[o] > 0)
                return cart_fail(CART_E_ARG, "cart_model_forward: streams %d and %d share a cache",
                                 o, b);
        T += n_tokens[b];
    }
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return cart_fail(CART_E_ARG, "cart_model_forward: token %lld is id %d, outside the "
                             "vocabulary of %d", (long long)t, tokens[t], c->n_vocab);
    for (int64_t j = 0; j < n_logit_rows; j++)
        if (logit_rows[j] < 0 || logit_rows[j] >= T)
            return cart_fail(CART_E_ARG, "cart_model_forward: logit row %lld asks for token %lld "
                             "of %lld", (long long)j, (long long)logit_rows[j], (long long)T);
    *T_out = T;
    return CART_OK;
}

/* y = x @ W^T over the pass's tokens, run by run: each stream's tokens on
 * the path its own count takes, so its outputs do not depend on the other
 * streams of the batch. count weights share the input (matmul.h _many).
 * The integer block products give every row the same bits on any path, so
 * their runs are one call. */
static int linear_runs(const forward_state *s, int32_t count, float *const *y, const int64_t *ldy,
                       const float *x, int64_t ldx, const cart_weight *const *w, cart_pool *pool) {
    float *yr[3];
    if (cart_matmul_path_invariant(w[0]->dtype))
        return cart_matmul_forward_many_path(count, y, ldy, x, ldx, w, s->T, CART_MM_AUTO, pool);
    for (int32_t r = 0; r < s->n_runs; r++) {
        for (int32_t k = 0; k < count; k++) yr[k] = y[k] + s->run_start[r] * ldy[k];
        int rc = cart_matmul_forward_many_path(count, yr, ldy, x + s->run_start[r] * ldx, ldx, w, s->run_len[r],
                                               s->run_path[r], pool);
        if (rc) return rc;
    }
    return CART_OK;
}

/* The same over n gathered rows that all belong to run r (the MoE's
 * experts): the run's path, so each row gets the bits it gets alone. */
static int linear_gathered(const forward_state *s, int32_t r, int32_t count, float *const *y,
                           const int64_t *ldy, const float *x, int64_t ldx, const cart_weight *const *w,
                           int64_t n, cart_pool *pool) {
    return cart_matmul_forward_many_path(count, y, ldy, x, ldx, w, n, s->run_path[r], pool);
}

/* Lays the pass's activations and index arrays out over one allocation
 * (s->arena, freed by the caller), assigns every token its stream, position
 * and attention block, and embeds the tokens into s->x. */
static int forward_setup(forward_state *s, const int32_t *tokens, const int64_t *n_tokens, int32_t n_streams,
                         cart_pool *pool) {
    const cart_model *m = s->m;
    const cart_model_config *c = s->c;
    const model_widths mw = cart_model_widths(m);
    const int64_t T = s->T, E = c->n_embd, F = mw.ff, HD = mw.hd, KD = mw.kd;
    const int64_t NR = m->rope_n_rot[0] + m->rope_n_rot[1];
    const int64_t PL = (int64_t)c->n_layer * c->n_embd_per_layer, Ep = c->n_embd_per_layer;
    const int64_t NE = c->n_expert, K = c->n_expert_used;
    const int gemma = c->arch == CART_ARCH_GEMMA4;
    size_t floats = (size_t)T * (size_t)(3 * E + HD * 2 + KD * 2 + 2 * F + NR);
    if (gemma) floats += (size_t)T * (size_t)(E + PL + Ep + NE + K + K * E) + (size_t)PL;
    size_t bytes = floats * sizeof(float) + (size_t)T * (3 * sizeof(int64_t) + 2 * sizeof(int32_t)) +
                   (size_t)(T * K) * sizeof(int32_t) + (size_t)n_streams * (3 * sizeof(int64_t) + sizeof(int32_t)) + 64;
    s->arena = cart_malloc(bytes, "forward activations");
    if (!s->arena) return CART_E_NOMEM;
    float *p = s->arena; /* floats first, then the index arrays */
    s->x = cart_carve(&p, T * E);
    s->xn = cart_carve(&p, T * E);
    s->tmp = cart_carve(&p, T * E);
    s->q = cart_carve(&p, T * HD);
    s->att = cart_carve(&p, T * HD);
    s->k = cart_carve(&p, T * KD);
    s->v = cart_carve(&p, T * KD);
    s->gate = cart_carve(&p, T * F);
    s->up = cart_carve(&p, T * F);
    s->angles[0] = cart_carve(&p, T * m->rope_n_rot[0]);
    s->angles[1] = cart_carve(&p, T * m->rope_n_rot[1]);
    if (gemma) {
        s->tmp2 = cart_carve(&p, T * E);
        s->pl_in = cart_carve(&p, T * PL);
        s->pl_h = cart_carve(&p, T * Ep);
        s->pl_row = cart_carve(&p, PL);
        s->logits_r = cart_carve(&p, T * NE);
        s->sel_w = cart_carve(&p, T * K);
        s->ys = cart_carve(&p, T * K * E);
    }
    s->pos = (int64_t *)p;
    s->gather = s->pos + T;
    s->block_start = s->gather + T;
    s->stream = (int32_t *)(s->block_start + T);
    s->block_len = s->stream + T;
    s->sel = s->block_len + T;
    s->run_start = (int64_t *)(s->sel + T * K + ((T * K) & 1)); /* 8-byte aligned */
    s->run_len = s->run_start + n_streams;
    s->stream_logits = s->run_len + n_streams;
    s->run_path = (int32_t *)(s->stream_logits + n_streams);
    s->n_runs = 0;
    for (int32_t b = 0, t = 0; b < n_streams; t += (int32_t)n_tokens[b], b++) {
        if (n_tokens[b] == 0) continue;
        int32_t path = cart_matmul_path_for(n_tokens[b]);
        if (s->n_runs > 0 && s->run_path[s->n_runs - 1] == path) {
            s->run_len[s->n_runs - 1] += n_tokens[b];
        } else {
            s->run_start[s->n_runs] = t;
            s->run_len[s->n_runs] = n_tokens[b];
            s->run_path[s->n_runs++] = path;
        }
    }
    for (int32_t b = 0, t = 0; b < n_streams; b++)
        for (int64_t i = 0; i < n_tokens[b]; i++, t++) {
            s->pos[t] = cart_kv_len(s->kvs[b]) + i;
            s->stream[t] = b;
            if (i % CART_ATTN_MAX_QUERIES == 0) {
                s->block_start[s->n_blocks] = t;
                s->block_len[s->n_blocks++] = 0;
            }
            s->block_len[s->n_blocks - 1]++;
        }
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < (gemma ? 2 : 1); i++)
            rope_angles_ff(s->angles[i] + t * m->rope_n_rot[i], s->pos[t], m->rope_n_rot[i], m->rope_base[i],
                           i == 0 ? m->rope_freqs : NULL);
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        cart_to_f32(s->x + t * E, m->tok_embd.dtype, row, E);
        if (c->embd_scale != 1.0f)
            for (int64_t i = 0; i < E; i++) s->x[t * E + i] *= c->embd_scale;
    }
    if (gemma && Ep > 0) {
        /* gemma4's per-layer inputs: (norm(proj(x) / sqrt(E)) + embd_pl[token] *
         * sqrt(Ep)) / sqrt(2), as [T, n_layer, Ep] */
        float *out[1] = {s->pl_in};
        const int64_t ld[1] = {PL};
        const cart_weight *w[1] = {&m->pl_model_proj};
        int rc = linear_runs(s, 1, out, ld, s->x, E, w, pool);
        if (rc) return rc;
        const float proj_scale = 1.0f / sqrtf((float)E), tok_scale = sqrtf((float)Ep);
        const float in_scale = 1.0f / sqrtf(2.0f);
        float *row = s->pl_row;
        for (int64_t t = 0; t < T; t++) {
            float *pl = s->pl_in + t * PL;
            for (int64_t i = 0; i < PL; i++) pl[i] *= proj_scale;
            rmsnorm_forward(pl, pl, m->pl_proj_norm, c->n_layer, Ep, c->rms_eps);
            const uint8_t *src = (const uint8_t *)m->pl_tok_embd.data + (size_t)tokens[t] * m->pl_tok_embd.row_bytes;
            cart_to_f32(row, m->pl_tok_embd.dtype, src, PL);
            for (int64_t i = 0; i < PL; i++) pl[i] = (pl[i] + row[i] * tok_scale) * in_scale;
        }
    }
    return CART_OK;
}

/* gemma4's MoE branch over the pass into s->tmp2 (before its post-norm):
 * route every token, then expert by expert and run by run, the tokens that
 * chose it through GEGLU, each result scaled by the expert's output scale
 * and the token's weight into its slot, the slots then summed in order. The
 * input xn2 (pre_ffw_norm_2 of the residual) is in s->xn; the residual in s->x. */
static int moe_forward(forward_state *s, cart_pool *pool) {
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    const int64_t T = s->T, E = c->n_embd, NE = c->n_expert, K = c->n_expert_used, FE = c->n_ff_exp;
    int rc;
    /* router: rmsnorm(x) / sqrt(E) * scale, then its logits */
    const float inv_sqrt = 1.0f / sqrtf((float)E);
    rmsnorm_forward(s->tmp, s->x, NULL, T, E, c->rms_eps);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < E; i++) s->tmp[t * E + i] = s->tmp[t * E + i] * inv_sqrt * L->router_scale[i];
    /* on the GEMV path for every token, whatever its stream's count: the
     * choice of experts is then the same however a prompt is split into
     * passes (a near-tie otherwise flips with the f32 summation order) */
    if ((rc = cart_matmul_forward_path(s->logits_r, NE, s->tmp, E, &L->router, T, CART_MM_GEMV, pool))) return rc;
    for (int64_t t = 0; t < T; t++)
        moe_route(s->sel + t * K, s->sel_w + t * K, s->logits_r + t * NE, (int32_t)NE, (int32_t)K);
    /* experts: gather each run's tokens that chose e into tmp (rows), run
     * them, scatter the scaled results into their slots. Experts of block
     * types give every row the same bits on any path (matmul.h), so then
     * the whole pass is one run: each expert's weights are read once per
     * step, whatever the streams of the batch */
    const int whole = cart_matmul_path_invariant(L->exp_gate[0].dtype) &&
                      cart_matmul_path_invariant(L->exp_up[0].dtype) &&
                      cart_matmul_path_invariant(L->exp_down[0].dtype);
    for (int32_t r = 0; r < (whole ? 1 : s->n_runs); r++) {
        const int64_t t0 = whole ? 0 : s->run_start[r], t1 = whole ? T : t0 + s->run_len[r];
        for (int32_t e = 0; e < NE; e++) {
            int64_t n = 0;
            for (int64_t t = t0; t < t1; t++)
                for (int64_t k = 0; k < K; k++)
                    if (s->sel[t * K + k] == e) s->gather[n++] = t * K + k;
            if (n == 0) continue;
            for (int64_t i = 0; i < n; i++)
                memcpy(s->tmp + i * E, s->xn + (s->gather[i] / K) * E, sizeof(float) * (size_t)E);
            float *gu[2] = {s->gate, s->up};
            const int64_t gu_ld[2] = {FE, FE};
            const cart_weight *gu_w[2] = {&L->exp_gate[e], &L->exp_up[e]};
            if ((rc = linear_gathered(s, r, 2, gu, gu_ld, s->tmp, E, gu_w, n, pool))) return rc;
            geglu_forward_table(s->gate, s->up, n * FE);
            float *dst[1] = {s->tmp};
            const int64_t ld[1] = {E};
            const cart_weight *wd[1] = {&L->exp_down[e]};
            if ((rc = linear_gathered(s, r, 1, dst, ld, s->gate, FE, wd, n, pool))) return rc;
            const float scale = L->exp_scale ? L->exp_scale[e] : 1.0f;
            for (int64_t i = 0; i < n; i++) {
                const int64_t slot = s->gather[i];
                const float w = s->sel_w[slot];
                float *y = s->ys + slot * E;
                const float *src = s->tmp + i * E;
                if (L->exp_scale)
                    for (int64_t d = 0; d < E; d++) y[d] = src[d] * scale * w;
                else
                    for (int64_t d = 0; d < E; d++) y[d] = src[d] * w;
            }
        }
    }
    for (int64_t t = 0; t < T; t++) {
        float *out = s->tmp2 + t * E;
        memcpy(out, s->ys + t * K * E, sizeof(float) * (size_t)E);
        for (int64_t k = 1; k < K; k++)
            for (int64_t d = 0; d < E; d++) out[d] += s->ys[(t * K + k) * E + d];
    }
    return CART_OK;
}

/* layer_exec's products: the pass's runs (linear_runs). */
static int infer_linear(void *ctx, int32_t count, float *const *y, const int64_t *ldy, const float *x, int64_t ldx,
                        const cart_weight *const *w) {
    const forward_state *s = ctx;
    return linear_runs(s, count, y, ldy, x, ldx, w, s->pool);
}

/* layer_exec's attention: q/k norms and RoPE in place, the queries kept
 * for cart_model_forward_queries, the new K/V rows into the streams'
 * caches, then attention over each stream's cache. */
static int infer_attend(void *ctx) {
    forward_state *s = ctx;
    const cart_layer_config *g = &s->m->layers[s->layer].g;
    const int64_t HD = (int64_t)g->n_head * g->head_dim, KD = (int64_t)g->n_head_kv * g->head_dim;
    cart_pool_for(s->pool, s->T, 4, qk_prepare_range, s);
    if (s->q_out) {
        for (int64_t j = 0; j < s->n_q_rows; j++)
            memcpy(s->q_out + j * HD, s->q + s->q_rows[j] * HD, sizeof(float) * (size_t)HD);
        s->q_out += s->n_q_rows * HD;
    }
    for (int32_t b = 0, t = 0; b < s->n_streams; t += (int32_t)s->n_tokens[b], b++)
        if (s->n_tokens[b] > 0)
            cart_kv_write(s->kvs[b], s->layer, cart_kv_len(s->kvs[b]), s->n_tokens[b], s->k + t * KD,
                          s->v + t * KD);
    cart_pool_for(s->pool, s->n_blocks * g->n_head_kv, 1, attention_range, s);
    return CART_OK;
}

static int infer_moe(void *ctx) {
    forward_state *s = ctx;
    return moe_forward(s, s->pool);
}

/* One block over the pass (models.h): every name of the residual stream is
 * s->x, of a norm's output s->xn, of an E-wide product s->tmp (gemma4's
 * MoE branch s->tmp2), each computed in place. */
static int forward_layer(forward_state *s) {
    layer_io io = {.x_in = s->x, .xn1 = s->xn, .q = s->q, .k = s->k, .v = s->v, .att = s->att, .o = s->tmp,
                   .x_mid = s->x, .xn2 = s->xn, .gate = s->gate, .up = s->up, .h = s->gate, .f = s->tmp,
                   .x_out = s->x, .on = s->tmp, .xm = s->xn, .msum = s->tmp2, .mn = s->tmp2, .fs = s->tmp,
                   .fn = s->tmp, .x_post = s->x, .pl_in = s->pl_in, .pl_g = s->pl_h, .pl_h = s->pl_h,
                   .pl_r = s->tmp, .pn = s->tmp};
    const layer_exec ex = {s, infer_linear, infer_attend, infer_moe, 0, s->pool};
    return arch_of(s->c->arch)->layer_forward(&ex, s->m, s->layer, &io, s->T);
}

/* The logits of the wanted rows: gathered T at a time (xn has room for T),
 * normed, one head product per chunk of rows whose streams take the same
 * path on their own (by how many logit rows each stream asked for), then
 * gemma4's soft-capping. */
static int forward_logits(forward_state *s, int32_t n_streams, const int64_t *logit_rows, int64_t n_logit_rows,
                          float *logits, cart_pool *pool) {
    const cart_model *m = s->m;
    const cart_model_config *c = s->c;
    const int64_t T = s->T, E = c->n_embd;
    for (int32_t b = 0; b < n_streams; b++) s->stream_logits[b] = 0;
    for (int64_t j = 0; j < n_logit_rows; j++) s->stream_logits[s->stream[logit_rows[j]]]++;
    int rc = CART_OK;
    for (int64_t done = 0; !rc && done < n_logit_rows;) {
        int32_t path = cart_matmul_path_for(s->stream_logits[s->stream[logit_rows[done]]]);
        int64_t chunk = 0;
        while (chunk < T && done + chunk < n_logit_rows &&
               cart_matmul_path_for(s->stream_logits[s->stream[logit_rows[done + chunk]]]) == path) {
            memcpy(s->xn + chunk * E, s->x + logit_rows[done + chunk] * E, (size_t)E * sizeof(float));
            chunk++;
        }
        rmsnorm_forward(s->xn, s->xn, m->output_norm, chunk, E, c->rms_eps);
        float *out = logits + done * (int64_t)c->n_vocab;
        rc = cart_matmul_forward_path(out, c->n_vocab, s->xn, E, &m->output, chunk, path, pool);
        if (!rc && c->final_softcap > 0.0f) softcap_forward(out, chunk * (int64_t)c->n_vocab, c->final_softcap);
        done += chunk;
    }
    return rc;
}

/* The final hidden states of the wanted rows: each row copied out of the
 * residual stream and normed on its own. */
static void forward_hidden(const forward_state *s, const int64_t *rows, int64_t n_rows, float *hidden) {
    const int64_t E = s->c->n_embd;
    for (int64_t j = 0; j < n_rows; j++) {
        memcpy(hidden + j * E, s->x + rows[j] * E, (size_t)E * sizeof(float));
        rmsnorm_forward(hidden + j * E, hidden + j * E, s->m->output_norm, 1, E, s->c->rms_eps);
    }
}

/* The pass behind cart_model_forward (hidden = 0: logits of the rows),
 * cart_model_forward_hidden (hidden = 1: final hidden states of the rows)
 * and cart_model_forward_queries (hidden = 2: each layer's queries). */
static int forward_pass(cart_model *m, cart_kv *const *kvs, int32_t n_streams, const int32_t *tokens,
                        const int64_t *n_tokens, const int64_t *rows, int64_t n_rows, float *out, int hidden) {
    int64_t T = 0;
    int rc = forward_check(m, kvs, n_streams, tokens, n_tokens, rows, n_rows, &T);
    if (rc || T == 0) return rc;
    cart_pool *pool = cart_default_pool();
    forward_state s = {.m = m, .c = &m->cfg, .T = T, .kvs = kvs, .n_tokens = n_tokens, .n_streams = n_streams,
                       .pool = pool};
    if (hidden == 2) s.q_rows = rows, s.n_q_rows = n_rows, s.q_out = out;
    if ((rc = forward_setup(&s, tokens, n_tokens, n_streams, pool))) {
        free(s.arena);
        return rc;
    }
    for (int32_t l = 0; l < m->cfg.n_layer && !rc; l++) {
        s.layer = l;
        rc = forward_layer(&s);
    }
    if (!rc && hidden == 1) forward_hidden(&s, rows, n_rows, out);
    else if (!rc && hidden == 0) rc = forward_logits(&s, n_streams, rows, n_rows, out, pool);
    if (!rc)
        for (int32_t b = 0; b < n_streams; b++)
            cart_kv_set_len(kvs[b], cart_kv_len(kvs[b]) + n_tokens[b]);
    free(s.arena);
    return rc;
}

int cart_model_forward(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                       const int32_t *tokens, const int64_t *n_tokens, const int64_t *logit_rows,
                       int64_t n_logit_rows, float *logits) {
    return forward_pass(m, kvs, n_streams, tokens, n_tokens, logit_rows, n_logit_rows, logits, 0);
}

int cart_model_forward_hidden(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                              const int32_t *tokens, const int64_t *n_tokens, const int64_t *rows,
                              int64_t n_rows, float *hidden) {
    return forward_pass(m, kvs, n_streams, tokens, n_tokens, rows, n_rows, hidden, 1);
}

int cart_model_forward_queries(cart_model *m, cart_kv *const *kvs, int32_t n_streams,
                               const int32_t *tokens, const int64_t *n_tokens, const int64_t *rows,
                               int64_t n_rows, float *queries) {
    return forward_pass(m, kvs, n_streams, tokens, n_tokens, rows, n_rows, queries, 2);
}

int64_t cart_model_query_floats(const cart_model *m, int64_t n_rows) {
    int64_t n = 0;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) n += (int64_t)m->layers[l].g.n_head * m->layers[l].g.head_dim;
    return n * n_rows;
}

int cart_model_rope_shift(const cart_model *m, int32_t layer, float *k, int64_t n_rows, int64_t ld,
                          int64_t delta) {
    if (layer < 0 || layer >= m->cfg.n_layer)
        return cart_fail(CART_E_ARG, "cart_model_rope_shift: layer %d of %d", layer, m->cfg.n_layer);
    const layer_weights *L = &m->layers[layer];
    const cart_layer_config *g = &L->g;
    if (ld < (int64_t)g->n_head_kv * g->head_dim)
        return cart_fail(CART_E_ARG, "cart_model_rope_shift: row stride %lld below the layer's %d x %d",
                         (long long)ld, g->n_head_kv, g->head_dim);
    const int32_t n_rot = m->rope_n_rot[L->rope_table];
    float cs[1024];
    if (n_rot > 1024) return cart_fail(CART_E_ARG, "cart_model_rope_shift: %d rotated dims", n_rot);
    rope_angles_ff(cs, delta < 0 ? -delta : delta, n_rot, m->rope_base[L->rope_table],
                   L->rope_table == 0 ? m->rope_freqs : NULL);
    for (int64_t r = 0; r < n_rows; r++) {
        if (delta < 0) rope_backward(k + r * ld, cs, g->n_head_kv, g->head_dim, g->n_rot, m->cfg.rope_neox);
        else rope_forward(k + r * ld, cs, g->n_head_kv, g->head_dim, g->n_rot, m->cfg.rope_neox);
    }
    return CART_OK;
}
