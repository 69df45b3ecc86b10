/*
 * probe.h - yardsticks of the machine, for benchmarks to state their figures
 * as fractions of: how fast it reads memory, how fast a plain f32 GEMM runs.
 * Each takes a fraction of a second and returns the best of a few runs, so
 * noise from other processes lowers it less than it lowers a single run.
 */
#ifndef CART_PROBE_H
#define CART_PROBE_H

#include <stdint.h>
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read bandwidth in bytes per second: `bytes` of memory (rounded up to 4 KiB;
 * make it well above the last-level cache) read `reps` times by the pool's
 * threads, each its own contiguous share, with integer sums that cost less
 * than the loads. The best pass counts. 0 when the buffer cannot be had. */
double cart_probe_read_bandwidth(int64_t bytes, int32_t reps, cart_pool *pool);

/* f32 GEMM rate in FLOP/s of an n x n x n product (2 n^3 flops) through the
 * BLAS (cart_gemm, OpenBLAS), best of `reps`, on cart_blas_threads() threads.
 * 0 on failure. */
double cart_probe_blas_gemm(int64_t n, int32_t reps);

/* The same product through the engine's own f32 GEMM kernels
 * (cart_matmul_forward with an f32 weight), at the active ISA level. */
double cart_probe_engine_gemm(int64_t n, int32_t reps, cart_pool *pool);

#ifdef __cplusplus
}
#endif

#endif
