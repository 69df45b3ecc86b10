/*
 * fs.c - path kinds and the sweep of stale temporary files (fs.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
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

int32_t cart_fs_is_link(const char *path) {
    struct stat st;
    return path && lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

int cart_fs_check_output(const char *path) {
    struct stat st;
    if (!path || !*path) return cart_fail(CART_E_ARG, "the output path is empty");
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return CART_OK;
        return cart_fail_errno(CART_E_IO, "%s: cannot examine the output path", path);
    }
    if (S_ISREG(st.st_mode)) return CART_OK;
    if (S_ISLNK(st.st_mode)) {
        char target[1024];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        return cart_fail(CART_E_ARG, "%s is a symbolic link (to %s): writing an artifact would replace the link, "
                         "not its target; give the target's path to write there (readlink -f %s), or remove "
                         "the link", path, n > 0 ? target : "?", path);
    }
    const char *what = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : "not a regular file";
    return cart_fail(CART_E_ARG, "%s is %s: an artifact replaces only a regular file; choose a file path", path,
                     what);
}

int64_t cart_fs_free_bytes(const char *path) {
    if (!path || !*path) {
        cart_fail(CART_E_ARG, "cart_fs_free_bytes: the path is empty");
        return -1;
    }
    struct statvfs sv;
    if (statvfs(path, &sv) != 0) {
        /* a file not written yet: its directory */
        char dir[4096] = ".";
        const char *slash = strrchr(path, '/');
        if (slash) {
            size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/x" lives in "/" */
            if (n >= sizeof dir) n = sizeof dir - 1;
            memcpy(dir, path, n);
            dir[n] = '\0';
        }
        if (statvfs(dir, &sv) != 0) {
            cart_fail_errno(CART_E_IO, "%s: cannot examine the free space of its filesystem", path);
            return -1;
        }
    }
    uint64_t bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return bytes > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bytes;
}

int cart_fs_lock(const char *path) {
    if (!path || !*path) return cart_fail(CART_E_ARG, "cart_fs_lock: the path is empty");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return cart_fail_errno(CART_E_IO, "%s: cannot open the lock file", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (err == EWOULDBLOCK)
            return cart_fail(CART_E_STATE, "%s is held by process %s", path, *holder ? holder : "(unknown)");
        errno = err;
        return cart_fail_errno(CART_E_IO, "%s: cannot lock", path);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        close(fd);
        return cart_fail_errno(CART_E_IO, "%s: cannot write this process's id into the lock file", path);
    }
    return fd;
}

void cart_fs_unlock(int fd) {
    if (fd >= 0) close(fd);
}

int64_t cart_fs_mtime_ns(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (path) cart_fail_errno(CART_E_IO, "%s: cannot stat", path);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        cart_fail(CART_E_IO, "%s is not a regular file", path);
        return -1;
    }
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
}

int cart_fs_touch(const char *path) {
    if (!path) return cart_fail(CART_E_ARG, "touch: path is NULL");
    if (utimensat(AT_FDCWD, path, NULL, 0) != 0) return cart_fail_errno(CART_E_IO, "cannot touch %s", path);
    return CART_OK;
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

int cart_fs_mkdirs(const char *path) {
    if (!path || !*path) return cart_fail(CART_E_ARG, "mkdirs: the path is empty");
    char *buf = cart_strdup(path, "mkdirs path");
    if (!buf) return CART_E_NOMEM;
    int rc = CART_OK;
    size_t n = strlen(buf);
    for (size_t i = 1; i <= n && rc == CART_OK; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        struct stat st;
        if (stat(buf, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                rc = cart_fail(CART_E_IO, "cannot create directory %s: %s exists and is not a directory",
                               path, buf);
        } else if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            rc = cart_fail_errno(CART_E_IO, "cannot create directory %s", buf);
        }
        buf[i] = saved;
    }
    free(buf);
    return rc;
}

int32_t cart_fs_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

struct cart_fs_listing {
    char **names;
    int64_t n;
};

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int cart_fs_list(cart_fs_listing **out, const char *dir) {
    if (!out) return cart_fail(CART_E_ARG, "list: out is NULL");
    *out = NULL;
    DIR *dp = dir ? opendir(dir) : NULL;
    if (!dp) return cart_fail_errno(CART_E_IO, "cannot list directory %s", dir ? dir : "(null)");
    cart_fs_listing *l = cart_calloc(1, sizeof *l, "directory listing");
    int64_t cap = 0;
    int rc = l ? CART_OK : CART_E_NOMEM;
    for (struct dirent *e; rc == CART_OK && (e = readdir(dp));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (l->n == cap) {
            cap = cap ? 2 * cap : 16;
            char **names = cart_realloc(l->names, (size_t)cap * sizeof *names, "directory listing");
            if (!names) {
                rc = CART_E_NOMEM;
                break;
            }
            l->names = names;
        }
        l->names[l->n] = cart_strdup(e->d_name, "directory entry");
        if (!l->names[l->n]) rc = CART_E_NOMEM;
        else l->n++;
    }
    closedir(dp);
    if (rc) {
        cart_fs_listing_free(l);
        return rc;
    }
    if (l->n > 1) qsort(l->names, (size_t)l->n, sizeof *l->names, cmp_names);
    *out = l;
    return CART_OK;
}

int64_t cart_fs_listing_count(const cart_fs_listing *l) {
    return l ? l->n : 0;
}

const char *cart_fs_listing_name(const cart_fs_listing *l, int64_t i) {
    return l && i >= 0 && i < l->n ? l->names[i] : NULL;
}

void cart_fs_listing_free(cart_fs_listing *l) {
    if (!l) return;
    for (int64_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l);
}
