/*
 * test_files.h - scratch files for the tests of file formats: a temporary
 * directory per test program, paths in it, and whole files read back.
 */
#ifndef CART_TEST_FILES_H
#define CART_TEST_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static char tmp_dir[256];

/* Makes tmp_dir under $TMPDIR (or /tmp) from a mkdtemp pattern name such as
 * "cart_st_XXXXXX"; 0 on success. */
static int make_tmp_dir(const char *pattern) {
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/%s", base && base[0] ? base : "/tmp", pattern);
    if (mkdtemp(tmp_dir)) return 0;
    perror("mkdtemp");
    return 1;
}

static const char *tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
    return buf;
}

/* The whole file at path in a malloc'd buffer (exactly *size bytes, so ASan
 * sees any read past the end); NULL when it cannot be read. */
static uint8_t *read_all(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

#endif
