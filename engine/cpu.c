/*
 * cpu.c - CPU feature detection and the choice of kernel table (cpu.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "internal.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CART_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__)
#include <sys/auxv.h>
#define CART_ARM64 1
#endif

static const char *const isa_names[CART_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "avx512vnni", "neondot", "amx"};

const char *cart_isa_name(int32_t isa) {
    return isa >= 0 && isa < CART_ISA_COUNT ? isa_names[isa] : "unknown";
}

int cart_isa_parse(int32_t *isa, const char *name) {
    if (!isa || !name) return cart_fail(CART_E_ARG, "cart_isa_parse: NULL argument");
    for (int32_t i = 0; i < CART_ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            *isa = i;
            return CART_OK;
        }
    return cart_fail(CART_E_ARG, "unknown ISA level '%s': use scalar, avx2, avx512, avx512vnni, amx, neon or neondot", name);
}

/* ---- what the CPU has ----------------------------------------------------- */

typedef struct cpu_info {
    int avx2, fma, f16c, avx512; /* avx512: F, BW, VL, DQ with OS support for zmm state */
    int avx512vnni;
    int amx;
    int neon, neondot; /* neondot: SDOT (HWCAP_ASIMDDP) */
    char features[256];
} cpu_info;

static cpu_info cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void add_feature(const char *name, int have) {
    if (!have) return;
    size_t len = strlen(cpu.features);
    snprintf(cpu.features + len, sizeof cpu.features - len, " %s", name);
}

#if CART_X86
/* XCR0: which register state the OS saves on a context switch. */
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Asks Linux for the AMX tile data state (ARCH_REQ_XCOMP_PERM, feature 18):
 * without it the first tile instruction is a fault. 1 when granted. */
static int request_tiles(void) {
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}
#endif

static void detect(void) {
#if CART_X86
    unsigned a, b, c, d;
    snprintf(cpu.features, sizeof cpu.features, "x86-64:");
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    cpu.fma = (c >> 12) & 1;
    cpu.f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const int ymm_os = (xcr0 & 0x6) == 0x6;             /* SSE and AVX state */
    const int zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    int avx2 = 0, f = 0, bw = 0, vl = 0, dq = 0, vnni = 0, amx_tile = 0, amx_int8 = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        vnni = (c >> 11) & 1;
        amx_tile = (d >> 24) & 1;
        amx_int8 = (d >> 25) & 1;
        avx2 = (b >> 5) & 1;
        f = (b >> 16) & 1;
        dq = (b >> 17) & 1;
        bw = (b >> 30) & 1;
        vl = (b >> 31) & 1;
    }
    cpu.avx2 = avx && ymm_os && avx2 && cpu.fma && cpu.f16c;
    cpu.avx512 = cpu.avx2 && zmm_os && f && bw && vl && dq;
    cpu.avx512vnni = cpu.avx512 && vnni;
    /* the tile state (XCR0 bits 17, 18) is saved by the OS only for a
     * process that asks for it */
    const int tiles_os = (xcr0 & 0x60000) == 0x60000;
    cpu.amx = cpu.avx512vnni && amx_tile && amx_int8 && tiles_os && request_tiles();
    add_feature("avx", avx && ymm_os);
    add_feature("avx2", avx2 && ymm_os);
    add_feature("fma", cpu.fma);
    add_feature("f16c", cpu.f16c);
    add_feature("avx512f", f && zmm_os);
    add_feature("avx512bw", bw && zmm_os);
    add_feature("avx512vl", vl && zmm_os);
    add_feature("avx512dq", dq && zmm_os);
    add_feature("avx512vnni", vnni && zmm_os);
    add_feature("amx-int8", amx_tile && amx_int8 && tiles_os);
#elif CART_ARM64
    snprintf(cpu.features, sizeof cpu.features, "aarch64:");
    unsigned long hw = getauxval(AT_HWCAP);
    cpu.neon = 1; /* Advanced SIMD is part of every AArch64 CPU */
    add_feature("asimd", 1);
#ifdef HWCAP_FPHP
    add_feature("fphp", (hw & HWCAP_FPHP) != 0);
#endif
#ifdef HWCAP_ASIMDHP
    add_feature("asimdhp", (hw & HWCAP_ASIMDHP) != 0);
#endif
#ifdef HWCAP_ASIMDDP
    add_feature("asimddp", (hw & HWCAP_ASIMDDP) != 0);
    cpu.neondot = (hw & HWCAP_ASIMDDP) != 0;
#endif
    (void)hw;
#else
    snprintf(cpu.features, sizeof cpu.features, "other:");
#endif
}

const char *cart_cpu_features(void) {
    pthread_once(&cpu_once, detect);
    return cpu.features;
}

static const cart_kernels *table_of(int32_t isa) {
    switch (isa) {
    case CART_ISA_SCALAR:
        return cart_kernels_scalar();
    case CART_ISA_AVX2:
        return cart_kernels_avx2();
    case CART_ISA_AVX512:
        return cart_kernels_avx512();
    case CART_ISA_NEON:
        return cart_kernels_neon();
    case CART_ISA_AVX512VNNI:
        return cart_kernels_avx512vnni();
    case CART_ISA_NEONDOT:
        return cart_kernels_neondot();
    case CART_ISA_AMX:
        return cart_kernels_amx();
    default:
        return NULL;
    }
}

int32_t cart_isa_supported(int32_t isa) {
    pthread_once(&cpu_once, detect);
    /* the CPU first: a level's file is compiled for that level, so nothing
     * in it is called on a CPU without it */
    int cpu_has = 0;
    switch (isa) {
    case CART_ISA_SCALAR:
        cpu_has = 1;
        break;
    case CART_ISA_AVX2:
        cpu_has = cpu.avx2;
        break;
    case CART_ISA_AVX512:
        cpu_has = cpu.avx512;
        break;
    case CART_ISA_NEON:
        cpu_has = cpu.neon;
        break;
    case CART_ISA_AVX512VNNI:
        cpu_has = cpu.avx512vnni;
        break;
    case CART_ISA_NEONDOT:
        cpu_has = cpu.neondot;
        break;
    case CART_ISA_AMX:
        cpu_has = cpu.amx;
        break;
    default:
        break;
    }
    return cpu_has && table_of(isa) != NULL;
}

int32_t cart_isa_best(void) {
    static const int32_t order[] = {CART_ISA_AMX, CART_ISA_AVX512VNNI, CART_ISA_AVX512, CART_ISA_AVX2, CART_ISA_NEONDOT,
                                    CART_ISA_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (cart_isa_supported(order[i])) return order[i];
    return CART_ISA_SCALAR;
}

/* Whether this build has the level's kernels at all (without calling into
 * them). */
static int build_has(int32_t isa) {
#if CART_X86
    return isa == CART_ISA_SCALAR || isa == CART_ISA_AVX2 || isa == CART_ISA_AVX512 ||
           isa == CART_ISA_AVX512VNNI || isa == CART_ISA_AMX;
#elif CART_ARM64
    return isa == CART_ISA_SCALAR || isa == CART_ISA_NEON || isa == CART_ISA_NEONDOT;
#else
    return isa == CART_ISA_SCALAR;
#endif
}

/* ---- the choice ----------------------------------------------------------- */

static const cart_kernels *active;
static int init_status = CART_OK;
static char init_message[512];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* The names of the levels this machine supports, for messages. */
static void supported_list(char *buf, size_t size) {
    buf[0] = 0;
    for (int32_t i = 0; i < CART_ISA_COUNT; i++)
        if (cart_isa_supported(i)) {
            size_t len = strlen(buf);
            snprintf(buf + len, size - len, "%s%s", len ? ", " : "", isa_names[i]);
        }
}

static void choose(void) {
    const char *env = getenv("CART_ISA");
    int32_t isa = cart_isa_best();
    if (env && *env) {
        char have[96];
        supported_list(have, sizeof have);
        int32_t want;
        if (cart_isa_parse(&want, env) != CART_OK) {
            init_status = CART_E_ARG;
            snprintf(init_message, sizeof init_message,
                     "CART_ISA=%s is not a level: use one of %s (this machine), or unset it", env,
                     have);
        } else if (!cart_isa_supported(want)) {
            init_status = CART_E_UNSUPPORTED;
            snprintf(init_message, sizeof init_message,
                     "CART_ISA=%s: %s cannot run %s kernels (it has %s); use one of %s, or unset "
                     "CART_ISA",
                     env, build_has(want) ? "this CPU" : "this build", env,
                     cart_cpu_features(), have);
        } else {
            isa = want;
        }
    }
    active = table_of(init_status == CART_OK ? isa : CART_ISA_SCALAR);
}

int cart_isa_init(void) {
    pthread_once(&init_once, choose);
    if (init_status != CART_OK) return cart_fail(init_status, "%s", init_message);
    return CART_OK;
}

const cart_kernels *cart_kern(void) {
    pthread_once(&init_once, choose);
    return active;
}

int32_t cart_isa_active(void) {
    return cart_kern()->isa;
}

int cart_isa_set(int32_t isa) {
    if (!cart_isa_supported(isa)) {
        char have[96];
        supported_list(have, sizeof have);
        return cart_fail(CART_E_UNSUPPORTED, "ISA level %s cannot run here (%s); supported: %s",
                         cart_isa_name(isa), cart_cpu_features(), have);
    }
    pthread_once(&init_once, choose);
    active = table_of(isa);
    init_status = CART_OK;
    return CART_OK;
}

/* The bulk conversions of dtype.h run at the active level: F16C, AVX-512
 * or NEON conversions round to nearest even and keep NaNs quiet, as the
 * scalar functions of dtype.c do, and test_dtype checks every level against them. */
void cart_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
    cart_kern()->f16_to_f32(dst, src, n);
}

void cart_f32_to_f16_n(uint16_t *dst, const float *src, int64_t n) {
    cart_kern()->f32_to_f16(dst, src, n);
}

void cart_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
    cart_kern()->bf16_to_f32(dst, src, n);
}

void cart_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n) {
    cart_kern()->f32_to_bf16(dst, src, n);
}
