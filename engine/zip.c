/*
 * zip.c - the stored-entry zip reader and writer of zip.h.
 *
 * Reader: find the end-of-central-directory record from the end (its
 * comment may be up to 64 KiB), follow the zip64 locator when present, then
 * walk the central directory once, checking every entry against its local
 * header and its CRC-32. Entry names are copied; data stays in the caller's
 * memory.
 *
 * Writer: every entry goes through cart_afile as local header, padding
 * extra field, data; the central directory and the end records follow at
 * commit.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "zip.h"

enum {
    SIG_LOCAL = 0x04034b50,
    SIG_CENTRAL = 0x02014b50,
    SIG_END = 0x06054b50,
    SIG_END64 = 0x06064b50,
    SIG_LOC64 = 0x07064b50,
    LOCAL_FIXED = 30,
    CENTRAL_FIXED = 46,
    END_FIXED = 22,
    END64_FIXED = 56,
    LOC64_FIXED = 20,
    EXTRA_ZIP64 = 0x0001,
    EXTRA_PAD = 0x4246, /* "FB": the padding field torch.save writes */
    ALIGN = 64,
    MAX_ENTRIES = 1 << 20,
};

static const uint32_t U32_MAX_MARK = 0xFFFFFFFFu;

/* ---- CRC-32 ------------------------------------------------------------- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

/* Slicing by 8: eight table lookups per 8 bytes. */
uint32_t cart_crc32(uint32_t crc, const void *data, uint64_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = (const uint8_t *)data;
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

/* ---- little-endian fields ----------------------------------------------- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---- reader ------------------------------------------------------------- */

struct cart_zip {
    char *name;
    const uint8_t *data;
    uint64_t size;
    cart_zip_entry *entries;
    int64_t n;
};

/* The directory's place, from the end record (or its zip64 one). */
typedef struct zip_dir {
    uint64_t offset, size, count;
} zip_dir;

static int find_end(const cart_zip *z, uint64_t *at) {
    if (z->size < END_FIXED)
        return cart_fail(CART_E_FORMAT, "%s: %llu bytes cannot hold a zip archive's end record (%d bytes)", z->name,
                         (unsigned long long)z->size, END_FIXED);
    uint64_t lowest = z->size > END_FIXED + 65535u ? z->size - END_FIXED - 65535u : 0;
    for (uint64_t i = z->size - END_FIXED + 1; i-- > lowest;) {
        if (rd32(z->data + i) != SIG_END) continue;
        if (i + END_FIXED + rd16(z->data + i + 20) != z->size) continue; /* its comment must end the file */
        *at = i;
        return CART_OK;
    }
    return cart_fail(CART_E_FORMAT, "%s: no zip end-of-central-directory record (not a zip archive, or cut short)",
                     z->name);
}

static int read_end64(const cart_zip *z, uint64_t end, zip_dir *d) {
    if (end < LOC64_FIXED || rd32(z->data + end - LOC64_FIXED) != SIG_LOC64)
        return cart_fail(CART_E_FORMAT, "%s: the end record defers to zip64 but no zip64 locator precedes it", z->name);
    const uint8_t *loc = z->data + end - LOC64_FIXED;
    if (rd32(loc + 4) != 0 || rd32(loc + 16) > 1)
        return cart_fail(CART_E_UNSUPPORTED, "%s: a zip archive split over several disks", z->name);
    uint64_t at = rd64(loc + 8);
    if (at > end - LOC64_FIXED || end - LOC64_FIXED - at < END64_FIXED || rd32(z->data + at) != SIG_END64)
        return cart_fail(CART_E_FORMAT, "%s: the zip64 locator points at offset %llu, where no zip64 end record is",
                         z->name, (unsigned long long)at);
    const uint8_t *e = z->data + at;
    if (rd32(e + 16) != 0 || rd32(e + 20) != 0)
        return cart_fail(CART_E_UNSUPPORTED, "%s: a zip archive split over several disks", z->name);
    d->count = rd64(e + 32);
    d->size = rd64(e + 40);
    d->offset = rd64(e + 48);
    if (rd64(e + 24) != d->count)
        return cart_fail(CART_E_FORMAT, "%s: the zip64 end record counts %llu entries on this disk and %llu in all",
                         z->name, (unsigned long long)rd64(e + 24), (unsigned long long)d->count);
    if (d->offset > at || d->size > at - d->offset)
        return cart_fail(CART_E_FORMAT, "%s: the central directory (offset %llu, %llu bytes) runs past its end record",
                         z->name, (unsigned long long)d->offset, (unsigned long long)d->size);
    return CART_OK;
}

static int read_dir_place(const cart_zip *z, zip_dir *d) {
    uint64_t end = 0;
    int rc = find_end(z, &end);
    if (rc != CART_OK) return rc;
    const uint8_t *e = z->data + end;
    if (rd16(e + 4) != 0 || rd16(e + 6) != 0)
        return cart_fail(CART_E_UNSUPPORTED, "%s: a zip archive split over several disks", z->name);
    d->count = rd16(e + 10);
    d->size = rd32(e + 12);
    d->offset = rd32(e + 16);
    if (d->count == 0xFFFF || d->size == U32_MAX_MARK || d->offset == U32_MAX_MARK) return read_end64(z, end, d);
    if (rd16(e + 8) != d->count)
        return cart_fail(CART_E_FORMAT, "%s: the end record counts %u entries on this disk and %llu in all", z->name,
                         rd16(e + 8), (unsigned long long)d->count);
    if (d->offset > end || d->size > end - d->offset)
        return cart_fail(CART_E_FORMAT, "%s: the central directory (offset %llu, %llu bytes) runs past its end record",
                         z->name, (unsigned long long)d->offset, (unsigned long long)d->size);
    return CART_OK;
}

/* A central entry's sizes and offset, with its zip64 extra field applied. */
typedef struct zip_sizes {
    uint64_t csize, usize, local;
} zip_sizes;

static int apply_zip64(const cart_zip *z, const char *name, const uint8_t *extra, uint32_t n, zip_sizes *s) {
    int need_u = s->usize == U32_MAX_MARK, need_c = s->csize == U32_MAX_MARK, need_o = s->local == U32_MAX_MARK;
    if (!need_u && !need_c && !need_o) return CART_OK;
    for (uint32_t i = 0; i + 4 <= n;) {
        uint16_t id = rd16(extra + i), len = rd16(extra + i + 2);
        if (len > n - i - 4) break;
        if (id == EXTRA_ZIP64) {
            const uint8_t *f = extra + i + 4;
            uint32_t want = 8u * (uint32_t)(need_u + need_c + need_o);
            if (len < want)
                return cart_fail(CART_E_FORMAT, "%s: entry '%s': its zip64 field holds %u bytes, %u needed", z->name,
                                 name, len, want);
            if (need_u) s->usize = rd64(f), f += 8;
            if (need_c) s->csize = rd64(f), f += 8;
            if (need_o) s->local = rd64(f);
            return CART_OK;
        }
        i += 4u + len;
    }
    return cart_fail(CART_E_FORMAT, "%s: entry '%s' marks a size or offset as zip64 but has no zip64 field", z->name,
                     name);
}

/* Checks the local header at s->local and points e at the data. */
static int read_local(const cart_zip *z, const zip_sizes *s, uint16_t method, uint64_t dir_offset, cart_zip_entry *e) {
    uint64_t at = s->local;
    if (at > dir_offset || dir_offset - at < LOCAL_FIXED || rd32(z->data + at) != SIG_LOCAL)
        return cart_fail(CART_E_FORMAT, "%s: entry '%s': no local header at offset %llu", z->name, e->name,
                         (unsigned long long)at);
    const uint8_t *h = z->data + at;
    uint64_t name_len = rd16(h + 26), extra_len = rd16(h + 28);
    if (rd16(h + 8) != method)
        return cart_fail(CART_E_FORMAT, "%s: entry '%s': the local header's method %u differs from the directory's %u",
                         z->name, e->name, rd16(h + 8), method);
    if (LOCAL_FIXED + name_len > dir_offset - at || name_len != strlen(e->name) ||
        memcmp(h + LOCAL_FIXED, e->name, name_len) != 0)
        return cart_fail(CART_E_FORMAT, "%s: entry '%s': the local header names another entry", z->name, e->name);
    uint64_t start = at + LOCAL_FIXED + name_len + extra_len;
    if (start > dir_offset || s->csize > dir_offset - start)
        return cart_fail(CART_E_FORMAT, "%s: entry '%s': its %llu bytes at offset %llu run into the central directory",
                         z->name, e->name, (unsigned long long)s->csize, (unsigned long long)start);
    e->data = z->data + start;
    e->size = s->usize;
    return CART_OK;
}

/* Reads the central entry at *at into e, advancing *at. */
static int read_central(cart_zip *z, const zip_dir *d, uint64_t *at, cart_zip_entry *e) {
    uint64_t end = d->offset + d->size;
    if (end - *at < CENTRAL_FIXED || rd32(z->data + *at) != SIG_CENTRAL)
        return cart_fail(CART_E_FORMAT, "%s: central directory entry %lld is missing or cut short", z->name,
                         (long long)z->n);
    const uint8_t *h = z->data + *at;
    uint16_t flags = rd16(h + 8), method = rd16(h + 10);
    uint32_t name_len = rd16(h + 28), extra_len = rd16(h + 30), comment_len = rd16(h + 32);
    if ((uint64_t)CENTRAL_FIXED + name_len + extra_len + comment_len > end - *at)
        return cart_fail(CART_E_FORMAT, "%s: central directory entry %lld runs past the directory", z->name,
                         (long long)z->n);
    const uint8_t *name = h + CENTRAL_FIXED;
    if (name_len == 0 || memchr(name, 0, name_len))
        return cart_fail(CART_E_FORMAT, "%s: central directory entry %lld has an empty name or a NUL in it", z->name,
                         (long long)z->n);
    char *copy = cart_malloc(name_len + 1u, "zip entry name");
    if (!copy) return CART_E_NOMEM;
    memcpy(copy, name, name_len);
    copy[name_len] = 0;
    e->name = copy;
    e->crc32 = rd32(h + 16);
    if (flags & 1) return cart_fail(CART_E_UNSUPPORTED, "%s: entry '%s' is encrypted", z->name, e->name);
    if (method != 0)
        return cart_fail(CART_E_UNSUPPORTED,
                         "%s: entry '%s' is compressed (zip method %u%s); torch.save stores entries uncompressed, so "
                         "this archive was rewritten by another tool: load and save it again with torch.save",
                         z->name, e->name, method, method == 8 ? ", deflate" : "");
    zip_sizes s = {rd32(h + 20), rd32(h + 24), rd32(h + 42)};
    int rc = apply_zip64(z, e->name, name + name_len, extra_len, &s);
    if (rc == CART_OK && s.csize != s.usize)
        rc = cart_fail(CART_E_FORMAT, "%s: stored entry '%s' has %llu bytes compressed and %llu uncompressed", z->name,
                       e->name, (unsigned long long)s.csize, (unsigned long long)s.usize);
    if (rc == CART_OK) rc = read_local(z, &s, method, d->offset, e);
    if (rc == CART_OK && e->crc32 != 0 && cart_crc32(0, e->data, e->size) != e->crc32)
        rc = cart_fail(CART_E_FORMAT, "%s: entry '%s' fails its CRC-32 (stored %08x, data %08x): the file is damaged",
                       z->name, e->name, e->crc32, cart_crc32(0, e->data, e->size));
    *at += CENTRAL_FIXED + (uint64_t)name_len + extra_len + comment_len;
    return rc;
}

static int check_unique(const cart_zip *z) {
    for (int64_t i = 0; i < z->n; i++)
        for (int64_t j = 0; j < i; j++)
            if (strcmp(z->entries[i].name, z->entries[j].name) == 0)
                return cart_fail(CART_E_FORMAT, "%s: entry '%s' appears twice", z->name, z->entries[i].name);
    return CART_OK;
}

static int read_dir(cart_zip *z) {
    zip_dir d = {0, 0, 0};
    int rc = read_dir_place(z, &d);
    if (rc != CART_OK) return rc;
    if (d.count > MAX_ENTRIES || d.count > d.size / CENTRAL_FIXED)
        return cart_fail(CART_E_FORMAT, "%s: %llu entries cannot fit a central directory of %llu bytes (limit %d)",
                         z->name, (unsigned long long)d.count, (unsigned long long)d.size, MAX_ENTRIES);
    z->entries = cart_calloc(d.count ? d.count : 1, sizeof *z->entries, "zip entries");
    if (!z->entries) return CART_E_NOMEM;
    uint64_t at = d.offset;
    for (uint64_t i = 0; i < d.count; i++) {
        rc = read_central(z, &d, &at, &z->entries[z->n]);
        if (z->entries[z->n].name) z->n++; /* owned from here, freed with z */
        if (rc != CART_OK) return rc;
    }
    return z->n < 2048 ? check_unique(z) : CART_OK;
}

int cart_zip_open_memory(cart_zip **out, const void *data, uint64_t size, const char *name) {
    if (!out || (!data && size)) return cart_fail(CART_E_ARG, "cart_zip_open_memory: NULL argument");
    *out = NULL;
    cart_zip *z = cart_calloc(1, sizeof *z, "zip archive");
    if (!z) return CART_E_NOMEM;
    z->name = cart_strdup(name ? name : "<memory>", "zip archive name");
    z->data = (const uint8_t *)data;
    z->size = size;
    int rc = z->name ? read_dir(z) : CART_E_NOMEM;
    if (rc != CART_OK) {
        cart_zip_close(z);
        return rc;
    }
    *out = z;
    return CART_OK;
}

void cart_zip_close(cart_zip *z) {
    if (!z) return;
    for (int64_t i = 0; i < z->n; i++) free((void *)z->entries[i].name);
    free(z->entries);
    free(z->name);
    free(z);
}

int64_t cart_zip_count(const cart_zip *z) { return z ? z->n : 0; }

const cart_zip_entry *cart_zip_entry_at(const cart_zip *z, int64_t i) {
    return z && i >= 0 && i < z->n ? &z->entries[i] : NULL;
}

/* With many entries check_unique is skipped (quadratic); the first of two
 * equal names wins then, as it does for Python's zipfile. */
const cart_zip_entry *cart_zip_find(const cart_zip *z, const char *name) {
    if (!z || !name) return NULL;
    for (int64_t i = 0; i < z->n; i++)
        if (strcmp(z->entries[i].name, name) == 0) return &z->entries[i];
    return NULL;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct zip_written {
    char *name;
    uint64_t size, local;
    uint32_t crc32;
} zip_written;

struct cart_zip_writer {
    cart_afile file;
    zip_written *entries;
    int64_t n, cap;
};

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, v & 0xFFFF), put16(p + 2, v >> 16); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v), put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t clamp32(uint64_t v) { return v >= U32_MAX_MARK ? U32_MAX_MARK : (uint32_t)v; }

int cart_zip_writer_open(cart_zip_writer **out, const char *path) {
    if (!out || !path) return cart_fail(CART_E_ARG, "cart_zip_writer_open: NULL argument");
    *out = NULL;
    cart_zip_writer *w = cart_calloc(1, sizeof *w, "zip writer");
    if (!w) return CART_E_NOMEM;
    int rc = cart_afile_open(&w->file, path);
    if (rc != CART_OK) {
        free(w);
        return rc;
    }
    *out = w;
    return CART_OK;
}

static void writer_free(cart_zip_writer *w) {
    for (int64_t i = 0; i < w->n; i++) free(w->entries[i].name);
    free(w->entries);
    free(w);
}

/* The local header: sizes in zip64 form when the entry is 4 GiB or more,
 * then a padding field that puts the data on a 64-byte boundary. */
static int write_local(cart_zip_writer *w, const zip_written *e) {
    size_t name_len = strlen(e->name);
    int big = e->size >= U32_MAX_MARK;
    uint64_t fixed = LOCAL_FIXED + name_len + (big ? 20u : 0u) + 4u;
    uint32_t pad = (uint32_t)((ALIGN - (e->local + fixed) % ALIGN) % ALIGN);
    uint8_t h[LOCAL_FIXED + 20 + 4 + ALIGN] = {0};
    put32(h, SIG_LOCAL);
    put16(h + 4, big ? 45 : 20);
    put32(h + 14, e->crc32);
    put32(h + 18, big ? U32_MAX_MARK : (uint32_t)e->size);
    put32(h + 22, big ? U32_MAX_MARK : (uint32_t)e->size);
    put16(h + 26, (uint32_t)name_len);
    put16(h + 28, (big ? 20u : 0u) + 4u + pad);
    uint8_t *x = h + LOCAL_FIXED;
    if (big) put16(x, EXTRA_ZIP64), put16(x + 2, 16), put64(x + 4, e->size), put64(x + 12, e->size), x += 20;
    put16(x, EXTRA_PAD), put16(x + 2, pad);
    int rc = cart_afile_write(&w->file, h, LOCAL_FIXED);
    if (rc == CART_OK) rc = cart_afile_write(&w->file, e->name, name_len);
    if (rc == CART_OK) rc = cart_afile_write(&w->file, h + LOCAL_FIXED, (size_t)(x - (h + LOCAL_FIXED)) + 4u + pad);
    return rc;
}

int cart_zip_writer_add(cart_zip_writer *w, const char *name, const void *data, uint64_t size) {
    if (!w || !name || (!data && size)) return cart_fail(CART_E_ARG, "cart_zip_writer_add: NULL argument");
    size_t name_len = strlen(name);
    if (name_len == 0 || name_len > 0xFFFF) return cart_fail(CART_E_ARG, "zip writer: an entry name of %zu bytes", name_len);
    if (w->n == w->cap) {
        int64_t cap = w->cap ? 2 * w->cap : 16;
        zip_written *grown = cart_realloc(w->entries, (size_t)cap * sizeof *grown, "zip writer entries");
        if (!grown) return CART_E_NOMEM;
        w->entries = grown, w->cap = cap;
    }
    zip_written *e = &w->entries[w->n];
    e->name = cart_strdup(name, "zip entry name");
    if (!e->name) return CART_E_NOMEM;
    w->n++;
    e->size = size;
    e->local = w->file.written;
    e->crc32 = cart_crc32(0, data, size);
    int rc = write_local(w, e);
    if (rc == CART_OK && size) rc = cart_afile_write(&w->file, data, (size_t)size);
    return rc;
}

static int write_central(cart_zip_writer *w, const zip_written *e) {
    size_t name_len = strlen(e->name);
    int big_size = e->size >= U32_MAX_MARK, big_off = e->local >= U32_MAX_MARK;
    uint32_t x_len = (big_size || big_off) ? 4u + 16u * (uint32_t)big_size + 8u * (uint32_t)big_off : 0u;
    uint8_t h[CENTRAL_FIXED + 28] = {0};
    put32(h, SIG_CENTRAL);
    put16(h + 4, x_len ? 45 : 20);
    put16(h + 6, x_len ? 45 : 20);
    put32(h + 16, e->crc32);
    put32(h + 20, clamp32(e->size));
    put32(h + 24, clamp32(e->size));
    put16(h + 28, (uint32_t)name_len);
    put16(h + 30, x_len);
    put32(h + 42, clamp32(e->local));
    uint8_t *x = h + CENTRAL_FIXED;
    if (x_len) {
        put16(x, EXTRA_ZIP64), put16(x + 2, x_len - 4u), x += 4;
        if (big_size) put64(x, e->size), put64(x + 8, e->size), x += 16;
        if (big_off) put64(x, e->local);
    }
    int rc = cart_afile_write(&w->file, h, CENTRAL_FIXED);
    if (rc == CART_OK) rc = cart_afile_write(&w->file, e->name, name_len);
    if (rc == CART_OK && x_len) rc = cart_afile_write(&w->file, h + CENTRAL_FIXED, x_len);
    return rc;
}

/* The end records: zip64 ones first when any count, size or offset needs them. */
static int write_end(cart_zip_writer *w, uint64_t dir_offset, uint64_t dir_size) {
    int big = w->n >= 0xFFFF || dir_offset >= U32_MAX_MARK || dir_size >= U32_MAX_MARK;
    uint8_t b[END64_FIXED + LOC64_FIXED + END_FIXED] = {0};
    uint8_t *p = b;
    if (big) {
        uint64_t at = w->file.written;
        put32(p, SIG_END64), put64(p + 4, END64_FIXED - 12), put16(p + 12, 45), put16(p + 14, 45);
        put64(p + 24, (uint64_t)w->n), put64(p + 32, (uint64_t)w->n), put64(p + 40, dir_size), put64(p + 48, dir_offset);
        p += END64_FIXED;
        put32(p, SIG_LOC64), put64(p + 8, at), put32(p + 16, 1);
        p += LOC64_FIXED;
    }
    put32(p, SIG_END);
    put16(p + 8, w->n >= 0xFFFF ? 0xFFFF : (uint32_t)w->n);
    put16(p + 10, w->n >= 0xFFFF ? 0xFFFF : (uint32_t)w->n);
    put32(p + 12, clamp32(dir_size));
    put32(p + 16, clamp32(dir_offset));
    return cart_afile_write(&w->file, b, (size_t)(p + END_FIXED - b));
}

int cart_zip_writer_commit(cart_zip_writer *w) {
    if (!w) return cart_fail(CART_E_ARG, "cart_zip_writer_commit: NULL writer");
    uint64_t dir_offset = w->file.written;
    int rc = CART_OK;
    for (int64_t i = 0; i < w->n && rc == CART_OK; i++) rc = write_central(w, &w->entries[i]);
    if (rc == CART_OK) rc = write_end(w, dir_offset, w->file.written - dir_offset);
    if (rc == CART_OK) rc = cart_afile_commit(&w->file);
    else cart_afile_abort(&w->file);
    writer_free(w);
    return rc;
}

void cart_zip_writer_abort(cart_zip_writer *w) {
    if (!w) return;
    cart_afile_abort(&w->file);
    writer_free(w);
}
