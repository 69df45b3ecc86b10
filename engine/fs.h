/*
 * fs.h - what a path is, and the clean-up of temporary files left by dead
 * processes.
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

/* Removes the temporary files "<base>.tmp.<pid>.<n>" beside `target` (in its
 * directory, <base> its file name) whose pid is not a live process here.
 * Returns how many it removed (0 when none, or the directory cannot be
 * read); their names, newline-separated, go to names[0..cap) (cut at cap,
 * always NUL-terminated when cap > 0; names may be NULL). A file it cannot
 * remove is skipped. */
int32_t cart_fs_sweep_temps(const char *target, char *names, int64_t cap);

#ifdef __cplusplus
}
#endif

#endif
