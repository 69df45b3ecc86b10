/*
 * matmul.c - products with weight matrices in any storage dtype: argument
 * checks, scratch, and the split over the pool. The arithmetic is the active
 * level's kernels (kernels/kernels.h, chosen by cpu.c).
 *
 * Forward:
 *   n <= GEMV_MAX_N (16) tokens: GEMV kernels read each weight row once per
 *     few tokens (memory-bound decode). Tasks are groups of weight rows.
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
#include "matmul.h"

enum {
    /* Forward products of at most this many tokens take the GEMV path. The
     * crossover measured on Zen 5 with weights streamed from DRAM: below about
     * 16 tokens the GEMM's packing costs more than its reuse gains (for block
     * types the two are even from 10 to 16). One limit for every dtype, so
     * that a widened copy takes the same path as its original and gives the
     * same bits. */
    GEMV_MAX_N = 16,
    MC_TOKENS = 528, /* tokens per GEMM block (rounded down to whole micro-tiles): their packed
                        k block fits L2 */
    GEMV_ROWS = 48,  /* weight rows per GEMV task: whole GEMV passes of 8, 6, 4, 3, 2 and 1 */
};

int64_t mm_bwd_cols(const mm_src *w) {
    return w->block_size > MM_BWD_COLS ? w->block_size : MM_BWD_COLS;
}

int64_t mm_bwd_kc(const mm_src *w) {
    return MM_BWD_BLOCK / mm_bwd_cols(w);
}

int64_t mm_scratch_floats(const mm_src *w, int32_t path, int64_t mv) {
    const int dequant = w->kind == MM_W_DEQUANT;
    switch (path) {
    case MM_PATH_FORWARD:
        return (int64_t)MM_KC * mv * (dequant ? 2 : 1);
    case MM_PATH_BACKWARD:
        return (int64_t)MM_BWD_BLOCK + mm_bwd_cols(w);
    default:
        return dequant ? (int64_t)MM_GEMV_MAXR * MM_GEMV_KB : 0;
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

/* The GEMV path for n <= GEMV_MAX_N tokens. */
static int forward_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const mm_src *w, int64_t n,
                        cart_pool *pool) {
    const int32_t threads = cart_pool_size(pool);
    const cart_kernels *k = cart_kern();
    job j = {.k = k, .w = w, .out = y, .ldo = ldy, .in = x, .ldi = ldx, .n = n, .round = round_for(w->dtype)};
    workspace ws;
    int64_t rounded = j.round != MM_ROUND_NONE ? n * w->cols : 0;
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_GEMV, k->mv), rounded) != CART_OK)
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
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_FORWARD, k->mv),
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

/* The forward on `path`: GEMV in passes of at most GEMV_MAX_N tokens (each
 * token's output is the same in any pass), or GEMM. */
static int forward_run(float *y, int64_t ldy, const float *x, int64_t ldx, const mm_src *w, int64_t n,
                       int32_t path, cart_pool *pool) {
    if (path == CART_MM_AUTO) path = cart_matmul_path_for(n);
    if (path == CART_MM_GEMM) return forward_gemm(y, ldy, x, ldx, w, n, pool);
    for (int64_t i0 = 0; i0 < n; i0 += GEMV_MAX_N) {
        int rc = forward_gemv(y + i0 * ldy, ldy, x + i0 * ldx, ldx, w, min64(GEMV_MAX_N, n - i0), pool);
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
    if (workspace_for(&j, &ws, threads, mm_scratch_floats(w, MM_PATH_BACKWARD, k->mv),
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


/* ---- entry points --------------------------------------------------------- */

int32_t cart_matmul_path_for(int64_t n) {
    return n <= GEMV_MAX_N ? CART_MM_GEMV : CART_MM_GEMM;
}

int cart_matmul_forward_path(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                             int64_t n, int32_t path, cart_pool *pool) {
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
    return forward_run(y, ldy, x, ldx, &src, n, path, pool);
}

int cart_matmul_forward(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                        int64_t n, cart_pool *pool) {
    return cart_matmul_forward_path(y, ldy, x, ldx, w, n, CART_MM_AUTO, pool);
}

enum { MANY_MAX = 8 };

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

int cart_matmul_forward_many_path(int32_t count, float *const *y, const int64_t *ldy, const float *x,
                                  int64_t ldx, const cart_weight *const *w, int64_t n, int32_t path,
                                  cart_pool *pool) {
    static const char fn[] = "cart_matmul_forward_many";
    if (count < 0) return cart_fail(CART_E_ARG, "%s: count %d", fn, (int)count);
    if (cart_isa_init() != CART_OK) return cart_fail_context(cart_last_status(), "%s", fn);
    if (path == CART_MM_AUTO) path = cart_matmul_path_for(n);
    if (path == CART_MM_GEMV && n > GEMV_MAX_N && count <= MANY_MAX) {
        /* passes of at most GEMV_MAX_N tokens: the same bits per token */
        float *yp[MANY_MAX];
        for (int64_t i0 = 0; i0 < n; i0 += GEMV_MAX_N) {
            for (int32_t k = 0; k < count; k++) yp[k] = y[k] + i0 * ldy[k];
            int rc = cart_matmul_forward_many_path(count, yp, ldy, x + i0 * ldx, ldx, w, min64(GEMV_MAX_N, n - i0),
                                                   CART_MM_GEMV, pool);
            if (rc != CART_OK) return rc;
        }
        return CART_OK;
    }
    int same = path == CART_MM_GEMV && count >= 1 && count <= MANY_MAX && n >= 1 && n <= GEMV_MAX_N;
    many_job j = {.k = cart_kern(), .count = count, .in = x, .ldi = ldx, .n = n};
    int64_t scratch = 0;
    for (int32_t k = 0; same && k < count; k++) {
        int rc = check_weight(&j.src[k], w[k], fn);
        if (rc != CART_OK) return rc;
        rc = check_operands(fn, y[k], ldy[k], j.src[k].rows, "y", x, ldx, j.src[k].cols, "x", n);
        if (rc != CART_OK) return rc;
        same = j.src[k].cols == j.src[0].cols && round_for(j.src[k].dtype) == round_for(j.src[0].dtype) &&
               j.src[k].rows > 0 && j.src[k].cols > 0;
        j.y[k] = y[k];
        j.ldy[k] = ldy[k];
        j.first_task[k + 1] = j.first_task[k] + ceil_div(j.src[k].rows, GEMV_ROWS);
        int64_t need = mm_scratch_floats(&j.src[k], MM_PATH_GEMV, j.k->mv);
        if (need > scratch) scratch = need;
    }
    if (same) {
        if (!pool) pool = cart_default_pool();
        const int32_t threads = cart_pool_size(pool);
        int32_t round = round_for(j.src[0].dtype);
        int64_t rounded = round != MM_ROUND_NONE ? n * j.src[0].cols : 0;
        job tmp = {0};
        workspace ws;
        if (workspace_for(&tmp, &ws, threads, scratch, rounded) != CART_OK) return CART_E_NOMEM;
        j.scratch = tmp.scratch;
        j.scratch_floats = tmp.scratch_floats;
        if (rounded) {
            /* the activations rounded once for every weight, as each call would */
            j.k->round_rows(tmp.packed, x, ldx, j.src[0].cols, round, 0, n);
            j.in = tmp.packed;
            j.ldi = j.src[0].cols;
        }
        cart_pool_for(pool, j.first_task[count], 1, gemv_many_task, &j);
        workspace_put(&ws);
        return CART_OK;
    }
    for (int32_t k = 0; k < count; k++) {
        int rc = cart_matmul_forward_path(y[k], ldy[k], x, ldx, w[k], n, path, pool);
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

/* ---- q8_0 x q8_0 ------------------------------------------------------------ */

enum { Q8_BLOCK = 32, Q8_ROWS = 16 /* weight rows per task */ };

typedef struct q8_job {
    const mm_src *w;
    float *y;
    int64_t ldy;
    const int8_t *xq; /* [n][cols] quantized activations */
    const float *xd;  /* [n][cols / 32] their block scales */
    int64_t n;
} q8_job;

/* One activation row to q8_0 as GGML's x86 quantize_row_q8_0. */
static void quantize_row_q8(int8_t *q, float *d, const float *x, int64_t cols) {
    for (int64_t b = 0; b < cols / Q8_BLOCK; b++) {
        const float *xb = x + b * Q8_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < Q8_BLOCK; i++) {
            float a = fabsf(xb[i]);
            if (a > amax) amax = a;
        }
        d[b] = cart_f16_to_f32(cart_f32_to_f16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < Q8_BLOCK; i++) q[b * Q8_BLOCK + i] = (int8_t)nearbyintf(xb[i] * id);
    }
}

static void q8_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    q8_job *j = ctx;
    const int64_t cols = j->w->cols, nb = cols / Q8_BLOCK;
    for (int64_t r = begin * Q8_ROWS; r < end * Q8_ROWS && r < j->w->rows; r++) {
        const uint8_t *row = j->w->data + (uint64_t)r * j->w->row_bytes;
        for (int64_t i = 0; i < j->n; i++) {
            const int8_t *xq = j->xq + i * cols;
            const float *xd = j->xd + i * nb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + b * 34; /* f16 d, then 32 int8 */
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const int8_t *wq = (const int8_t *)(blk + 2);
                int32_t isum = 0;
                for (int k = 0; k < Q8_BLOCK; k++) isum += (int32_t)wq[k] * (int32_t)xq[b * Q8_BLOCK + k];
                acc += (float)isum * (cart_f16_to_f32(dh) * xd[b]);
            }
            j->y[i * j->ldy + r] = acc;
        }
    }
}

int cart_matmul_forward_q8(float *y, int64_t ldy, const float *x, int64_t ldx, const cart_weight *w,
                           int64_t n, cart_pool *pool) {
    static const char fn[] = "cart_matmul_forward_q8";
    mm_src src;
    int rc = check_weight(&src, w, fn);
    if (rc != CART_OK) return rc;
    if (src.dtype != CART_Q8_0)
        return cart_fail(CART_E_ARG, "%s: the weight is %s, not q8_0", fn, cart_dtype_name(src.dtype));
    rc = check_operands(fn, y, ldy, src.rows, "y", x, ldx, src.cols, "x", n);
    if (rc != CART_OK) return rc;
    if (n == 0 || src.rows == 0) return CART_OK;
    const int64_t nb = src.cols / Q8_BLOCK;
    int8_t *xq = malloc((size_t)(n * src.cols) + 1);
    float *xd = malloc(sizeof(float) * (size_t)(n * nb) + 1);
    if (!xq || !xd) {
        free(xq);
        free(xd);
        return cart_fail(CART_E_NOMEM, "%s: out of memory quantizing %lld activation rows", fn, (long long)n);
    }
    for (int64_t i = 0; i < n; i++) quantize_row_q8(xq + i * src.cols, xd + i * nb, x + i * ldx, src.cols);
    q8_job j = {.w = &src, .y = y, .ldy = ldy, .xq = xq, .xd = xd, .n = n};
    cart_pool_for(pool ? pool : cart_default_pool(), ceil_div(src.rows, Q8_ROWS), 1, q8_task, &j);
    free(xq);
    free(xd);
    return CART_OK;
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
