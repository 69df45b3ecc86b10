/*
 * torchpt.h - PyTorch's torch.save files (.pt, the zip format of torch 1.6
 * and later), read without running any of their code, and written so that
 * torch.load(..., weights_only=True) accepts them.
 *
 * A .pt file is a zip archive (zip.h) of one folder, "<archive>/", holding
 * data.pkl (a pickle of the saved object), data/<key> (each storage's raw
 * little-endian bytes), byteorder and version. Python's pickle runs
 * whatever callables a file names; this reader never calls anything. It is a
 * small pickle machine that builds plain values (None, bools, integers,
 * floats, strings, bytes, tuples, lists, dicts) and accepts only these
 * names (the ones torch's own weights_only unpickler allows for tensors,
 * plus the structure of nn.ParameterList read as data):
 *
 *   torch._utils._rebuild_tensor_v2      a tensor over a storage (below)
 *   torch._utils._rebuild_parameter       nn.Parameter: the tensor itself
 *   torch._utils._rebuild_parameter_with_state
 *   torch.<Type>Storage                   a storage's dtype, in its persistent id
 *   collections.OrderedDict               a dict
 *   builtins.set / frozenset (__builtin__ in protocol 2) a list
 *   torch.nn.modules.container.ParameterList / ParameterDict, and
 *   torch.nn.modules.module.Module        an object (CART_PK_OBJECT): its class
 *                                         name and the state BUILD gives it
 *
 * Any other global is refused when it is named (CART_E_UNSUPPORTED naming
 * module.name), as are the opcodes that would run code without one (INST,
 * OBJ, the extension registry, text persistent ids, out-of-band buffers),
 * each named with its byte. Storages come from BINPERSID tuples ('storage',
 * torch.<Type>Storage, key, location, numel) and are checked against
 * data/<key>: present, and holding numel elements. A tensor's shape,
 * strides and offset are checked to stay inside its storage. Limits: 8 dims,
 * 2^22 values, a stack depth of 2^16.
 *
 * The legacy format of torch before 1.6 (a pickle sequence or a tar file,
 * not a zip) and big-endian archives are refused with the way to convert
 * them.
 */
#ifndef CART_TORCHPT_H
#define CART_TORCHPT_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_pk_kind {
    CART_PK_NONE = 0,
    CART_PK_BOOL = 1,
    CART_PK_INT = 2,
    CART_PK_FLOAT = 3,
    CART_PK_STR = 4,   /* UTF-8 text (pickle's unicode) */
    CART_PK_BYTES = 5, /* bytes, and protocol 0-2 byte strings */
    CART_PK_TUPLE = 6,
    CART_PK_LIST = 7,
    CART_PK_DICT = 8,    /* insertion order kept */
    CART_PK_TENSOR = 9,  /* from _rebuild_tensor_v2 (a Parameter is its tensor) */
    CART_PK_OBJECT = 10, /* an allowed class built by NEWOBJ: class name and state */
    CART_PK_GLOBAL = 11, /* an allowed name not (yet) called */
    CART_PK_STORAGE = 12 /* a persistent id resolved to an archive entry */
} cart_pk_kind;

typedef struct cart_pk_value cart_pk_value;
typedef struct cart_pt cart_pt;

/* Opens and validates a .pt file (mapped read-only), or the same bytes in
 * caller-owned memory (`name` for messages, may be NULL). Errors:
 * CART_E_IO, CART_E_FORMAT (a damaged archive or pickle, naming the entry,
 * opcode or offset), CART_E_UNSUPPORTED (a refused name or opcode, a
 * legacy or big-endian file), CART_E_NOMEM. Close with cart_pt_close. */
int cart_pt_open(cart_pt **out, const char *path);
int cart_pt_open_memory(cart_pt **out, const void *data, uint64_t size, const char *name);
void cart_pt_close(cart_pt *pt);

/* The saved object, and the archive's folder name ("archive", "cache_last"). */
const cart_pk_value *cart_pt_root(const cart_pt *pt);
const char *cart_pt_archive(const cart_pt *pt);

/* Reading values. A call on the wrong kind returns 0 / NULL. */
int32_t cart_pk_kind_of(const cart_pk_value *v);
int64_t cart_pk_int(const cart_pk_value *v);    /* INT, BOOL */
double cart_pk_float(const cart_pk_value *v);   /* FLOAT, INT */
const char *cart_pk_str(const cart_pk_value *v, int64_t *len); /* STR, BYTES: NUL-terminated too */
int64_t cart_pk_len(const cart_pk_value *v);    /* TUPLE, LIST, DICT: items */
const cart_pk_value *cart_pk_item(const cart_pk_value *v, int64_t i); /* TUPLE, LIST item; DICT value */
const cart_pk_value *cart_pk_key(const cart_pk_value *v, int64_t i);  /* DICT key */
const cart_pk_value *cart_pk_get(const cart_pk_value *v, const char *key); /* DICT, by STR key */
const char *cart_pk_class(const cart_pk_value *v); /* OBJECT, GLOBAL: "module.name" */
const cart_pk_value *cart_pk_state(const cart_pk_value *v); /* OBJECT: what BUILD gave it, or NULL */

/* A tensor as stored: dtype (cart_dtype: F64 F32 F16 BF16 I64 I32 I16 I8 U8
 * BOOL), shape and strides in elements (row-major, outermost first), the
 * offset into its storage in elements. */
typedef struct cart_pt_tensor {
    int32_t dtype;
    int32_t ndim;
    int64_t shape[8];
    int64_t stride[8];
    int64_t offset;
    int64_t numel;
    int32_t requires_grad;
    int32_t parameter; /* 1: it was an nn.Parameter */
    const char *storage_key;
} cart_pt_tensor;

/* Fills *out for a TENSOR value (CART_E_ARG otherwise). */
int cart_pk_tensor(const cart_pk_value *v, cart_pt_tensor *out);

/* Copies a floating tensor's n = numel elements to dst as f32, row-major,
 * following its strides (F32 and BF16 exactly, F16 exactly, F64 rounded).
 * CART_E_UNSUPPORTED for an integer or bool tensor, CART_E_ARG when n is
 * not its element count. */
int cart_pt_tensor_f32(const cart_pk_value *v, float *dst, int64_t n);

/* Writing: a dict of lists of tensors, {key: [tensor, ...], ...}, with
 * optional aliases (a second key naming the same list object, as a pickle
 * memo reference: no data is repeated). Each tensor is written contiguous
 * in its own storage, dtype F32, F16 or BF16, 1-8 dims, requires_grad False.
 * The archive folder is `archive` (torch.save uses the file's stem). */
typedef struct cart_pt_out_tensor {
    int32_t dtype;
    int32_t ndim;
    int64_t shape[8];
    const void *data; /* row-major, shape's element count */
} cart_pt_out_tensor;

typedef struct cart_pt_out_list {
    const char *key;
    const char *alias; /* NULL: none */
    const cart_pt_out_tensor *tensors;
    int64_t n;
} cart_pt_out_list;

int cart_pt_write_lists(const char *path, const char *archive, const cart_pt_out_list *lists, int64_t n_lists);

#ifdef __cplusplus
}
#endif

#endif
