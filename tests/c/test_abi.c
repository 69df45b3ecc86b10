/*
 * test_abi.c - every struct defined in a public header has a row in the ABI
 * table (the Lua spec then compares each row with ffi.sizeof / ffi.alignof).
 */
#include "abi.h"
#include "check.h"

static int in_table(const char *name) {
    for (int64_t i = 0; i < cart_abi_struct_count(); i++)
        if (strcmp(cart_abi_struct_at(i)->name, name) == 0) return 1;
    return 0;
}

/* Counts the struct definitions of one header, checking each against the table. */
static int scan_header(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "r");
    CHECK_MSG(fp != NULL, "cannot open %s", path);
    if (!fp) return 0;
    int found = 0;
    char line[512];
    while (fgets(line, sizeof line, fp)) {
        char sname[128];
        int end = 0; /* set only when the opening brace matched: a definition */
        if (sscanf(line, "typedef struct %127[a-z0-9_] {%n", sname, &end) == 1 && end > 0) {
            found++;
            CHECK_MSG(in_table(sname), "%s defines struct %s, missing from abi.c", name, sname);
        }
    }
    fclose(fp);
    return found;
}

/* The public headers are the ones cartridge.h includes (the FFI reads the same list). */
static void test_every_public_struct_is_in_the_abi_table(void) {
    const char *dir = CART_SOURCE_DIR "/engine";
    char path[1024];
    snprintf(path, sizeof path, "%s/cartridge.h", dir);
    FILE *fp = fopen(path, "r");
    CHECK_MSG(fp != NULL, "cannot open %s", path);
    if (!fp) return;
    int found = 0, headers = 0;
    char line[512];
    while (fgets(line, sizeof line, fp)) {
        char name[128];
        if (sscanf(line, "#include \"%127[a-z0-9_.]\"", name) == 1) {
            headers++;
            found += scan_header(dir, name);
        }
    }
    fclose(fp);
    CHECK(headers > 5);
    CHECK_MSG(found == cart_abi_struct_count(), "headers define %d structs, the table lists %lld",
              found, (long long)cart_abi_struct_count());
    CHECK(cart_abi_struct_at(-1) == NULL && cart_abi_struct_at(cart_abi_struct_count()) == NULL);
}

int main(void) {
    RUN(test_every_public_struct_is_in_the_abi_table);
    return check_finish("abi");
}
