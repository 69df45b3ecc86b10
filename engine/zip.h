/*
 * zip.h - zip archives of stored (uncompressed) entries: read from memory,
 * written atomically. This is the container of PyTorch's torch.save files
 * (torchpt.h), whose writer stores every entry uncompressed, with a CRC-32,
 * its data aligned to 64 bytes, and zip64 records when a size or an offset
 * passes 4 GiB.
 *
 * The reader checks, each failure a CART_E_FORMAT naming the entry and the
 * field: the end-of-central-directory record (and the zip64 one it points
 * to), every central directory entry against the bytes left, each local
 * header against its central entry (signature, name, method), every data
 * range inside the file and before the central directory, no duplicate
 * names, no NUL in a name, no encryption, and each entry's CRC-32 (a CRC
 * of 0 means none was recorded, as torch.save writes with
 * torch.serialization.set_crc32_options(False), and is not checked). Entries
 * compressed with any method but "stored" are CART_E_UNSUPPORTED, naming
 * the method: torch.save never compresses, so such an archive was written
 * by another tool. Multi-disk archives are refused.
 *
 * Names returned by the reader are NUL-terminated copies owned by the
 * archive; data pointers point into the caller's memory, which must outlive
 * the archive.
 */
#ifndef CART_ZIP_H
#define CART_ZIP_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_zip_entry {
    const char *name;    /* NUL-terminated, as stored ("archive/data.pkl") */
    const uint8_t *data; /* the entry's bytes, inside the archive's memory */
    uint64_t size;
    uint32_t crc32;
} cart_zip_entry;

typedef struct cart_zip cart_zip;

/* Reads the archive in data[0..size), which must outlive it; `name` (may be
 * NULL: "<memory>") names it in messages. Close with cart_zip_close. */
int cart_zip_open_memory(cart_zip **out, const void *data, uint64_t size, const char *name);
void cart_zip_close(cart_zip *z);

/* Entries in central directory order; NULL out of range or when absent. */
int64_t cart_zip_count(const cart_zip *z);
const cart_zip_entry *cart_zip_entry_at(const cart_zip *z, int64_t i);
const cart_zip_entry *cart_zip_find(const cart_zip *z, const char *name);

/* The CRC-32 of zip (and gzip, PNG): polynomial 0xEDB88320, reflected,
 * initial and final XOR 0xFFFFFFFF. Chain pieces by passing the previous
 * result as crc (0 to start). */
uint32_t cart_crc32(uint32_t crc, const void *data, uint64_t n);

/* A zip written atomically (temporary file beside the path, fsync, rename):
 * add entries in order, then commit. Each entry is stored with its CRC-32,
 * its data starting on a 64-byte boundary (padding in the local header's
 * extra field, as torch.save does), zip64 fields where a size or offset
 * needs them. Abort (or a failed commit) leaves the path as it was. */
typedef struct cart_zip_writer cart_zip_writer;

int cart_zip_writer_open(cart_zip_writer **out, const char *path);
int cart_zip_writer_add(cart_zip_writer *w, const char *name, const void *data, uint64_t size);
int cart_zip_writer_commit(cart_zip_writer *w); /* frees w */
void cart_zip_writer_abort(cart_zip_writer *w); /* frees w */

#ifdef __cplusplus
}
#endif

#endif
