/*
 * pool.c - the engine's pthread pool and its process-wide default.
 *
 * One job at a time: the caller publishes (fn, ctx, n, chunk), bumps the
 * generation and wakes the workers; everybody, the caller included, claims
 * chunks from an atomic cursor until none is left. The caller then waits for
 * the workers to report back, so when cart_pool_for returns no worker touches
 * the job any more.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "blas.h"
#include "internal.h"
#include "pool.h"

struct cart_pool {
    int32_t size; /* threads in all, the caller included */
    pthread_t *workers; /* size - 1 of them */
    pthread_mutex_t mutex;
    pthread_cond_t start;
    pthread_cond_t done;
    pthread_mutex_t call_mutex; /* serializes cart_pool_for calls */
    uint64_t generation;        /* guarded by mutex */
    int stopping;               /* guarded by mutex */
    int32_t running;            /* workers still on the current job; guarded by mutex */
    /* the current job */
    cart_pool_fn fn;
    void *ctx;
    int64_t n;
    int64_t chunk;
    atomic_llong cursor;
};

typedef struct worker_arg {
    cart_pool *pool;
    int32_t thread;
} worker_arg;

static void run_chunks(cart_pool *p, int32_t thread) {
    for (;;) {
        int64_t begin = atomic_fetch_add(&p->cursor, p->chunk);
        if (begin >= p->n) break;
        int64_t end = begin + p->chunk < p->n ? begin + p->chunk : p->n;
        p->fn(p->ctx, begin, end, thread);
    }
}

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    cart_pool *p = arg->pool;
    int32_t thread = arg->thread;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mutex);
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->start, &p->mutex);
        if (p->stopping) {
            pthread_mutex_unlock(&p->mutex);
            return NULL;
        }
        seen = p->generation;
        pthread_mutex_unlock(&p->mutex);

        run_chunks(p, thread);

        pthread_mutex_lock(&p->mutex);
        if (--p->running == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mutex);
    }
}

int32_t cart_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t)n : 1;
}

int cart_pool_new(cart_pool **out, int32_t n_threads) {
    *out = NULL;
    if (n_threads < 0) return cart_fail(CART_E_ARG, "thread count %d is negative", (int)n_threads);
    if (n_threads == 0) n_threads = cart_cpu_count();
    if (n_threads > 1024)
        return cart_fail(CART_E_ARG, "thread count %d is above the limit of 1024", (int)n_threads);
    cart_pool *p = cart_calloc(1, sizeof *p, "thread pool");
    if (!p) return CART_E_NOMEM;
    p->size = n_threads;
    pthread_mutex_init(&p->mutex, NULL);
    pthread_mutex_init(&p->call_mutex, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->cursor, 0);
    if (n_threads > 1) {
        p->workers = cart_calloc((size_t)n_threads - 1, sizeof *p->workers, "thread pool workers");
        if (!p->workers) {
            cart_pool_free(p);
            return CART_E_NOMEM;
        }
    }
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg *arg = cart_malloc(sizeof *arg, "thread pool worker");
        if (!arg) {
            p->size = i; /* join the ones started so far */
            cart_pool_free(p);
            return CART_E_NOMEM;
        }
        arg->pool = p;
        arg->thread = i;
        if (pthread_create(&p->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
            p->size = i;
            cart_pool_free(p);
            return cart_fail(CART_E_NOMEM, "cannot start thread %d of %d", (int)i, (int)n_threads);
        }
    }
    *out = p;
    return CART_OK;
}

void cart_pool_free(cart_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mutex);
    p->stopping = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mutex);
    for (int32_t i = 1; i < p->size; i++) pthread_join(p->workers[i - 1], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mutex);
    pthread_mutex_destroy(&p->call_mutex);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p);
}

int32_t cart_pool_size(const cart_pool *p) {
    return p ? p->size : 1;
}

void cart_pool_for(cart_pool *p, int64_t n, int64_t grain, cart_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain <= 0) grain = 1;
    if (!p || p->size == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* About four chunks per thread balances uneven parts without much
     * cursor traffic; never below the caller's grain. */
    int64_t chunk = (n + (int64_t)p->size * 4 - 1) / ((int64_t)p->size * 4);
    if (chunk < grain) chunk = grain;

    pthread_mutex_lock(&p->call_mutex);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->cursor, 0);
    pthread_mutex_lock(&p->mutex);
    p->running = p->size - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mutex);

    run_chunks(p, 0);

    pthread_mutex_lock(&p->mutex);
    while (p->running > 0) pthread_cond_wait(&p->done, &p->mutex);
    pthread_mutex_unlock(&p->mutex);
    pthread_mutex_unlock(&p->call_mutex);
}

/* ---- the default pool --------------------------------------------------- */

static pthread_mutex_t default_mutex = PTHREAD_MUTEX_INITIALIZER;
static cart_pool *default_pool;
static int32_t default_threads; /* 0: all cores */

cart_pool *cart_default_pool(void) {
    pthread_mutex_lock(&default_mutex);
    if (!default_pool) {
        cart_pool *p = NULL;
        if (cart_pool_new(&p, default_threads) == CART_OK) default_pool = p;
    }
    cart_pool *p = default_pool;
    pthread_mutex_unlock(&default_mutex);
    return p; /* NULL only if threads could not start: cart_pool_for then runs inline */
}

int cart_set_threads(int32_t n) {
    if (n < 0 || n > 1024)
        return cart_fail(CART_E_ARG, "thread count %d is outside 0..1024 (0 means all cores)",
                         (int)n);
    int32_t resolved = n == 0 ? cart_cpu_count() : n;
    pthread_mutex_lock(&default_mutex);
    cart_pool *old = default_pool;
    default_pool = NULL;
    default_threads = resolved;
    pthread_mutex_unlock(&default_mutex);
    cart_pool_free(old);
    cart_blas_set_threads(resolved);
    return CART_OK;
}

int32_t cart_threads(void) {
    pthread_mutex_lock(&default_mutex);
    int32_t n = default_pool ? default_pool->size
                             : (default_threads ? default_threads : cart_cpu_count());
    pthread_mutex_unlock(&default_mutex);
    return n;
}
