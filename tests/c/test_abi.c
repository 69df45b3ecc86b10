/*
 * test_abi.c - every struct defined in a public header has a row in the ABI
 * table (the Lua spec then compares each row with ffi.sizeof / ffi.alignof).
 */
#include <dirent.h>

#include "abi.h"
#include "check.h"

static int in_table(const char *name) {
    for (int64_t i = 0; i < cart_abi_struct_count(); i++)
        if (strcmp(cart_abi_struct_at(i)->name, name) == 0) return 1;
    return 0;
}

static void test_every_public_struct_is_in_the_abi_table(void) {
    const char *dir = CART_SOURCE_DIR "/engine";
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d) return;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h") != 0) continue;
        if (strcmp(e->d_name, "internal.h") == 0) continue; /* not public */
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "r");
        char line[512];
        while (fp && fgets(line, sizeof line, fp)) {
            char name[128];
            int end = 0; /* set only when the opening brace matched: a definition */
            if (sscanf(line, "typedef struct %127[a-z0-9_] {%n", name, &end) == 1 && end > 0) {
                found++;
                CHECK_MSG(in_table(name), "%s defines struct %s, missing from abi.c", e->d_name,
                          name);
            }
        }
        if (fp) fclose(fp);
    }
    closedir(d);
    CHECK_MSG(found == cart_abi_struct_count(),
              "headers define %d structs, the table lists %lld", found,
              (long long)cart_abi_struct_count());
    CHECK(cart_abi_struct_at(-1) == NULL && cart_abi_struct_at(cart_abi_struct_count()) == NULL);
}

int main(void) {
    RUN(test_every_public_struct_is_in_the_abi_table);
    return check_finish("abi");
}
