/*
 * models.c - the architecture table (models.h).
 */
#include <stddef.h>

#include "models.h"

const arch_ops *arch_of(int32_t arch) {
    static const arch_ops *const all[] = {&arch_llama, &arch_qwen2, &arch_qwen3, &arch_gemma4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->arch == arch) return all[i];
    return NULL;
}
