/*
 * fs.h - the file system for recipes: what a path is, directories made and
 * listed, whole files written atomically, and the clean-up of temporary files
 * left by dead processes. Lua uses these instead of the shell, so that paths
 * with spaces, quotes or newlines work.
 *
 * The engine writes artifacts atomically (a temporary file beside the target,
 * fsynced, then renamed over it; see fileio.c). A process killed between the
 * two leaves "<target>.tmp.<pid>.<n>" behind. cart_fs_sweep_temps removes
 * those whose process no longer exists on this machine, so crashes do not
 * pile up half-written files.
 */
#ifndef CART_FS_H
#define CART_FS_H

#include <stdint.h>
#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cart_path_kind {
    CART_PATH_MISSING = 0, /* nothing there, or it cannot be examined (see cart_last_error) */
    CART_PATH_FILE = 1,    /* a regular file (symbolic links followed) */
    CART_PATH_DIR = 2,     /* a directory */
    CART_PATH_OTHER = 3    /* a FIFO, socket or device: not something to read a document from */
} cart_path_kind;

/* What `path` is (a cart_path_kind); *size (may be NULL) gets a regular
 * file's size in bytes, else 0. Never opens the path, so a FIFO cannot block. */
int32_t cart_fs_path_kind(const char *path, int64_t *size);

/* 1 when `path` itself is a symbolic link (not followed), else 0. */
int32_t cart_fs_is_link(const char *path);

/* Removes the temporary files "<base>.tmp.<pid>.<n>" beside `target` (in its
 * directory, <base> its file name) whose pid is not a live process here.
 * Returns how many it removed (0 when none, or the directory cannot be
 * read); their names, newline-separated, go to names[0..cap) (cut at cap,
 * always NUL-terminated when cap > 0; names may be NULL). A file it cannot
 * remove is skipped. */
int32_t cart_fs_sweep_temps(const char *target, char *names, int64_t cap);

/* Creates `path` and its missing parents (mode 0777 less the umask), as
 * mkdir -p does; an existing directory is fine. CART_E_IO names the part
 * that could not be made, or that exists and is not a directory. */
int cart_fs_mkdirs(const char *path);

/* Whether a and b name the same file (device and inode, links followed):
 * 1 yes, 0 no or one of them missing. */
int32_t cart_fs_same_file(const char *a, const char *b);

/* Whether an artifact may be written to `path`: CART_OK when nothing is
 * there or a regular file is (which the atomic rename then replaces);
 * CART_E_ARG, with a message naming what is there and the fix, for a
 * directory, a symbolic link (renaming over it would replace the link, not
 * its target), a FIFO, socket or device. Every atomic write checks it
 * first; recipes call it before long work. */
int cart_fs_check_output(const char *path);

/* The bytes an unprivileged process may still write on the filesystem
 * that holds `path` (a directory, or a file whose directory is used when the
 * file does not exist yet): statvfs's f_bavail x f_frsize. -1 with
 * CART_E_IO naming the path when it cannot be examined. Recipes check it
 * before long work whose result they must save. */
int64_t cart_fs_free_bytes(const char *path);

/* Takes the lock file `path` for this process: creates it if missing,
 * takes an exclusive flock on it without waiting and writes this process's
 * id into it. Returns the open descriptor (>= 0), which holds the lock until
 * cart_fs_unlock or the process ends (a crash releases it too). CART_E_STATE
 * with a message naming the holder's process id when another open file
 * holds it (another process, or another cart_fs_lock in this one);
 * CART_E_IO when the file cannot be made. For directories one process at a
 * time may own (a server's disk tier of KV caches). */
int cart_fs_lock(const char *path);
void cart_fs_unlock(int fd);

/* A regular file's last modification time in nanoseconds since the epoch,
 * or -1 when path is missing or not a regular file (cart_last_error says
 * why). */
int64_t cart_fs_mtime_ns(const char *path);

/* Sets a file's modification (and access) time to now, as `touch` does on
 * an existing file; never creates one. CART_E_IO names the file. Used to
 * keep least-recently-used order in files across restarts. */
int cart_fs_touch(const char *path);

/* Writes n bytes to path atomically (temporary file beside it, fsync,
 * rename, the directory fsynced), after sweeping stale temporary files of
 * the target. The old file, if any, is untouched on failure. */
int cart_fs_write_atomic(const char *path, const void *data, int64_t n);

/* The entries of a directory ("." and ".." left out), sorted bytewise. */
typedef struct cart_fs_listing cart_fs_listing;

/* Lists `dir`. CART_E_IO names the directory when it cannot be read. Free
 * with cart_fs_listing_free. */
int cart_fs_list(cart_fs_listing **out, const char *dir);
int64_t cart_fs_listing_count(const cart_fs_listing *l);
/* Entry i's name (no directory part); NULL out of range. */
const char *cart_fs_listing_name(const cart_fs_listing *l, int64_t i);
void cart_fs_listing_free(cart_fs_listing *l);

#ifdef __cplusplus
}
#endif

#endif
