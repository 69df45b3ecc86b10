/*
 * matmul.c - products with weight matrices in any storage dtype: argument
 * checks, scratch, and the split over the pool. The arithmetic is the active
 * level's kernels (kernels/kernels.h, chosen by cpu.c).
 *
 * Forward:
 *   n <= GEMV_MAX_N (16) tokens: GEMV kernels read each weight row once per
 *     few tokens (memory-bound decode). Tasks are groups of weight rows. On
 *     a path fixed to GEMV, calls of up to GEMV_PASS_N (64) tokens.
 *   more tokens: GEMM. Tokens go in blocks of about MC_TOKENS; per block the
 *     activations are rounded and packed once (split over token panels), then
 *     tasks of MM_FWD_ROWS weight rows run the packed micro-kernel.
 * Backward (dx += dy @ W): GEMM for every n, tasks are groups of weight
 *   columns, i.e. of dx columns, so no two tasks write the same element.
 *
 * Results do not depend on the thread count: a task is a fixed range of
 * outputs computed by one thread, and which thread runs it does not matter.
 * Nor on the level: every level does the same arithmetic (kernels.h).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"
#include "internal.h"
#include "kernels/kernels.h"
#include "kernels/qdot.h"
#include "matmul.h"

enum {
    /* Forward products of at most this many tokens take the GEMV path. The
     * crossover measured on Zen 5 with weights streamed from DRAM: below about
     * 16 tokens the GEMM's packing costs more than its reuse gains (for block
     * types the two are even from 10 to 16). One limit for every dtype, so
     * that a widened copy takes the same path as its original and gives the
     * same bits. */
    GEMV_MAX_N = 16,
    /* Tokens per call of the GEMV kernels when a caller fixes that path for
     * more (lockstep decode of many streams): every weight row comes from
     * DRAM once for up to this many (f16 at 64 streams: 1.6x the tok/s of
     * calls of 16). */
    GEMV_PASS_N = 64,
    MC_TOKENS = 528, /* tokens per GEMM block (rounded down to whole micro-tiles): their packed
                        k block fits L2 */
    GEMV_ROWS = 48,  /* weight rows per GEMV task: whole GEMV passes of 8, 6, 4, 3, 2 and 1 */
};

int64_t mm_scratch_floats(const mm_src *w, int32_t path, int64_t mv, int64_t n) {
    const int dequant = w->kind == MM_W_DEQUANT;
    switch (path) {
    case MM_PATH_FORWARD:
        return (int64_t)MM_KC * mv * (dequant ? 2 : 1);
    case MM_PATH_BACKWARD:
        return (int64_t)MM_BWD_BLOCK + mm_bwd_cols(w);
    default:
        return dequant ? (int64_t)MM_GEMV_MAXR * MM_GEMV_KB : n * ((w->cols + 15) & ~(int64_t)15);
    }
}

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* 64-byte aligned memory for `n` bytes (at least 64), freed with free(). */
static void *alloc_aligned(size_t n, const char *what) {
    void *p = n <= SIZE_MAX - 64 ? aligned_alloc(64, n ? (n + 63) & ~(size_t)63 : 64) : NULL;
    if (!p) cart_fail(CART_E_NOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

/* floats * count as a size_t byte count; SIZE_MAX when it overflows. */
static size_t float_bytes(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return SIZE_MAX;
    if (b != 0 && (uint64_t)a > (uint64_t)(SIZE_MAX / 4) / (uint64_t)b) return SIZE_MAX;
    return (size_t)a * (size_t)b * 4;
}

/* ---- workspaces -------------------------------------------------------------
 * A call's scratch is one 64-byte aligned block. Blocks go back to a small
 * process-wide cache rather than to free(): glibc returns big blocks to the
 * kernel, and faulting 8 MiB back in costs milliseconds (more in a VM), as
 * much as a whole 1024 x 1024 x 512 product. The cache holds at most
 * CACHE_SLOTS blocks of at most CACHE_MAX bytes; it lives until exit. */

enum { CACHE_SLOTS = 2 };
static const size_t CACHE_MAX = (size_t)32 << 20;

typedef struct workspace {
    float *p;
    size_t size; /* bytes */
} workspace;

static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;
static workspace cache[CACHE_SLOTS];

/* Fills *ws with a block of at least `bytes`: the smallest cached block that
 * fits, else a new one. */
static int workspace_get(workspace *ws, size_t bytes, const char *what) {
    ws->p = NULL;
    ws->size = 0;
    pthread_mutex_lock(&cache_mutex);
    int best = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache[i].p && cache[i].size >= bytes && (best < 0 || cache[i].size < cache[best].size))
            best = i;
    if (best >= 0) {
        *ws = cache[best];
        cache[best].p = NULL;
        cache[best].size = 0;
    }
    pthread_mutex_unlock(&cache_mutex);
    if (ws->p) return CART_OK;
    ws->p = alloc_aligned(bytes, what);
    if (!ws->p) return CART_E_NOMEM;
    ws->size = bytes;
    return CART_OK;
}

/* Returns ws's block to the cache, evicting the smallest cached block when
 * all slots are taken (or freeing ws's when it is the smallest or too big). */
static void workspace_put(workspace *ws) {
    if (!ws->p) return;
    workspace out = *ws;
    if (out.size <= CACHE_MAX) {
        pthread_mutex_lock(&cache_mutex);
        int slot = 0;
        for (int i = 1; i < CACHE_SLOTS; i++)
            if (!cache[i].p || (cache[slot].p && cache[i].size < cache[slot].size)) slot = i;
        if (!cache[slot].p || cache[slot].size < out.size) {
            workspace evicted = cache[slot];
            cache[slot] = out;
            out = evicted;
        }
        pthread_mutex_unlock(&cache_mutex);
    }
    free(out.p);
    ws->p = NULL;
}

/* ---- weights -------------------------------------------------------------- */

int cart_weight_init(cart_weight *w, int32_t dtype, const void *data, int64_t rows, int64_t cols) {
    if (!w) return cart_fail(CART_E_ARG, "cart_weight_init: NULL weight");
    memset(w, 0, sizeof *w);
    cart_dtype_info info;
    if (cart_dtype_get_info(&info, dtype) != CART_OK)
        return cart_fail(CART_E_ARG, "cart_weight_init: unknown dtype id %d", (int)dtype);
    if (!info.can_dequantize)
        return cart_fail(CART_E_UNSUPPORTED,
                         "cart_weight_init: dtype %s cannot be dequantized, so it cannot be "
                         "multiplied",
                         info.name);
    if (rows < 0 || cols < 0)
        return cart_fail(CART_E_ARG, "cart_weight_init: negative shape (%lld rows, %lld cols)",
                         (long long)rows, (long long)cols);
    if (cols % info.block_size != 0)
        return cart_fail(CART_E_ARG,
                         "cart_weight_init: cols %lld is not a whole number of %s blocks of %d",
                         (long long)cols, info.name, (int)info.block_size);
    uint64_t row_bytes;
    if (cart_dtype_nbytes(&row_bytes, dtype, cols) != CART_OK)
        return cart_fail_context(CART_E_ARG, "cart_weight_init");
    if (row_bytes > 0 && (uint64_t)rows > (UINT64_C(1) << 62) / row_bytes)
        return cart_fail(CART_E_ARG, "cart_weight_init: %lld rows of %llu bytes overflow",
                         (long long)rows, (unsigned long long)row_bytes);
    if (!data && rows > 0 && cols > 0)
        return cart_fail(CART_E_ARG, "cart_weight_init: NULL data for a %lld x %lld matrix",
                         (long long)rows, (long long)cols);
    w->data = data;
    w->dtype = dtype;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = row_bytes;
    return CART_OK;
}

/* Checks *w as `fn` received it and fills *src for the kernels. */
static int check_weight(mm_src *src, const cart_weight *w, const char *fn) {
    if (!w) return cart_fail(CART_E_ARG, "%s: NULL weight", fn);
    cart_dtype_info info;
    if (cart_dtype_get_info(&info, w->dtype) != CART_OK)
        return cart_fail(CART_E_ARG, "%s: weight has unknown dtype id %d", fn, (int)w->dtype);
    if (!info.can_dequantize)
        return cart_fail(CART_E_UNSUPPORTED, "%s: weight dtype %s cannot be dequantized", fn,
                         info.name);
    if (w->reserved != 0)
        return cart_fail(CART_E_ARG, "%s: weight field reserved is %d, expected 0", fn,
                         (int)w->reserved);
    if (w->rows < 0 || w->cols < 0)
        return cart_fail(CART_E_ARG, "%s: weight has a negative shape (%lld rows, %lld cols)", fn,
                         (long long)w->rows, (long long)w->cols);
    if (w->cols % info.block_size != 0)
        return cart_fail(CART_E_ARG,
                         "%s: weight cols %lld is not a whole number of %s blocks of %d", fn,
                         (long long)w->cols, info.name, (int)info.block_size);
    uint64_t need;
    if (cart_dtype_nbytes(&need, w->dtype, w->cols) != CART_OK)
        return cart_fail_context(CART_E_ARG, "%s", fn);
    if (w->row_bytes < need)
        return cart_fail(CART_E_ARG, "%s: weight row_bytes %llu is below the %llu bytes of a row",
                         fn, (unsigned long long)w->row_bytes, (unsigned long long)need);
    if (!w->data && w->rows > 0 && w->cols > 0)
        return cart_fail(CART_E_ARG, "%s: weight data is NULL", fn);
    src->data = w->data;
    src->row_bytes = w->row_bytes;
    src->dtype = w->dtype;
    src->kind = w->dtype == CART_F32    ? MM_W_F32
                : w->dtype == CART_F16  ? MM_W_F16
                : w->dtype == CART_BF16 ? MM_W_BF16
                                        : MM_W_DEQUANT;
    src->block_size = info.block_size;
    src->type_size = info.type_size;
    src->rows = w->rows;
    src->cols = w->cols;
    src->packed = w->packed;
    return CART_OK;
}

/* Checks the activation/output pair of a product: `out` (n, out_cols; pitch
 * ldo) and `in` (n, in_cols; pitch ldi), which must not overlap. */
static int check_operands(const char *fn, const float *out, int64_t ldo, int64_t out_cols,
                          const char *out_name, const float *in, int64_t ldi, int64_t in_cols,
                          const char *in_name, int64_t n) {
    if (n < 0) return cart_fail(CART_E_ARG, "%s: negative token count %lld", fn, (long long)n);
    if (ldo < out_cols)
        return cart_fail(CART_E_ARG, "%s: pitch of %s %lld is below its %lld columns", fn, out_name,
                         (long long)ldo, (long long)out_cols);
    if (ldi < in_cols)
        return cart_fail(CART_E_ARG, "%s: pitch of %s %lld is below its %lld columns", fn, in_name,
                         (long long)ldi, (long long)in_cols);
    if (n == 0) return CART_OK;
    if ((out_cols > 0 && !out) || (in_cols > 0 && !in))
        return cart_fail(CART_E_ARG, "%s: NULL %s", fn, !out ? out_name : in_name);
    if (out_cols > 0 && in_cols > 0) {
        uintptr_t o0 = (uintptr_t)out, o1 = (uintptr_t)(out + (n - 1) * ldo + out_cols);
        uintptr_t i0 = (uintptr_t)in, i1 = (uintptr_t)(in + (n - 1) * ldi + in_cols);
        if (o0 < i1 && i0 < o1)
            return cart_fail(CART_E_ARG, "%s: %s overlaps %s", fn, out_name, in_name);
    }
    return CART_OK;
}

static int32_t round_for(int32_t dtype) {
    if (dtype == CART_F16) return MM_ROUND_F16;
    if (dtype == CART_BF16) return MM_ROUND_BF16;
    return MM_ROUND_NONE;
}

/* ---- jobs run on the pool ------------------------------------------------- */

typedef struct job {
    const cart_kernels *k;
    const mm_src *w;
    float *out; /* y (forward) or dx (backward) */
    int64_t ldo;
    const float *in; /* x or dy as given, or rounded */
    int64_t ldi;
    int64_t n; /* tokens in this block */
    int32_t round;
    float *packed;  /* packed activations of this block */
    float *scratch; /* per-thread scratch, scratch_floats each */
    int64_t scratch_floats;
    int64_t d0;    /* first reduction index of the packed block */
    int64_t depth; /* reduction length of the packed block */
} job;

/* Carves one workspace into per-thread scratch (each floats per thread) and
 * `packed` floats for the activations. */
static int workspace_for(job *j, workspace *ws, int32_t threads, int64_t each, int64_t packed) {
    j->scratch_floats = (each + 15) & ~(int64_t)15; /* keep every part 64-byte aligned */
    int64_t scratch = j->scratch_floats * threads;
    if (workspace_get(ws, float_bytes(scratch + packed, 1), "matmul workspace") != CART_OK)
        return CART_E_NOMEM;
    j->scratch = ws->p;
    j->packed = ws->p + scratch;
    return CART_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static void pack_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    job *j = ctx;
    j->k->pack_act(j->packed, j->in, j->ldi, j->n, j->depth, j->round, begin, end);
}

static void forward_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    job *j = ctx;
    float *scratch = j->scratch + (int64_t)thread * j->scratch_floats;
    for (int64_t t = begin; t < end; t++) {
        int64_t r0 = t * MM_FWD_ROWS, r1 = min64(r0 + MM_FWD_ROWS, j->w->rows);
        j->k->forward_rows(j->w, j->out, j->ldo, j->packed, j->n, j->d0, j->depth, r0, r1,
                           scratch);
    }
}

static void gemv_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    job *j = ctx;
    float *scratch = j->scratch + (int64_t)thread * j->scratch_floats;
    int64_t r0 = begin * GEMV_ROWS, r1 = min64(end * GEMV_ROWS, j->w->rows);
    j->k->gemv_rows(j->w, j->out, j->ldo, j->in, j->ldi, j->n, r0, r1, scratch);
}

static void backward_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    job *j = ctx;
    float *scratch = j->scratch + (int64_t)thread * j->scratch_floats;
    int64_t width = mm_bwd_cols(j->w);
    for (int64_t t = begin; t < end; t++) {
        int64_t c0 = t * width, c1 = min64(c0 + width, j->w->cols);
        j->k->backward_cols(j->w, j->out, j->ldo, j->packed, j->n, j->d0, j->depth, c0, c1,
                            scratch);
    }
}

/* Tokens per GEMM block for n tokens: at most about MC_TOKENS, as even as
 * whole micro-tiles allow. */
static int64_t block_tokens(const cart_kernels *k, int64_t n) {
    const int64_t mc = MC_TOKENS / k->mu * k->mu;
    const int64_t blocks = ceil_div(n, mc);
    return ceil_div(ceil_div(n, blocks), k->mu) * k->mu;
}

/* The GEMV path for n <= GEMV_PASS_N tokens. */
static int forward_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const mm_src *w, int64_t n,
                        cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    const cart_kernels *k = cart_kern();
    job j = {.k = k, .w = w, .out = y, .ldo = ldy, .in = x, .ldi = ldx, .n = n, .round = round_for(w->dtype)};
    workspace ws;
    int64_t rounded = j.round != MM_ROUND_NONE ? n * w->cols : 0;
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_GEMV, k->mv, n), rounded) != CART_OK)
        return CART_E_NOMEM;
    if (rounded) {
        k->round_rows(j.packed, x, ldx, w->cols, j.round, 0, n);
        j.in = j.packed;
        j.ldi = w->cols;
    }
    cart_pool_for(pool, ceil_div(w->rows, GEMV_ROWS), 1, gemv_task, &j);
    workspace_put(&ws);
    return CART_OK;
}

/* The GEMM path for any n. */
static int forward_gemm(float *y, int64_t ldy, const float *x, int64_t ldx, const mm_src *w, int64_t n,
                        cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    const cart_kernels *k = cart_kern();
    job j = {.k = k, .w = w, .out = y, .ldo = ldy, .in = x, .ldi = ldx, .n = n, .round = round_for(w->dtype)};
    workspace ws;
    const int64_t per = block_tokens(k, n);
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_FORWARD, k->mv, n),
                      per * min64(w->cols, MM_DEPTH)) != CART_OK)
        return CART_E_NOMEM;
    for (int64_t i0 = 0; i0 < n; i0 += per)
        for (j.d0 = 0; j.d0 < w->cols; j.d0 += MM_DEPTH) {
            j.n = min64(per, n - i0);
            j.depth = min64(MM_DEPTH, w->cols - j.d0);
            j.in = x + i0 * ldx + j.d0;
            j.out = y + i0 * ldy;
            cart_pool_for(pool, ceil_div(j.n, k->mu), 4, pack_task, &j);
            cart_pool_for(pool, ceil_div(w->rows, MM_FWD_ROWS), 1, forward_task, &j);
        }
    workspace_put(&ws);
    return CART_OK;
}

/* The forward on `path`: GEMV in passes of at most GEMV_PASS_N tokens (each
 * token's output is the same in any pass), or GEMM. */
static int forward_run(float *y, int64_t ldy, const float *x, int64_t ldx, const mm_src *w, int64_t n,
                       int32_t path, cart_pool *pool) {
    if (path == CART_MM_AUTO) path = cart_matmul_path_for(n);
    if (path == CART_MM_GEMM) return forward_gemm(y, ldy, x, ldx, w, n, pool);
    for (int64_t i0 = 0; i0 < n; i0 += GEMV_PASS_N) {
        int rc = forward_gemv(y + i0 * ldy, ldy, x + i0 * ldx, ldx, w, min64(GEMV_PASS_N, n - i0), pool);
        if (rc != CART_OK) return rc;
    }
    return CART_OK;
}

static int backward_run(float *dx, int64_t ldx, const float *dy, int64_t ldy, const mm_src *w,
                        int64_t n, cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    const cart_kernels *k = cart_kern();
    job j = {.k = k, .w = w, .ldo = ldx, .ldi = ldy, .round = MM_ROUND_NONE};
    const int64_t per = block_tokens(k, n);
    workspace ws;
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_BACKWARD, k->mv, n),
                      per * min64(w->rows, MM_DEPTH)) != CART_OK)
        return CART_E_NOMEM;
    for (int64_t i0 = 0; i0 < n; i0 += per)
        for (j.d0 = 0; j.d0 < w->rows; j.d0 += MM_DEPTH) {
            j.n = min64(per, n - i0);
            j.depth = min64(MM_DEPTH, w->rows - j.d0);
            j.in = dy + i0 * ldy + j.d0;
            j.out = dx + i0 * ldx;
            cart_pool_for(pool, ceil_div(j.n, k->mu), 4, pack_task, &j);
            cart_pool_for(pool, ceil_div(w->cols, mm_bwd_cols(w)), 1, backward_task, &j);
        }
    workspace_put(&ws);
    return CART_OK;
}

/* ---- the integer block products (kernels/qdot.h) ---------------------------
 * The activations are quantized once per call (for every weight of a _many
 * call that shares their kind), then tasks of whole row groups run the
 * level's qk_groups over blocks of QK_TOKENS tokens. A weight without a
 * packed copy is packed one group at a time into per-thread scratch: the
 * same bytes, so the same bits, only slower. */

enum {
    MANY_MAX = 8,
    QK_TOKENS = 256, /* tokens per pass over the groups: their quantized rows stay in L2 */
};

typedef struct qk_job {
    const cart_kernels *k;
    int32_t count;
    const mm_src *w[MANY_MAX];
    qk_src src[MANY_MAX];
    float *y[MANY_MAX];
    int64_t ldy[MANY_MAX];
    int64_t first[MANY_MAX + 1]; /* the global index of weight k's first group */
    qk_act act;
    const float *x;
    int64_t ldx;
    int64_t t0, t1;     /* the pass's tokens */
    uint8_t *scratch;   /* per thread: one packed group, scratch_bytes each */
    uint64_t scratch_bytes;
} qk_job;

static void qk_quantize_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    qk_job *j = ctx;
    qk_quantize(&j->act, j->x, j->ldx, begin, end);
}

static void qk_group_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    qk_job *j = ctx;
    for (int32_t k = 0; k < j->count; k++) {
        const int64_t lo = begin > j->first[k] ? begin : j->first[k];
        const int64_t hi = end < j->first[k + 1] ? end : j->first[k + 1];
        if (lo >= hi) continue;
        const int64_t g0 = lo - j->first[k], g1 = hi - j->first[k];
        if (j->src[k].data) {
            j->k->qk_groups(&j->src[k], &j->act, j->t0, j->t1, g0, g1, j->y[k], j->ldy[k]);
            continue;
        }
        const mm_src *w = j->w[k];
        uint8_t *buf = j->scratch + (uint64_t)thread * j->scratch_bytes;
        for (int64_t g = g0; g < g1; g++) {
            qk_pack_groups(buf, w->dtype, w->data, w->row_bytes, w->rows, w->cols, g, g + 1);
            qk_src one;
            qk_src_init(&one, w->dtype, buf, w->rows - g * QK_ROWS, w->cols);
            j->k->qk_groups(&one, &j->act, j->t0, j->t1, 0, 1, j->y[k] + g * QK_ROWS, j->ldy[k]);
        }
    }
}

/* count weights (qk_supported, one activation kind, the same cols, rows >
 * 0) times x, n >= 1 tokens. */
static int forward_qk(int32_t count, const mm_src *const *w, float *const *y, const int64_t *ldy, const float *x,
                      int64_t ldx, int64_t n, cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    qk_job j = {.k = cart_kern(), .count = count, .x = x, .ldx = ldx};
    const int64_t cols = w[0]->cols;
    const int32_t kind = qk_act_kind_of(w[0]->dtype);
    uint64_t scratch = 0;
    for (int32_t k = 0; k < count; k++) {
        j.w[k] = w[k];
        j.y[k] = y[k];
        j.ldy[k] = ldy[k];
        qk_src_init(&j.src[k], w[k]->dtype, w[k]->packed, w[k]->rows, cols);
        j.first[k + 1] = j.first[k] + j.src[k].groups;
        if (!w[k]->packed && j.src[k].group_bytes > scratch) scratch = j.src[k].group_bytes;
    }
    j.scratch_bytes = scratch;
    const size_t act = qk_act_bytes(kind, n, cols);
    workspace ws;
    if (workspace_get(&ws, act + (size_t)scratch * (size_t)threads + 64, "quantized activations") != CART_OK)
        return CART_E_NOMEM;
    j.scratch = (uint8_t *)ws.p;
    qk_act_init(&j.act, (uint8_t *)ws.p + (size_t)scratch * (size_t)threads, kind, n, cols);
    cart_pool_for(pool, n, 1 + 8192 / cols, qk_quantize_task, &j);
    for (j.t0 = 0; j.t0 < n; j.t0 += QK_TOKENS) {
        j.t1 = min64(j.t0 + QK_TOKENS, n);
        cart_pool_for(pool, j.first[count], 1, qk_group_task, &j);
    }
    workspace_put(&ws);
    return CART_OK;
}


typedef struct qk_pack_job {
    const mm_src *w;
    uint8_t *dst;
    uint64_t group_bytes;
} qk_pack_job;

static void qk_pack_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    qk_pack_job *j = ctx;
    qk_pack_groups(j->dst + (uint64_t)begin * j->group_bytes, j->w->dtype, j->w->data, j->w->row_bytes,
                   j->w->rows, j->w->cols, begin, end);
}

int cart_weight_repack(cart_weight *w, uint64_t *bytes, cart_pool *pool) {
    static const char fn[] = "cart_weight_repack";
    if (bytes) *bytes = 0;
    mm_src src;
    int rc = check_weight(&src, w, fn);
    if (rc != CART_OK) return rc;
    if (!qk_supported(src.dtype) || src.rows == 0 || src.cols == 0) return CART_OK;
    qk_src q;
    qk_src_init(&q, src.dtype, NULL, src.rows, src.cols);
    if (q.group_bytes > 0 && (uint64_t)q.groups > (UINT64_C(1) << 62) / q.group_bytes)
        return cart_fail(CART_E_ARG, "%s: %lld rows of %lld columns overflow", fn, (long long)src.rows,
                         (long long)src.cols);
    const uint64_t total = q.group_bytes * (uint64_t)q.groups;
    uint8_t *dst = alloc_aligned((size_t)total, "repacked weight");
    if (!dst) return cart_fail_context(CART_E_NOMEM, "%s", fn);
    qk_pack_job pj = {.w = &src, .dst = dst, .group_bytes = q.group_bytes};
    cart_pool_for(pool ? pool : cart_default_pool(), q.groups, 8, qk_pack_task, &pj);
    cart_weight_free_packed(w);
    w->packed = dst;
    if (bytes) *bytes = total;
    return CART_OK;
}

void cart_weight_free_packed(cart_weight *w) {
    if (!w) return;
    free((void *)w->packed);
    w->packed = NULL;
}


/* ---- entry points --------------------------------------------------------- */

int32_t cart_matmul_path_for(int64_t n) {
    return n <= GEMV_MAX_N ? CART_MM_GEMV : CART_MM_GEMM;
}

int32_t cart_matmul_path_invariant(int32_t dtype) {
    return qk_supported(dtype);
}

/* Checks a forward call and runs it: the integer products for the types
 * they cover (unless exact), else the f32 kernels on `path`. */
static int forward_checked(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w, int64_t n,
                           int32_t path, int exact, cart_pool *pool) {
    static const char fn[] = "cart_matmul_forward";
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", fn);
    if (path != CART_MM_AUTO && path != CART_MM_GEMV && path != CART_MM_GEMM)
        return cart_fail(CART_E_ARG, "%s: path %d is not CART_MM_AUTO, CART_MM_GEMV or CART_MM_GEMM", fn,
                         (int)path);
    mm_src src;
    int rc = check_weight(&src, w, fn);
    if (rc != CART_OK) return rc;
    rc = check_operands(fn, y, ldy, src.rows, "y", x, ldx, src.cols, "x", n);
    if (rc != CART_OK) return rc;
    if (n == 0 || src.rows == 0) return CART_OK;
    if (src.cols == 0) { /* empty sums */
        for (int64_t i = 0; i < n; i++) memset(y + i * ldy, 0, (size_t)src.rows * sizeof *y);
        return CART_OK;
    }
    if (!pool) pool = cart_default_pool();
    if (!exact && qk_supported(src.dtype)) {
        const mm_src *ws[1] = {&src};
        return forward_qk(1, ws, &y, &ldy, x, ldx, n, pool);
    }
    return forward_run(y, ldy, x, ldx, &src, n, path, pool);
}

int cart_matmul_forward_path(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                             int64_t n, int32_t path, cart_pool *pool) {
    return forward_checked(y, ldy, x, ldx, w, n, path, 0, pool);
}

int cart_matmul_forward(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                        int64_t n, cart_pool *pool) {
    return forward_checked(y, ldy, x, ldx, w, n, CART_MM_AUTO, 0, pool);
}

int cart_matmul_forward_exact(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                              int64_t n, cart_pool *pool) {
    return forward_checked(y, ldy, x, ldx, w, n, CART_MM_AUTO, 1, pool);
}

typedef struct many_job {
    const cart_kernels *k;
    int32_t count;
    mm_src src[MANY_MAX];
    float *y[MANY_MAX];
    int64_t ldy[MANY_MAX];
    int64_t first_task[MANY_MAX + 1]; /* task index where weight k starts */
    const float *in;
    int64_t ldi;
    int64_t n;
    float *scratch;
    int64_t scratch_floats;
} many_job;

static void gemv_many_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    many_job *j = ctx;
    float *scratch = j->scratch + (int64_t)thread * j->scratch_floats;
    for (int32_t k = 0; k < j->count; k++) {
        int64_t lo = begin > j->first_task[k] ? begin : j->first_task[k];
        int64_t hi = end < j->first_task[k + 1] ? end : j->first_task[k + 1];
        if (lo >= hi) continue;
        int64_t r0 = (lo - j->first_task[k]) * GEMV_ROWS;
        int64_t r1 = min64((hi - j->first_task[k]) * GEMV_ROWS, j->src[k].rows);
        j->k->gemv_rows(&j->src[k], j->y[k], j->ldy[k], j->in, j->ldi, j->n, r0, r1, scratch);
    }
}

/* Checks the weights and operands of a _many call into j->src; *shared
 * says whether they can share one pass: the same cols, nonempty, and
 * either all integer products of one activation kind (*qk = 1) or all
 * float kinds of one rounding. */
static int many_check(many_job *j, float *const *y, const int64_t *ldy, const float *x, int64_t ldx,
                      const cart_weight *const *w, int64_t n, int *shared, int *qk) {
    static const char fn[] = "cart_matmul_forward_many";
    *shared = j->count >= 1 && j->count <= MANY_MAX && n >= 1;
    *qk = *shared;
    for (int32_t k = 0; *shared && k < j->count; k++) {
        int rc = check_weight(&j->src[k], w[k], fn);
        if (rc != CART_OK) return rc;
        rc = check_operands(fn, y[k], ldy[k], j->src[k].rows, "y", x, ldx, j->src[k].cols, "x", n);
        if (rc != CART_OK) return rc;
        const mm_src *a = &j->src[0], *b = &j->src[k];
        *qk = *qk && qk_supported(b->dtype) && qk_act_kind_of(b->dtype) == qk_act_kind_of(a->dtype);
        *shared = b->cols == a->cols && b->rows > 0 && b->cols > 0 &&
                  (*qk || (!qk_supported(a->dtype) && !qk_supported(b->dtype) &&
                           round_for(b->dtype) == round_for(a->dtype)));
        j->y[k] = y[k];
        j->ldy[k] = ldy[k];
        j->first_task[k + 1] = j->first_task[k] + ceil_div(b->rows, GEMV_ROWS);
    }
    *qk = *qk && *shared;
    return CART_OK;
}

/* The GEMV pass of a _many call over float-kind weights (n <= GEMV_PASS_N). */
static int many_gemv(many_job *j, const float *x, int64_t ldx, int64_t n, cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    int64_t scratch = 0;
    for (int32_t k = 0; k < j->count; k++) {
        int64_t need = mm_scratch_floats(&j->src[k], MM_PATH_GEMV, j->k->mv, n);
        if (need > scratch) scratch = need;
    }
    int32_t round = round_for(j->src[0].dtype);
    int64_t rounded = round != MM_ROUND_NONE ? n * j->src[0].cols : 0;
    job tmp = {0};
    workspace ws;
    if (workspace_for(&tmp, &ws, threads, scratch, rounded) != CART_OK) return CART_E_NOMEM;
    j->scratch = tmp.scratch;
    j->scratch_floats = tmp.scratch_floats;
    j->in = x;
    j->ldi = ldx;
    j->n = n;
    if (rounded) {
        /* the activations rounded once for every weight, as each call would */
        j->k->round_rows(tmp.packed, x, ldx, j->src[0].cols, round, 0, n);
        j->in = tmp.packed;
        j->ldi = j->src[0].cols;
    }
    cart_pool_for(pool, j->first_task[j->count], 1, gemv_many_task, j);
    workspace_put(&ws);
    return CART_OK;
}

int cart_matmul_forward_many_path(int32_t count, float *const *y, const int64_t *ldy, const float *x,
                                  int64_t ldx, const cart_weight *const *w, int64_t n, int32_t path,
                                  cart_pool *pool) {
    static const char fn[] = "cart_matmul_forward_many";
    if (count < 0) return cart_fail(CART_E_ARG, "%s: count %d", fn, (int)count);
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", fn);
    if (path == CART_MM_AUTO) path = cart_matmul_path_for(n);
    many_job j = {.k = cart_kern(), .count = count};
    int shared, qk;
    int rc = many_check(&j, y, ldy, x, ldx, w, n, &shared, &qk);
    if (rc != CART_OK) return rc;
    if (!pool && shared) pool = cart_default_pool();
    if (qk) {
        const mm_src *ws[MANY_MAX];
        for (int32_t k = 0; k < count; k++) ws[k] = &j.src[k];
        return forward_qk(count, ws, j.y, j.ldy, x, ldx, n, pool);
    }
    if (shared && path == CART_MM_GEMV) {
        /* passes of at most GEMV_PASS_N tokens: the same bits per token */
        for (int64_t i0 = 0; i0 < n; i0 += GEMV_PASS_N) {
            float *yp[MANY_MAX];
            for (int32_t k = 0; k < count; k++) yp[k] = y[k] + i0 * ldy[k];
            many_job part = j;
            for (int32_t k = 0; k < count; k++) part.y[k] = yp[k];
            if ((rc = many_gemv(&part, x + i0 * ldx, ldx, min64(GEMV_PASS_N, n - i0), pool)) != CART_OK) return rc;
        }
        return CART_OK;
    }
    for (int32_t k = 0; k < count; k++) {
        rc = cart_matmul_forward_path(y[k], ldy[k], x, ldx, w[k], n, path, pool);
        if (rc != CART_OK) return rc;
    }
    return CART_OK;
}

int cart_matmul_forward_many(int32_t count, float *const *y, const int64_t *ldy, const float *x,
                             int64_t ldx, const cart_weight *const *w, int64_t n,
                             cart_pool *pool) {
    return cart_matmul_forward_many_path(count, y, ldy, x, ldx, w, n, CART_MM_AUTO, pool);
}

int cart_matmul_backward(float *dx, int64_t ldx, const float *dy, int64_t ldy, const cart_weight *w,
                         int64_t n, cart_pool *pool) {
    static const char fn[] = "cart_matmul_backward";
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", fn);
    mm_src src;
    int rc = check_weight(&src, w, fn);
    if (rc != CART_OK) return rc;
    rc = check_operands(fn, dx, ldx, src.cols, "dx", dy, ldy, src.rows, "dy", n);
    if (rc != CART_OK) return rc;
    if (n == 0 || src.rows == 0 || src.cols == 0) return CART_OK;
    if (!pool) pool = cart_default_pool();
    return backward_run(dx, ldx, dy, ldy, &src, n, pool);
}

typedef struct widen_job {
    const mm_src *w;
    float *dst;
} widen_job;

static void widen_rows_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    widen_job *j = ctx;
    for (int64_t r = begin; r < end; r++)
        cart_to_f32(j->dst + r * j->w->cols, j->w->dtype,
                    j->w->data + (uint64_t)r * j->w->row_bytes, j->w->cols);
}

int cart_weight_widen(cart_weight *out, const cart_weight *w, cart_pool *pool) {
    static const char fn[] = "cart_weight_widen";
    if (!out) return cart_fail(CART_E_ARG, "%s: NULL output", fn);
    mm_src src;
    int rc = check_weight(&src, w, fn);
    if (rc != CART_OK) return rc;
    float *dst = alloc_aligned(float_bytes(src.rows, src.cols), "widened weight");
    if (!dst) return cart_fail_context(CART_E_NOMEM, "%s", fn);
    widen_job j = {.w = &src, .dst = dst};
    if (src.rows > 0 && src.cols > 0)
        cart_pool_for(pool ? pool : cart_default_pool(), src.rows, 16, widen_rows_task, &j);
    memset(out, 0, sizeof *out);
    out->data = dst;
    out->dtype = CART_F32;
    out->rows = src.rows;
    out->cols = src.cols;
    out->row_bytes = (uint64_t)src.cols * 4;
    return CART_OK;
}

void cart_weight_free_data(cart_weight *w) {
    if (!w) return;
    free((void *)w->data);
    w->data = NULL;
}

/* qdot.h: the activations' quantization at the active level (the plain C
 * where the level has none). */
void qk_quantize(qk_act *a, const float *x, int64_t ldx, int64_t i0, int64_t i1) {
    const cart_kernels *k = cart_kern();
    if (k && k->qk_quantize) k->qk_quantize(a, x, ldx, i0, i1);
    else qk_quantize_rows_c(a, x, ldx, i0, i1);
    qk_unit_sums(a, i0, i1);
}
