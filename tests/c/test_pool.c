/*
 * test_pool.c - the thread pool covers every index exactly once.
 */
#include <stdatomic.h>

#include "check.h"
#include "pool.h"

typedef struct cover {
    atomic_int *hits;
    atomic_int max_thread;
    int32_t size;
    atomic_int bad_thread;
} cover;

static void mark(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    cover *c = ctx;
    if (thread < 0 || thread >= c->size) atomic_store(&c->bad_thread, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void run_cover(cart_pool *pool, int64_t n, int64_t grain) {
    cover c = {0};
    c.hits = calloc((size_t)(n ? n : 1), sizeof *c.hits);
    c.size = cart_pool_size(pool);
    cart_pool_for(pool, n, grain, mark, &c);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += atomic_load(&c.hits[i]) != 1;
    CHECK_MSG(wrong == 0, "%lld of %lld indices not hit exactly once (n %lld, grain %lld)",
              (long long)wrong, (long long)n, (long long)n, (long long)grain);
    CHECK(atomic_load(&c.bad_thread) == 0);
    free(c.hits);
}

static void test_every_index_runs_exactly_once(void) {
    for (int threads = 1; threads <= 5; threads++) {
        cart_pool *pool = NULL;
        CHECK_OK(cart_pool_new(&pool, threads));
        CHECK(cart_pool_size(pool) == threads);
        int64_t sizes[] = {0, 1, 2, 7, 64, 1000, 100003};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            run_cover(pool, sizes[i], 1);
            run_cover(pool, sizes[i], 16);
        }
        for (int rep = 0; rep < 2000; rep++) run_cover(pool, 37, 1); /* many short jobs */
        cart_pool_free(pool);
    }
}

static void test_the_default_pool_follows_set_threads(void) {
    CHECK(cart_cpu_count() >= 1);
    CHECK_OK(cart_set_threads(3));
    CHECK(cart_threads() == 3);
    CHECK(cart_pool_size(cart_default_pool()) == 3);
    run_cover(cart_default_pool(), 12345, 1);
    CHECK_OK(cart_set_threads(0));
    CHECK(cart_threads() == cart_cpu_count());
    CHECK_ERR(cart_set_threads(-1), CART_E_ARG);
    cart_pool *p = NULL;
    CHECK_ERR(cart_pool_new(&p, 5000), CART_E_ARG);
    cart_pool_free(NULL);
}

int main(void) {
    RUN(test_every_index_runs_exactly_once);
    RUN(test_the_default_pool_follows_set_threads);
    return check_finish("pool");
}
