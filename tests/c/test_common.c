/*
 * test_common.c - last-error bookkeeping and the atomic file writer.
 */
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "check.h"
#include "internal.h"

static char tmpdir[256];

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void test_a_failure_records_status_and_message(void) {
    cart_clear_error();
    CHECK(cart_last_status() == CART_OK);
    CHECK(strcmp(cart_last_error(), "") == 0);
    CHECK(cart_fail(CART_E_FORMAT, "model.gguf: field %s", "x") == CART_E_FORMAT);
    CHECK(cart_last_status() == CART_E_FORMAT);
    CHECK(strcmp(cart_last_error(), "model.gguf: field x") == 0);
    cart_fail_context(CART_E_FORMAT, "loading %s", "m");
    CHECK(strcmp(cart_last_error(), "loading m: model.gguf: field x") == 0);
    CHECK(strcmp(cart_status_name(CART_E_ARG), "CART_E_ARG") == 0);
    CHECK(strcmp(cart_status_name(-99), "CART_E_UNKNOWN") == 0);
    CHECK(cart_version()[0] != '\0');
}

static void *other_thread(void *arg) {
    cart_fail(CART_E_IO, "from the other thread");
    return NULL;
}

static void test_errors_are_kept_per_thread(void) {
    cart_fail(CART_E_ARG, "mine");
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    CHECK(strcmp(cart_last_error(), "mine") == 0);
    CHECK(cart_last_status() == CART_E_ARG);
}

static void test_atomic_write_replaces_the_target_only_on_commit(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.bin", tmpdir);
    FILE *fp = fopen(path, "wb");
    fputs("old", fp);
    fclose(fp);

    cart_afile f;
    CHECK_OK(cart_afile_open(&f, path));
    CHECK_OK(cart_afile_write(&f, "new!", 4));
    CHECK_OK(cart_afile_pad(&f, 8));
    CHECK(f.written == 8);
    /* before commit the old file is intact and a temporary exists beside it */
    fp = fopen(path, "rb");
    char buf[16] = {0};
    size_t got = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    CHECK(got == 3 && memcmp(buf, "old", 3) == 0);
    CHECK(count_entries(tmpdir) == 2);
    CHECK_OK(cart_afile_commit(&f));
    CHECK(count_entries(tmpdir) == 1);
    fp = fopen(path, "rb");
    got = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    CHECK(got == 8 && memcmp(buf, "new!\0\0\0\0", 8) == 0);

    /* abort leaves the old content and no temporary */
    CHECK_OK(cart_afile_open(&f, path));
    CHECK_OK(cart_afile_write(&f, "zzzzzzzzzz", 10));
    cart_afile_abort(&f);
    CHECK(count_entries(tmpdir) == 1);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 8);
    unlink(path);
}

static void test_opening_in_a_missing_directory_names_the_path(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/no/such/dir/out.bin", tmpdir);
    cart_afile f;
    CHECK_ERR(cart_afile_open(&f, path), CART_E_IO);
    CHECK_ERROR_MENTIONS("no/such/dir/out.bin");
}

static void test_mapping_reports_missing_files_and_maps_empty_ones(void) {
    cart_mapping m;
    CHECK_ERR(cart_map_file(&m, "/nonexistent/file.gguf"), CART_E_IO);
    CHECK_ERROR_MENTIONS("/nonexistent/file.gguf");
    CHECK_ERR(cart_map_file(&m, tmpdir), CART_E_IO);
    CHECK_ERROR_MENTIONS("not a regular file");
    char path[512];
    snprintf(path, sizeof path, "%s/empty", tmpdir);
    fclose(fopen(path, "wb"));
    CHECK_OK(cart_map_file(&m, path));
    CHECK(m.size == 0);
    cart_unmap_file(&m);
    unlink(path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cart_test_common.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_a_failure_records_status_and_message);
    RUN(test_errors_are_kept_per_thread);
    RUN(test_atomic_write_replaces_the_target_only_on_commit);
    RUN(test_opening_in_a_missing_directory_names_the_path);
    RUN(test_mapping_reports_missing_files_and_maps_empty_ones);
    rmdir(tmpdir);
    return check_finish("common");
}
