/*
 * proc.c - child processes without a shell (proc.h), over posix_spawnp.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "fs.h"
#include "internal.h"
#include "proc.h"

extern char **environ;

/* Opens the child's stream `fd` here (so that a path that cannot be opened
 * is an error naming it) for dup2 there; -1 in *out when inherited. */
static int open_stream(int fd, const char *path, int *out) {
    static const char *const names[3] = {"input", "output", "error"};
    *out = -1;
    if (!path) return CART_OK;
    int flags = fd == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC;
    *out = open(path, flags | O_CLOEXEC, 0666);
    if (*out < 0)
        return cart_fail_errno(CART_E_IO, "cart_proc_spawn: cannot open %s for the child's standard %s", path,
                               names[fd]);
    return CART_OK;
}

/* environ plus the entries of `extra` (which replace entries of the same name). */
static char **child_env(const char *const *extra) {
    size_t n = 0, k = 0;
    while (environ[n]) n++;
    while (extra && extra[k]) k++;
    char **env = cart_malloc(sizeof *env * (n + k + 1), "child environment");
    if (!env) return NULL;
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t len = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
        int replaced = 0;
        for (size_t j = 0; j < k && !replaced; j++) replaced = strncmp(extra[j], environ[i], len) == 0;
        if (!replaced) env[out++] = environ[i];
    }
    for (size_t j = 0; j < k; j++) env[out++] = (char *)extra[j];
    env[out] = NULL;
    return env;
}

/* (so that a missing program is an error of spawn, not an exit status of
 * 127 later) */
int32_t cart_proc_exists(const char *name) {
    if (!name || !*name) return 0;
    if (strchr(name, '/')) return access(name, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    char buf[4096];
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len + strlen(name) + 2 < sizeof buf) {
            memcpy(buf, len ? p : ".", len ? len : 1);
            size_t at = len ? len : 1;
            buf[at] = '/';
            strcpy(buf + at + 1, name);
            if (access(buf, X_OK) == 0) return 1;
        }
        p = end ? end + 1 : p + len;
    }
    return 0;
}

/* Opens the streams (fds[3], -1 for inherited) and plans their dup2 and
 * the working directory. */
static int plan_streams(posix_spawn_file_actions_t *fa, const cart_proc_options *o, int fds[3]) {
    const char *paths[3] = {o->stdin_path, o->stdout_path, o->stderr_path};
    const int both = o->stdout_path && o->stderr_path && strcmp(o->stdout_path, o->stderr_path) == 0;
    for (int fd = 0; fd < 3; fd++) {
        if (fd == 2 && both) fds[2] = -1;
        else {
            int rc = open_stream(fd, paths[fd], &fds[fd]);
            if (rc != CART_OK) return rc;
        }
        const int src = fd == 2 && both ? fds[1] : fds[fd];
        if (src >= 0 && posix_spawn_file_actions_adddup2(fa, src, fd))
            return cart_fail(CART_E_NOMEM, "cart_proc_spawn: out of memory");
    }
    int rc;
    if (o->cwd && (rc = posix_spawn_file_actions_addchdir_np(fa, o->cwd)) != 0)
        return cart_fail(CART_E_IO, "cart_proc_spawn: cannot plan the working directory %s: %s", o->cwd, strerror(rc));
    return CART_OK;
}

int cart_proc_spawn(int64_t *pid, const char *const *argv, const cart_proc_options *opts) {
    if (!pid || !argv || !argv[0])
        return cart_fail(CART_E_ARG, "cart_proc_spawn: %s is NULL", !pid ? "pid" : "the program");
    *pid = 0;
    if (!cart_proc_exists(argv[0]))
        return cart_fail(CART_E_NOT_FOUND, "cart_proc_spawn: no program '%s' on PATH (or it is not executable)",
                         argv[0]);
    const cart_proc_options none = {0};
    const cart_proc_options *o = opts ? opts : &none;
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa)) return cart_fail(CART_E_NOMEM, "cart_proc_spawn: out of memory");
    int fds[3] = {-1, -1, -1};
    if (o->cwd && cart_fs_path_kind(o->cwd, NULL) != CART_PATH_DIR) {
        posix_spawn_file_actions_destroy(&fa);
        return cart_fail(CART_E_IO, "cart_proc_spawn: the working directory %s is not a directory", o->cwd);
    }
    int rc = plan_streams(&fa, o, fds);
    char **env = rc == CART_OK ? child_env(o->env) : NULL;
    if (rc == CART_OK && !env) rc = CART_E_NOMEM;
    if (rc == CART_OK) {
        pid_t child = 0;
        int err = posix_spawnp(&child, argv[0], &fa, NULL, (char *const *)argv, env);
        if (err) rc = cart_fail(err == ENOENT ? CART_E_NOT_FOUND : CART_E_IO, "cart_proc_spawn: cannot start %s: %s",
                                argv[0], strerror(err));
        else *pid = child;
    }
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    for (int fd = 0; fd < 3; fd++)
        if (fds[fd] >= 0) close(fds[fd]);
    return rc;
}

int cart_proc_wait(int64_t pid, double timeout, int32_t *status) {
    if (pid <= 0 || !status) return cart_fail(CART_E_ARG, "cart_proc_wait: %s", pid <= 0 ? "no process id" : "status is NULL");
    const double until = cart_now_seconds() + timeout;
    for (double pause = 0.001;; pause = pause < 0.05 ? pause * 2 : 0.05) {
        int ws = 0;
        pid_t got = waitpid((pid_t)pid, &ws, timeout < 0 ? 0 : WNOHANG);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return cart_fail(CART_E_ARG, "cart_proc_wait: process %lld is not a child of this one: %s",
                                      (long long)pid, strerror(errno));
        if (got == (pid_t)pid) {
            *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 255;
            return CART_OK;
        }
        if (cart_now_seconds() >= until)
            return cart_fail(CART_E_STATE, "cart_proc_wait: process %lld is still running after %.1f s",
                             (long long)pid, timeout);
        cart_sleep_seconds(pause);
    }
}

static int proc_signal(int64_t pid, int sig) {
    if (pid <= 0) return cart_fail(CART_E_ARG, "cart_proc: no process id");
    if (kill((pid_t)pid, sig) != 0)
        return cart_fail(errno == ESRCH ? CART_E_NOT_FOUND : CART_E_IO, "cart_proc: cannot signal process %lld: %s",
                         (long long)pid, strerror(errno));
    return CART_OK;
}

int cart_proc_terminate(int64_t pid) { return proc_signal(pid, SIGTERM); }
int cart_proc_kill(int64_t pid) { return proc_signal(pid, SIGKILL); }

int32_t cart_proc_alive(int64_t pid) {
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}
