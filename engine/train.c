/*
 * train.c - the training forward over packed segments behind a
 * cartridge, the fused distillation loss, and the backward pass into the
 * cartridge rows (see train.h).
 *
 * Shapes below: T tokens in the pass, E = n_embd, F = n_ff, D = head_dim,
 * H = n_head, G = n_head_kv, HD = H * D, KD = G * D, p = cartridge rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "dtype.h"
#include "internal.h"
#include "model_internal.h"
#include "models/models.h"
#include "ops.h"
#include "pool.h"
#include "sampler.h"
#include "train.h"

enum { LSE_CHUNK = 512 }; /* vocabulary entries per chunk of the loss gradient's exps */


/* ---- the trainer ----------------------------------------------------------- */

/* One layer's activations for T tokens: what the backward reads. Sizes use
 * the widest layer (cart_model_widths); gemma4's extra fields are NULL for
 * the other architectures, its MoE fields NULL without experts. */
typedef struct acts {
    float *x_in;   /* [T, E] layer input */
    float *xn1;    /* [T, E] attention-norm output */
    float *rstd1;  /* [T] */
    float *q_raw;  /* [T, HD] before q-norm and RoPE */
    float *k_raw;  /* [T, KD] */
    float *q_rstd; /* [T, H] (qk-norm models) */
    float *k_rstd; /* [T, G] */
    float *q;      /* [T, HD] normed and rotated */
    float *k;      /* [T, KD] */
    float *v;      /* [T, KD] */
    float *att;    /* [T, HD] attention output */
    float *lse;    /* [T, H] log-sum-exp of each head's scores */
    float *x_mid;  /* [T, E] after the attention residual */
    float *xn2;    /* [T, E] ffn-norm output */
    float *rstd2;  /* [T] */
    float *gate;   /* [T, F] */
    float *up;     /* [T, F] */
    float *h;      /* [T, F] silu(gate) * up (gemma4: gelu(gate) * up) */
    /* gemma4 */
    float *v_raw;    /* [T, KD] before the value norm */
    float *v_rstd;   /* [T, G] */
    float *o;        /* [T, E] attention output projection, before post_attention_norm */
    float *o_rstd;   /* [T] */
    float *f;        /* [T, E] the dense FFN's down projection */
    float *f_rstd;   /* [T] its post_ffw_norm_1 (MoE layers) */
    float *fs;       /* [T, E] what post_ffw_norm normalizes (f, or both branches' normed sum) */
    float *fs_rstd;  /* [T] */
    float *x_post;   /* [T, E] after the FFN residual */
    float *pl_g;     /* [T, Ep] per-layer input gate, before its GELU */
    float *pl_r;     /* [T, E] per-layer projection, before its norm */
    float *pl_rstd;  /* [T] */
    /* gemma4 MoE */
    float *xm;       /* [T, E] pre_ffw_norm_2 output: the experts' input */
    float *xm_rstd;  /* [T] */
    float *rin_rstd; /* [T] the router input's norm */
    int32_t *sel;    /* [T, K] the experts each token runs, best first */
    float *sel_w;    /* [T, K] their weights */
    float *eg, *eu;  /* [T * K, FE] each slot's gate and up */
    float *ey;       /* [T * K, E] each slot's expert output times its scale */
    float *msum;     /* [T, E] the slots weighted and summed */
    float *m_rstd;   /* [T] its post_ffw_norm_2 */
} acts;

struct cart_trainer {
    cart_model *m;
    cart_params *params; /* attached weights to train, or NULL */
    cart_trainer_options opts;
    uint64_t peak_bytes;
    /* the activations and backward scratch of the last pass, kept for the
     * next one: a training step needs gigabytes, and fresh pages cost their
     * zeroing (slot 0: activations, 1: backward scratch, 2: trunk gradient,
     * 3: weight-gradient scratch, 4: the head's logits) */
    float *cache[5];
    size_t cache_bytes[5];
};

int cart_trainer_new(cart_trainer **out, cart_model *m, const cart_trainer_options *opts) {
    *out = NULL;
    cart_trainer *t = cart_calloc(1, sizeof *t, "trainer");
    if (!t) return CART_E_NOMEM;
    t->m = m;
    if (opts) t->opts = *opts;
    *out = t;
    return CART_OK;
}

void cart_trainer_free(cart_trainer *t) {
    if (!t) return;
    for (int i = 0; i < 5; i++) free(t->cache[i]);
    free(t);
}

int cart_trainer_set_params(cart_trainer *t, cart_params *p) {
    if (p && cart_params_model(p) != t->m)
        return cart_fail(CART_E_ARG, "cart_trainer_set_params: the parameter set belongs to another model");
    t->params = p;
    return CART_OK;
}

uint64_t cart_trainer_peak_bytes(const cart_trainer *t) {
    return t->peak_bytes;
}

/* The working memory of weight gradients: the transposed input and output
 * gradient of a linear layer, and its gradient before it is added. */
typedef struct wgrad_scratch {
    float *xt, *dyt, *g; /* [cols, T], [rows, T], [rows, cols] for the largest layer */
} wgrad_scratch;

/* gemma4's MoE scratch for a pass of T tokens (K = experts per token). */
typedef struct moe_scratch {
    int64_t *list;   /* [T * K] */
    float *rows_e;   /* [T * K, E] */
    float *rows_fe;  /* [T * K, 2 * FE] */
    float *d_e;      /* [T * K, E] backward */
    float *d_fe;     /* [T * K, 3 * FE] backward */
    float *dlogits;  /* [T, NE] backward */
    float *gk;       /* [T * K] backward: dmsum . ey of each slot */
} moe_scratch;

/* Everything one pass needs. */
typedef struct pass {
    const cart_model *m;
    const cart_model_config *c;
    const layer_weights *L; /* the current layer's weights */
    const cart_cartridge *cart; /* may be NULL */
    cart_cartridge *grad_cart;  /* receives prefix gradients; NULL in a forward-only pass */
    const model_grads *wg;      /* receives weight gradients; NULL unless weights train */
    const int32_t *tokens;      /* [T] */
    int32_t layer;
    int64_t p;          /* prefix rows (0 without a cartridge) */
    int64_t T;
    int64_t *seg_start; /* [T] first token of each token's segment */
    float *angles[2];   /* [T, rope_n_rot[i]] RoPE tables 0 (full) and 1 (gemma4's sliding) */
    float *pl_in;       /* [T, n_layer * n_embd_per_layer] gemma4's per-layer inputs, or NULL */
    float *tmp;         /* [T, E] scratch of a layer's forward */
    moe_scratch ms;     /* gemma4 MoE models only */
    float *block;       /* the allocation behind tmp, pl_in and ms */
    acts *a;            /* the current layer's activations */
    float *kh, *vh;     /* [G, p + T, D] the current layer's keys and values by kv head:
                           the prefix rows, then the tokens' (heads_pack_range) */
    /* backward scratch */
    float *datt;        /* [T, HD] gradient of the attention output */
    float *dq;          /* [T, HD] */
    float *dk;          /* [T, KD] */
    float *dv;          /* [T, KD] */
    float *delta;       /* [T, H] dout . out per token and head */
    float *dqn_w;       /* [T, D] per token: the q-norm weight's gradient (weights training) */
    float *dkn_w;       /* [T, D] the same for the k-norm */
    wgrad_scratch ws;   /* weights training only */
} pass;

/* dst[c, r] = src[r, c] for src [rows, cols] with row pitch ld. */
static void transpose(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols) {
    enum { B = 32 };
    for (int64_t r0 = 0; r0 < rows; r0 += B)
        for (int64_t c0 = 0; c0 < cols; c0 += B)
            for (int64_t r = r0; r < rows && r < r0 + B; r++)
                for (int64_t c = c0; c < cols && c < c0 + B; c++) dst[c * rows + r] = src[r * ld + c];
}

/* dw[rows, cols] += dy[T, rows]^T x[T, cols]: a linear layer's weight
 * gradient over T tokens (nothing when dw is NULL). It runs through the
 * engine's own f32 matmul kernels -- x^T as the weight, the columns of dy as
 * the inputs -- whose results are the same bits at every ISA level, so that
 * a training run gives the same model on any CPU. */
/* The input half of weight_grad: x [T, cols] transposed into ws->xt, for
 * the weight_grad_with calls that share it (q, k and v read one input). */
static void weight_grad_input(const wgrad_scratch *ws, const float *x, int64_t ldx, int64_t cols, int64_t T) {
    transpose(ws->xt, x, ldx, T, cols);
}

static int weight_grad_with(const wgrad_scratch *ws, float *dw, const float *dy, int64_t ldy, int64_t rows,
                            int64_t cols, int64_t T) {
    if (!dw || T == 0) return CART_OK;
    cart_weight w;
    transpose(ws->dyt, dy, ldy, T, rows);
    int rc = cart_weight_init(&w, CART_F32, ws->xt, cols, T);
    if (!rc) rc = cart_matmul_forward_exact(ws->g, cols, ws->dyt, T, &w, rows, cart_default_pool());
    if (!rc)
        for (int64_t i = 0; i < rows * cols; i++) dw[i] += ws->g[i];
    return rc;
}

static int weight_grad(const wgrad_scratch *ws, float *dw, const float *dy, int64_t ldy, const float *x,
                       int64_t ldx, int64_t rows, int64_t cols, int64_t T) {
    if (!dw || T == 0) return CART_OK;
    weight_grad_input(ws, x, ldx, cols, T);
    return weight_grad_with(ws, dw, dy, ldy, rows, cols, T);
}

/* dw[i] += sum over rows r of dy[r, i] * x[r, i] * rstd[r]: an RMSNorm
 * weight's gradient (y = x * rstd * w), rows in order. */
static void norm_weight_grad(float *dw, const float *dy, const float *x, const float *rstd, int64_t rows,
                             int64_t dim) {
    if (!dw) return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < dim; i++) dw[i] += dy[r * dim + i] * x[r * dim + i] * rstd[r];
}

/* What both attention passes read of a layer: its head geometry and the
 * cartridge's rows (NULL without a prefix). */
typedef struct att_geom {
    int32_t D, G, H, rep; /* head_dim, KV heads, query heads, query heads per KV head */
    int64_t KD, HD;     /* floats per token of K/V and of Q */
    int64_t window;     /* sliding window in positions (0: none) */
    float scale;        /* multiplies the scores */
    const float *pk, *pv;
} att_geom;

static att_geom att_geometry(const pass *s) {
    const cart_layer_config *g = &s->m->layers[s->layer].g;
    att_geom a;
    a.D = g->head_dim, a.G = g->n_head_kv, a.H = g->n_head, a.rep = g->n_head / g->n_head_kv;
    a.KD = (int64_t)a.G * a.D, a.HD = (int64_t)a.H * a.D;
    a.window = g->window;
    a.scale = g->attn_scale;
    a.pk = s->cart ? cart_cartridge_rows_of(s->cart, s->layer, 0) : NULL;
    a.pv = s->cart ? cart_cartridge_rows_of(s->cart, s->layer, 1) : NULL;
    return a;
}

/* The first prefix row and the first segment row token t sees: all of them,
 * or on a sliding layer those within the window of its position p + (t - s0). */
static int64_t first_prefix_row(const pass *s, const att_geom *ag, int64_t t, int64_t s0) {
    if (ag->window <= 0) return 0;
    int64_t first = s->p + (t - s0) - ag->window + 1;
    return first > 0 ? first : 0;
}

static int64_t first_segment_row(const att_geom *ag, int64_t t, int64_t s0) {
    if (ag->window <= 0 || t - ag->window + 1 <= s0) return s0;
    return t - ag->window + 1;
}

/* n rows of D floats from src (rows stride apart) to dst, D apart. */
static void gather_rows(float *dst, const float *src, int64_t stride, int64_t n, int32_t D) {
    for (int64_t j = 0; j < n; j++) memcpy(dst + j * D, src + j * stride, sizeof(float) * (size_t)D);
}

/* kv head g's rows in kh or vh (base): the prefix's, then the tokens'. */
static float *head_rows(const pass *s, float *base, int64_t g, int32_t D) {
    return base + g * (s->p + s->T) * D;
}

/* kh and vh for kv heads [begin, end) of the current layer. Attention reads
 * a head's rows contiguous: in place, rows of all the heads lie a multiple
 * of 4 KiB apart, so that each row of a tile is another page and the same
 * few L1 sets (measured on one multi-query call of 8 heads over 456 rows
 * in cache: 43.5 GFLOP/s in place, 81.7 contiguous). */
static void heads_pack_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    const att_geom ag = att_geometry(s);
    for (int64_t g = begin; g < end; g++) {
        float *kd = head_rows(s, s->kh, g, ag.D), *vd = head_rows(s, s->vh, g, ag.D);
        if (s->p) {
            gather_rows(kd, ag.pk + g * ag.D, ag.KD, s->p, ag.D);
            gather_rows(vd, ag.pv + g * ag.D, ag.KD, s->p, ag.D);
        }
        gather_rows(kd + s->p * ag.D, s->a->k + g * ag.D, ag.KD, s->T, ag.D);
        gather_rows(vd + s->p * ag.D, s->a->v + g * ag.D, ag.KD, s->T, ag.D);
    }
}

/* Forward attention for items [begin, end): item = kv head * blocks +
 * token block, a block being FWD_TOKENS consecutive tokens; head-major, so
 * a thread's run of items reads one kv head's rows (heads_pack_range),
 * which stay in L2, not every head's for each block. Tokens of a block that
 * see the same prefix rows and the same first segment row run together
 * (attention_heads_forward: each head the bits of its own pass). */
/* FWD_HEADS: room for one token's heads of a KV head (at most 16, which
 * the model loader enforces) or a full multi-query call */
enum { FWD_TOKENS = 4, FWD_HEADS = CART_ATTN_MAX_MQ > 16 ? CART_ATTN_MAX_MQ : 16 };

static void attention_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    const att_geom ag = att_geometry(s);
    const int32_t D = ag.D, rep = ag.rep;
    const int64_t HD = ag.HD;
    const int64_t blocks = (s->T + FWD_TOKENS - 1) / FWD_TOKENS;
    for (int64_t item = begin; item < end; item++) {
        int64_t tb = item % blocks * FWD_TOKENS, g = item / blocks;
        const float *kh = head_rows(s, s->kh, g, D), *vh = head_rows(s, s->vh, g, D);
        int64_t te = tb + FWD_TOKENS < s->T ? tb + FWD_TOKENS : s->T;
        for (int64_t t = tb; t < te;) {
            int64_t s0 = s->seg_start[t];
            int64_t j0 = first_prefix_row(s, &ag, t, s0), u0 = first_segment_row(&ag, t, s0);
            float *out[FWD_HEADS], *lse[FWD_HEADS];
            const float *q[FWD_HEADS];
            int64_t nb[FWD_HEADS];
            int32_t n = 0;
            for (; t < te; t++) { /* the run of tokens with these rows, rep heads each (a token at least) */
                if (n && (s->seg_start[t] != s0 || first_prefix_row(s, &ag, t, s0) != j0 ||
                          first_segment_row(&ag, t, s0) != u0 || n + rep > CART_ATTN_MAX_MQ))
                    break;
                for (int32_t r = 0; r < rep; r++, n++) {
                    int64_t h = g * rep + r;
                    out[n] = s->a->att + t * HD + h * D, lse[n] = s->a->lse + t * ag.H + h;
                    q[n] = s->a->q + t * HD + h * D, nb[n] = t - u0 + 1;
                }
            }
            int64_t na = j0 < s->p ? s->p - j0 : 0;
            attention_heads_forward(out, lse, q, n, na ? kh + j0 * D : NULL, na ? vh + j0 * D : NULL, na, D,
                                    kh + (s->p + u0) * D, vh + (s->p + u0) * D, nb, D, D, ag.scale);
        }
    }
}

/* Backward attention for kv heads [begin, end), tile by tile: for a tile of
 * 64 key rows, every query that sees it adds its share to the tile's
 * gradients held in L1-sized buffers, which are then added to the rows. Row
 * gradients sum over queries in token order, query gradients over tiles in
 * row order: the order of the plain per-query loop. A query on a sliding
 * layer reads only the part of a tile within its window. */
enum { BTILE = 64, QB = CART_ATTN_MAX_MQ };

/* Consecutive query heads (token, head) that see the same rows [lo, hi) of
 * a tile, gathered so the tile is read once for all of them. */
typedef struct qblock {
    int32_t n;
    int64_t lo, nt[QB]; /* the tile's rows lo .. lo + nt[a] for query a */
    float *dq[QB];
    const float *q[QB], *dout[QB];
    float delta[QB], lse[QB];
} qblock;

/* The tile's rows (k, v at row lo of the tile), its gradient buffers (NULL:
 * none) and the first row of it that takes gradients. */
typedef struct btile {
    const float *k, *v;
    float *dkt, *dvt;
    int64_t skip, stride;
    int32_t D;
    float scale;
} btile;

static void qblock_flush(qblock *b, const btile *bt) {
    if (!b->n) return;
    int64_t lo = b->lo, sk = bt->skip > lo ? bt->skip - lo : 0;
    attention_tiles_backward(b->dq, bt->dkt ? bt->dkt + lo * bt->D : NULL, bt->dkt ? bt->dvt + lo * bt->D : NULL,
                             sk, b->dout, b->delta, b->lse, b->q, bt->k + lo * bt->stride,
                             bt->v + lo * bt->stride, bt->stride, b->nt, b->n, bt->D, bt->scale);
    b->n = 0;
}

/* Adds the rep heads of kv head g at token t, seeing rows [lo, hi). */
static void qblock_add(qblock *b, const btile *bt, const pass *s, int64_t t, int64_t g, int32_t rep, int64_t lo,
                       int64_t hi) {
    const int32_t D = bt->D, H = s->m->layers[s->layer].g.n_head;
    const int64_t HD = (int64_t)H * D;
    for (int32_t r = 0; r < rep; r++) {
        if (b->n == QB || (b->n && b->lo != lo)) qblock_flush(b, bt);
        int64_t h = g * rep + r, at = t * HD + h * D;
        b->lo = lo, b->nt[b->n] = hi - lo;
        b->dq[b->n] = s->dq + at;
        b->q[b->n] = s->a->q + at;
        b->dout[b->n] = s->datt + at;
        b->delta[b->n] = s->delta[t * H + h];
        b->lse[b->n] = s->a->lse[t * H + h];
        b->n++;
    }
}

static void attention_backward_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    const att_geom ag = att_geometry(s);
    const int32_t D = ag.D, rep = ag.rep;
    const int64_t KD = ag.KD;
    float *gk = s->grad_cart ? cart_cartridge_grad(s->grad_cart, s->layer, 0) : NULL;
    float *gv = s->grad_cart ? cart_cartridge_grad(s->grad_cart, s->layer, 1) : NULL;
    int64_t frozen = s->cart ? cart_cartridge_frozen(s->cart) : 0;
    float dkt[BTILE * 512], dvt[BTILE * 512]; /* head_dim <= 512 */
    qblock b = {0};
    for (int64_t g = begin; g < end; g++) {
        const float *kh = head_rows(s, s->kh, g, D), *vh = head_rows(s, s->vh, g, D);
        /* the cartridge rows: a token sees those from its first prefix row on */
        for (int64_t t0 = 0; t0 < s->p; t0 += BTILE) {
            int64_t nt = s->p - t0 < BTILE ? s->p - t0 : BTILE;
            int64_t skip = frozen > t0 ? frozen - t0 : 0;
            int want = gk && skip < nt;
            if (want) {
                memset(dkt, 0, sizeof(float) * (size_t)(nt * D));
                memset(dvt, 0, sizeof(float) * (size_t)(nt * D));
            }
            btile bt = {kh + t0 * D, vh + t0 * D, want ? dkt : NULL, want ? dvt : NULL, skip, D, D, ag.scale};
            for (int64_t t = 0; t < s->T; t++) {
                int64_t j0 = first_prefix_row(s, &ag, t, s->seg_start[t]);
                int64_t lo = j0 > t0 ? j0 - t0 : 0; /* within the tile */
                if (lo < nt) qblock_add(&b, &bt, s, t, g, rep, lo, nt);
            }
            qblock_flush(&b, &bt);
            if (want)
                for (int64_t j = skip; j < nt; j++)
                    for (int32_t d = 0; d < D; d++) {
                        gk[(t0 + j) * KD + g * D + d] += dkt[j * D + d];
                        gv[(t0 + j) * KD + g * D + d] += dvt[j * D + d];
                    }
        }
        /* each segment's own rows: token t sees rows first_segment_row..t */
        for (int64_t s0 = 0; s0 < s->T;) {
            int64_t s1 = s0;
            while (s1 < s->T && s->seg_start[s1] == s0) s1++;
            for (int64_t t0 = s0; t0 < s1; t0 += BTILE) {
                int64_t width = s1 - t0 < BTILE ? s1 - t0 : BTILE;
                memset(dkt, 0, sizeof(float) * (size_t)(width * D));
                memset(dvt, 0, sizeof(float) * (size_t)(width * D));
                btile bt = {kh + (s->p + t0) * D, vh + (s->p + t0) * D, dkt, dvt, 0, D, D, ag.scale};
                for (int64_t t = t0; t < s1; t++) {
                    int64_t u0 = first_segment_row(&ag, t, s0);
                    int64_t lo = u0 > t0 ? u0 - t0 : 0;
                    int64_t hi = t - t0 + 1 < width ? t - t0 + 1 : width; /* rows [lo, hi) of the tile */
                    if (lo < hi) qblock_add(&b, &bt, s, t, g, rep, lo, hi);
                }
                qblock_flush(&b, &bt);
                for (int64_t j = 0; j < width; j++)
                    for (int32_t d = 0; d < D; d++) {
                        s->dk[(t0 + j) * KD + g * D + d] += dkt[j * D + d];
                        s->dv[(t0 + j) * KD + g * D + d] += dvt[j * D + d];
                    }
            }
            s0 = s1;
        }
    }
}

/* delta = dout . out for every token and head (the backward's softmax term). */
static void delta_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    int32_t D = s->m->layers[s->layer].g.head_dim;
    for (int64_t i = begin; i < end; i++)
        s->delta[i] = attention_delta(s->datt + i * D, s->a->att + i * D, D);
}

/* q/k norm and RoPE (gemma4: and the value norm) for tokens [begin, end). */
static void qk_prepare_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    const cart_model_config *c = s->c;
    const layer_weights *L = s->L;
    const cart_layer_config *g = &L->g;
    int64_t D = g->head_dim, HD = (int64_t)g->n_head * D, KD = (int64_t)g->n_head_kv * D;
    const int32_t n_rot = s->m->rope_n_rot[L->rope_table];
    acts *a = s->a;
    for (int64_t t = begin; t < end; t++) {
        qk_prepare_forward(a->q + t * HD, a->k + t * KD, a->q_rstd + t * g->n_head,
                           a->k_rstd + t * g->n_head_kv, a->q_raw + t * HD, a->k_raw + t * KD,
                           c->qk_norm ? L->q_norm : NULL, c->qk_norm ? L->k_norm : NULL,
                           s->angles[L->rope_table] + t * n_rot, g->n_head, g->n_head_kv, (int32_t)D,
                           g->n_rot, c->rope_neox, c->rms_eps);
        if (a->v_raw)
            rmsnorm_forward_keep(a->v + t * KD, a->v_rstd + t * g->n_head_kv, a->v_raw + t * KD, NULL,
                                 g->n_head_kv, D, c->rms_eps);
    }
}

/* The backward of qk_prepare for tokens [begin, end): dq, dk (gradients of
 * the rotated, normed q/k) become gradients of q_raw, k_raw, in place; on
 * gemma4 dv (of the normed values) becomes that of v_raw likewise. */
static void qk_backward_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    pass *s = ctx;
    const cart_model_config *c = s->c;
    const layer_weights *L = s->L;
    const cart_layer_config *g = &L->g;
    int64_t D = g->head_dim, HD = (int64_t)g->n_head * D, KD = (int64_t)g->n_head_kv * D;
    const int32_t n_rot = s->m->rope_n_rot[L->rope_table];
    const acts *a = s->a;
    float tmp[512]; /* head_dim <= 512 (model.c checks) */
    for (int64_t t = begin; t < end; t++) {
        const float *cs = s->angles[L->rope_table] + t * n_rot;
        float *dq = s->dq + t * HD, *dk = s->dk + t * KD;
        rope_backward(dq, cs, g->n_head, (int32_t)D, g->n_rot, c->rope_neox);
        rope_backward(dk, cs, g->n_head_kv, (int32_t)D, g->n_rot, c->rope_neox);
        if (a->v_raw) {
            float *dv = s->dv + t * KD;
            for (int32_t h = 0; h < g->n_head_kv; h++) {
                memset(tmp, 0, sizeof(float) * (size_t)D);
                rmsnorm_backward(tmp, dv + h * D, a->v_raw + t * KD + h * D, a->v_rstd + t * g->n_head_kv + h,
                                 NULL, 1, D);
                memcpy(dv + h * D, tmp, sizeof(float) * (size_t)D);
            }
        }
        if (!c->qk_norm) continue;
        if (s->dqn_w) { /* this token's share of the norm weights' gradients, heads in order */
            float *wq = s->dqn_w + t * D, *wk = s->dkn_w + t * D;
            memset(wq, 0, sizeof(float) * (size_t)D);
            memset(wk, 0, sizeof(float) * (size_t)D);
            for (int32_t h = 0; h < g->n_head; h++)
                norm_weight_grad(wq, dq + h * D, a->q_raw + t * HD + h * D, a->q_rstd + t * g->n_head + h, 1, D);
            for (int32_t k = 0; k < g->n_head_kv; k++)
                norm_weight_grad(wk, dk + k * D, a->k_raw + t * KD + k * D, a->k_rstd + t * g->n_head_kv + k, 1, D);
        }
        for (int32_t h = 0; h < g->n_head; h++) {
            memset(tmp, 0, sizeof(float) * (size_t)D);
            rmsnorm_backward(tmp, dq + h * D, a->q_raw + t * HD + h * D,
                             a->q_rstd + t * g->n_head + h, L->q_norm, 1, D);
            memcpy(dq + h * D, tmp, sizeof(float) * (size_t)D);
        }
        for (int32_t k = 0; k < g->n_head_kv; k++) {
            memset(tmp, 0, sizeof(float) * (size_t)D);
            rmsnorm_backward(tmp, dk + k * D, a->k_raw + t * KD + k * D,
                             a->k_rstd + t * g->n_head_kv + k, L->k_norm, 1, D);
            memcpy(dk + k * D, tmp, sizeof(float) * (size_t)D);
        }
    }
}

/* Floats of one layer's activations for T tokens (the widest layer's). */
static size_t acts_floats(const cart_model *m, int64_t T) {
    const cart_model_config *c = &m->cfg;
    const model_widths w = cart_model_widths(m);
    size_t E = (size_t)c->n_embd, F = (size_t)w.ff, HD = (size_t)w.hd, KD = (size_t)w.kd;
    size_t n = (size_t)T * (4 * E + 2 + 4 * HD + 4 * KD + 3 * F + (size_t)w.n_head * 2 + (size_t)w.n_head_kv);
    if (c->arch == CART_ARCH_GEMMA4) {
        n += (size_t)T * (KD + (size_t)w.n_head_kv + 5 * E + 4 + (size_t)c->n_embd_per_layer);
        if (c->n_expert > 0) {
            size_t K = (size_t)c->n_expert_used, FE = (size_t)c->n_ff_exp;
            n += (size_t)T * (2 * E + 3 + 2 * K + K * (2 * FE + E));
        }
    }
    return n;
}

/* Lays out acts over `p` (x_in excluded when x_in is given). */
static float *acts_carve(acts *a, float *p, const cart_model *m, int64_t T, float *x_in) {
    const cart_model_config *c = &m->cfg;
    const model_widths w = cart_model_widths(m);
    int64_t E = c->n_embd, F = w.ff, HD = w.hd, KD = w.kd;
    memset(a, 0, sizeof *a);
    a->x_in = x_in ? x_in : cart_carve(&p, T * E);
    a->xn1 = cart_carve(&p, T * E);
    a->rstd1 = cart_carve(&p, T);
    a->q_raw = cart_carve(&p, T * HD);
    a->k_raw = cart_carve(&p, T * KD);
    a->q_rstd = cart_carve(&p, T * w.n_head);
    a->k_rstd = cart_carve(&p, T * w.n_head_kv);
    a->q = cart_carve(&p, T * HD);
    a->k = cart_carve(&p, T * KD);
    a->v = cart_carve(&p, T * KD);
    a->att = cart_carve(&p, T * HD);
    a->lse = cart_carve(&p, T * w.n_head);
    a->x_mid = cart_carve(&p, T * E);
    a->xn2 = cart_carve(&p, T * E);
    a->rstd2 = cart_carve(&p, T);
    a->gate = cart_carve(&p, T * F);
    a->up = cart_carve(&p, T * F);
    a->h = cart_carve(&p, T * F);
    if (c->arch == CART_ARCH_GEMMA4) {
        a->v_raw = cart_carve(&p, T * KD);
        a->v_rstd = cart_carve(&p, T * w.n_head_kv);
        a->o = cart_carve(&p, T * E);
        a->o_rstd = cart_carve(&p, T);
        a->f = cart_carve(&p, T * E);
        a->f_rstd = cart_carve(&p, T);
        a->fs = cart_carve(&p, T * E);
        a->fs_rstd = cart_carve(&p, T);
        a->x_post = cart_carve(&p, T * E);
        a->pl_g = cart_carve(&p, T * c->n_embd_per_layer);
        a->pl_r = cart_carve(&p, T * E);
        a->pl_rstd = cart_carve(&p, T);
        if (c->n_expert > 0) {
            int64_t K = c->n_expert_used, FE = c->n_ff_exp;
            a->xm = cart_carve(&p, T * E);
            a->xm_rstd = cart_carve(&p, T);
            a->rin_rstd = cart_carve(&p, T);
            a->sel = (int32_t *)cart_carve(&p, T * K); /* int32 in a float's room */
            a->sel_w = cart_carve(&p, T * K);
            a->eg = cart_carve(&p, T * K * FE);
            a->eu = cart_carve(&p, T * K * FE);
            a->ey = cart_carve(&p, T * K * E);
            a->msum = cart_carve(&p, T * E);
            a->m_rstd = cart_carve(&p, T);
        }
    }
    return p;
}

/* Every (token, slot) of the pass that chose expert e, into list[]; returns
 * how many. Slots are t * K + k, in token order. */
static int64_t expert_slots(const acts *a, int64_t T, int64_t K, int32_t e, int64_t *list) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++)
            if (a->sel[t * K + k] == e) list[n++] = t * K + k;
    return n;
}

/* gemma4's MoE branch of layer s->layer over the pass, from a->xm (the
 * block's pre_ffw_norm_2 of a->x_mid): the router's choice (kept in a),
 * each expert over the tokens that chose it, the weighted sum of the slots
 * into a->msum. rows: [T * K, E] and [T * K, FE] scratch. */
static int moe_forward(pass *s, int64_t *list, float *rows_e, float *rows_fe) {
    const cart_model_config *c = s->c;
    const layer_weights *L = s->L;
    acts *a = s->a;
    const int64_t T = s->T, E = c->n_embd, NE = c->n_expert, K = c->n_expert_used, FE = c->n_ff_exp;
    cart_pool *pool = cart_default_pool();
    int rc;
    /* router: rmsnorm(x_mid) / sqrt(E) * scale, then softmax, top-k */
    const float inv_sqrt = 1.0f / sqrtf((float)E);
    rmsnorm_forward_keep(s->tmp, a->rin_rstd, a->x_mid, NULL, T, E, c->rms_eps);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < E; i++) s->tmp[t * E + i] = s->tmp[t * E + i] * inv_sqrt * L->router_scale[i];
    float *probs = s->ms.dlogits; /* [T, NE]; the backward's until then */
    if ((rc = cart_matmul_forward_exact(probs, NE, s->tmp, E, &L->router, T, pool))) return rc;
    for (int64_t t = 0; t < T; t++) moe_route(a->sel + t * K, a->sel_w + t * K, probs + t * NE, (int32_t)NE, (int32_t)K);
    for (int32_t e = 0; e < NE; e++) {
        int64_t n = expert_slots(a, T, K, e, list);
        if (n == 0) continue;
        for (int64_t i = 0; i < n; i++)
            memcpy(rows_e + i * E, a->xm + (list[i] / K) * E, sizeof(float) * (size_t)E);
        float *g = rows_fe, *u = rows_fe + n * FE;
        if ((rc = cart_matmul_forward_exact(g, FE, rows_e, E, &L->exp_gate[e], n, pool)) ||
            (rc = cart_matmul_forward_exact(u, FE, rows_e, E, &L->exp_up[e], n, pool)))
            return rc;
        for (int64_t i = 0; i < n; i++) {
            memcpy(a->eg + list[i] * FE, g + i * FE, sizeof(float) * (size_t)FE);
            memcpy(a->eu + list[i] * FE, u + i * FE, sizeof(float) * (size_t)FE);
        }
        geglu_forward(g, g, u, n * FE); /* h in place of the gate rows */
        if ((rc = cart_matmul_forward_exact(rows_e, E, g, FE, &L->exp_down[e], n, pool))) return rc;
        const float scale = L->exp_scale ? L->exp_scale[e] : 1.0f;
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < E; d++) a->ey[list[i] * E + d] = rows_e[i * E + d] * scale;
    }
    for (int64_t t = 0; t < T; t++) {
        float *out = a->msum + t * E;
        for (int64_t d = 0; d < E; d++) out[d] = a->ey[t * K * E + d] * a->sel_w[t * K];
        for (int64_t k = 1; k < K; k++)
            for (int64_t d = 0; d < E; d++) out[d] += a->ey[(t * K + k) * E + d] * a->sel_w[t * K + k];
    }
    return CART_OK;
}

/* layer_exec's products: each on its own, exact (matmul.h). */
static int train_linear(void *ctx, int32_t count, float *const *y, const int64_t *ldy, const float *x, int64_t ldx,
                        const cart_weight *const *w) {
    const pass *s = ctx;
    for (int32_t i = 0; i < count; i++) {
        int rc = cart_matmul_forward_exact(y[i], ldy[i], x, ldx, w[i], s->T, cart_default_pool());
        if (rc) return rc;
    }
    return CART_OK;
}

/* layer_exec's attention: q/k norms and RoPE kept beside their inputs,
 * then attention over the cartridge and each token's segment. */
static int train_attend(void *ctx) {
    pass *s = ctx;
    cart_pool *pool = cart_default_pool();
    cart_pool_for(pool, s->T, 16, qk_prepare_range, s);
    cart_pool_for(pool, s->L->g.n_head_kv, 1, heads_pack_range, s);
    cart_pool_for(pool, (s->T + FWD_TOKENS - 1) / FWD_TOKENS * s->L->g.n_head_kv, 1, attention_range, s);
    return CART_OK;
}

static int train_moe(void *ctx) {
    pass *s = ctx;
    return moe_forward(s, s->ms.list, s->ms.rows_e, s->ms.rows_fe);
}

/* Runs layer s->layer on s->a (x_in filled) and writes its output to x_out
 * (models.h): every intermediate the backward reads in its own buffer of
 * s->a, the rest in s->tmp. gemma4's GELU is exact here (the inference
 * forward uses GGML's f16 table, ops.h): a table has no derivative to
 * train through. */
static int layer_forward(pass *s, float *x_out) {
    acts *a = s->a;
    const int gemma = s->c->arch == CART_ARCH_GEMMA4;
    s->L = &s->m->layers[s->layer];
    layer_io io = {.x_in = a->x_in, .xn1 = a->xn1, .rstd1 = a->rstd1, .q = a->q_raw, .k = a->k_raw,
                   .v = gemma ? a->v_raw : a->v, .att = a->att, .o = gemma ? a->o : a->x_mid, .x_mid = a->x_mid,
                   .xn2 = a->xn2, .rstd2 = a->rstd2, .gate = a->gate, .up = a->up, .h = a->h,
                   .f = gemma ? a->f : x_out, .x_out = x_out, .on = s->tmp, .o_rstd = a->o_rstd, .xm = a->xm,
                   .xm_rstd = a->xm_rstd, .msum = a->msum, .mn = s->tmp, .m_rstd = a->m_rstd, .fs = a->fs,
                   .f_rstd = a->f_rstd, .fn = s->tmp, .fs_rstd = a->fs_rstd, .x_post = a->x_post,
                   .pl_in = s->pl_in, .pl_g = a->pl_g, .pl_h = s->tmp, .pl_r = a->pl_r, .pn = s->tmp,
                   .pl_rstd = a->pl_rstd};
    const layer_exec ex = {s, train_linear, train_attend, train_moe, 1, cart_default_pool()};
    return arch_of(s->c->arch)->layer_forward(&ex, s->m, s->layer, &io, s->T);
}

/* Scratch of the backward of one layer. */
typedef struct back_scratch {
    float *dh;    /* [T, F] gradient of h */
    float *dgate; /* [T, F] */
    float *dup;   /* [T, F] */
    float *dxn;  /* [T, E] gradient of a norm's output */
    float *dy;   /* [T, E] gemma4: a gradient before a norm */
    float *dz;   /* [T, E] gemma4: another */
} back_scratch;

/* gemma4 MoE backward: dmsum (the gradient of the weighted slot sum) into
 * dxm (of the experts' input, +=) and into dlogits (of the router's logits,
 * the choice of experts held constant). */
static int moe_backward(pass *s, const float *dmsum, float *dxm, float *dlogits, moe_scratch *ms) {
    const cart_model_config *c = s->c;
    const layer_weights *L = s->L;
    const acts *a = s->a;
    const int64_t T = s->T, E = c->n_embd, NE = c->n_expert, K = c->n_expert_used, FE = c->n_ff_exp;
    cart_pool *pool = cart_default_pool();
    int rc;
    /* the routing weights: w = softmax over the chosen logits, so
     * dl_k = w_k (g_k - sum_j w_j g_j) with g_k = dmsum . ey_k */
    memset(dlogits, 0, sizeof(float) * (size_t)(T * NE));
    for (int64_t t = 0; t < T; t++) {
        double mean = 0.0;
        for (int64_t k = 0; k < K; k++) {
            double g = 0.0;
            for (int64_t d = 0; d < E; d++) g += (double)dmsum[t * E + d] * a->ey[(t * K + k) * E + d];
            ms->gk[t * K + k] = (float)g;
            mean += a->sel_w[t * K + k] * g;
        }
        for (int64_t k = 0; k < K; k++)
            dlogits[t * NE + a->sel[t * K + k]] = (float)(a->sel_w[t * K + k] * (ms->gk[t * K + k] - mean));
    }
    /* each expert over its slots: dy = dmsum * w * scale, back through down,
     * GEGLU, gate and up */
    for (int32_t e = 0; e < NE; e++) {
        int64_t n = expert_slots(a, T, K, e, ms->list);
        if (n == 0) continue;
        const float scale = L->exp_scale ? L->exp_scale[e] : 1.0f;
        float *dy = ms->d_e, *dh = ms->d_fe, *dg = dh + n * FE, *du = dg + n * FE, *hrow = ms->rows_fe;
        for (int64_t i = 0; i < n; i++) {
            const int64_t slot = ms->list[i], t = slot / K;
            for (int64_t d = 0; d < E; d++) dy[i * E + d] = dmsum[t * E + d] * a->sel_w[slot] * scale;
        }
        memset(dh, 0, sizeof(float) * (size_t)(3 * n * FE));
        if ((rc = cart_matmul_backward(dh, FE, dy, E, &L->exp_down[e], n, pool))) return rc;
        for (int64_t i = 0; i < n; i++) {
            memcpy(hrow + i * FE, a->eg + ms->list[i] * FE, sizeof(float) * (size_t)FE);
            memcpy(hrow + (n + i) * FE, a->eu + ms->list[i] * FE, sizeof(float) * (size_t)FE);
        }
        geglu_backward(dg, du, dh, hrow, hrow + n * FE, n * FE);
        float *dx = ms->rows_e;
        memset(dx, 0, sizeof(float) * (size_t)(n * E));
        if ((rc = cart_matmul_backward(dx, E, dg, FE, &L->exp_gate[e], n, pool)) ||
            (rc = cart_matmul_backward(dx, E, du, FE, &L->exp_up[e], n, pool)))
            return rc;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = ms->list[i] / K;
            for (int64_t d = 0; d < E; d++) dxm[t * E + d] += dx[i * E + d];
        }
    }
    return CART_OK;
}

/* dx holds the gradient of the layer's output; on return, of its input. */
static int layer_backward_gemma4(pass *s, float *dx, back_scratch *b) {
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    const cart_layer_config *g = &L->g;
    s->L = L;
    const acts *a = s->a;
    int64_t T = s->T, E = c->n_embd, F = g->n_ff;
    int64_t HD = (int64_t)g->n_head * g->head_dim, KD = (int64_t)g->n_head_kv * g->head_dim;
    cart_pool *pool = cart_default_pool();
    int rc;
    if (L->out_scale != 1.0f)
        for (int64_t i = 0; i < T * E; i++) dx[i] *= L->out_scale;
    if (c->n_embd_per_layer > 0) {
        /* x_out = x_post + norm(proj(gelu(pl_g) * c)): into x_post's gradient */
        const int64_t Ep = c->n_embd_per_layer, PL = (int64_t)c->n_layer * Ep;
        step_zero(pool, b->dy, T * E);
        step_norm_backward(pool, b->dy, dx, a->pl_r, a->pl_rstd, L->pl_post_norm, T, E);
        float *dh = b->dh; /* [T, Ep] */
        step_zero(pool, dh, T * Ep);
        if ((rc = cart_matmul_backward(dh, Ep, b->dy, E, &L->pl_proj, T, pool))) return rc;
        float *dg = b->dgate;
        step_zero(pool, dg, T * Ep);
        for (int64_t t = 0; t < T; t++)
            geglu_backward(dg + t * Ep, NULL, dh + t * Ep, a->pl_g + t * Ep,
                           s->pl_in + t * PL + (int64_t)s->layer * Ep, Ep);
        if ((rc = cart_matmul_backward(dx, E, dg, Ep, &L->pl_gate, T, pool))) return rc;
    }
    /* x_post = x_mid + norm(fs): dx is now d x_post, and d x_mid's start */
    step_zero(pool, b->dy, T * E);
    step_norm_backward(pool, b->dy, dx, a->fs, a->fs_rstd, L->post_ffn_norm, T, E); /* d fs */
    float *df = b->dz; /* d f, the dense branch's down output */
    step_zero(pool, df, T * E);
    if (g->moe) {
        moe_scratch *ms = &s->ms;
        step_norm_backward(pool, df, b->dy, a->f, a->f_rstd, L->post_ffn_norm_1, T, E);
        float *dmsum = b->dxn;
        step_zero(pool, dmsum, T * E);
        step_norm_backward(pool, dmsum, b->dy, a->msum, a->m_rstd, L->post_ffn_norm_2, T, E);
        /* b->dy is free again: the experts' input gradient */
        float *dxm = b->dy;
        step_zero(pool, dxm, T * E);
        if ((rc = moe_backward(s, dmsum, dxm, ms->dlogits, ms))) return rc;
        step_norm_backward(pool, dx, dxm, a->x_mid, a->xm_rstd, L->pre_ffn_norm_2, T, E);
        /* the router: logits = W (rmsnorm(x_mid) / sqrt(E) * scale) */
        float *drin = b->dxn;
        step_zero(pool, drin, T * E);
        if ((rc = cart_matmul_backward(drin, E, ms->dlogits, c->n_expert, &L->router, T, pool))) return rc;
        const float inv_sqrt = 1.0f / sqrtf((float)E);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < E; i++) drin[t * E + i] *= inv_sqrt * L->router_scale[i];
        step_norm_backward(pool, dx, drin, a->x_mid, a->rin_rstd, NULL, T, E);
    } else {
        memcpy(df, b->dy, sizeof(float) * (size_t)(T * E));
    }
    /* the dense branch: f = down(gelu(gate) * up) of xn2 = norm(x_mid) */
    step_zero(pool, b->dh, T * F);
    if ((rc = cart_matmul_backward(b->dh, F, df, E, &L->wdown, T, pool))) return rc;
    step_glu_backward(pool, 1, b->dgate, b->dup, b->dh, a->gate, a->up, T * F);
    step_zero(pool, b->dxn, T * E);
    if ((rc = cart_matmul_backward(b->dxn, E, b->dgate, F, &L->wgate, T, pool))) return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, b->dup, F, &L->wup, T, pool))) return rc;
    step_norm_backward(pool, dx, b->dxn, a->x_mid, a->rstd2, L->ffn_norm, T, E); /* dx: now d x_mid */
    /* x_mid = x_in + norm(o(att)) */
    step_zero(pool, b->dy, T * E);
    step_norm_backward(pool, b->dy, dx, a->o, a->o_rstd, L->post_attn_norm, T, E);
    step_zero(pool, s->datt, T * HD);
    if ((rc = cart_matmul_backward(s->datt, HD, b->dy, E, &L->wo, T, pool))) return rc;
    step_zero(pool, s->dq, T * HD);
    step_zero(pool, s->dk, T * KD);
    step_zero(pool, s->dv, T * KD);
    cart_pool_for(pool, T * g->n_head, 64, delta_range, s);
    cart_pool_for(pool, g->n_head_kv, 1, heads_pack_range, s);
    cart_pool_for(pool, g->n_head_kv, 1, attention_backward_range, s);
    cart_pool_for(pool, T, 16, qk_backward_range, s); /* dv: now of v_raw */
    step_zero(pool, b->dxn, T * E);
    if (L->wv.rows == 0) /* v_raw = k_raw */
        for (int64_t i = 0; i < T * KD; i++) s->dk[i] += s->dv[i];
    else if ((rc = cart_matmul_backward(b->dxn, E, s->dv, KD, &L->wv, T, pool)))
        return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, s->dq, HD, &L->wq, T, pool))) return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, s->dk, KD, &L->wk, T, pool))) return rc;
    step_norm_backward(pool, dx, b->dxn, a->x_in, a->rstd1, L->attn_norm, T, E);
    return CART_OK;
}

/* dx holds the gradient of the layer's output; on return, of its input. */
static int layer_backward(pass *s, float *dx, back_scratch *b) {
    if (s->c->arch == CART_ARCH_GEMMA4) return layer_backward_gemma4(s, dx, b);
    const cart_model_config *c = s->c;
    const layer_weights *L = &s->m->layers[s->layer];
    static const layer_grads none;
    const layer_grads *G = s->wg ? &s->wg->layers[s->layer] : &none;
    s->L = L;
    const acts *a = s->a;
    int64_t T = s->T, E = c->n_embd, F = c->n_ff;
    int64_t HD = (int64_t)c->n_head * c->head_dim, KD = (int64_t)c->n_head_kv * c->head_dim;
    cart_pool *pool = cart_default_pool();
    int rc;
    /* feed-forward: x_out = x_mid + down(silu(gate) * up) */
    step_zero(pool, b->dh, T * F);
    if ((rc = cart_matmul_backward(b->dh, F, dx, E, &L->wdown, T, pool))) return rc;
    if ((rc = weight_grad(&s->ws, G->wdown, dx, E, a->h, F, E, F, T))) return rc;
    step_glu_backward(pool, 0, b->dgate, b->dup, b->dh, a->gate, a->up, T * F);
    step_zero(pool, b->dxn, T * E);
    if ((rc = cart_matmul_backward(b->dxn, E, b->dgate, F, &L->wgate, T, pool))) return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, b->dup, F, &L->wup, T, pool))) return rc;
    if (G->wgate || G->wup) weight_grad_input(&s->ws, a->xn2, E, E, T);
    if ((rc = weight_grad_with(&s->ws, G->wgate, b->dgate, F, F, E, T))) return rc;
    if ((rc = weight_grad_with(&s->ws, G->wup, b->dup, F, F, E, T))) return rc;
    norm_weight_grad(G->ffn_norm, b->dxn, a->x_mid, a->rstd2, T, E);
    step_norm_backward(pool, dx, b->dxn, a->x_mid, a->rstd2, L->ffn_norm, T, E); /* dx: now d x_mid */
    /* attention: x_mid = x_in + o(att) */
    step_zero(pool, s->datt, T * HD);
    if ((rc = cart_matmul_backward(s->datt, HD, dx, E, &L->wo, T, pool))) return rc;
    if ((rc = weight_grad(&s->ws, G->wo, dx, E, a->att, HD, E, HD, T))) return rc;
    step_zero(pool, s->dq, T * HD);
    step_zero(pool, s->dk, T * KD);
    step_zero(pool, s->dv, T * KD);
    cart_pool_for(pool, T * c->n_head, 64, delta_range, s);
    cart_pool_for(pool, c->n_head_kv, 1, heads_pack_range, s);
    cart_pool_for(pool, c->n_head_kv, 1, attention_backward_range, s);
    cart_pool_for(pool, T, 16, qk_backward_range, s);
    if (s->dqn_w && c->qk_norm) /* the tokens' shares, in token order */
        for (int64_t t = 0; t < T; t++)
            for (int32_t d = 0; d < c->head_dim; d++) {
                if (G->q_norm) G->q_norm[d] += s->dqn_w[t * c->head_dim + d];
                if (G->k_norm) G->k_norm[d] += s->dkn_w[t * c->head_dim + d];
            }
    step_zero(pool, b->dxn, T * E);
    if ((rc = cart_matmul_backward(b->dxn, E, s->dq, HD, &L->wq, T, pool))) return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, s->dk, KD, &L->wk, T, pool))) return rc;
    if ((rc = cart_matmul_backward(b->dxn, E, s->dv, KD, &L->wv, T, pool))) return rc;
    if (G->wq || G->wk || G->wv) weight_grad_input(&s->ws, a->xn1, E, E, T);
    if ((rc = weight_grad_with(&s->ws, G->wq, s->dq, HD, HD, E, T))) return rc;
    if ((rc = weight_grad_with(&s->ws, G->wk, s->dk, KD, KD, E, T))) return rc;
    if ((rc = weight_grad_with(&s->ws, G->wv, s->dv, KD, KD, E, T))) return rc;
    norm_weight_grad(G->attn_norm, b->dxn, a->x_in, a->rstd1, T, E);
    step_norm_backward(pool, dx, b->dxn, a->x_in, a->rstd1, L->attn_norm, T, E);
    return CART_OK;
}

/* Checks segments and fills seg_start[] and the RoPE angles. */
static int setup_positions(pass *s, const int64_t *seg_len, int32_t n_seg, const char *fn) {
    if (n_seg < 1) return cart_fail(CART_E_ARG, "%s: %d segments", fn, n_seg);
    const cart_model *m = s->m;
    const int tables = s->c->arch == CART_ARCH_GEMMA4 ? 2 : 1;
    int64_t at = 0;
    for (int32_t i = 0; i < n_seg; i++) {
        if (seg_len[i] < 1)
            return cart_fail(CART_E_ARG, "%s: segment %d has %lld tokens", fn, i, (long long)seg_len[i]);
        if (seg_len[i] > s->T - at)
            return cart_fail(CART_E_ARG, "%s: the segments hold more than the %lld tokens", fn,
                             (long long)s->T);
        for (int64_t j = 0; j < seg_len[i]; j++) {
            s->seg_start[at + j] = at;
            for (int k = 0; k < tables; k++)
                rope_angles_ff(s->angles[k] + (at + j) * m->rope_n_rot[k], s->p + j, m->rope_n_rot[k],
                               m->rope_base[k], k == 0 ? m->rope_freqs : NULL);
        }
        at += seg_len[i];
    }
    if (at != s->T)
        return cart_fail(CART_E_ARG, "%s: the segments hold %lld tokens, the pass has %lld", fn,
                         (long long)at, (long long)s->T);
    return CART_OK;
}

/* The forward trunk: embeddings, every layer. Fills x_final [T, E]. With
 * keep_all, layers[l] holds each layer's activations; otherwise layers[l]
 * holds only x_in (a->x_in of every layer) and `scratch` is reused. */
typedef struct trunk {
    acts *layers;   /* [n_layer] */
    float *x_final; /* [T, E] */
    float *block;   /* the allocation behind all of it (the trainer's cache) */
    size_t bytes;
} trunk;

static void trunk_free(trunk *tr) {
    free(tr->layers);
    memset(tr, 0, sizeof *tr);
}

/* At least `bytes` of one of the trainer's cached blocks (contents stale). */
static float *trainer_block(cart_trainer *t, int slot, size_t bytes) {
    if (t->cache_bytes[slot] < bytes) {
        free(t->cache[slot]);
        t->cache[slot] = cart_malloc(bytes, "trainer working memory");
        t->cache_bytes[slot] = t->cache[slot] ? bytes : 0;
    }
    return t->cache[slot];
}

static int trunk_forward(cart_trainer *t, pass *s, const int32_t *tokens, int keep_all, acts *scratch,
                         trunk *tr) {
    const cart_model_config *c = s->c;
    int64_t T = s->T, E = c->n_embd;
    size_t per_layer = keep_all ? acts_floats(s->m, T) : (size_t)(T * E);
    size_t floats = per_layer * (size_t)c->n_layer + (size_t)(T * E);
    if (!keep_all) floats += acts_floats(s->m, T); /* the scratch layer */
    tr->layers = cart_calloc((size_t)c->n_layer, sizeof(acts), "trainer activations");
    tr->block = tr->layers ? trainer_block(t, 0, floats * sizeof(float)) : NULL;
    if (!tr->block) {
        trunk_free(tr);
        return CART_E_NOMEM;
    }
    tr->bytes = floats * sizeof(float);
    float *p = tr->block;
    for (int32_t l = 0; l < c->n_layer; l++) {
        if (keep_all) p = acts_carve(&tr->layers[l], p, s->m, T, NULL);
        else tr->layers[l].x_in = cart_carve(&p, T * E);
    }
    tr->x_final = cart_carve(&p, T * E);
    if (!keep_all) acts_carve(scratch, p, s->m, T, tr->layers[0].x_in);

    const cart_model *m = s->m;
    for (int64_t t = 0; t < T; t++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        float *x = tr->layers[0].x_in + t * E;
        int rc = cart_to_f32(x, m->tok_embd.dtype, row, E);
        if (rc) return rc;
        if (c->embd_scale != 1.0f)
            for (int64_t i = 0; i < E; i++) x[i] *= c->embd_scale;
    }
    if (s->pl_in) {
        /* gemma4's per-layer inputs: (norm(proj(x) / sqrt(E)) + embd_pl[token] *
         * sqrt(Ep)) / sqrt(2), as [T, n_layer, Ep]; constants of the pass */
        const int64_t Ep = c->n_embd_per_layer, PL = (int64_t)c->n_layer * Ep;
        int rc = cart_matmul_forward_exact(s->pl_in, PL, tr->layers[0].x_in, E, &m->pl_model_proj, T, cart_default_pool());
        if (rc) return rc;
        const float proj_scale = 1.0f / sqrtf((float)E), tok_scale = sqrtf((float)Ep), in_scale = 1.0f / sqrtf(2.0f);
        float *row = s->pl_in + T * PL; /* pass_init leaves a row of room */
        for (int64_t t = 0; t < T; t++) {
            float *pl = s->pl_in + t * PL;
            for (int64_t i = 0; i < PL; i++) pl[i] *= proj_scale;
            rmsnorm_forward(pl, pl, m->pl_proj_norm, c->n_layer, Ep, c->rms_eps);
            const uint8_t *src = (const uint8_t *)m->pl_tok_embd.data + (size_t)tokens[t] * m->pl_tok_embd.row_bytes;
            if ((rc = cart_to_f32(row, m->pl_tok_embd.dtype, src, PL))) return rc;
            for (int64_t i = 0; i < PL; i++) pl[i] = (pl[i] + row[i] * tok_scale) * in_scale;
        }
    }
    for (int32_t l = 0; l < c->n_layer; l++) {
        s->layer = l;
        if (keep_all) s->a = &tr->layers[l];
        else {
            scratch->x_in = tr->layers[l].x_in;
            s->a = scratch;
        }
        float *x_out = l + 1 < c->n_layer ? tr->layers[l + 1].x_in : tr->x_final;
        int rc = layer_forward(s, x_out);
        if (rc) return rc;
    }
    return CART_OK;
}

enum {
    HEAD_CHUNK = 32,           /* rows through the output head at a time, at least */
    HEAD_LOGITS = 1 << 22,     /* logits of one chunk when the head's weights train */
    HEAD_LOGITS_CART = 1 << 25 /* ... when they do not (128 MiB of f32) */
};

/* Rows through the head at a time: as many as fit the chunk's logits
 * (between 32 and 1024). With weights training, 4 Mi logits, so that the
 * head's weight gradient sums over many rows per product in bounded memory
 * (the chunk fixes its order of sums, so it stays as it is); without, every
 * row is its own sum and the chunk changes no bit, so the GEMMs get 32 Mi
 * logits' worth of rows (the Qwen3 vocabulary: 220; a 160-row chunk ran the
 * head's forward at 279 GFLOP/s where 32 rows ran at 194, 2 threads). */
static int64_t head_chunk(int64_t V, int weights) {
    int64_t n = (weights ? HEAD_LOGITS : HEAD_LOGITS_CART) / V;
    return n < HEAD_CHUNK ? HEAD_CHUNK : n > 1024 ? 1024 : n;
}

/* The output head over a list of rows of x_final: norm, logits into `logits`
 * ([n, V]); xn and rstd receive the normed rows (for the backward). */
static int head_forward(const pass *s, const float *x_final, const int64_t *rows, int64_t n,
                        float *xn, float *rstd, float *logits) {
    const cart_model_config *c = s->c;
    int64_t E = c->n_embd;
    for (int64_t j = 0; j < n; j++)
        memcpy(xn + j * E, x_final + rows[j] * E, sizeof(float) * (size_t)E);
    rmsnorm_forward_keep(xn, rstd, xn, s->m->output_norm, n, E, c->rms_eps);
    int rc = cart_matmul_forward_exact(logits, c->n_vocab, xn, E, &s->m->output, n, cart_default_pool());
    if (!rc && c->final_softcap > 0.0f) softcap_forward(logits, n * c->n_vocab, c->final_softcap);
    return rc;
}

static int check_pass_args(const cart_trainer *t, const cart_cartridge *c, const int32_t *tokens,
                           int64_t n, const char *fn) {
    if (n < 1) return cart_fail(CART_E_ARG, "%s: %lld tokens", fn, (long long)n);
    if (c) {
        int rc = cart_cartridge_check_model(c, t->m, fn);
        if (rc) return rc;
    }
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= t->m->cfg.n_vocab)
            return cart_fail(CART_E_ARG, "%s: token %lld is id %d, outside the vocabulary of %d",
                             fn, (long long)i, tokens[i], t->m->cfg.n_vocab);
    return CART_OK;
}

/* Allocates seg_start and angles for a pass of n tokens. */
static int pass_init(pass *s, cart_trainer *t, const cart_cartridge *c, int64_t n) {
    memset(s, 0, sizeof *s);
    s->m = t->m;
    s->c = &t->m->cfg;
    s->cart = c;
    s->p = c ? cart_cartridge_p(c) : 0;
    s->T = n;
    s->seg_start = cart_malloc(sizeof(int64_t) * (size_t)n, "segment table");
    const cart_model *m = t->m;
    const int64_t tables = (int64_t)m->rope_n_rot[0] + m->rope_n_rot[1];
    s->angles[0] = cart_malloc(sizeof(float) * (size_t)(n * tables), "RoPE table");
    if (!s->seg_start || !s->angles[0]) return CART_E_NOMEM;
    s->angles[1] = s->angles[0] + n * m->rope_n_rot[0];
    int64_t kd = 0; /* the widest layer's keys */
    for (int32_t l = 0; l < s->c->n_layer; l++) {
        const cart_layer_config *g = &m->layers[l].g;
        if ((int64_t)g->n_head_kv * g->head_dim > kd) kd = (int64_t)g->n_head_kv * g->head_dim;
    }
    s->kh = cart_malloc(sizeof(float) * (size_t)(2 * (s->p + n) * kd), "attention rows by head");
    if (!s->kh) return CART_E_NOMEM;
    s->vh = s->kh + (s->p + n) * kd;
    if (s->c->arch != CART_ARCH_GEMMA4) return CART_OK;
    const int64_t E = s->c->n_embd, PL = (int64_t)s->c->n_layer * s->c->n_embd_per_layer;
    const int64_t K = s->c->n_expert_used, FE = s->c->n_ff_exp, NE = s->c->n_expert;
    size_t floats = (size_t)(n * E);
    if (PL > 0) floats += (size_t)((n + 1) * PL);
    if (NE > 0) floats += (size_t)(n * K * (2 * E + 5 * FE + 3) + n * NE);
    float *p = cart_malloc(sizeof(float) * floats, "trainer scratch");
    if (!p) return CART_E_NOMEM;
    s->block = p;
    if (NE > 0) s->ms.list = (int64_t *)cart_carve(&p, 2 * n * K); /* first: 8-byte aligned */
    s->tmp = cart_carve(&p, n * E);
    if (PL > 0) s->pl_in = cart_carve(&p, (n + 1) * PL);
    if (NE > 0) {
        s->ms.rows_e = cart_carve(&p, n * K * E);
        s->ms.rows_fe = cart_carve(&p, n * K * 2 * FE);
        s->ms.d_e = cart_carve(&p, n * K * E);
        s->ms.d_fe = cart_carve(&p, n * K * 3 * FE);
        s->ms.dlogits = cart_carve(&p, n * NE);
        s->ms.gk = cart_carve(&p, n * K);
    }
    return CART_OK;
}

static void pass_free(pass *s) {
    free(s->seg_start);
    free(s->angles[0]);
    free(s->kh);
    free(s->block);
}

int cart_trainer_logits(cart_trainer *t, const cart_cartridge *c, const int32_t *tokens, int64_t n,
                        const int64_t *seg_len, int32_t n_seg, const int64_t *rows,
                        int64_t n_rows, float *logits) {
    int rc = check_pass_args(t, c, tokens, n, "cart_trainer_logits");
    if (rc) return rc;
    for (int64_t j = 0; j < n_rows; j++)
        if (rows[j] < 0 || rows[j] >= n)
            return cart_fail(CART_E_ARG, "cart_trainer_logits: row %lld asks for token %lld of %lld",
                             (long long)j, (long long)rows[j], (long long)n);
    pass s;
    trunk tr = {0};
    acts scratch;
    float *xn = NULL, *rstd = NULL;
    if (!(rc = pass_init(&s, t, c, n)) && !(rc = setup_positions(&s, seg_len, n_seg, "cart_trainer_logits")))
        rc = trunk_forward(t, &s, tokens, 0, &scratch, &tr);
    if (!rc) {
        xn = cart_malloc(sizeof(float) * HEAD_CHUNK * (size_t)s.c->n_embd, "head rows");
        rstd = cart_malloc(sizeof(float) * HEAD_CHUNK, "head rows");
        if (!xn || !rstd) rc = CART_E_NOMEM;
    }
    for (int64_t j = 0; !rc && j < n_rows; j += HEAD_CHUNK) {
        int64_t chunk = n_rows - j < HEAD_CHUNK ? n_rows - j : HEAD_CHUNK;
        rc = head_forward(&s, tr.x_final, rows + j, chunk, xn, rstd,
                          logits + j * (int64_t)s.c->n_vocab);
    }
    if (tr.bytes > t->peak_bytes) t->peak_bytes = tr.bytes;
    free(xn);
    free(rstd);
    trunk_free(&tr);
    pass_free(&s);
    return rc;
}

/* Entries sorted by the row they read (position - 1), stable. */
typedef struct entry_ref {
    int64_t row;
    int64_t index;
} entry_ref;

static int compare_refs(const void *pa, const void *pb) {
    const entry_ref *a = pa, *b = pb;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Every target must read a row of the pass: positions in 1..n-1 that do not
 * start a segment, tokens in the vocabulary, log-probabilities <= 0. */
static int check_targets(const pass *s, const cart_distill_targets *tg, int64_t n, const char *fn) {
    for (int64_t e = 0; e < tg->n; e++) {
        int64_t pos = tg->position[e];
        if (pos < 1 || pos >= n || s->seg_start[pos] == pos || tg->token[e] < 0 ||
            tg->token[e] >= s->c->n_vocab || !(tg->logprob[e] <= 0.0f))
            return cart_fail(CART_E_ARG, "%s: target %lld (position %lld, token %d, logprob %g) is "
                             "outside the pass: positions must lie in 1..%lld and not start a "
                             "segment, tokens in the vocabulary, logprobs <= 0", fn, (long long)e,
                             (long long)pos, tg->token[e], tg->logprob[e], (long long)(n - 1));
    }
    return CART_OK;
}

/* The head's working memory: the targets in row order, the distinct rows
 * they read, and one chunk of normed rows, their logits and gradients. */
typedef struct head_work {
    entry_ref *refs; /* [n targets] sorted by row */
    int64_t *rows;   /* [n_rows] distinct rows, ascending */
    int64_t *first;  /* [n_rows] each row's first target in refs */
    double *losses;  /* [chunk] each row's unscaled loss */
    int64_t n_rows;
    int64_t chunk;                   /* rows per pass through the head */
    float *xn, *rstd, *dxn, *logits; /* chunk rows */
    float *capped;                   /* chunk rows: the soft-capped logits (gemma4), or NULL */
} head_work;

static void head_work_free(head_work *w) {
    free(w->refs);
    free(w->rows);
    free(w->first);
    free(w->losses);
    free(w->xn);
    free(w->rstd);
    free(w->dxn);
}

/* The targets in row order and a chunk's memory: at most `chunk` rows (no
 * more than the targets read), the logits (and soft-capped ones) in the
 * trainer's cached slot 4. */
static int head_work_init(head_work *w, cart_trainer *t, const cart_distill_targets *tg, int64_t E, int64_t V,
                          int64_t chunk, int capped) {
    memset(w, 0, sizeof *w);
    w->refs = cart_malloc(sizeof(entry_ref) * (size_t)tg->n, "target order");
    w->rows = cart_malloc(sizeof(int64_t) * (size_t)tg->n, "target rows");
    w->first = cart_malloc(sizeof(int64_t) * (size_t)tg->n, "target rows");
    if (!w->refs || !w->rows || !w->first) return CART_E_NOMEM;
    for (int64_t e = 0; e < tg->n; e++) w->refs[e] = (entry_ref){tg->position[e] - 1, e};
    qsort(w->refs, (size_t)tg->n, sizeof *w->refs, compare_refs);
    for (int64_t e = 0; e < tg->n; e++)
        if (w->n_rows == 0 || w->rows[w->n_rows - 1] != w->refs[e].row) {
            w->first[w->n_rows] = e;
            w->rows[w->n_rows++] = w->refs[e].row;
        }
    w->chunk = chunk < w->n_rows ? chunk : w->n_rows;
    size_t R = (size_t)w->chunk;
    w->losses = cart_malloc(sizeof(double) * R, "head rows");
    w->xn = cart_malloc(sizeof(float) * R * (size_t)E, "head rows");
    w->rstd = cart_malloc(sizeof(float) * R, "head rows");
    w->dxn = cart_malloc(sizeof(float) * R * (size_t)E, "head gradient");
    w->logits = trainer_block(t, 4, sizeof(float) * R * (size_t)V * (capped ? 2 : 1));
    if (!w->losses || !w->xn || !w->rstd || !w->dxn || !w->logits) return CART_E_NOMEM;
    if (capped) w->capped = w->logits + R * (size_t)V;
    return CART_OK;
}

/* The unscaled loss of one row's logits lr against the targets refs[*e0..)
 * that read it; with backward, lr becomes d loss / d logits (times scale):
 * scale * (weight * softmax_v - sum_e w_e [v == token_e]). Advances *e0. */
static double row_loss(float *lr, int64_t V, int64_t row, const cart_distill_targets *tg, const entry_ref *refs,
                       int64_t *e0, double scale, int32_t backward) {
    double lse = cart_log_sum_exp(lr, V);
    double loss = 0.0, weight = 0.0; /* weight: the teacher probability reading this row */
    int64_t e1 = *e0;
    while (e1 < tg->n && refs[e1].row == row) {
        int64_t e = refs[e1].index;
        double w = exp((double)tg->logprob[e]);
        loss += -w * ((double)lr[tg->token[e]] - lse);
        weight += w;
        e1++;
    }
    if (backward) {
        const double sw = scale * weight;
        double t[LSE_CHUNK];
        for (int64_t v0 = 0; v0 < V; v0 += LSE_CHUNK) {
            const int64_t m = V - v0 < LSE_CHUNK ? V - v0 : LSE_CHUNK;
            for (int64_t v = 0; v < m; v++) t[v] = (double)lr[v0 + v] - lse;
            cart_exp_n(t, t, m);
            for (int64_t v = 0; v < m; v++) lr[v0 + v] = (float)(sw * t[v]);
        }
        for (int64_t k = *e0; k < e1; k++) {
            int64_t e = refs[k].index;
            lr[tg->token[e]] -= (float)(scale * exp((double)tg->logprob[e]));
        }
    }
    *e0 = e1;
    return loss;
}

/* Rows [begin, end) of a chunk's logits through row_loss, each loss into
 * w->losses (their sum runs in row order after). */
typedef struct loss_job {
    head_work *w;
    const cart_distill_targets *tg;
    int64_t j, V; /* the chunk's first row */
    double scale;
    int32_t backward;
} loss_job;

static void loss_range(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    const loss_job *l = ctx;
    head_work *w = l->w;
    (void)thread;
    for (int64_t r = begin; r < end; r++) {
        int64_t e0 = w->first[l->j + r];
        w->losses[r] = row_loss(w->logits + r * l->V, l->V, w->rows[l->j + r], l->tg, w->refs, &e0, l->scale,
                                l->backward);
    }
}

/* The head over every target row, w->chunk rows at a time: the scaled
 * loss, and with dx the gradient of the final hidden rows added into dx. */
static int head_pass(pass *s, head_work *w, const trunk *tr, const cart_distill_targets *tg, double scale,
                     float *dx, double *loss_out) {
    const int64_t V = s->c->n_vocab, E = s->c->n_embd;
    double loss = 0.0;
    int rc = CART_OK;
    for (int64_t j = 0; !rc && j < w->n_rows; j += w->chunk) {
        int64_t chunk = w->n_rows - j < w->chunk ? w->n_rows - j : w->chunk;
        if ((rc = head_forward(s, tr->x_final, w->rows + j, chunk, w->xn, w->rstd, w->logits))) break;
        const float cap = s->c->final_softcap;
        if (cap > 0.0f && dx) memcpy(w->capped, w->logits, sizeof(float) * (size_t)(chunk * V));
        loss_job lj = {w, tg, j, V, scale, dx != NULL};
        cart_pool_for(cart_default_pool(), chunk, 1, loss_range, &lj);
        for (int64_t r = 0; r < chunk; r++) loss += w->losses[r];
        if (!dx) continue;
        if (cap > 0.0f) softcap_backward(w->logits, w->capped, chunk * V, cap); /* into the uncapped logits' */
        memset(w->dxn, 0, sizeof(float) * (size_t)(chunk * E));
        if ((rc = cart_matmul_backward(w->dxn, E, w->logits, V, &s->m->output, chunk, cart_default_pool())))
            break;
        if (s->wg) { /* the head's weight (token_embd's when tied) and the final norm's */
            float *dout = s->c->tied_output ? s->wg->tok_embd : s->wg->output;
            if ((rc = weight_grad(&s->ws, dout, w->logits, V, w->xn, E, V, E, chunk))) break;
            for (int64_t r = 0; s->wg->output_norm && r < chunk; r++)
                norm_weight_grad(s->wg->output_norm, w->dxn + r * E, tr->x_final + w->rows[j + r] * E,
                                 w->rstd + r, 1, E);
        }
        for (int64_t r = 0; r < chunk; r++)
            rmsnorm_backward(dx + w->rows[j + r] * E, w->dxn + r * E, tr->x_final + w->rows[j + r] * E,
                             w->rstd + r, s->m->output_norm, 1, E);
    }
    *loss_out = loss * scale;
    return rc;
}

/* The backward from dx (the final hidden rows' gradient) through every
 * layer into the cartridge's gradient; with recompute, each layer's
 * activations are recomputed from its input into `scratch` first. */
static int layers_backward(cart_trainer *t, pass *s, trunk *tr, acts *scratch, float *dx, cart_cartridge *c) {
    const cart_model_config *cfg = s->c;
    const model_widths mw = cart_model_widths(s->m);
    const int gemma = cfg->arch == CART_ARCH_GEMMA4;
    const int64_t T = s->T, E = cfg->n_embd, HD = mw.hd, KD = mw.kd;
    const int64_t F = mw.ff > cfg->n_embd_per_layer ? mw.ff : cfg->n_embd_per_layer; /* dh also holds [T, Ep] */
    const int weights = s->wg != NULL;
    size_t floats = (size_t)(T * (3 * F + E + 2 * HD + 2 * KD + mw.n_head + (weights ? 2 * cfg->head_dim : 0) +
                                  (gemma ? 2 * E : 0)));
    float *p = trainer_block(t, 1, floats * sizeof(float));
    if (!p) return CART_E_NOMEM;
    back_scratch b = {0};
    b.dh = cart_carve(&p, T * F);
    b.dgate = cart_carve(&p, T * F);
    b.dup = cart_carve(&p, T * F);
    b.dxn = cart_carve(&p, T * E);
    if (gemma) {
        b.dy = cart_carve(&p, T * E);
        b.dz = cart_carve(&p, T * E);
    }
    s->datt = cart_carve(&p, T * HD);
    s->dq = cart_carve(&p, T * HD);
    s->dk = cart_carve(&p, T * KD);
    s->dv = cart_carve(&p, T * KD);
    s->delta = cart_carve(&p, T * mw.n_head);
    if (weights) {
        s->dqn_w = cart_carve(&p, T * cfg->head_dim);
        s->dkn_w = cart_carve(&p, T * cfg->head_dim);
    }
    s->grad_cart = c;
    uint64_t bytes = tr->bytes + floats * sizeof(float) + (size_t)(T * E) * sizeof(float);
    if (bytes > t->peak_bytes) t->peak_bytes = bytes;
    int rc = CART_OK;
    for (int32_t l = cfg->n_layer - 1; l >= 0 && !rc; l--) {
        s->layer = l;
        if (t->opts.recompute) {
            /* the layer's output (already known from the forward) lands in scratch */
            scratch->x_in = tr->layers[l].x_in;
            s->a = scratch;
            if ((rc = layer_forward(s, b.dxn))) break;
        } else {
            s->a = &tr->layers[l];
        }
        rc = layer_backward(s, dx, &b);
    }
    /* dx is now the gradient of the embedded tokens: rows of token_embd, in token order */
    if (!rc && weights && s->wg->tok_embd)
        for (int64_t i = 0; i < T; i++) {
            float *row = s->wg->tok_embd + (int64_t)s->tokens[i] * E;
            for (int64_t e = 0; e < E; e++) row[e] += dx[i * E + e];
        }
    return rc;
}

/* The weight-gradient scratch for a pass of s->T tokens, from the trainer's
 * cache (slot 3): room for the largest linear layer, the head's chunks
 * included. */
static int wgrad_scratch_init(pass *s, cart_trainer *t, int64_t head_rows) {
    const cart_model_config *c = s->c;
    int64_t E = c->n_embd, F = c->n_ff, V = c->n_vocab, T = s->T;
    int64_t HD = (int64_t)c->n_head * c->head_dim;
    int64_t widest = E > F ? E : F;
    if (HD > widest) widest = HD;
    int64_t xt = widest * T, dyt = widest * T, g = F * E;
    if (HD * E > g) g = HD * E;
    if (V * E > g) g = V * E;
    if (head_rows * V > dyt) dyt = head_rows * V;
    float *p = trainer_block(t, 3, sizeof(float) * (size_t)(xt + dyt + g));
    if (!p) return CART_E_NOMEM;
    s->ws.xt = cart_carve(&p, xt);
    s->ws.dyt = cart_carve(&p, dyt);
    s->ws.g = cart_carve(&p, g);
    return CART_OK;
}

int cart_trainer_distill(cart_trainer *t, cart_cartridge *c, const int32_t *tokens, int64_t n,
                         const int64_t *seg_len, int32_t n_seg, const cart_distill_targets *tg,
                         int32_t mean, float loss_scale, int32_t backward, double *loss_out) {
    const char *fn = "cart_trainer_distill";
    if (!c && !t->params)
        return cart_fail(CART_E_ARG, "%s: no cartridge, and no parameter set attached: nothing to train", fn);
    int rc = check_pass_args(t, c, tokens, n, fn);
    if (rc) return rc;
    if (tg->n < 1) return cart_fail(CART_E_ARG, "%s: no targets", fn);
    pass s;
    if ((rc = pass_init(&s, t, c, n)) || (rc = setup_positions(&s, seg_len, n_seg, fn)) ||
        (rc = check_targets(&s, tg, n, fn))) {
        pass_free(&s);
        return rc;
    }
    const int64_t E = s.c->n_embd;
    s.tokens = tokens;
    if (backward && t->params) s.wg = cart_params_grads(t->params);
    head_work w;
    trunk tr = {0};
    acts scratch;
    float *dx = NULL;
    rc = head_work_init(&w, t, tg, E, s.c->n_vocab, head_chunk(s.c->n_vocab, s.wg != NULL),
                        s.c->final_softcap > 0.0f);
    if (!rc && s.wg) rc = wgrad_scratch_init(&s, t, w.chunk);
    if (!rc) rc = trunk_forward(t, &s, tokens, !t->opts.recompute, &scratch, &tr);
    if (!rc && backward) {
        dx = trainer_block(t, 2, (size_t)(n * E) * sizeof(float));
        if (!dx) rc = CART_E_NOMEM;
        else memset(dx, 0, (size_t)(n * E) * sizeof(float));
    }
    double loss = 0.0;
    if (!rc) rc = head_pass(&s, &w, &tr, tg, (double)loss_scale / (mean ? (double)tg->n : 1.0), dx, &loss);
    if (!rc && backward) rc = layers_backward(t, &s, &tr, &scratch, dx, c);
    else if (!rc && tr.bytes > t->peak_bytes) t->peak_bytes = tr.bytes;
    if (!rc && loss_out) *loss_out = loss;
    head_work_free(&w);
    trunk_free(&tr);
    pass_free(&s);
    return rc;
}
