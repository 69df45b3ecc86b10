/*
 * fs.c - path kinds and the sweep of stale temporary files (fs.h).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "fs.h"
#include "internal.h"

int32_t cart_fs_path_kind(const char *path, int64_t *size) {
    if (size) *size = 0;
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (path) cart_fail_errno(CART_E_IO, "%s: cannot stat", path);
        return CART_PATH_MISSING;
    }
    if (S_ISDIR(st.st_mode)) return CART_PATH_DIR;
    if (!S_ISREG(st.st_mode)) return CART_PATH_OTHER;
    if (size) *size = (int64_t)st.st_size;
    return CART_PATH_FILE;
}

/* The pid of "<base>.tmp.<pid>.<n>", or 0 when name is not one. */
static long temp_pid(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return 0;
    const char *p = name + n + 5;
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || *end != '.' || pid <= 0) return 0;
    const char *q = end + 1;
    if (!*q) return 0;
    for (; *q; q++)
        if (*q < '0' || *q > '9') return 0;
    return pid;
}

static int process_alive(long pid) {
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

int32_t cart_fs_sweep_temps(const char *target, char *names, int64_t cap) {
    if (names && cap > 0) names[0] = '\0';
    if (!target || !*target) return 0;
    char *dir = cart_strdup(target, "sweep path");
    if (!dir) return 0;
    char *slash = strrchr(dir, '/');
    const char *base = target, *d = ".";
    if (slash) {
        base = target + (slash - dir) + 1;
        *slash = '\0';
        d = slash == dir ? "/" : dir;
    }
    int32_t removed = 0;
    size_t used = 0;
    DIR *dp = *base ? opendir(d) : NULL;
    for (struct dirent *e; dp && (e = readdir(dp));) {
        long pid = temp_pid(e->d_name, base);
        if (!pid || process_alive(pid)) continue;
        char full[4096];
        if (snprintf(full, sizeof full, "%s/%s", d, e->d_name) >= (int)sizeof full) continue;
        if (unlink(full) != 0) continue;
        removed++;
        if (names && cap > 0) {
            int k = snprintf(names + used, (size_t)cap - used, "%s%s", used ? "\n" : "", full);
            if (k > 0) used = used + (size_t)k < (size_t)cap ? used + (size_t)k : (size_t)cap - 1;
        }
    }
    if (dp) closedir(dp);
    free(dir);
    return removed;
}
