/*
 * models.c - the architecture table (models.h).
 */
#include <string.h>

#include "models.h"

static const arch_ops *const all[] = {&arch_llama, &arch_qwen2, &arch_qwen3, &arch_gemma4};
enum { N_ARCHS = sizeof all / sizeof all[0] };

const arch_ops *arch_of(int32_t arch) {
    for (size_t i = 0; i < N_ARCHS; i++)
        if (all[i]->arch == arch) return all[i];
    return NULL;
}

const arch_ops *arch_by_name(const char *name, size_t len) {
    for (size_t i = 0; i < N_ARCHS; i++)
        if (len == strlen(all[i]->name) && memcmp(name, all[i]->name, len) == 0) return all[i];
    return NULL;
}
