/*
 * neondot.c - the AArch64 level with ARMv8.2's dot-product instructions
 * (FEAT_DotProd: Cortex-A55/A76, Neoverse N1, Apple M1 and later): the neon
 * level's table with the integer block products on SDOT (qk_neon.h).
 * Compiled with +dotprod; cpu.c runs it only on a CPU whose HWCAP says
 * ASIMDDP.
 */
#include "kernels.h"

#if defined(__aarch64__)

#include <pthread.h>

#include "dtype.h"

#define QK_SDOT 1
#include "qk_neon.h"
#define QK_T 4
#define QK_FN qk_groups_neondot
#include "qgeneric.h"

static cart_kernels table;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
    table = *cart_kernels_neon();
    table.isa = 5; /* CART_ISA_NEONDOT */
    table.name = "neondot";
    table.qk_groups = qk_groups_neondot;
}

const cart_kernels *cart_kernels_neondot(void) {
    pthread_once(&once, build);
    return &table;
}

#else

const cart_kernels *cart_kernels_neondot(void) {
    return 0; /* not an AArch64 build */
}

#endif
