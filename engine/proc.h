/*
 * proc.h - child processes without a shell: a program and its arguments
 * (found on PATH as execvp finds it), its standard streams from or to files,
 * a wait with a time limit, and the signals that stop it. No string is ever
 * given to /bin/sh, so no argument needs quoting and none is interpreted.
 */
#ifndef CART_PROC_H
#define CART_PROC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cart_proc_options {
    const char *stdin_path;  /* NULL: this process's standard input; "/dev/null" for none */
    const char *stdout_path; /* NULL: this process's standard output; else created or truncated */
    const char *stderr_path; /* NULL: this process's; the same text as stdout_path: one file for both */
    const char *cwd;         /* NULL: this process's working directory */
    const char *const *env;  /* "NAME=value" entries set in the child's environment (NULL-terminated), or NULL */
} cart_proc_options;

/* Starts argv[0] (searched on PATH when it has no slash) with argv
 * (NULL-terminated) and writes its process id to *pid. CART_E_NOT_FOUND
 * names a program that is not there or not executable; CART_E_IO a stream
 * file or working directory that cannot be opened (stream paths are
 * relative to this process's working directory). opts may be NULL. Wait
 * for every child started (cart_proc_wait), or it stays a zombie. */
int cart_proc_spawn(int64_t *pid, const char *const *argv, const cart_proc_options *opts);

/* Waits for child pid to end, at most `timeout` seconds (< 0: as long as it
 * takes), and writes its exit code to *status (128 + the signal's number
 * when a signal ended it). CART_E_STATE when it is still running at the
 * limit (wait again, or stop it); CART_E_ARG when pid is not a child of
 * this process. */
int cart_proc_wait(int64_t pid, double timeout, int32_t *status);

/* Asks pid to stop (SIGTERM), or stops it at once (SIGKILL). CART_E_NOT_FOUND
 * when there is no such process. */
int cart_proc_terminate(int64_t pid);
int cart_proc_kill(int64_t pid);

/* 1 when `program` would run: with a slash, an executable file; without,
 * one on PATH (as execvp searches it). Else 0. */
int32_t cart_proc_exists(const char *program);

/* 1 while a process of that id exists (a zombie child included), else 0. */
int32_t cart_proc_alive(int64_t pid);

#ifdef __cplusplus
}
#endif

#endif
