/*
 * test_fs.c - fs.h: path kinds (a FIFO is never opened), mkdirs, listings,
 * atomic whole-file writes, modification times, same-file checks, the sweep of temporary
 * files left by dead processes, free space and lock files.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fs.h"

static char tmp_dir[256];

static void path_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_tells_files_dirs_and_fifos_apart_without_opening(void) {
    char file[512], fifo[512], none[512];
    path_in(file, sizeof file, "f.txt");
    path_in(fifo, sizeof fifo, "pipe");
    path_in(none, sizeof none, "none");
    put(file, "hello");
    CHECK(mkfifo(fifo, 0600) == 0);
    int64_t size = -1;
    CHECK(cart_fs_path_kind(file, &size) == CART_PATH_FILE && size == 5);
    CHECK(cart_fs_path_kind(tmp_dir, &size) == CART_PATH_DIR && size == 0);
    CHECK(cart_fs_path_kind(fifo, &size) == CART_PATH_OTHER); /* returns at once: a FIFO is not opened */
    CHECK(cart_fs_path_kind(none, NULL) == CART_PATH_MISSING);
    CHECK_ERROR_MENTIONS("none: cannot stat");
    printf("  file, directory, FIFO and missing told apart; %s\n", cart_last_error());
}

static void test_makes_nested_directories_with_odd_names(void) {
    char deep[512], file[512], bad[600];
    path_in(deep, sizeof deep, "a b/'c'/\"d\"/e");
    CHECK_OK(cart_fs_mkdirs(deep));
    CHECK_OK(cart_fs_mkdirs(deep)); /* already there */
    CHECK(cart_fs_path_kind(deep, NULL) == CART_PATH_DIR);
    path_in(file, sizeof file, "plain");
    put(file, "x");
    snprintf(bad, sizeof bad, "%s/under", file);
    CHECK_ERR(cart_fs_mkdirs(bad), CART_E_IO);
    CHECK_ERROR_MENTIONS("exists and is not a directory");
    printf("  %s\n", cart_last_error());
}

static void test_lists_a_directory_sorted(void) {
    char dir[512], p[600];
    path_in(dir, sizeof dir, "list");
    CHECK_OK(cart_fs_mkdirs(dir));
    const char *names[] = {"b.md", "a b.md", "Z", ".hidden"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        put(p, "x");
    }
    cart_fs_listing *l = NULL;
    CHECK_OK(cart_fs_list(&l, dir));
    CHECK(cart_fs_listing_count(l) == 4);
    const char *want[] = {".hidden", "Z", "a b.md", "b.md"};
    for (int i = 0; i < 4 && cart_fs_listing_count(l) == 4; i++)
        CHECK_MSG(strcmp(cart_fs_listing_name(l, i), want[i]) == 0, "entry %d: %s", i, cart_fs_listing_name(l, i));
    CHECK(cart_fs_listing_name(l, 4) == NULL);
    cart_fs_listing_free(l);
    snprintf(p, sizeof p, "%s/missing", dir);
    CHECK_ERR(cart_fs_list(&l, p), CART_E_IO);
    CHECK_ERROR_MENTIONS("cannot list directory");
    CHECK(l == NULL);
}

static void test_writes_whole_files_atomically(void) {
    char path[512], same[512], other[512];
    path_in(path, sizeof path, "atomic.txt");
    CHECK_OK(cart_fs_write_atomic(path, "first", 5));
    CHECK_OK(cart_fs_write_atomic(path, "second", 6));
    int64_t size = 0;
    CHECK(cart_fs_path_kind(path, &size) == CART_PATH_FILE && size == 6);
    snprintf(same, sizeof same, "%s/./atomic.txt", tmp_dir);
    path_in(other, sizeof other, "f.txt");
    CHECK(cart_fs_same_file(path, same) == 1);
    CHECK(cart_fs_same_file(path, other) == 0);
    CHECK(cart_fs_same_file(path, "/no/such/file") == 0);
    /* into a missing directory: an error, and nothing left behind */
    char lost[512];
    path_in(lost, sizeof lost, "no-dir/x.txt");
    CHECK_ERR(cart_fs_write_atomic(lost, "x", 1), CART_E_IO);
}

/* An artifact replaces only a regular file: a FIFO, a directory, a symbolic
 * link (whose target must stay as it is) and a device are refused by name
 * before anything is written, and nothing is left beside them. */
static void test_refuses_to_write_over_what_is_not_a_regular_file(void) {
    char fifo[512], dir[512], link[512], target[512];
    path_in(fifo, sizeof fifo, "out.fifo");
    path_in(dir, sizeof dir, "out.dir");
    path_in(link, sizeof link, "out.link");
    path_in(target, sizeof target, "link-target.txt");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(mkdir(dir, 0700) == 0);
    put(target, "kept");
    CHECK(symlink(target, link) == 0);
    CHECK_ERR(cart_fs_write_atomic(fifo, "x", 1), CART_E_ARG);
    CHECK_ERROR_MENTIONS("is a FIFO: an artifact replaces only a regular file");
    CHECK(cart_fs_path_kind(fifo, NULL) == CART_PATH_OTHER);
    CHECK_ERR(cart_fs_write_atomic(dir, "x", 1), CART_E_ARG);
    CHECK_ERROR_MENTIONS("is a directory");
    CHECK_ERR(cart_fs_write_atomic(link, "x", 1), CART_E_ARG);
    CHECK_ERROR_MENTIONS("is a symbolic link (to ");
    CHECK_ERROR_MENTIONS("readlink -f");
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    int64_t size = 0;
    CHECK(cart_fs_path_kind(target, &size) == CART_PATH_FILE && size == 4);
    CHECK_ERR(cart_fs_check_output("/dev/null"), CART_E_ARG);
    CHECK_ERROR_MENTIONS("/dev/null is a device");
    CHECK_OK(cart_fs_check_output(target));
    char none[512];
    path_in(none, sizeof none, "not-yet.txt");
    CHECK_OK(cart_fs_check_output(none));
    printf("  %s\n", cart_last_error());
}

static void test_reads_and_touches_modification_times(void) {
    char path[512], dir[512];
    path_in(path, sizeof path, "old.txt");
    put(path, "x");
    struct timespec times[2] = {{1000000000, 5}, {1000000000, 5}}; /* 2001-09-09, +5 ns */
    CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
    CHECK(cart_fs_mtime_ns(path) == INT64_C(1000000000000000005));
    CHECK_OK(cart_fs_touch(path));
    int64_t now = (int64_t)time(NULL) * 1000000000;
    int64_t got = cart_fs_mtime_ns(path);
    CHECK_MSG(got > now - INT64_C(60000000000) && got < now + INT64_C(60000000000),
              "touched mtime %lld, now %lld", (long long)got, (long long)now);
    path_in(dir, sizeof dir, "missing.txt");
    CHECK(cart_fs_mtime_ns(dir) == -1);
    CHECK_ERR(cart_fs_touch(dir), CART_E_IO); /* never creates a file */
    CHECK(cart_fs_path_kind(dir, NULL) == CART_PATH_MISSING);
    CHECK(cart_fs_mtime_ns(tmp_dir) == -1); /* a directory is not a regular file */
}

static void test_sweeps_only_dead_processes_temp_files(void) {
    char target[512], stale[600], live[600], other[600], names[1024];
    path_in(target, sizeof target, "c.safetensors");
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0); /* a pid that no longer runs */
    snprintf(stale, sizeof stale, "%s.tmp.%d.0", target, (int)child);
    snprintf(live, sizeof live, "%s.tmp.%d.3", target, (int)getpid());
    snprintf(other, sizeof other, "%s.tmp.%d.x", target, (int)child); /* not our pattern */
    put(stale, "half");
    put(live, "in progress");
    put(other, "keep");
    CHECK(cart_fs_sweep_temps(target, names, sizeof names) == 1);
    CHECK_MSG(strcmp(names, stale) == 0, "removed '%s'", names);
    CHECK(cart_fs_path_kind(stale, NULL) == CART_PATH_MISSING);
    CHECK(cart_fs_path_kind(live, NULL) == CART_PATH_FILE);
    CHECK(cart_fs_path_kind(other, NULL) == CART_PATH_FILE);
    CHECK(cart_fs_sweep_temps(target, NULL, 0) == 0);
    printf("  removed %s; kept the live process's and a non-matching name\n", names);
}

static void test_reports_free_space_of_a_path_or_its_directory(void) {
    char file[512];
    path_in(file, sizeof file, "not-written-yet.bin");
    const int64_t dir_free = cart_fs_free_bytes(tmp_dir), file_free = cart_fs_free_bytes(file);
    printf("  free bytes at %s: %lld (a file not written yet there: %lld)\n", tmp_dir, (long long)dir_free,
           (long long)file_free);
    CHECK(dir_free > 0 && file_free > 0);
    CHECK(cart_fs_free_bytes("/no/such/dir/x") == -1);
    CHECK(strstr(cart_last_error(), "/no/such/dir/x") != NULL);
    CHECK(cart_fs_free_bytes("") == -1);
}

static void test_lock_is_held_until_unlocked_and_names_its_holder(void) {
    char lock[512], want[64];
    path_in(lock, sizeof lock, ".lock");
    const int fd = cart_fs_lock(lock);
    CHECK(fd >= 0);
    /* another open file of this process is another holder */
    CHECK(cart_fs_lock(lock) == CART_E_STATE);
    snprintf(want, sizeof want, "held by process %ld", (long)getpid());
    CHECK_MSG(strstr(cart_last_error(), want) != NULL, "%s", cart_last_error());
    /* and another process too */
    pid_t child = fork();
    if (child == 0) _exit(cart_fs_lock(lock) == CART_E_STATE ? 0 : 1);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cart_fs_unlock(fd);
    const int again = cart_fs_lock(lock);
    CHECK(again >= 0);
    cart_fs_unlock(again);
    CHECK(cart_fs_lock("/no/such/dir/.lock") == CART_E_IO);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/cart_fs_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_tells_files_dirs_and_fifos_apart_without_opening);
    RUN(test_makes_nested_directories_with_odd_names);
    RUN(test_lists_a_directory_sorted);
    RUN(test_writes_whole_files_atomically);
    RUN(test_refuses_to_write_over_what_is_not_a_regular_file);
    RUN(test_reads_and_touches_modification_times);
    RUN(test_sweeps_only_dead_processes_temp_files);
    RUN(test_reports_free_space_of_a_path_or_its_directory);
    RUN(test_lock_is_held_until_unlocked_and_names_its_holder);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    return check_finish("fs");
}
