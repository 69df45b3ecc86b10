/*
 * pool.c - the engine's pthread pool and its process-wide default.
 *
 * One job at a time: the caller publishes (fn, ctx, n, chunk), bumps the
 * generation and wakes the workers; everybody, the caller included, claims
 * chunks from an atomic cursor until none is left. The caller then waits for
 * the workers to report back, so when cart_pool_for returns no worker touches
 * the job any more.
 *
 * Waiting spins first (about SPIN_ROUNDS pause instructions, tens of
 * microseconds) and only then sleeps on a condition variable: a decode step
 * runs hundreds of short jobs back to back, and a futex wake-up costs more
 * than such a job. The sleeper counts and the generation are sequentially
 * consistent atomics, so a waker sees a sleeper or the sleeper sees the new
 * generation (never neither).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif
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
    atomic_ullong generation;   /* bumped once per job */
    atomic_int stopping;
    atomic_int running;         /* workers still on the current job */
    atomic_int sleepers;        /* workers asleep on `start` */
    atomic_int caller_sleeping; /* the caller asleep on `done` */
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

enum { SPIN_ROUNDS = 20000 };

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    cart_pool *p = arg->pool;
    int32_t thread = arg->thread;
    free(arg);
    uint64_t seen = 0;
    for (;;) {
        /* wait for a new generation: spin, then sleep */
        for (int i = 0; i < SPIN_ROUNDS && atomic_load(&p->generation) == seen &&
                        !atomic_load(&p->stopping);
             i++)
            cpu_relax();
        if (atomic_load(&p->generation) == seen && !atomic_load(&p->stopping)) {
            pthread_mutex_lock(&p->mutex);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stopping))
                pthread_cond_wait(&p->start, &p->mutex);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mutex);
        }
        if (atomic_load(&p->stopping)) return NULL;
        seen = atomic_load(&p->generation);

        run_chunks(p, thread);

        if (atomic_fetch_sub(&p->running, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mutex);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mutex);
        }
    }
}

int32_t cart_cpu_count(void) {
    /* the CPUs this process may run on: what taskset, cgroups' cpusets or
     * mpirun's binding of one rank to its cores leave it */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return (int32_t)n;
    }
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
    atomic_init(&p->generation, 0);
    atomic_init(&p->stopping, 0);
    atomic_init(&p->running, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
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
    atomic_store(&p->stopping, 1);
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
    atomic_store(&p->running, p->size - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mutex);
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mutex);
    }

    run_chunks(p, 0);

    for (int i = 0; i < SPIN_ROUNDS && atomic_load(&p->running) > 0; i++) cpu_relax();
    if (atomic_load(&p->running) > 0) {
        pthread_mutex_lock(&p->mutex);
        atomic_store(&p->caller_sleeping, 1);
        while (atomic_load(&p->running) > 0) pthread_cond_wait(&p->done, &p->mutex);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mutex);
    }
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
