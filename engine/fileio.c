/*
 * fileio.c - read-only file mappings and atomic (temp + fsync + rename) writes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "internal.h"

int cart_map_file(cart_mapping *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cart_fail_errno(CART_E_IO, "%s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = cart_fail_errno(CART_E_IO, "%s: cannot stat", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cart_fail(CART_E_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int rc = cart_fail_errno(CART_E_IO, "%s: cannot map %lld bytes", path,
                                     (long long)st.st_size);
            close(fd);
            return rc;
        }
        m->data = p;
        m->owned = 1;
        /* Model weights are read front to back on every decode step: ask for
         * huge pages (fewer TLB misses when streaming a gigabyte) where the
         * kernel offers them for file mappings; harmless where it does not. */
        if (st.st_size >= (64 << 20)) madvise(p, (size_t)st.st_size, MADV_HUGEPAGE);
    }
    m->size = (uint64_t)st.st_size;
    close(fd);
    return CART_OK;
}

void cart_unmap_file(cart_mapping *m) {
    if (m->owned && m->data) munmap((void *)m->data, (size_t)m->size);
    memset(m, 0, sizeof *m);
}

static atomic_uint tmp_counter;

int cart_afile_open(cart_afile *f, const char *path) {
    memset(f, 0, sizeof *f);
    int checked = cart_fs_check_output(path);
    if (checked) return checked;
    size_t n = strlen(path) + 64;
    f->path = cart_strdup(path, "output path");
    f->tmp_path = cart_malloc(n, "temporary path");
    if (!f->path || !f->tmp_path) {
        cart_afile_abort(f);
        return CART_E_NOMEM;
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld.%u", path, (long)getpid(),
             atomic_fetch_add(&tmp_counter, 1));
    int fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = cart_fail_errno(CART_E_IO, "%s: cannot create temporary file %s", path,
                                 f->tmp_path);
        free(f->path);
        free(f->tmp_path);
        memset(f, 0, sizeof *f);
        return rc;
    }
    f->fp = fdopen(fd, "wb");
    if (!f->fp) {
        int rc = cart_fail_errno(CART_E_IO, "%s: cannot open a stream", f->tmp_path);
        close(fd);
        unlink(f->tmp_path);
        free(f->path);
        free(f->tmp_path);
        memset(f, 0, sizeof *f);
        return rc;
    }
    return CART_OK;
}

int cart_afile_write(cart_afile *f, const void *data, size_t n) {
    if (!f->fp) return cart_fail(CART_E_STATE, "write to a closed output file");
    if (f->failed) return CART_E_IO;
    if (n && fwrite(data, 1, n, f->fp) != n) {
        f->failed = 1;
        return cart_fail_errno(CART_E_IO, "%s: write failed after %llu bytes", f->path,
                               (unsigned long long)f->written);
    }
    f->written += n;
    return CART_OK;
}

int cart_afile_pad(cart_afile *f, uint64_t alignment) {
    static const uint8_t zeros[256];
    if (alignment == 0) return CART_OK;
    uint64_t pad = (alignment - f->written % alignment) % alignment;
    while (pad > 0) {
        size_t step = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        int rc = cart_afile_write(f, zeros, step);
        if (rc) return rc;
        pad -= step;
    }
    return CART_OK;
}

static void fsync_parent_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) d = "/";
    else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* best effort: some filesystems refuse fsync on directories */
        close(fd);
    }
    free(dir);
}

int cart_afile_commit(cart_afile *f) {
    if (!f->fp) return cart_fail(CART_E_STATE, "commit of a closed output file");
    int rc = CART_OK;
    if (f->failed) rc = CART_E_IO;
    if (!rc && fflush(f->fp) != 0)
        rc = cart_fail_errno(CART_E_IO, "%s: flush failed", f->tmp_path);
    if (!rc && fsync(fileno(f->fp)) != 0)
        rc = cart_fail_errno(CART_E_IO, "%s: fsync failed", f->tmp_path);
    if (fclose(f->fp) != 0 && !rc) rc = cart_fail_errno(CART_E_IO, "%s: close failed", f->tmp_path);
    f->fp = NULL;
    if (!rc && rename(f->tmp_path, f->path) != 0)
        rc = cart_fail_errno(CART_E_IO, "cannot rename %s to %s", f->tmp_path, f->path);
    if (rc) {
        unlink(f->tmp_path);
    } else {
        fsync_parent_dir(f->path);
    }
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
    return rc;
}

void cart_afile_abort(cart_afile *f) {
    if (f->fp) {
        fclose(f->fp);
        unlink(f->tmp_path);
    }
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof *f);
}

/* fs.h: one buffer to path, atomically (the temporary files of dead
 * processes swept first). */
int cart_fs_write_atomic(const char *path, const void *data, int64_t n) {
    if (!path || n < 0 || (n > 0 && !data))
        return cart_fail(CART_E_ARG, "write_atomic: %s", !path ? "path is NULL" : "bad data or length");
    cart_fs_sweep_temps(path, NULL, 0);
    cart_afile f;
    int rc = cart_afile_open(&f, path);
    if (rc) return rc;
    rc = cart_afile_write(&f, data, (size_t)n);
    if (rc) {
        cart_afile_abort(&f);
        return rc;
    }
    return cart_afile_commit(&f);
}
