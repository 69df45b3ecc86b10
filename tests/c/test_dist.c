/*
 * test_dist.c - the job of processes and the reproducible sum.
 *
 * Alone (ctest's `dist` and `dist@nompi`, the second compiled without MPI)
 * it is a job of one: rank 0, size 1, collectives that return at once, and
 * the sum checked against an exact float64 reference, for any order of the
 * parts. Under `mpirun -np 2` (ctest's `dist@mpi2`, when the build has MPI)
 * the same cases run on every rank, and the sum must come out the same bits
 * however the parts are spread over the ranks.
 */
#include <stdlib.h>

#include "check.h"
#include "dist.h"
#include "rng.h"

static int launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

/* Launcher variables that are not there refuse or change nothing. */
static void test_refuses_a_slurm_step_without_an_mpi_launcher_but_not_a_batch_script(void) {
    if (launched()) return; /* the launcher's own variables are set: not this case */
    /* a step srun started without PMI: refused */
    setenv("SLURM_STEP_NUM_TASKS", "3", 1);
    CHECK_ERR(cart_dist_init(), CART_E_STATE);
    CHECK_ERROR_MENTIONS("srun --mpi=pmix");
    unsetenv("SLURM_STEP_NUM_TASKS");
    if (!cart_dist_built_with_mpi()) {
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
        CHECK_ERR(cart_dist_init(), CART_E_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("built without MPI");
        unsetenv("OMPI_COMM_WORLD_SIZE");
    }
    /* a batch script's own shell (the allocation's tasks, no step): one process */
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "3", 1);
    CHECK_OK(cart_dist_init());
    CHECK(cart_dist_size() == 1);
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
}

static void test_joins_the_job_once(void) {
    CHECK_OK(cart_dist_init());
    CHECK_OK(cart_dist_init());
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    printf("  %s; rank %d of %d; MPI in this build: %s\n", cart_dist_library(), (int)rank, (int)size,
           cart_dist_built_with_mpi() ? "yes" : "no");
    CHECK(size >= 1 && rank >= 0 && rank < size);
    if (!launched()) CHECK(size == 1 && rank == 0);
    if (!cart_dist_built_with_mpi()) CHECK(strstr(cart_dist_library(), "without MPI") != NULL);
}

static void test_barrier_broadcast_and_allgather(void) {
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    CHECK_OK(cart_dist_barrier());
    uint64_t v[3] = {0, 0, 0};
    if (rank == size - 1) v[0] = 11, v[1] = 22, v[2] = 33;
    CHECK_OK(cart_dist_broadcast(v, sizeof v, size - 1));
    CHECK(v[0] == 11 && v[1] == 22 && v[2] == 33);
    int64_t mine[2] = {rank, 100 + rank};
    int64_t *all = calloc((size_t)size * 2, sizeof(int64_t));
    CHECK_OK(cart_dist_allgather(all, mine, sizeof mine));
    for (int32_t r = 0; r < size; r++) CHECK(all[2 * r] == r && all[2 * r + 1] == 100 + r);
    CHECK_ERR(cart_dist_broadcast(v, sizeof v, size), CART_E_ARG);
    CHECK_ERR(cart_dist_allgather(all, all, 8), CART_E_ARG); /* overlap */
    free(all);
}

/* Parts of n random values with exponents in [-10, 10]: their exact sum has
 * at most 24 + 20 + 3 bits, so a float64 sum in any order is exact. */
static float *bounded_parts(int32_t count, int64_t n, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)count * (size_t)n);
    cart_rng r;
    cart_rng_seed(&r, seed);
    for (int64_t i = 0; i < count * n; i++) {
        float m = 1.0f + cart_rng_uniform(&r); /* [1, 2) with 24 bits */
        int e = (int)cart_rng_below(&r, 21) - 10;
        x[i] = ldexpf(cart_rng_below(&r, 2) ? m : -m, e);
    }
    return x;
}

/* Reduces the parts listed in own[0..k) of all[count][n] on this rank. */
static int reduce_subset(float *out, const float *all, int64_t n, const int32_t *own, int32_t k,
                         int32_t room, double scale) {
    cart_dist_sum *s;
    int rc = cart_dist_sum_new(&s, n, room);
    if (rc) return rc;
    for (int32_t i = 0; i < k; i++)
        memcpy(cart_dist_sum_part(s, i), all + (size_t)own[i] * (size_t)n, sizeof(float) * (size_t)n);
    rc = cart_dist_sum_reduce(s, k, scale, out);
    cart_dist_sum_free(s);
    return rc;
}

static void test_sum_is_the_exact_sum_rounded_once(void) {
    const int32_t count = 7;
    const int64_t n = 1000;
    const double scale = 1.0 / 7.0;
    float *all = bounded_parts(count, n, 5);
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    int32_t own[7], k = 0;
    for (int32_t i = 0; i < count; i++)
        if (i % size == rank) own[k++] = i; /* round robin over the ranks */
    float *out = malloc(sizeof(float) * n);
    CHECK_OK(reduce_subset(out, all, n, own, k, count, scale));
    double worst = 0;
    for (int64_t j = 0; j < n; j++) {
        double exact = 0;
        for (int32_t i = count - 1; i >= 0; i--) exact += all[i * n + j];
        float want = (float)(exact * scale);
        /* a branch, not fmax: aarch64 gcc 12 -O3 dies vectorizing this
         * fmax reduction (internal compiler error in vect_transform_reduction) */
        double d = fabs((double)out[j] - want);
        if (!(d <= worst)) worst = d; /* a NaN is kept, so it fails the check */
    }
    CHECK_MAXDIFF("sum of 7 parts vs the exact float64 sum rounded once", worst, 0.0);
    free(out);
    free(all);
}

static const uint64_t WIDE_SUM_HASH = 0x09f6ffe0a0552f78ULL;

/* The same parts, spread three ways: round robin, in blocks, all on the last
 * rank; and in reverse order. Every way gives the same bits. */
static void test_sum_has_the_same_bits_however_the_parts_are_spread(void) {
    const int32_t count = 5;
    const int64_t n = 4099;
    float *all = malloc(sizeof(float) * count * n);
    cart_rng r;
    cart_rng_seed(&r, 9);
    /* values of every magnitude a gradient may hold, denormals included,
     * made with exact operations only (no libm), so they are the same on
     * every machine */
    for (int64_t i = 0; i < count * n; i++) {
        /* one draw per statement: the order of a call's arguments is
         * unspecified (x86-64 gcc takes them right to left, AArch64 left to
         * right), and the hash below needs the same parts on every machine */
        float m = 1.0f + cart_rng_uniform(&r);
        int e = (int)cart_rng_below(&r, 271) - 150;
        all[i] = ldexpf(cart_rng_below(&r, 2) ? m : -m, e);
    }
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    float *ways[4];
    int32_t own[5], k;
    for (int w = 0; w < 4; w++) {
        k = 0;
        for (int32_t i = 0; i < count; i++) {
            int32_t owner = w == 0 ? i % size : w == 1 ? (int32_t)((int64_t)i * size / count) : size - 1;
            int32_t part = w == 3 ? count - 1 - i : i;
            if (owner == rank) own[k++] = part;
        }
        ways[w] = malloc(sizeof(float) * n);
        CHECK_OK(reduce_subset(ways[w], all, n, own, k, count, 1.0));
    }
    int differ = 0;
    for (int w = 1; w < 4; w++) differ += memcmp(ways[0], ways[w], sizeof(float) * n) != 0;
    printf("  %d ranks: round robin, blocks, all on one rank, reversed: %d of 3 differ in any bit\n",
           (int)size, differ);
    CHECK(differ == 0);
    /* and the same bits as with any other number of ranks, on any machine:
     * the value a job of one computed when this test was written */
    uint64_t h = cart_dist_hash(ways[0], (int64_t)sizeof(float) * n, 0);
    printf("  FNV-1a of the sum: %016llx (expected %016llx)\n", (unsigned long long)h,
           (unsigned long long)WIDE_SUM_HASH);
    CHECK(h == WIDE_SUM_HASH);
    /* against a float64 sum: at most half a float ulp of it, beside what the
     * grid drops (2^-57 of the largest part) and denormal rounding */
    double worst = 0;
    for (int64_t j = 0; j < n; j++) {
        double ref = 0, big = 0;
        for (int32_t i = 0; i < count; i++) ref += all[i * n + j], big = fmax(big, fabs(all[i * n + j]));
        double unit = ldexp(fabs(ref), -24) + ldexp(big, -50) + 0x1p-150;
        worst = fmax(worst, fabs(ways[0][j] - ref) / unit);
    }
    CHECK_MAXDIFF("|sum - float64 sum| / (2^-24 |float64 sum| + 2^-50 largest + 2^-150)", worst, 1.0);
    for (int w = 0; w < 4; w++) free(ways[w]);
    free(all);
}

static void test_sum_keeps_what_a_float_sum_loses_and_marks_non_finite(void) {
    /* element 0: 1 + 2^-30 - 1 (a float sum gives 0); 1: all zero; 2: a NaN;
     * 3: an infinity; 4: denormals; 5: -0 */
    const int64_t n = 6;
    float all[3][6] = {{1.0f, 0.0f, 1.0f, INFINITY, 0x1p-149f, -0.0f},
                       {0x1p-30f, 0.0f, NAN, 1.0f, 0x1p-149f, 0.0f},
                       {-1.0f, 0.0f, 2.0f, 1.0f, 0x1p-148f, -0.0f}};
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    int32_t own[3], k = 0;
    for (int32_t i = 0; i < 3; i++)
        if (i % size == rank) own[k++] = i;
    float out[6];
    CHECK_OK(reduce_subset(out, &all[0][0], n, own, k, 3, 1.0));
    printf("  1 + 2^-30 - 1 = %a (a float sum: %a)\n", out[0], (double)((1.0f + 0x1p-30f) - 1.0f));
    CHECK(out[0] == 0x1p-30f);
    CHECK(out[1] == 0.0f && !signbit(out[1]));
    CHECK(isnan(out[2]) && isnan(out[3]));
    CHECK(out[4] == 0x1p-147f);
    CHECK(out[5] == 0.0f);
    /* no parts anywhere: zeros */
    cart_dist_sum *s;
    CHECK_OK(cart_dist_sum_new(&s, n, 1));
    for (int j = 0; j < n; j++) out[j] = 5;
    CHECK_OK(cart_dist_sum_reduce(s, 0, 1.0, out));
    for (int j = 0; j < n; j++) CHECK(out[j] == 0.0f);
    /* bad arguments */
    CHECK_ERR(cart_dist_sum_reduce(s, 2, 1.0, out), CART_E_ARG);
    CHECK(cart_dist_sum_part(s, 1) == NULL && cart_dist_sum_part(s, -1) == NULL);
    cart_dist_sum_free(s);
    CHECK_ERR(cart_dist_sum_new(&s, 0, 1), CART_E_ARG);
    CHECK(s == NULL);
    cart_dist_sum_free(NULL);
}

/* More values than one round holds (4 Mi), so the rounds' seams are crossed;
 * out is the first part itself. */
static void test_sum_crosses_rounds_in_place(void) {
    const int64_t n = ((int64_t)1 << 22) + 5;
    int32_t rank = cart_dist_rank(), size = cart_dist_size();
    cart_dist_sum *s;
    CHECK_OK(cart_dist_sum_new(&s, n, 2));
    float *a = cart_dist_sum_part(s, 0), *b = cart_dist_sum_part(s, 1);
    for (int64_t j = 0; j < n; j++) a[j] = (float)(j % 1000) * 0.5f, b[j] = 0.25f;
    /* rank 0 holds both parts; the others none */
    CHECK_OK(cart_dist_sum_reduce(s, rank == 0 ? 2 : 0, 2.0, a));
    int64_t bad = 0;
    for (int64_t j = 0; j < n; j++) bad += a[j] != (float)(j % 1000) + 0.5f;
    printf("  %lld values over %d ranks: %lld wrong\n", (long long)n, (int)size, (long long)bad);
    CHECK(bad == 0);
    int64_t bytes;
    int32_t calls;
    cart_dist_sum_traffic(n, &bytes, &calls);
    CHECK(calls == 5 && bytes == 8 + n * 10);
    cart_dist_sum_free(s);
}

static void test_hash_is_fnv1a_64(void) {
    /* the published FNV-1a 64 test vectors */
    CHECK(cart_dist_hash("", 0, 0) == 0xcbf29ce484222325ULL);
    CHECK(cart_dist_hash("a", 1, 0) == 0xaf63dc4c8601ec8cULL);
    CHECK(cart_dist_hash("foobar", 6, 0) == 0x85944171f73967e8ULL);
    CHECK(cart_dist_hash("bar", 3, cart_dist_hash("foo", 3, 0)) == 0x85944171f73967e8ULL);
}

int main(void) {
    RUN(test_refuses_a_slurm_step_without_an_mpi_launcher_but_not_a_batch_script);
    RUN(test_joins_the_job_once);
    RUN(test_barrier_broadcast_and_allgather);
    RUN(test_sum_is_the_exact_sum_rounded_once);
    RUN(test_sum_has_the_same_bits_however_the_parts_are_spread);
    RUN(test_sum_keeps_what_a_float_sum_loses_and_marks_non_finite);
    RUN(test_sum_crosses_rounds_in_place);
    RUN(test_hash_is_fnv1a_64);
    int rc = check_finish("dist");
    cart_dist_finalize();
    return rc;
}
