/*
 * steps.c - the steps every architecture's block shares (models.h).
 */
#include <string.h>

#include "../ops.h"
#include "../pool.h"
#include "models.h"

void layer_add_bias(float *y, const float *b, int64_t rows, int64_t n) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

/* ---- the element and row steps, split over ex->pool ----------------------
 * Parts of STEP_GRAIN elements (a multiple of every kernel's vector and
 * chunk width, so an element takes the same path whatever the split) or of
 * whole groups of NORM_GROUP rows (a row's norm depends on that row only):
 * the same bits at any thread count. A pass too small for two parts runs
 * inline. */
enum { STEP_GRAIN = 4096, NORM_GROUP = 8, NORM_FLOATS = 16384 };

typedef enum {
    STEP_ADD, STEP_SWIGLU, STEP_GEGLU, STEP_GEGLU_TABLE, STEP_NORM,
    /* the training backward's: zeroing, the GLUs' gradients, the norm's */
    STEP_ZERO, STEP_SWIGLU_BACK, STEP_GEGLU_BACK, STEP_NORM_BACK
} step_kind;

typedef struct step_job {
    step_kind kind;
    float *y, *rstd, *y2; /* the GLUs' backward: y dgate, y2 dup */
    const float *a, *b, *w, *dy; /* the backward: a gate or x, b up, dy dh or the norm's dy */
    int64_t n, per, dim; /* elements (rows for the norms), per part, row width */
    float eps;
} step_job;

static void step_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    const step_job *j = ctx;
    const int64_t lo = begin * j->per, hi = end * j->per < j->n ? end * j->per : j->n, m = hi - lo;
    (void)thread;
    switch (j->kind) {
    case STEP_ADD:
        for (int64_t i = lo; i < hi; i++) j->y[i] = j->a[i] + j->b[i];
        break;
    case STEP_SWIGLU: swiglu_forward(j->y + lo, j->b + lo, m); break;
    case STEP_GEGLU: geglu_forward(j->y + lo, j->a + lo, j->b + lo, m); break;
    case STEP_GEGLU_TABLE:
        if (j->y != j->a) memcpy(j->y + lo, j->a + lo, sizeof(float) * (size_t)m);
        geglu_forward_table(j->y + lo, j->b + lo, m);
        break;
    case STEP_NORM:
        rmsnorm_forward_keep(j->y + lo * j->dim, j->rstd ? j->rstd + lo : NULL, j->a + lo * j->dim, j->w, m,
                             j->dim, j->eps);
        break;
    case STEP_ZERO: memset(j->y + lo, 0, sizeof(float) * (size_t)m); break;
    case STEP_SWIGLU_BACK:
    case STEP_GEGLU_BACK: /* the gradients add into zeros */
        memset(j->y + lo, 0, sizeof(float) * (size_t)m);
        if (j->y2) memset(j->y2 + lo, 0, sizeof(float) * (size_t)m);
        if (j->kind == STEP_SWIGLU_BACK) swiglu_backward(j->y + lo, j->y2 + lo, j->dy + lo, j->a + lo, j->b + lo, m);
        else geglu_backward(j->y + lo, j->y2 ? j->y2 + lo : NULL, j->dy + lo, j->a + lo, j->b + lo, m);
        break;
    case STEP_NORM_BACK:
        rmsnorm_backward(j->y + lo * j->dim, j->dy + lo * j->dim, j->a + lo * j->dim, j->rstd + lo, j->w, m, j->dim);
        break;
    }
}

static void step_run_on(cart_pool *pool, step_job *j) {
    if (j->kind == STEP_NORM || j->kind == STEP_NORM_BACK) {
        /* NORM_FLOATS a part, but no more groups than give each thread one
         * (a decode step's 16 rows of 1024: two parts of 8, not one) */
        int64_t groups = (NORM_FLOATS / (j->dim > 0 ? j->dim : 1) + NORM_GROUP - 1) / NORM_GROUP;
        const int64_t threads = cart_pool_size(pool);
        const int64_t each = (j->n + NORM_GROUP * threads - 1) / (NORM_GROUP * threads);
        if (groups > each) groups = each;
        j->per = NORM_GROUP * (groups > 0 ? groups : 1);
    } else {
        j->per = STEP_GRAIN;
    }
    cart_pool_for(pool, (j->n + j->per - 1) / j->per, 1, step_task, j);
}

static void step_run(const layer_exec *ex, step_job *j) {
    step_run_on(ex->pool, j);
}

void layer_add(const layer_exec *ex, float *y, const float *a, const float *b, int64_t n) {
    step_job j = {.kind = STEP_ADD, .y = y, .a = a, .b = b, .n = n};
    step_run(ex, &j);
}

void layer_swiglu(const layer_exec *ex, float *h, const float *up, int64_t n) {
    step_job j = {.kind = STEP_SWIGLU, .y = h, .b = up, .n = n};
    step_run(ex, &j);
}

void layer_geglu(const layer_exec *ex, float *h, const float *gate, const float *up, int64_t n) {
    step_job j = {.kind = ex->exact_gelu ? STEP_GEGLU : STEP_GEGLU_TABLE, .y = h, .a = gate, .b = up, .n = n};
    step_run(ex, &j);
}

void layer_norm(const layer_exec *ex, float *y, float *rstd, const float *x, const float *w, int64_t rows,
                int64_t dim, float eps) {
    step_job j = {.kind = STEP_NORM, .y = y, .rstd = rstd, .a = x, .w = w, .n = rows, .dim = dim, .eps = eps};
    step_run(ex, &j);
}

void step_zero(cart_pool *pool, float *y, int64_t n) {
    step_job j = {.kind = STEP_ZERO, .y = y, .n = n};
    step_run_on(pool, &j);
}

void step_glu_backward(cart_pool *pool, int geglu, float *dgate, float *dup, const float *dh, const float *gate,
                       const float *up, int64_t n) {
    step_job j = {.kind = geglu ? STEP_GEGLU_BACK : STEP_SWIGLU_BACK, .y = dgate, .y2 = dup, .dy = dh,
                  .a = gate, .b = up, .n = n};
    step_run_on(pool, &j);
}

void step_norm_backward(cart_pool *pool, float *dx, const float *dy, const float *x, const float *rstd,
                        const float *w, int64_t rows, int64_t dim) {
    step_job j = {.kind = STEP_NORM_BACK, .y = dx, .dy = dy, .a = x, .rstd = (float *)rstd, .w = w, .n = rows,
                  .dim = dim};
    step_run_on(pool, &j);
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
    layer_norm(ex, io->xn1, io->rstd1, io->x_in, L->attn_norm, T, E, c->rms_eps);
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
