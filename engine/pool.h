/*
 * pool.h - a fixed pthread pool for the engine's own kernels.
 *
 * cart_pool_for splits an index range over the pool's threads and returns when
 * every part is done; the calling thread does one part itself. Kernels receive
 * a half-open range and the index of the thread running it (0..size-1), which
 * they may use to pick per-thread scratch. Calls on one pool are serialized.
 * Callbacks run on pool threads, so they must be C functions (never LuaJIT
 * callbacks).
 */
#ifndef CART_POOL_H
#define CART_POOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_pool cart_pool;

/* Work function: handle items [begin, end) on thread `thread`. */
typedef void (*cart_pool_fn)(void *ctx, int64_t begin, int64_t end, int32_t thread);

/* The CPU cores this process may run on (its affinity mask: all online
 * cores unless taskset, a cpuset or an MPI launcher's binding narrowed it),
 * at least 1. */
int32_t cart_cpu_count(void);

/* A pool of n_threads threads in all, the caller included; 0 means
 * cart_cpu_count(). Free with cart_pool_free. */
int cart_pool_new(cart_pool **out, int32_t n_threads);
void cart_pool_free(cart_pool *pool);

/* Threads in the pool, the caller included. */
int32_t cart_pool_size(const cart_pool *pool);

/* Runs fn over [0, n) in parts of at least `grain` items (grain <= 0: 1) and
 * waits for all of them. With one thread or a small n it runs inline. */
void cart_pool_for(cart_pool *pool, int64_t n, int64_t grain, cart_pool_fn fn, void *ctx);

/* The process-wide pool the engine's kernels use, created on first use with
 * cart_cpu_count() threads unless cart_set_threads chose otherwise. */
cart_pool *cart_default_pool(void);

/* Sets the thread count for the default pool and the BLAS (n >= 1; 0 means
 * all cores). Replaces the default pool; do not call while kernels run. */
int cart_set_threads(int32_t n);

/* The default pool's thread count. */
int32_t cart_threads(void);

#ifdef __cplusplus
}
#endif

#endif
