/*
 * cpu.h - which instruction-set level the engine's kernels run at.
 *
 * One build carries the kernels of every level its target architecture has
 * (x86-64: scalar, avx2, avx512, avx512vnni, amx; AArch64: scalar, neon,
 * neondot) and picks, on first
 * use, the best one the CPU supports: cpuid and xgetbv on x86 (the OS must
 * save the vector registers too), getauxval(AT_HWCAP) on Linux/AArch64.
 * The environment variable CART_ISA=scalar|avx2|avx512|avx512vnni|amx|neon|neondot forces a level.
 * Naming one the CPU or the build lacks is an error that cart_isa_init()
 * returns, and with it every model load and matmul call: the cartridge
 * executable prints it and exits 1 rather than run at another level.
 *
 *   scalar  plain C, any CPU: the definition every other level reproduces
 *   avx2    x86-64 with AVX2, FMA and F16C (Haswell, Zen 1 and later)
 *   avx512  x86-64 with AVX-512 F, BW, VL and DQ (Skylake-X, Zen 4 and later)
 *   neon    AArch64 Advanced SIMD (every AArch64 CPU)
 *   avx512vnni  avx512 plus AVX-512 VNNI (Ice Lake, Zen 4 and later): the
 *           integer block products on vpdpbusd, everything else as avx512
 *   amx     avx512vnni plus AMX-TILE and AMX-INT8 (Sapphire Rapids and later
 *           Xeons), which Linux grants a process on request (arch_prctl):
 *           the integer block products of 16 tokens at a time (prefill,
 *           batched decode) on tile products, fewer tokens as avx512vnni
 *   neondot neon plus the dot-product instructions (ARMv8.2 DotProd: A55,
 *           A76, Neoverse N1, Apple M1 and later): the integer block
 *           products on SDOT, everything else as neon
 *
 * Every level computes the same bits. Each output element of a product is
 * one chain of fused multiply-adds in a fixed order, each vector sum a fixed
 * tree, each conversion round-to-nearest-even; the levels differ only in how
 * many of those operations one instruction does. So the gate, batch
 * invariance (matmul.h) and lossless speculation hold at every level, and a
 * result computed at one level equals the same result at any other
 * (test_kernels checks each level the machine has against scalar, bit for
 * bit).
 */
#ifndef CART_CPU_H
#define CART_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_isa {
    CART_ISA_SCALAR = 0,
    CART_ISA_AVX2 = 1,
    CART_ISA_AVX512 = 2,
    CART_ISA_NEON = 3,
    CART_ISA_AVX512VNNI = 4,
    CART_ISA_NEONDOT = 5,
    CART_ISA_AMX = 6,
    CART_ISA_COUNT = 7
} cart_isa;

/* The level's name ("scalar", "avx2", ...), or "unknown". Static storage. */
const char *cart_isa_name(int32_t isa);

/* The level a name means, in *isa; CART_E_ARG naming the valid names when
 * `name` is none of them. */
int cart_isa_parse(int32_t *isa, const char *name);

/* 1 when this build has the level's kernels and this CPU can run them. */
int32_t cart_isa_supported(int32_t isa);

/* The best level this build and CPU support. */
int32_t cart_isa_best(void);

/* Chooses the level once per process: CART_ISA when set, else the best.
 * Every kernel call does this implicitly; call it first to get the error of a
 * bad CART_ISA as a status (CART_E_ARG for an unknown name, CART_E_UNSUPPORTED
 * for a level the CPU or build lacks, naming what it has) instead of an exit. */
int cart_isa_init(void);

/* The level in use (after cart_isa_init, which it calls). */
int32_t cart_isa_active(void);

/* Switches to `isa` (for tests and side-by-side comparisons). Not while
 * another thread is computing. CART_E_UNSUPPORTED when the level is not
 * supported here. */
int cart_isa_set(int32_t isa);

/* What this CPU has, for messages: e.g. "x86-64: avx2 fma f16c avx512f ...".
 * Static storage. */
const char *cart_cpu_features(void);

#ifdef __cplusplus
}
#endif

#endif
