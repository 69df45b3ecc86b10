/*
 * dist.c - the job of processes (MPI when built with it) and the
 * reproducible sum; see dist.h for the contract. The only file that
 * includes mpi.h: everything MPI-specific sits under CART_HAVE_MPI, and the
 * other branch is the job of one process.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "internal.h"

#ifdef CART_HAVE_MPI
#include <mpi.h>
#endif

/* The job as this process sees it. */
static struct {
    int initialized; /* cart_dist_init succeeded */
    int mpi;         /* MPI_Init was called by us and not yet finalized */
    int32_t rank, size;
    int32_t failing_together;
} job = {0, 0, 0, 1, 0};

#ifdef CART_HAVE_MPI
/* A duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN. */
static MPI_Comm job_comm = MPI_COMM_NULL;
#endif

/* Elements converted and reduced per round: bounds the scratch (2 + 8 bytes
 * per element, 40 MiB) while keeping the rounds, each two allreduces, few. */
enum { SUM_CHUNK = 1 << 22 };

/* The int16 exponent marks: no nonzero value at the element, and a NaN or
 * infinity there. Every finite nonzero float's frexp exponent (-148..128)
 * lies between them. */
enum { EXP_NONE = INT16_MIN, EXP_BAD = INT16_MAX };

/* ------------------------------------------------------------------------- */
/* The launcher's environment. */

/* The value of the first of the variables that is set to a number, or -1;
 * *which receives its name. */
static long env_number(const char *const *names, const char **which) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (!v || !v[0]) continue;
        char *end;
        long x = strtol(v, &end, 10);
        if (*end == '\0' && x >= 0) {
            *which = names[i];
            return x;
        }
    }
    *which = NULL;
    return -1;
}

static const char *const launcher_rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL};
static const char *const launcher_size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
/* srun sets it for the tasks of a step (a batch script's own shell has
 * SLURM_NTASKS and SLURM_PROCID=0 for the whole allocation, but no step) */
static const char *const slurm_size_vars[] = {"SLURM_STEP_NUM_TASKS", NULL};

/* ------------------------------------------------------------------------- */
/* MPI errors as the engine's. */

#ifdef CART_HAVE_MPI
static int mpi_fail(int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    return cart_fail(CART_E_IO,
                     "%s failed on rank %d of %d: %s; a process of the job stopped or its host is "
                     "unreachable",
                     call, (int)job.rank, (int)job.size, msg);
}
#endif

int32_t cart_dist_built_with_mpi(void) {
#ifdef CART_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

const char *cart_dist_library(void) {
#ifdef CART_HAVE_MPI
    static char line[MPI_MAX_LIBRARY_VERSION_STRING];
    if (!line[0]) {
        int len = 0;
        if (MPI_Get_library_version(line, &len) != MPI_SUCCESS) snprintf(line, sizeof line, "MPI");
        char *nl = strchr(line, '\n'); /* the first line says what it is */
        if (nl) *nl = '\0';
    }
    return line;
#else
    return "none (built without MPI)";
#endif
}

int cart_dist_init(void) {
    if (job.initialized) return CART_OK;
    const char *rank_var, *size_var, *slurm_var;
    long env_rank = env_number(launcher_rank_vars, &rank_var);
    long env_size = env_number(launcher_size_vars, &size_var);
    long slurm_size = env_number(slurm_size_vars, &slurm_var);
    int launched = rank_var != NULL || size_var != NULL;
    (void)env_rank;
    if (!launched) {
        /* srun started several tasks but gave them no PMI: each would train
         * alone and write the same files */
        if (slurm_size > 1)
            return cart_fail(CART_E_STATE,
                             "Slurm started %ld tasks (%s) without an MPI launcher's "
                             "environment, so each would train alone; launch with `srun --mpi=pmix` "
                             "(or mpirun inside the allocation)",
                             slurm_size, slurm_var);
        job.initialized = 1;
        return CART_OK;
    }
#ifndef CART_HAVE_MPI
    if (env_size > 1 || (env_size < 0 && slurm_size > 1))
        return cart_fail(CART_E_UNSUPPORTED,
                         "launched as one of %ld processes (%s), but this cartridge was built "
                         "without MPI; install libopenmpi-dev and rebuild (cmake finds it), or run a "
                         "single process without mpirun",
                         env_size > 1 ? env_size : slurm_size, env_size > 1 ? size_var : slurm_var);
    job.initialized = 1;
    return CART_OK;
#else
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return cart_fail(CART_E_STATE, "MPI_Init_thread failed (launched by %s)",
                             rank_var ? rank_var : size_var);
        job.mpi = 1;
    }
    MPI_Comm comm;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_dup");
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    long expect = env_size > 0 ? env_size : slurm_size;
    if (expect > 0 && expect != size) {
        MPI_Comm_free(&comm);
        return cart_fail(CART_E_STATE,
                         "the launcher started %ld processes (%s) but MPI sees a job of %d: "
                         "the launcher belongs to another MPI than this build's (%s), or srun ran "
                         "without --mpi=pmix; use the matching mpirun",
                         expect, env_size > 0 ? size_var : slurm_var, size, cart_dist_library());
    }
    job_comm = comm;
    job.rank = rank;
    job.size = size;
    job.initialized = 1;
    return CART_OK;
#endif
}

int32_t cart_dist_rank(void) {
    return job.rank;
}

int32_t cart_dist_size(void) {
    return job.size;
}

/* ------------------------------------------------------------------------- */
/* Collectives. With one process they return at once. */

int cart_dist_barrier(void) {
#ifdef CART_HAVE_MPI
    if (job.size > 1) {
        int rc = MPI_Barrier(job_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Barrier");
    }
#endif
    return CART_OK;
}

int cart_dist_broadcast(void *data, int64_t bytes, int32_t root) {
    if (bytes < 0 || (bytes > 0 && !data))
        return cart_fail(CART_E_ARG, "cart_dist_broadcast: %lld bytes at %p", (long long)bytes, data);
    if (root < 0 || root >= job.size)
        return cart_fail(CART_E_ARG, "cart_dist_broadcast: root %d is not a rank of the job of %d",
                         (int)root, (int)job.size);
#ifdef CART_HAVE_MPI
    if (job.size > 1) {
        /* MPI counts are int: large buffers go in pieces of 1 GiB */
        for (int64_t at = 0; at < bytes; at += (int64_t)1 << 30) {
            int64_t n = bytes - at < ((int64_t)1 << 30) ? bytes - at : (int64_t)1 << 30;
            int rc = MPI_Bcast((char *)data + at, (int)n, MPI_BYTE, root, job_comm);
            if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Bcast");
        }
    }
#endif
    return CART_OK;
}

int cart_dist_allgather(void *out, const void *in, int64_t bytes) {
    if (bytes < 0 || bytes > INT_MAX || (bytes > 0 && (!out || !in)))
        return cart_fail(CART_E_ARG, "cart_dist_allgather: %lld bytes per rank (at most %d)",
                         (long long)bytes, INT_MAX);
    if (bytes > 0 && (const char *)in < (char *)out + bytes * job.size &&
        (char *)out < (const char *)in + bytes)
        return cart_fail(CART_E_ARG, "cart_dist_allgather: out and in overlap");
#ifdef CART_HAVE_MPI
    if (job.size > 1) {
        int rc = MPI_Allgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, job_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allgather");
        return CART_OK;
    }
#endif
    if (bytes > 0) memcpy(out, in, (size_t)bytes);
    return CART_OK;
}

/* In place over every rank: MPI_MAX of int16 and MPI_SUM of int64. */
static int allreduce_max_i16(int16_t *v, int64_t n) {
#ifdef CART_HAVE_MPI
    if (job.size > 1) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_INT16_T, MPI_MAX, job_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allreduce (max)");
    }
#endif
    (void)v, (void)n;
    return CART_OK;
}

static int allreduce_sum_i64(int64_t *v, int64_t n) {
#ifdef CART_HAVE_MPI
    if (job.size > 1) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_INT64_T, MPI_SUM, job_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allreduce (sum)");
    }
#endif
    (void)v, (void)n;
    return CART_OK;
}

/* ------------------------------------------------------------------------- */
/* The reproducible sum. */

struct cart_dist_sum {
    int64_t n;
    int32_t max_parts;
    float *parts;    /* [max_parts, n] */
    int16_t *exps;   /* [chunk] largest exponent per element */
    int64_t *fixed;  /* [chunk] the parts' sum on the grid */
    int64_t chunk;
};

int cart_dist_sum_new(cart_dist_sum **out, int64_t n, int32_t max_parts) {
    *out = NULL;
    if (n < 1 || max_parts < 1 || (uint64_t)n * (uint64_t)max_parts > ((uint64_t)1 << 40))
        return cart_fail(CART_E_ARG, "cart_dist_sum_new: %lld values x %d parts", (long long)n,
                         (int)max_parts);
    cart_dist_sum *s = cart_calloc(1, sizeof *s, "reproducible sum");
    if (!s) return CART_E_NOMEM;
    s->n = n;
    s->max_parts = max_parts;
    s->chunk = n < SUM_CHUNK ? n : SUM_CHUNK;
    s->parts = cart_calloc((size_t)n * (size_t)max_parts, sizeof(float), "reproducible sum parts");
    s->exps = cart_malloc((size_t)s->chunk * sizeof(int16_t), "reproducible sum exponents");
    s->fixed = cart_malloc((size_t)s->chunk * sizeof(int64_t), "reproducible sum accumulator");
    if (!s->parts || !s->exps || !s->fixed) {
        cart_dist_sum_free(s);
        return CART_E_NOMEM;
    }
    *out = s;
    return CART_OK;
}

void cart_dist_sum_free(cart_dist_sum *s) {
    if (!s) return;
    free(s->parts);
    free(s->exps);
    free(s->fixed);
    free(s);
}

float *cart_dist_sum_part(cart_dist_sum *s, int32_t i) {
    if (!s || i < 0 || i >= s->max_parts) return NULL;
    return s->parts + (size_t)i * (size_t)s->n;
}

/* The int16 exponent mark of one value (see EXP_NONE, EXP_BAD). */
static int16_t exponent_of(float v) {
    if (v == 0.0f) return EXP_NONE;
    if (!isfinite(v)) return EXP_BAD;
    int e;
    frexpf(v, &e); /* |v| < 2^e */
    return (int16_t)e;
}

/* ceil(log2(x)) for x >= 1. */
static int ceil_log2(int64_t x) {
    int k = 0;
    while (((int64_t)1 << k) < x) k++;
    return k;
}

int cart_dist_sum_reduce(cart_dist_sum *s, int32_t n_parts, double scale, float *out) {
    if (!s || !out || n_parts < 0 || n_parts > s->max_parts)
        return cart_fail(CART_E_ARG, "cart_dist_sum_reduce: %d parts (room for %d)", (int)n_parts,
                         s ? (int)s->max_parts : 0);
    /* the total number of parts sets the grid: every rank must know it */
    int64_t total = n_parts;
    int rc = allreduce_sum_i64(&total, 1);
    if (rc) return rc;
    if (total < 0 || total > INT32_MAX)
        return cart_fail(CART_E_STATE, "cart_dist_sum_reduce: the ranks hold %lld parts in all",
                         (long long)total);
    const int F = 62 - ceil_log2(total > 0 ? total : 1);
    for (int64_t j0 = 0; j0 < s->n; j0 += s->chunk) {
        const int64_t m = s->n - j0 < s->chunk ? s->n - j0 : s->chunk;
        /* 1. the largest exponent of each element, over every part of every rank */
        for (int64_t j = 0; j < m; j++) s->exps[j] = EXP_NONE;
        for (int32_t p = 0; p < n_parts; p++) {
            const float *x = s->parts + (size_t)p * (size_t)s->n + j0;
            for (int64_t j = 0; j < m; j++) {
                int16_t e = exponent_of(x[j]);
                if (e > s->exps[j]) s->exps[j] = e;
            }
        }
        if ((rc = allreduce_max_i16(s->exps, m))) return rc;
        /* 2. each value on its element's grid 2^(E - F), added exactly */
        memset(s->fixed, 0, (size_t)m * sizeof(int64_t));
        for (int32_t p = 0; p < n_parts; p++) {
            const float *x = s->parts + (size_t)p * (size_t)s->n + j0;
            for (int64_t j = 0; j < m; j++) {
                int16_t e = s->exps[j];
                if (e == EXP_NONE || e == EXP_BAD) continue;
                /* |x| < 2^e <= 2^E, so |q| <= 2^F: the sum of `total` of them fits */
                s->fixed[j] += (int64_t)llrint(ldexp((double)x[j], F - e));
            }
        }
        if ((rc = allreduce_sum_i64(s->fixed, m))) return rc;
        /* 3. the exact sum, rounded once to double, scaled, rounded to float */
        for (int64_t j = 0; j < m; j++) {
            int16_t e = s->exps[j];
            if (e == EXP_BAD)
                out[j0 + j] = NAN;
            else if (e == EXP_NONE)
                out[j0 + j] = 0.0f;
            else
                out[j0 + j] = (float)(ldexp((double)s->fixed[j], e - F) * scale);
        }
    }
    return CART_OK;
}

void cart_dist_sum_traffic(int64_t n, int64_t *bytes, int32_t *allreduces) {
    int64_t rounds = n > 0 ? (n + SUM_CHUNK - 1) / SUM_CHUNK : 0;
    if (bytes) *bytes = (int64_t)sizeof(int64_t) + n * (int64_t)(sizeof(int16_t) + sizeof(int64_t));
    if (allreduces) *allreduces = (int32_t)(1 + 2 * rounds);
}

uint64_t cart_dist_hash(const void *data, int64_t bytes, uint64_t h) {
    const unsigned char *p = data;
    if (h == 0) h = 14695981039346656037ULL;
    for (int64_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* ------------------------------------------------------------------------- */
/* Ending the job. */

void cart_dist_fail_together(void) {
    job.failing_together = 1;
}

int32_t cart_dist_failing_together(void) {
    return job.failing_together;
}

int cart_dist_finalize(void) {
#ifdef CART_HAVE_MPI
    if (job.mpi) {
        if (job_comm != MPI_COMM_NULL) MPI_Comm_free(&job_comm);
        job.mpi = 0;
        if (MPI_Finalize() != MPI_SUCCESS) return cart_fail(CART_E_IO, "MPI_Finalize failed");
    }
#endif
    return CART_OK;
}

void cart_dist_abort(int32_t code, const char *message) {
    if (job.size > 1)
        fprintf(stderr, "cartridge: rank %d of %d: %s\n", (int)job.rank, (int)job.size,
                message ? message : "(no message)");
    else
        fprintf(stderr, "cartridge: %s\n", message ? message : "(no message)");
    fflush(stderr);
#ifdef CART_HAVE_MPI
    if (job.mpi && job.size > 1) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
#endif
}
