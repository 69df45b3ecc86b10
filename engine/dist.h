/*
 * dist.h - processes that train one cartridge together, over MPI, and the
 * reproducible sum their gradients are reduced with.
 *
 * This is the only part of the engine that talks to MPI (dist.c). Built
 * without MPI (CMake found none, or -DCART_MPI=OFF) every call below still
 * exists and behaves as a job of one process: rank 0, size 1, collectives
 * that return at once. So the C core and the Lua API are the same either way.
 *
 * A process joins a job only when an MPI launcher started it: mpirun or
 * mpiexec (Open MPI sets OMPI_COMM_WORLD_SIZE), a PMI/PMIx launcher such as
 * Slurm's `srun --mpi=pmix` (PMIX_RANK, PMI_RANK, PMI_SIZE). A plain
 * `cartridge run ...` never initializes MPI, even in a build that has it.
 *
 * Errors: MPI's own errors are returned, not fatal (MPI_ERRORS_RETURN on the
 * job's communicator): a failed collective is CART_E_IO with MPI's message,
 * the rank and the job size. A rank that dies is usually noticed first by
 * the launcher, which stops the others and names the rank.
 *
 * Threads: only the thread that called cart_dist_init may call the
 * collectives (MPI_THREAD_FUNNELED); the engine's worker threads never do.
 */
#ifndef CART_DIST_H
#define CART_DIST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the job this process was launched in, once (later calls return
 * CART_OK and change nothing). Without a launcher's environment: a job of
 * one, MPI untouched. Fails with CART_E_UNSUPPORTED when a launcher started
 * several processes but this build has no MPI (rebuild with libopenmpi-dev),
 * and with CART_E_STATE when the launcher started N processes but MPI sees
 * another number (a launcher of another MPI implementation, or `srun`
 * without --mpi=pmix); the message names the variables it read. */
int cart_dist_init(void);

/* This process's rank in [0, size), and the number of processes. 0 and 1
 * before cart_dist_init, alone, or built without MPI. */
int32_t cart_dist_rank(void);
int32_t cart_dist_size(void);

/* 1 when the engine was built with MPI, else 0. */
int32_t cart_dist_built_with_mpi(void);

/* One line naming the MPI library ("Open MPI v4.1.4, ..."), or "none (built
 * without MPI)". Static storage. */
const char *cart_dist_library(void);

/* Waits until every rank has called it. */
int cart_dist_barrier(void);

/* Copies `bytes` bytes at data on rank `root` into data on every rank. */
int cart_dist_broadcast(void *data, int64_t bytes, int32_t root);

/* Every rank contributes `bytes` bytes (the same count on every rank);
 * out[r * bytes ...] receives rank r's, in rank order, on every rank. out
 * holds size * bytes bytes and must not overlap in. */
int cart_dist_allgather(void *out, const void *in, int64_t bytes);

/* The reproducible sum: every rank holds some vectors ("parts") of n floats,
 * and every rank receives scale times the sum of all parts of all ranks,
 * bit for bit the same whatever the number of ranks and however the parts
 * are spread over them.
 *
 * Floating-point addition is not associative, so a plain MPI_SUM over
 * floats gives bits that depend on the order the library picks. Here the
 * sum is exact instead: the ranks first add up their part counts (one
 * MPI_SUM allreduce of an int64) to know A, the number of parts in all;
 * then, for each element, E is the largest binary exponent any part has
 * there (one MPI_MAX allreduce of int16), every part's value is rounded to
 * the integer grid 2^(E - F) with F = 62 - ceil(log2 A) (exactly, unless
 * the value lies more than 2^(F - 24) below the element's largest: 2^36 for
 * A = 4), those int64 values are added (one MPI_SUM allreduce: integer
 * addition is exact in any order and cannot overflow at that F), and the
 * exact sum is rounded once to double, scaled, and rounded to float. The
 * result is the exact sum within half a float ulp plus A * 2^(E - F - 1).
 * An element where any part is NaN or infinite gives NaN; one where all are
 * zero gives +0. Elements go in rounds of 4 Mi (two allreduces each).
 * Memory: max_parts * n floats for the parts and a bounded scratch. */
typedef struct cart_dist_sum cart_dist_sum;

/* A sum of vectors of n values with room for max_parts parts on this rank.
 * Free with cart_dist_sum_free. */
int cart_dist_sum_new(cart_dist_sum **out, int64_t n, int32_t max_parts);
void cart_dist_sum_free(cart_dist_sum *s);

/* Part i (0 <= i < max_parts): n writable floats, owned by s. NULL for a bad
 * index. */
float *cart_dist_sum_part(cart_dist_sum *s, int32_t i);

/* Collective: out[0..n) = scale * (the sum over every rank of its parts
 * 0..n_parts-1). n_parts may differ between ranks and be 0; n must be the
 * same on every rank. out may be one of this rank's parts. */
int cart_dist_sum_reduce(cart_dist_sum *s, int32_t n_parts, double scale, float *out);

/* What one cart_dist_sum_reduce of n values sends into the collectives:
 * *bytes, the payload bytes of its allreduces added up (per rank, before
 * the algorithm's own copies), and *allreduces, how many it calls. */
void cart_dist_sum_traffic(int64_t n, int64_t *bytes, int32_t *allreduces);

/* FNV-1a (64 bits) over `bytes` bytes, continuing from h; h = 0 starts a
 * new hash (from the FNV offset basis). For fingerprints that ranks
 * compare. */
uint64_t cart_dist_hash(const void *data, int64_t bytes, uint64_t h);

/* Ending the job. cart_dist_finalize leaves MPI after a normal end (all
 * ranks call it; a no-op when MPI was not initialized). An error that every
 * rank reaches at the same point (a check all of them made on the same
 * gathered data) is marked with cart_dist_fail_together before it is
 * raised: the host then prints it once (rank 0), finalizes and exits
 * non-zero on every rank. Any other error on one rank calls cart_dist_abort,
 * which prints "cartridge: rank R of N: message" on stderr and stops every
 * process of the job (MPI_Abort) with `code`; alone it only prints. */
int cart_dist_finalize(void);
void cart_dist_fail_together(void);
int32_t cart_dist_failing_together(void);
void cart_dist_abort(int32_t code, const char *message);

#ifdef __cplusplus
}
#endif

#endif
