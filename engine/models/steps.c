/*
 * steps.c - the steps every architecture's block shares (models.h).
 */
#include <string.h>

#include "../ops.h"
#include "models.h"

void layer_add_bias(float *y, const float *b, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

void layer_add(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void layer_geglu(const layer_exec *ex, float *h, const float *gate, const float *up, int64_t n) {
    if (ex->exact_gelu) {
        geglu_forward(h, gate, up, n);
        return;
    }
    if (h != gate) memcpy(h, gate, sizeof(float) * (size_t)n);
    geglu_forward_table(h, up, n);
}

int layer_linear1(const layer_exec *ex, float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w) {
    float *ys[1] = {y};
    const int64_t ld[1] = {ldy};
    const cart_weight *ws[1] = {w};
    return ex->linear(ex->ctx, 1, ys, ld, x, ldx, ws);
}

int layer_attention(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io, int64_t T) {
    const cart_model_config *c = &m->cfg;
    const layer_weights *L = &m->layers[layer];
    const int64_t E = c->n_embd, HD = (int64_t)L->g.n_head * L->g.head_dim;
    const int64_t KD = (int64_t)L->g.n_head_kv * L->g.head_dim;
    int rc;
    rmsnorm_forward_keep(io->xn1, io->rstd1, io->x_in, L->attn_norm, T, E, c->rms_eps);
    float *qkv[3] = {io->q, io->k, io->v};
    const int64_t qkv_ld[3] = {HD, KD, KD};
    const cart_weight *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
    const int v_from_k = L->wv.rows == 0;
    if ((rc = ex->linear(ex->ctx, v_from_k ? 2 : 3, qkv, qkv_ld, io->xn1, E, qkv_w))) return rc;
    if (v_from_k) memcpy(io->v, io->k, sizeof(float) * (size_t)(T * KD));
    if (L->bq) {
        layer_add_bias(io->q, L->bq, T, HD);
        layer_add_bias(io->k, L->bk, T, KD);
        layer_add_bias(io->v, L->bv, T, KD);
    }
    if ((rc = ex->attend(ex->ctx))) return rc;
    return layer_linear1(ex, io->o, E, io->att, HD, &L->wo);
}

int layer_gate_up(const layer_exec *ex, const cart_model *m, int32_t layer, const layer_io *io) {
    const layer_weights *L = &m->layers[layer];
    const int64_t F = L->g.n_ff;
    float *gu[2] = {io->gate, io->up};
    const int64_t gu_ld[2] = {F, F};
    const cart_weight *gu_w[2] = {&L->wgate, &L->wup};
    return ex->linear(ex->ctx, 2, gu, gu_ld, io->xn2, m->cfg.n_embd, gu_w);
}
