/*
 * avx512vnni.c - the x86-64 AVX-512 VNNI level: the avx512 level's table
 * with the integer block products on vpdpbusd (qk_avx512.h). Compiled with
 * VNNI enabled; cpu.c runs it only on a CPU that has it.
 */
#include "kernels.h"

#if defined(__x86_64__)

#include <pthread.h>

#include "dtype.h"

#define QK_VNNI 1
#include "qk_avx512.h"
#define QK_T 4
#define QK_FN qk_groups_avx512vnni
#include "qgeneric.h"

static cart_kernels table;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
    table = *cart_kernels_avx512();
    table.isa = 4; /* CART_ISA_AVX512VNNI */
    table.name = "avx512vnni";
    table.qk_groups = qk_groups_avx512vnni;
}

const cart_kernels *cart_kernels_avx512vnni(void) {
    pthread_once(&once, build);
    return &table;
}

#else

const cart_kernels *cart_kernels_avx512vnni(void) {
    return 0; /* not an x86-64 build */
}

#endif
