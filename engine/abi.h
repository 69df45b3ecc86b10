/*
 * abi.h - sizes of the public structs as the C compiler laid them out.
 *
 * The Lua side declares the same structs by reading these headers; its test
 * compares ffi.sizeof / ffi.alignof with this table to prove the two agree.
 */
#ifndef CART_ABI_H
#define CART_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_abi_struct {
    const char *name;  /* the C type name as written in the header: "cart_tensor" */
    uint64_t size;     /* sizeof */
    uint64_t align;    /* _Alignof */
} cart_abi_struct;

/* Number of entries in the table, and entry i (NULL out of range). */
int64_t cart_abi_struct_count(void);
const cart_abi_struct *cart_abi_struct_at(int64_t i);

#ifdef __cplusplus
}
#endif

#endif
