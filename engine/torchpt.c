/*
 * torchpt.c - torch.save archives: the pickle machine that builds plain
 * values and never calls anything (torchpt.h lists what it accepts), the
 * storages resolved against the zip's entries, tensors read as f32, and the
 * writer of a dict of lists of tensors.
 *
 * Every value is a heap node listed in the archive's `nodes`, freed with it;
 * lists and dicts are mutable (APPEND, SETITEM reach them through the memo),
 * so values are shared by pointer, never copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"
#include "torchpt.h"
#include "utf8.h"
#include "zip.h"

enum {
    MAX_VALUES = 1 << 22, /* about 1 GiB of nodes at most; a cartridge needs about 20 per tensor */
    MAX_DEPTH = 1 << 16,
    MAX_MEMO = 1 << 24,
    MAX_DIMS = 8,
};

/* The names a file may use (torchpt.h). */
typedef enum pk_global {
    G_REBUILD_TENSOR_V2,
    G_REBUILD_PARAMETER,
    G_REBUILD_PARAMETER_STATE,
    G_ORDERED_DICT,
    G_SET,
    G_STORAGE, /* torch.<Type>Storage: dtype in the node */
    G_CLASS,   /* a class read as data (NEWOBJ) */
} pk_global;

struct cart_pk_value {
    int32_t kind;
    int64_t n, cap;             /* TUPLE, LIST: items; DICT: pairs (items holds 2n) */
    struct cart_pk_value **items;
    int64_t i;                  /* INT, BOOL; GLOBAL: pk_global */
    double f;
    char *str;                  /* STR, BYTES; OBJECT, GLOBAL: "module.name" */
    int64_t len;
    struct cart_pk_value *state; /* OBJECT */
    int32_t dtype;              /* GLOBAL storage type, STORAGE */
    cart_pt_tensor t;           /* TENSOR; STORAGE: storage_key and numel */
    const uint8_t *data;        /* TENSOR, STORAGE: the storage's first byte */
};

struct cart_pt {
    char *name;
    char *archive;
    cart_mapping map;
    cart_zip *zip;
    cart_pk_value **nodes;
    int64_t n_nodes, cap_nodes;
    cart_pk_value *root;
};

/* The machine's state while data.pkl is read. */
typedef struct pk_vm {
    cart_pt *pt;
    const uint8_t *p, *end, *start;
    cart_pk_value **stack;
    int64_t sp, stack_cap;
    int64_t *marks;
    int64_t n_marks, marks_cap;
    cart_pk_value **memo;
    int64_t memo_cap, memo_count; /* MEMOIZE stores at memo_count, as Python's len(memo) */
    uint8_t op;  /* the opcode being run, for messages */
    int status;  /* why the last value could not be made */
} pk_vm;

static const char *kind_name(int32_t k) {
    static const char *const names[] = {"None", "bool", "int", "float", "str", "bytes", "tuple",
                                        "list", "dict", "tensor", "object", "global", "storage"};
    return k >= 0 && k <= CART_PK_STORAGE ? names[k] : "?";
}

static int64_t vm_offset(const pk_vm *vm) { return (int64_t)(vm->p - vm->start); }

static int vm_fail(pk_vm *vm, int status, const char *what) {
    vm->status = status;
    return cart_fail(status, "%s: data.pkl at byte %lld (opcode 0x%02x): %s", vm->pt->name, (long long)vm_offset(vm) - 1,
                     vm->op, what);
}

/* ---- values -------------------------------------------------------------- */

static cart_pk_value *new_value(pk_vm *vm, int32_t kind) {
    cart_pt *pt = vm->pt;
    if (pt->n_nodes >= MAX_VALUES) {
        vm_fail(vm, CART_E_FORMAT, "more than 2^22 values: not a cartridge's pickle");
        return NULL;
    }
    if (pt->n_nodes == pt->cap_nodes) {
        int64_t cap = pt->cap_nodes ? 2 * pt->cap_nodes : 256;
        cart_pk_value **grown = cart_realloc(pt->nodes, (size_t)cap * sizeof *grown, "pickle values");
        if (!grown) return NULL;
        pt->nodes = grown, pt->cap_nodes = cap;
    }
    cart_pk_value *v = cart_calloc(1, sizeof *v, "pickle value");
    if (!v) return NULL;
    v->kind = kind;
    pt->nodes[pt->n_nodes++] = v;
    return v;
}

/* Appends one item (TUPLE, LIST) or one slot of a pair (DICT: two calls). */
static int push_item(cart_pk_value *c, cart_pk_value *item) {
    if (c->len == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 4;
        cart_pk_value **grown = cart_realloc(c->items, (size_t)cap * sizeof *grown, "pickle items");
        if (!grown) return CART_E_NOMEM;
        c->items = grown, c->cap = cap;
    }
    c->items[c->len++] = item;
    c->n = c->kind == CART_PK_DICT ? c->len / 2 : c->len;
    return CART_OK;
}

static cart_pk_value *new_text(pk_vm *vm, int32_t kind, const uint8_t *s, uint64_t n) {
    cart_pk_value *v = new_value(vm, kind);
    if (!v) return NULL;
    v->str = cart_malloc((size_t)n + 1, "pickle string");
    if (!v->str) return NULL;
    memcpy(v->str, s, (size_t)n);
    v->str[n] = 0;
    v->len = (int64_t)n;
    return v;
}

static void free_values(cart_pt *pt) {
    for (int64_t i = 0; i < pt->n_nodes; i++) {
        free(pt->nodes[i]->items);
        free(pt->nodes[i]->str);
        free(pt->nodes[i]);
    }
    free(pt->nodes);
    pt->nodes = NULL;
    pt->n_nodes = pt->cap_nodes = 0;
}

/* ---- the stack, marks and memo -------------------------------------------- */

static int push(pk_vm *vm, cart_pk_value *v) {
    if (!v) return vm->status ? vm->status : CART_E_NOMEM;
    if (vm->sp >= MAX_DEPTH) return vm_fail(vm, CART_E_FORMAT, "the stack passes 2^16 values");
    if (vm->sp == vm->stack_cap) {
        int64_t cap = vm->stack_cap ? 2 * vm->stack_cap : 64;
        cart_pk_value **grown = cart_realloc(vm->stack, (size_t)cap * sizeof *grown, "pickle stack");
        if (!grown) return CART_E_NOMEM;
        vm->stack = grown, vm->stack_cap = cap;
    }
    vm->stack[vm->sp++] = v;
    return CART_OK;
}

static cart_pk_value *pop(pk_vm *vm) {
    int64_t floor = vm->n_marks ? vm->marks[vm->n_marks - 1] : 0;
    if (vm->sp <= floor) {
        vm_fail(vm, CART_E_FORMAT, vm->sp ? "pops past a mark" : "pops an empty stack");
        return NULL;
    }
    return vm->stack[--vm->sp];
}

static cart_pk_value *top(pk_vm *vm) {
    int64_t floor = vm->n_marks ? vm->marks[vm->n_marks - 1] : 0;
    if (vm->sp <= floor) {
        vm_fail(vm, CART_E_FORMAT, "reads an empty stack");
        return NULL;
    }
    return vm->stack[vm->sp - 1];
}

static int push_mark(pk_vm *vm) {
    if (vm->n_marks >= MAX_DEPTH) return vm_fail(vm, CART_E_FORMAT, "more than 2^16 open marks");
    if (vm->n_marks == vm->marks_cap) {
        int64_t cap = vm->marks_cap ? 2 * vm->marks_cap : 16;
        int64_t *grown = cart_realloc(vm->marks, (size_t)cap * sizeof *grown, "pickle marks");
        if (!grown) return CART_E_NOMEM;
        vm->marks = grown, vm->marks_cap = cap;
    }
    vm->marks[vm->n_marks++] = vm->sp;
    return CART_OK;
}

/* Pops back to the last mark; the values above it are stack[*from .. sp). */
static int pop_mark(pk_vm *vm, int64_t *from) {
    if (!vm->n_marks) return vm_fail(vm, CART_E_FORMAT, "no mark to pop to");
    *from = vm->marks[--vm->n_marks];
    return CART_OK;
}

static int memo_put(pk_vm *vm, uint64_t idx) {
    cart_pk_value *v = top(vm);
    if (!v) return CART_E_FORMAT;
    if (idx >= MAX_MEMO) return vm_fail(vm, CART_E_FORMAT, "a memo index past 2^24");
    if ((int64_t)idx >= vm->memo_cap) {
        int64_t cap = vm->memo_cap ? vm->memo_cap : 64;
        while (cap <= (int64_t)idx) cap *= 2;
        cart_pk_value **grown = cart_realloc(vm->memo, (size_t)cap * sizeof *grown, "pickle memo");
        if (!grown) return CART_E_NOMEM;
        memset(grown + vm->memo_cap, 0, (size_t)(cap - vm->memo_cap) * sizeof *grown);
        vm->memo = grown, vm->memo_cap = cap;
    }
    if (!vm->memo[idx]) vm->memo_count++;
    vm->memo[idx] = v;
    return CART_OK;
}

static int memo_get(pk_vm *vm, uint64_t idx) {
    if ((int64_t)idx >= vm->memo_cap || !vm->memo[idx]) return vm_fail(vm, CART_E_FORMAT, "gets an unset memo entry");
    return push(vm, vm->memo[idx]);
}

/* ---- reading the byte stream ------------------------------------------------ */

static int need(pk_vm *vm, uint64_t n) {
    if ((uint64_t)(vm->end - vm->p) < n) return vm_fail(vm, CART_E_FORMAT, "cut short: an argument runs past the end");
    return CART_OK;
}

static uint64_t read_le(pk_vm *vm, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)vm->p[i] << (8 * i);
    vm->p += n;
    return v;
}

/* ---- names ------------------------------------------------------------------ */

typedef struct storage_name {
    const char *name;
    int32_t dtype;
} storage_name;

static const storage_name storage_names[] = {
    {"FloatStorage", CART_F32},   {"DoubleStorage", CART_F64}, {"HalfStorage", CART_F16}, {"BFloat16Storage", CART_BF16},
    {"LongStorage", CART_I64},    {"IntStorage", CART_I32},    {"ShortStorage", CART_I16}, {"CharStorage", CART_I8},
    {"ByteStorage", CART_U8},     {"BoolStorage", CART_BOOL},
};

/* The allowed global module.name as a GLOBAL node, or a refusal naming it. */
static cart_pk_value *make_global(pk_vm *vm, const char *module, const char *name) {
    int64_t id = -1;
    int32_t dtype = CART_DTYPE_INVALID;
    if (strcmp(module, "torch._utils") == 0) {
        if (strcmp(name, "_rebuild_tensor_v2") == 0) id = G_REBUILD_TENSOR_V2;
        if (strcmp(name, "_rebuild_parameter") == 0) id = G_REBUILD_PARAMETER;
        if (strcmp(name, "_rebuild_parameter_with_state") == 0) id = G_REBUILD_PARAMETER_STATE;
    } else if (strcmp(module, "collections") == 0 && strcmp(name, "OrderedDict") == 0) {
        id = G_ORDERED_DICT;
    } else if ((strcmp(module, "builtins") == 0 || strcmp(module, "__builtin__") == 0) &&
               (strcmp(name, "set") == 0 || strcmp(name, "frozenset") == 0)) {
        id = G_SET;
    } else if (strcmp(module, "torch") == 0) {
        for (size_t i = 0; i < sizeof storage_names / sizeof storage_names[0]; i++)
            if (strcmp(name, storage_names[i].name) == 0) id = G_STORAGE, dtype = storage_names[i].dtype;
    } else if (strcmp(module, "torch.nn.modules.container") == 0 &&
               (strcmp(name, "ParameterList") == 0 || strcmp(name, "ParameterDict") == 0)) {
        id = G_CLASS;
    }
    if (id < 0) {
        vm->status = CART_E_UNSUPPORTED;
        cart_fail(CART_E_UNSUPPORTED,
                  "%s: data.pkl at byte %lld names %s.%s, which this reader refuses: it builds tensors, lists, "
                  "dicts and nn.ParameterList structure only, and never runs a file's code",
                  vm->pt->name, (long long)vm_offset(vm), module, name);
        return NULL;
    }
    size_t n = strlen(module) + strlen(name) + 2;
    cart_pk_value *v = new_value(vm, CART_PK_GLOBAL);
    if (!v || !(v->str = cart_malloc(n, "pickle global"))) return NULL;
    snprintf(v->str, n, "%s.%s", module, name);
    v->len = (int64_t)n - 1;
    v->i = id;
    v->dtype = dtype;
    return v;
}

/* GLOBAL: "module\nname\n" in the stream. */
static int op_global(pk_vm *vm) {
    const uint8_t *nl1 = memchr(vm->p, '\n', (size_t)(vm->end - vm->p));
    const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(vm->end - nl1 - 1)) : NULL;
    if (!nl2 || nl1 - vm->p > 255 || nl2 - nl1 > 256) return vm_fail(vm, CART_E_FORMAT, "a GLOBAL without two short lines");
    size_t module_len = (size_t)(nl1 - vm->p), name_len = (size_t)(nl2 - nl1 - 1);
    char module[256], name[256];
    memcpy(module, vm->p, module_len);
    module[module_len] = 0;
    memcpy(name, nl1 + 1, name_len);
    name[name_len] = 0;
    vm->p = nl2 + 1;
    if (strlen(module) != module_len || strlen(name) != name_len)
        return vm_fail(vm, CART_E_FORMAT, "a global name with a NUL in it");
    return push(vm, make_global(vm, module, name));
}

static int op_stack_global(pk_vm *vm) {
    cart_pk_value *name = pop(vm), *module = name ? pop(vm) : NULL;
    if (!module) return CART_E_FORMAT;
    if (module->kind != CART_PK_STR || name->kind != CART_PK_STR)
        return vm_fail(vm, CART_E_FORMAT, "STACK_GLOBAL of values that are not strings");
    if ((int64_t)strlen(module->str) != module->len || (int64_t)strlen(name->str) != name->len)
        return vm_fail(vm, CART_E_FORMAT, "a global name with a NUL in it");
    return push(vm, make_global(vm, module->str, name->str));
}

/* ---- scalars and strings -------------------------------------------------------- */

static int push_int(pk_vm *vm, int64_t i, int32_t kind) {
    cart_pk_value *v = new_value(vm, kind);
    if (v) v->i = i, v->f = (double)i;
    return push(vm, v);
}

/* LONG1 / LONG4: n little-endian two's complement bytes, at most 8. */
static int op_long(pk_vm *vm, int len_bytes) {
    int rc = need(vm, (uint64_t)len_bytes);
    if (rc != CART_OK) return rc;
    uint64_t n = read_le(vm, len_bytes);
    if (n > 8) return vm_fail(vm, CART_E_UNSUPPORTED, "an integer of more than 8 bytes");
    if ((rc = need(vm, n)) != CART_OK) return rc;
    uint64_t u = read_le(vm, (int)n);
    if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    return push_int(vm, (int64_t)u, CART_PK_INT);
}

static int op_binfloat(pk_vm *vm) {
    int rc = need(vm, 8);
    if (rc != CART_OK) return rc;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u = u << 8 | vm->p[i]; /* big-endian */
    vm->p += 8;
    double d;
    memcpy(&d, &u, sizeof d);
    cart_pk_value *v = new_value(vm, CART_PK_FLOAT);
    if (v) v->f = d;
    return push(vm, v);
}

/* A string whose length takes len_bytes bytes; kind STR is checked as UTF-8. */
static int op_text(pk_vm *vm, int len_bytes, int32_t kind) {
    int rc = need(vm, (uint64_t)len_bytes);
    if (rc != CART_OK) return rc;
    uint64_t n = read_le(vm, len_bytes);
    if ((rc = need(vm, n)) != CART_OK) return rc;
    if (kind == CART_PK_STR && cart_utf8_invalid_offset((const char *)vm->p, (int64_t)n) >= 0)
        return vm_fail(vm, CART_E_FORMAT, "a unicode string that is not valid UTF-8");
    cart_pk_value *v = new_text(vm, kind, vm->p, n);
    vm->p += n;
    return push(vm, v);
}

/* ---- containers ---------------------------------------------------------------- */

/* TUPLE, LIST, DICT from the values above the last mark. */
static int op_from_mark(pk_vm *vm, int32_t kind) {
    int64_t from = 0;
    int rc = pop_mark(vm, &from);
    if (rc != CART_OK) return rc;
    if (kind == CART_PK_DICT && (vm->sp - from) % 2)
        return vm_fail(vm, CART_E_FORMAT, "DICT of an odd number of values");
    cart_pk_value *v = new_value(vm, kind);
    if (!v) return CART_E_NOMEM;
    for (int64_t i = from; i < vm->sp && rc == CART_OK; i++) rc = push_item(v, vm->stack[i]);
    vm->sp = from;
    return rc == CART_OK ? push(vm, v) : rc;
}

static int op_tuple_n(pk_vm *vm, int n) {
    cart_pk_value *items[3] = {0};
    for (int i = n - 1; i >= 0; i--)
        if (!(items[i] = pop(vm))) return CART_E_FORMAT;
    cart_pk_value *v = new_value(vm, CART_PK_TUPLE);
    if (!v) return CART_E_NOMEM;
    for (int i = 0; i < n; i++)
        if (push_item(v, items[i]) != CART_OK) return CART_E_NOMEM;
    return push(vm, v);
}

/* APPEND(S), SETITEM(S), ADDITEMS: values onto the container below them. */
static int add_to(pk_vm *vm, cart_pk_value *c, int64_t from, int64_t to) {
    int32_t want = vm->op == 's' || vm->op == 'u' ? CART_PK_DICT : CART_PK_LIST;
    if (c->kind != want)
        return cart_fail(CART_E_FORMAT, "%s: data.pkl at byte %lld: opcode 0x%02x adds to a %s, not a %s", vm->pt->name,
                         (long long)vm_offset(vm) - 1, vm->op, kind_name(c->kind), kind_name(want));
    if (want == CART_PK_DICT && (to - from) % 2) return vm_fail(vm, CART_E_FORMAT, "SETITEMS of an odd number of values");
    for (int64_t i = from; i < to; i++)
        if (push_item(c, vm->stack[i]) != CART_OK) return CART_E_NOMEM;
    return CART_OK;
}

static int op_add_one(pk_vm *vm, int values) {
    if (vm->sp - (vm->n_marks ? vm->marks[vm->n_marks - 1] : 0) < values + 1)
        return vm_fail(vm, CART_E_FORMAT, "too few values on the stack");
    int rc = add_to(vm, vm->stack[vm->sp - values - 1], vm->sp - values, vm->sp);
    vm->sp -= values;
    return rc;
}

static int op_add_marked(pk_vm *vm) {
    int64_t from = 0;
    int rc = pop_mark(vm, &from);
    if (rc != CART_OK) return rc;
    if (from == 0 || (vm->n_marks && vm->marks[vm->n_marks - 1] >= from))
        return vm_fail(vm, CART_E_FORMAT, "no container below the mark");
    rc = add_to(vm, vm->stack[from - 1], from, vm->sp);
    vm->sp = from;
    return rc;
}

/* ---- storages and tensors --------------------------------------------------------- */

static int64_t elem_bytes(int32_t dtype) {
    cart_dtype_info info;
    return cart_dtype_get_info(&info, dtype) == CART_OK ? (int64_t)info.type_size : 0;
}

/* BINPERSID: ('storage', torch.<Type>Storage, key, location, numel), the key
 * resolved to the entry <archive>/data/<key>. */
static int op_persid(pk_vm *vm) {
    cart_pk_value *id = pop(vm);
    if (!id) return CART_E_FORMAT;
    cart_pk_value **f = id->items;
    if (id->kind != CART_PK_TUPLE || id->n != 5 || f[0]->kind != CART_PK_STR || strcmp(f[0]->str, "storage") != 0)
        return vm_fail(vm, CART_E_UNSUPPORTED, "a persistent id that is not ('storage', type, key, location, numel)");
    if (f[1]->kind != CART_PK_GLOBAL || f[1]->i != G_STORAGE)
        return vm_fail(vm, CART_E_UNSUPPORTED, "a storage whose type is not a torch.<Type>Storage this reader knows");
    if (f[2]->kind != CART_PK_STR || f[3]->kind != CART_PK_STR || f[4]->kind != CART_PK_INT || f[4]->i < 0)
        return vm_fail(vm, CART_E_FORMAT, "a storage id whose key, location or numel has the wrong type");
    cart_pt *pt = vm->pt;
    size_t n = strlen(pt->archive) + strlen(f[2]->str) + 8;
    char *entry = cart_malloc(n, "storage entry name");
    if (!entry) return CART_E_NOMEM;
    snprintf(entry, n, "%s/data/%s", pt->archive, f[2]->str);
    const cart_zip_entry *e = cart_zip_find(pt->zip, entry);
    int64_t size = elem_bytes(f[1]->dtype);
    int rc = CART_OK;
    if (!e)
        rc = cart_fail(CART_E_FORMAT, "%s: storage '%s' has no entry %s in the archive", pt->name, f[2]->str, entry);
    else if (f[4]->i > INT64_MAX / size || (uint64_t)(f[4]->i * size) != e->size)
        rc = cart_fail(CART_E_FORMAT, "%s: storage '%s' of %lld %s elements needs %lld bytes, but %s holds %llu",
                       pt->name, f[2]->str, (long long)f[4]->i, cart_dtype_name(f[1]->dtype),
                       f[4]->i > INT64_MAX / size ? -1LL : (long long)(f[4]->i * size), entry,
                       (unsigned long long)e->size);
    free(entry);
    if (rc != CART_OK) return rc;
    cart_pk_value *s = new_value(vm, CART_PK_STORAGE);
    if (!s) return CART_E_NOMEM;
    s->dtype = f[1]->dtype;
    s->t.numel = f[4]->i;
    s->t.storage_key = f[2]->str;
    s->data = e->data;
    return push(vm, s);
}

/* A tuple of at most 8 non-negative ints into out; its length, or -1. */
static int read_dims(const cart_pk_value *v, int64_t *out) {
    if (v->kind != CART_PK_TUPLE || v->n > MAX_DIMS) return -1;
    for (int64_t i = 0; i < v->n; i++) {
        if (v->items[i]->kind != CART_PK_INT || v->items[i]->i < 0) return -1;
        out[i] = v->items[i]->i;
    }
    return (int)v->n;
}

/* The element count, and that the last element lies inside the storage. */
static int check_extent(pk_vm *vm, cart_pt_tensor *t, int64_t storage_numel) {
    int64_t numel = 1, last = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] && numel > INT64_MAX / t->shape[d]) return vm_fail(vm, CART_E_FORMAT, "a tensor size overflows");
        numel *= t->shape[d];
    }
    for (int d = 0; d < t->ndim && numel; d++) {
        if (t->stride[d] && t->shape[d] - 1 > (INT64_MAX - last) / t->stride[d])
            return vm_fail(vm, CART_E_FORMAT, "a tensor's strides overflow");
        last += (t->shape[d] - 1) * t->stride[d];
    }
    if (numel && last >= storage_numel)
        return vm_fail(vm, CART_E_FORMAT, "a tensor reaches past the end of its storage");
    t->numel = numel;
    return CART_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) */
static int rebuild_tensor(pk_vm *vm, const cart_pk_value *args) {
    cart_pk_value **a = args->items;
    if (args->n != 6 && args->n != 7) return vm_fail(vm, CART_E_FORMAT, "_rebuild_tensor_v2 takes 6 or 7 arguments");
    if (a[0]->kind != CART_PK_STORAGE || a[1]->kind != CART_PK_INT || a[1]->i < 0 || a[4]->kind != CART_PK_BOOL)
        return vm_fail(vm, CART_E_FORMAT, "_rebuild_tensor_v2's storage, offset or requires_grad has the wrong type");
    cart_pk_value *v = new_value(vm, CART_PK_TENSOR);
    if (!v) return CART_E_NOMEM;
    v->t.ndim = read_dims(a[2], v->t.shape);
    if (v->t.ndim < 0 || read_dims(a[3], v->t.stride) != v->t.ndim)
        return vm_fail(vm, CART_E_FORMAT, "a tensor whose size and stride are not tuples of up to 8 ints of one length");
    v->t.dtype = a[0]->dtype;
    v->t.offset = a[1]->i;
    v->t.requires_grad = (int32_t)a[4]->i;
    v->t.storage_key = a[0]->t.storage_key;
    v->data = a[0]->data;
    int rc = check_extent(vm, &v->t, a[0]->t.numel);
    return rc == CART_OK ? push(vm, v) : rc;
}

/* _rebuild_parameter(tensor, requires_grad, hooks[, state]): the tensor, marked. */
static int rebuild_parameter(pk_vm *vm, const cart_pk_value *args, int64_t want) {
    if (args->n != want || args->items[0]->kind != CART_PK_TENSOR || args->items[1]->kind != CART_PK_BOOL)
        return vm_fail(vm, CART_E_FORMAT, "_rebuild_parameter's arguments are not (tensor, requires_grad, hooks)");
    cart_pk_value *v = new_value(vm, CART_PK_TENSOR);
    if (!v) return CART_E_NOMEM;
    v->t = args->items[0]->t;
    v->data = args->items[0]->data;
    v->t.requires_grad = (int32_t)args->items[1]->i;
    v->t.parameter = 1;
    return push(vm, v);
}

/* OrderedDict() / OrderedDict([(k, v), ...]) and set() / set([...]). */
static int rebuild_container(pk_vm *vm, const cart_pk_value *g, const cart_pk_value *args) {
    int dict = g->i == G_ORDERED_DICT;
    if (args->n > 1 || (args->n == 1 && args->items[0]->kind != CART_PK_LIST && args->items[0]->kind != CART_PK_TUPLE))
        return vm_fail(vm, CART_E_FORMAT, "OrderedDict() or set() with arguments other than one list");
    cart_pk_value *v = new_value(vm, dict ? CART_PK_DICT : CART_PK_LIST);
    if (!v) return CART_E_NOMEM;
    const cart_pk_value *src = args->n ? args->items[0] : NULL;
    for (int64_t i = 0; src && i < src->n; i++) {
        const cart_pk_value *it = src->items[i];
        if (dict && ((it->kind != CART_PK_TUPLE && it->kind != CART_PK_LIST) || it->n != 2))
            return vm_fail(vm, CART_E_FORMAT, "OrderedDict of items that are not pairs");
        int rc = dict ? push_item(v, it->items[0]) : push_item(v, src->items[i]);
        if (rc == CART_OK && dict) rc = push_item(v, it->items[1]);
        if (rc != CART_OK) return rc;
    }
    return push(vm, v);
}

static int op_reduce(pk_vm *vm) {
    cart_pk_value *args = pop(vm), *g = args ? pop(vm) : NULL;
    if (!g) return CART_E_FORMAT;
    if (g->kind != CART_PK_GLOBAL || args->kind != CART_PK_TUPLE)
        return vm_fail(vm, CART_E_FORMAT, "REDUCE of something other than an allowed name and a tuple");
    switch (g->i) {
    case G_REBUILD_TENSOR_V2: return rebuild_tensor(vm, args);
    case G_REBUILD_PARAMETER: return rebuild_parameter(vm, args, 3);
    case G_REBUILD_PARAMETER_STATE: return rebuild_parameter(vm, args, 4);
    case G_ORDERED_DICT:
    case G_SET: return rebuild_container(vm, g, args);
    default:
        return cart_fail(CART_E_UNSUPPORTED, "%s: data.pkl at byte %lld: %s is called (REDUCE); this reader only "
                         "reads it as data", vm->pt->name, (long long)vm_offset(vm) - 1, g->str);
    }
}

/* NEWOBJ / NEWOBJ_EX: cls.__new__(cls, *args) for a class read as data. */
static int op_newobj(pk_vm *vm, int with_kwargs) {
    cart_pk_value *kwargs = with_kwargs ? pop(vm) : NULL;
    if (with_kwargs && !kwargs) return CART_E_FORMAT;
    cart_pk_value *args = pop(vm), *cls = args ? pop(vm) : NULL;
    if (!cls) return CART_E_FORMAT;
    if (cls->kind != CART_PK_GLOBAL || cls->i != G_CLASS || args->kind != CART_PK_TUPLE)
        return cart_fail(CART_E_UNSUPPORTED, "%s: data.pkl at byte %lld: NEWOBJ of %s; only nn.ParameterList and "
                         "nn.ParameterDict are read as objects", vm->pt->name, (long long)vm_offset(vm) - 1,
                         cls->kind == CART_PK_GLOBAL ? cls->str : kind_name(cls->kind));
    cart_pk_value *v = new_value(vm, CART_PK_OBJECT);
    if (!v || !(v->str = cart_strdup(cls->str, "pickle class"))) return CART_E_NOMEM;
    v->len = cls->len;
    return push(vm, v);
}

/* BUILD: an object's state (a dict, or (dict, slots)); a tensor's only when empty. */
static int op_build(pk_vm *vm) {
    cart_pk_value *state = pop(vm), *obj = state ? top(vm) : NULL;
    if (!obj) return CART_E_FORMAT;
    if (obj->kind == CART_PK_OBJECT) {
        if (state->kind == CART_PK_TUPLE && state->n == 2) state = state->items[0];
        if (state->kind != CART_PK_DICT && state->kind != CART_PK_NONE)
            return vm_fail(vm, CART_E_FORMAT, "BUILD of an object with a state that is not a dict");
        obj->state = state;
        return CART_OK;
    }
    if ((state->kind == CART_PK_DICT || state->kind == CART_PK_TUPLE) && state->n == 0) return CART_OK;
    return cart_fail(CART_E_UNSUPPORTED, "%s: data.pkl at byte %lld: BUILD of a %s with a state", vm->pt->name,
                     (long long)vm_offset(vm) - 1, kind_name(obj->kind));
}

/* ---- the machine ---------------------------------------------------------------- */

static int op_memo(pk_vm *vm, int len_bytes) {
    int rc = need(vm, (uint64_t)len_bytes);
    if (rc != CART_OK) return rc;
    uint64_t idx = read_le(vm, len_bytes);
    return vm->op == 'q' || vm->op == 'r' ? memo_put(vm, idx) : memo_get(vm, idx);
}

static int op_skip(pk_vm *vm, int n) {
    int rc = need(vm, (uint64_t)n);
    if (rc == CART_OK) vm->p += n;
    return rc;
}

static int op_pop(pk_vm *vm) {
    if (vm->n_marks && vm->marks[vm->n_marks - 1] == vm->sp) { /* POP of a bare mark discards it */
        vm->n_marks--;
        return CART_OK;
    }
    return pop(vm) ? CART_OK : CART_E_FORMAT;
}

/* POP_MARK: drops everything above the last mark, and the mark. */
static int op_pop_mark(pk_vm *vm) {
    int64_t from = 0;
    int rc = pop_mark(vm, &from);
    if (rc == CART_OK) vm->sp = from;
    return rc;
}

static int op_int(pk_vm *vm, int n, int is_signed) {
    int rc = need(vm, (uint64_t)n);
    if (rc != CART_OK) return rc;
    uint64_t u = read_le(vm, n);
    return push_int(vm, is_signed ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u, CART_PK_INT);
}

static int op_refused(pk_vm *vm, const char *name) {
    char what[160];
    snprintf(what, sizeof what, "%s is not accepted: torch.save writes pickle protocol 2, and this reader never runs "
             "code", name);
    return vm_fail(vm, CART_E_UNSUPPORTED, what);
}

/* One opcode; CART_OK to go on, 1 at STOP. */
static int step(pk_vm *vm) {
    vm->op = *vm->p++;
    switch (vm->op) {
    case 0x80: return op_skip(vm, 1);          /* PROTO */
    case 0x95: return op_skip(vm, 8);          /* FRAME: its bytes follow inline */
    case '.': return 1;                        /* STOP */
    case '(': return push_mark(vm);
    case '0': return op_pop(vm);
    case '1': return op_pop_mark(vm);
    case '2': { cart_pk_value *v = top(vm); return v ? push(vm, v) : CART_E_FORMAT; }
    case 'N': return push(vm, new_value(vm, CART_PK_NONE));
    case 0x88: return push_int(vm, 1, CART_PK_BOOL);
    case 0x89: return push_int(vm, 0, CART_PK_BOOL);
    case 'J': return op_int(vm, 4, 1);
    case 'K': return op_int(vm, 1, 0);
    case 'M': return op_int(vm, 2, 0);
    case 0x8a: return op_long(vm, 1);
    case 0x8b: return op_long(vm, 4);
    case 'G': return op_binfloat(vm);
    case 'X': return op_text(vm, 4, CART_PK_STR);
    case 0x8c: return op_text(vm, 1, CART_PK_STR);
    case 0x8d: return op_text(vm, 8, CART_PK_STR);
    case 'T': return op_text(vm, 4, CART_PK_BYTES);
    case 'U': return op_text(vm, 1, CART_PK_BYTES);
    case 'B': return op_text(vm, 4, CART_PK_BYTES);
    case 'C': return op_text(vm, 1, CART_PK_BYTES);
    case 0x8e: return op_text(vm, 8, CART_PK_BYTES);
    case ')': return push(vm, new_value(vm, CART_PK_TUPLE));
    case ']': case 0x8f: return push(vm, new_value(vm, CART_PK_LIST));
    case '}': return push(vm, new_value(vm, CART_PK_DICT));
    case 't': return op_from_mark(vm, CART_PK_TUPLE);
    case 'l': case 0x91: return op_from_mark(vm, CART_PK_LIST);
    case 'd': return op_from_mark(vm, CART_PK_DICT);
    case 0x85: return op_tuple_n(vm, 1);
    case 0x86: return op_tuple_n(vm, 2);
    case 0x87: return op_tuple_n(vm, 3);
    case 'a': return op_add_one(vm, 1);
    case 's': return op_add_one(vm, 2);
    case 'e': case 'u': case 0x90: return op_add_marked(vm);
    case 'q': case 'h': return op_memo(vm, 1);
    case 'r': case 'j': return op_memo(vm, 4);
    case 0x94: return memo_put(vm, (uint64_t)vm->memo_count);
    case 'c': return op_global(vm);
    case 0x93: return op_stack_global(vm);
    case 'R': return op_reduce(vm);
    case 0x81: return op_newobj(vm, 0);
    case 0x92: return op_newobj(vm, 1);
    case 'b': return op_build(vm);
    case 'Q': return op_persid(vm);
    case 'i': return op_refused(vm, "INST");
    case 'o': return op_refused(vm, "OBJ");
    case 0x82: case 0x83: case 0x84: return op_refused(vm, "EXT (the extension registry)");
    case 'P': return op_refused(vm, "PERSID (a text persistent id)");
    case 0x96: case 0x97: case 0x98: return op_refused(vm, "an out-of-band buffer (protocol 5)");
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'g': case 'p':
        return op_refused(vm, "a protocol 0 text opcode");
    default: return vm_fail(vm, CART_E_FORMAT, "an unknown opcode");
    }
}

static int run(cart_pt *pt, const cart_zip_entry *pkl) {
    pk_vm vm = {.pt = pt, .p = pkl->data, .start = pkl->data, .end = pkl->data + pkl->size};
    int rc = CART_OK;
    while (rc == CART_OK) {
        if (vm.p >= vm.end) {
            rc = cart_fail(CART_E_FORMAT, "%s: data.pkl ends without STOP (cut short)", pt->name);
            break;
        }
        rc = step(&vm);
    }
    if (rc == 1) {
        if (vm.sp != 1 || vm.n_marks)
            rc = cart_fail(CART_E_FORMAT, "%s: data.pkl stops with %lld values and %lld marks on the stack, not one value",
                           pt->name, (long long)vm.sp, (long long)vm.n_marks);
        else
            pt->root = vm.stack[0], rc = CART_OK;
    }
    free(vm.stack);
    free(vm.marks);
    free(vm.memo);
    return rc;
}

/* ---- the archive --------------------------------------------------------------- */

/* Why bytes that are not a zip are no .pt this reader takes. */
static int not_zip(const char *name, const uint8_t *d, uint64_t n) {
    if (n >= 2 && d[0] == 0x80 && d[1] <= 5)
        return cart_fail(CART_E_UNSUPPORTED, "%s: a torch.save file in the legacy format of torch before 1.6 (a pickle "
                         "stream, not a zip archive); load it and save it again with torch 1.6 or later "
                         "(torch.save(torch.load(f, weights_only=False), f2)) and import that", name);
    if (n >= 262 && memcmp(d + 257, "ustar", 5) == 0)
        return cart_fail(CART_E_UNSUPPORTED, "%s: a tar archive: the legacy torch.save format of torch before 1.6; "
                         "save it again with torch 1.6 or later", name);
    return cart_fail(CART_E_FORMAT, "%s: not a torch.save file: it does not start as a zip archive (PK\\3\\4)", name);
}

/* The folder holding data.pkl (exactly one), and its byte order. */
static int find_archive(cart_pt *pt, const cart_zip_entry **pkl) {
    *pkl = NULL;
    for (int64_t i = 0; i < cart_zip_count(pt->zip); i++) {
        const cart_zip_entry *e = cart_zip_entry_at(pt->zip, i);
        const char *slash = strchr(e->name, '/');
        if (!slash || strcmp(slash, "/data.pkl") != 0) continue;
        if (*pkl) return cart_fail(CART_E_FORMAT, "%s: two data.pkl entries (%s, %s)", pt->name, (*pkl)->name, e->name);
        *pkl = e;
    }
    if (!*pkl) return cart_fail(CART_E_FORMAT, "%s: a zip archive without <folder>/data.pkl: not a torch.save file", pt->name);
    size_t n = (size_t)(strchr((*pkl)->name, '/') - (*pkl)->name);
    if (!(pt->archive = cart_malloc(n + 1, "archive name"))) return CART_E_NOMEM;
    memcpy(pt->archive, (*pkl)->name, n);
    pt->archive[n] = 0;
    char order_name[300];
    snprintf(order_name, sizeof order_name, "%.256s/byteorder", pt->archive);
    const cart_zip_entry *order = cart_zip_find(pt->zip, order_name);
    if (order && !(order->size == 6 && memcmp(order->data, "little", 6) == 0))
        return cart_fail(order->size == 3 && memcmp(order->data, "big", 3) == 0 ? CART_E_UNSUPPORTED : CART_E_FORMAT,
                         "%s: byteorder is '%.*s'; this reader takes little-endian files (load and save it again on "
                         "a little-endian machine)", pt->name, (int)(order->size < 16 ? order->size : 16), order->data);
    return CART_OK;
}

static int open_bytes(cart_pt *pt) {
    const uint8_t *d = pt->map.data;
    uint64_t n = pt->map.size;
    if (n < 4 || memcmp(d, "PK\x03\x04", 4) != 0) return not_zip(pt->name, d, n);
    int rc = cart_zip_open_memory(&pt->zip, d, n, pt->name);
    const cart_zip_entry *pkl = NULL;
    if (rc == CART_OK) rc = find_archive(pt, &pkl);
    if (rc == CART_OK) rc = run(pt, pkl);
    return rc;
}

static int open_common(cart_pt **out, cart_pt *pt, int rc) {
    if (rc == CART_OK) rc = open_bytes(pt);
    if (rc != CART_OK) {
        cart_pt_close(pt);
        return rc;
    }
    *out = pt;
    return CART_OK;
}

int cart_pt_open(cart_pt **out, const char *path) {
    if (!out || !path) return cart_fail(CART_E_ARG, "cart_pt_open: NULL argument");
    *out = NULL;
    cart_pt *pt = cart_calloc(1, sizeof *pt, "torch archive");
    if (!pt) return CART_E_NOMEM;
    pt->name = cart_strdup(path, "torch archive name");
    int rc = pt->name ? cart_map_file(&pt->map, path) : CART_E_NOMEM;
    return open_common(out, pt, rc);
}

int cart_pt_open_memory(cart_pt **out, const void *data, uint64_t size, const char *name) {
    if (!out || (!data && size)) return cart_fail(CART_E_ARG, "cart_pt_open_memory: NULL argument");
    *out = NULL;
    cart_pt *pt = cart_calloc(1, sizeof *pt, "torch archive");
    if (!pt) return CART_E_NOMEM;
    pt->name = cart_strdup(name ? name : "<memory>", "torch archive name");
    pt->map.data = (const uint8_t *)data;
    pt->map.size = size;
    return open_common(out, pt, pt->name ? CART_OK : CART_E_NOMEM);
}

void cart_pt_close(cart_pt *pt) {
    if (!pt) return;
    free_values(pt);
    cart_zip_close(pt->zip);
    if (pt->map.owned) cart_unmap_file(&pt->map);
    free(pt->archive);
    free(pt->name);
    free(pt);
}

const cart_pk_value *cart_pt_root(const cart_pt *pt) { return pt ? pt->root : NULL; }
const char *cart_pt_archive(const cart_pt *pt) { return pt ? pt->archive : NULL; }

/* ---- reading values ------------------------------------------------------------ */

int32_t cart_pk_kind_of(const cart_pk_value *v) { return v ? v->kind : -1; }

int64_t cart_pk_int(const cart_pk_value *v) {
    return v && (v->kind == CART_PK_INT || v->kind == CART_PK_BOOL) ? v->i : 0;
}

double cart_pk_float(const cart_pk_value *v) {
    return v && (v->kind == CART_PK_FLOAT || v->kind == CART_PK_INT) ? v->f : 0.0;
}

const char *cart_pk_str(const cart_pk_value *v, int64_t *len) {
    int ok = v && (v->kind == CART_PK_STR || v->kind == CART_PK_BYTES);
    if (len) *len = ok ? v->len : 0;
    return ok ? v->str : NULL;
}

int64_t cart_pk_len(const cart_pk_value *v) {
    return v && (v->kind == CART_PK_TUPLE || v->kind == CART_PK_LIST || v->kind == CART_PK_DICT) ? v->n : 0;
}

const cart_pk_value *cart_pk_item(const cart_pk_value *v, int64_t i) {
    if (!v || i < 0 || i >= cart_pk_len(v)) return NULL;
    return v->kind == CART_PK_DICT ? v->items[2 * i + 1] : v->items[i];
}

const cart_pk_value *cart_pk_key(const cart_pk_value *v, int64_t i) {
    return v && v->kind == CART_PK_DICT && i >= 0 && i < v->n ? v->items[2 * i] : NULL;
}

/* A key set twice keeps both entries; the later one is found. */
const cart_pk_value *cart_pk_get(const cart_pk_value *v, const char *key) {
    if (!v || v->kind != CART_PK_DICT || !key) return NULL;
    for (int64_t i = v->n; i-- > 0;) {
        const cart_pk_value *k = v->items[2 * i];
        if (k->kind == CART_PK_STR && strcmp(k->str, key) == 0 && (int64_t)strlen(key) == k->len) return v->items[2 * i + 1];
    }
    return NULL;
}

const char *cart_pk_class(const cart_pk_value *v) {
    return v && (v->kind == CART_PK_OBJECT || v->kind == CART_PK_GLOBAL) ? v->str : NULL;
}

const cart_pk_value *cart_pk_state(const cart_pk_value *v) {
    return v && v->kind == CART_PK_OBJECT ? v->state : NULL;
}

int cart_pk_tensor(const cart_pk_value *v, cart_pt_tensor *out) {
    if (!v || !out || v->kind != CART_PK_TENSOR) return cart_fail(CART_E_ARG, "cart_pk_tensor: not a tensor");
    *out = v->t;
    return CART_OK;
}

/* Row-major over the dims before the last, a run of the last dim at a time. */
int cart_pt_tensor_f32(const cart_pk_value *v, float *dst, int64_t n) {
    if (!v || !dst || v->kind != CART_PK_TENSOR) return cart_fail(CART_E_ARG, "cart_pt_tensor_f32: not a tensor");
    const cart_pt_tensor *t = &v->t;
    if (n != t->numel) return cart_fail(CART_E_ARG, "cart_pt_tensor_f32: %lld floats asked of a tensor of %lld",
                                        (long long)n, (long long)t->numel);
    if (t->dtype != CART_F32 && t->dtype != CART_F16 && t->dtype != CART_BF16 && t->dtype != CART_F64)
        return cart_fail(CART_E_UNSUPPORTED, "a %s tensor where floats are needed", cart_dtype_name(t->dtype));
    if (n == 0) return CART_OK;
    int64_t es = elem_bytes(t->dtype), idx[MAX_DIMS] = {0};
    int last = t->ndim - 1;
    int64_t run = last >= 0 ? t->shape[last] : 1, step = last >= 0 ? t->stride[last] : 1;
    for (int64_t done = 0; done < n; done += run) {
        int64_t at = t->offset;
        for (int d = 0; d < last; d++) at += idx[d] * t->stride[d];
        int rc = step == 1 ? cart_to_f32(dst + done, t->dtype, v->data + at * es, run) : CART_OK;
        for (int64_t j = 0; j < run && step != 1 && rc == CART_OK; j++)
            rc = cart_to_f32(dst + done + j, t->dtype, v->data + (at + j * step) * es, 1);
        if (rc != CART_OK) return rc;
        for (int d = last - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
    }
    return CART_OK;
}

/* ---- writing --------------------------------------------------------------------- */

/* The pickle being written: protocol 2, only the opcodes torch's
 * weights_only unpickler accepts. */
typedef struct pk_out {
    uint8_t *b;
    size_t n, cap;
    int failed;
    uint32_t memo;
} pk_out;

static void out_bytes(pk_out *o, const void *p, size_t n) {
    if (o->failed) return;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n) cap *= 2;
        uint8_t *grown = cart_realloc(o->b, cap, "pickle output");
        if (!grown) {
            o->failed = 1;
            return;
        }
        o->b = grown, o->cap = cap;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void out_op(pk_out *o, uint8_t op) { out_bytes(o, &op, 1); }

static void out_le(pk_out *o, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    out_bytes(o, b, (size_t)n);
}

static void out_int(pk_out *o, int64_t v) {
    if (v >= 0 && v < 256) out_op(o, 'K'), out_le(o, (uint64_t)v, 1);
    else if (v >= INT32_MIN && v <= INT32_MAX) out_op(o, 'J'), out_le(o, (uint64_t)(uint32_t)(int32_t)v, 4);
    else out_op(o, 0x8a), out_le(o, 8, 1), out_le(o, (uint64_t)v, 8);
}

static void out_str(pk_out *o, const char *s) {
    out_op(o, 'X');
    out_le(o, strlen(s), 4);
    out_bytes(o, s, strlen(s));
}

static void out_global(pk_out *o, const char *module, const char *name) {
    out_op(o, 'c');
    out_bytes(o, module, strlen(module));
    out_op(o, '\n');
    out_bytes(o, name, strlen(name));
    out_op(o, '\n');
}

static uint32_t out_put(pk_out *o) {
    out_op(o, 'r');
    out_le(o, o->memo, 4);
    return o->memo++;
}

static const char *storage_type(int32_t dtype) {
    for (size_t i = 0; i < sizeof storage_names / sizeof storage_names[0]; i++)
        if (storage_names[i].dtype == dtype) return storage_names[i].name;
    return NULL;
}

/* _rebuild_tensor_v2(('storage', T, key, 'cpu', numel), 0, size, stride, False, OrderedDict()) */
static void out_tensor(pk_out *o, const cart_pt_out_tensor *t, int64_t key, int64_t numel) {
    char key_text[24];
    snprintf(key_text, sizeof key_text, "%lld", (long long)key);
    out_global(o, "torch._utils", "_rebuild_tensor_v2");
    out_op(o, '(');
    out_op(o, '(');
    out_str(o, "storage");
    out_global(o, "torch", storage_type(t->dtype));
    out_str(o, key_text);
    out_str(o, "cpu");
    out_int(o, numel);
    out_op(o, 't');
    out_op(o, 'Q');
    out_int(o, 0);
    out_op(o, '(');
    for (int d = 0; d < t->ndim; d++) out_int(o, t->shape[d]);
    out_op(o, 't');
    out_op(o, '(');
    int64_t stride = 1, strides[8];
    for (int d = t->ndim; d-- > 0;) strides[d] = stride, stride *= t->shape[d];
    for (int d = 0; d < t->ndim; d++) out_int(o, strides[d]);
    out_op(o, 't');
    out_op(o, 0x89);
    out_global(o, "collections", "OrderedDict");
    out_op(o, ')');
    out_op(o, 'R');
    out_op(o, 't');
    out_op(o, 'R');
}

static int check_out_tensor(const cart_pt_out_tensor *t, int64_t *numel) {
    if (!storage_type(t->dtype) || (t->dtype != CART_F32 && t->dtype != CART_F16 && t->dtype != CART_BF16))
        return cart_fail(CART_E_ARG, "torch writer: dtype %s (F32, F16 or BF16 only)", cart_dtype_name(t->dtype));
    if (t->ndim < 1 || t->ndim > MAX_DIMS) return cart_fail(CART_E_ARG, "torch writer: %d dims", t->ndim);
    *numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || (t->shape[d] && *numel > INT64_MAX / 8 / t->shape[d]))
            return cart_fail(CART_E_ARG, "torch writer: a shape of negative or huge size");
        *numel *= t->shape[d];
    }
    if (*numel && !t->data) return cart_fail(CART_E_ARG, "torch writer: a tensor without data");
    return CART_OK;
}

/* {key: [tensors], alias: <the same list>, ...}; storages numbered in order. */
static int build_pickle(pk_out *o, const cart_pt_out_list *lists, int64_t n_lists) {
    int64_t key = 0;
    out_op(o, 0x80), out_op(o, 2);
    out_op(o, '}');
    out_put(o);
    out_op(o, '(');
    for (int64_t l = 0; l < n_lists; l++) {
        if (!lists[l].key || (lists[l].n && !lists[l].tensors) || lists[l].n < 0)
            return cart_fail(CART_E_ARG, "torch writer: list %lld has no key or no tensors", (long long)l);
        out_str(o, lists[l].key);
        out_op(o, ']');
        uint32_t memo = out_put(o);
        if (lists[l].n) out_op(o, '(');
        for (int64_t i = 0; i < lists[l].n; i++) {
            int64_t numel;
            int rc = check_out_tensor(&lists[l].tensors[i], &numel);
            if (rc != CART_OK) return rc;
            out_tensor(o, &lists[l].tensors[i], key++, numel);
        }
        if (lists[l].n) out_op(o, 'e');
        if (lists[l].alias) out_str(o, lists[l].alias), out_op(o, 'j'), out_le(o, memo, 4);
    }
    out_op(o, 'u');
    out_op(o, '.');
    return o->failed ? CART_E_NOMEM : CART_OK;
}

static int add_entry(cart_zip_writer *w, const char *archive, const char *name, const void *data, uint64_t n) {
    char full[512];
    if (snprintf(full, sizeof full, "%s/%s", archive, name) >= (int)sizeof full)
        return cart_fail(CART_E_ARG, "torch writer: archive name too long");
    return cart_zip_writer_add(w, full, data, n);
}

static int write_storages(cart_zip_writer *w, const char *archive, const cart_pt_out_list *lists, int64_t n_lists) {
    int64_t key = 0;
    for (int64_t l = 0; l < n_lists; l++)
        for (int64_t i = 0; i < lists[l].n; i++) {
            const cart_pt_out_tensor *t = &lists[l].tensors[i];
            int64_t numel;
            int rc = check_out_tensor(t, &numel);
            char name[40];
            snprintf(name, sizeof name, "data/%lld", (long long)key++);
            if (rc == CART_OK) rc = add_entry(w, archive, name, t->data, (uint64_t)(numel * elem_bytes(t->dtype)));
            if (rc != CART_OK) return rc;
        }
    return CART_OK;
}

int cart_pt_write_lists(const char *path, const char *archive, const cart_pt_out_list *lists, int64_t n_lists) {
    if (!path || !archive || (!lists && n_lists) || n_lists < 0)
        return cart_fail(CART_E_ARG, "cart_pt_write_lists: NULL argument");
    if (!archive[0] || strchr(archive, '/')) return cart_fail(CART_E_ARG, "torch writer: archive name '%s'", archive);
    pk_out o = {0};
    int rc = build_pickle(&o, lists, n_lists);
    cart_zip_writer *w = NULL;
    if (rc == CART_OK) rc = cart_zip_writer_open(&w, path);
    if (rc == CART_OK) rc = add_entry(w, archive, "data.pkl", o.b, o.n);
    if (rc == CART_OK) rc = add_entry(w, archive, "byteorder", "little", 6);
    if (rc == CART_OK) rc = write_storages(w, archive, lists, n_lists);
    if (rc == CART_OK) rc = add_entry(w, archive, "version", "3\n", 2);
    char id[48];
    snprintf(id, sizeof id, "%020llu%020llu", (unsigned long long)cart_crc32(0, o.b, o.n),
             (unsigned long long)o.n);
    if (rc == CART_OK) rc = add_entry(w, archive, ".data/serialization_id", id, 40);
    free(o.b);
    if (w) rc = rc == CART_OK ? cart_zip_writer_commit(w) : (cart_zip_writer_abort(w), rc);
    return rc;
}
