/*
 * abi.c - the table behind abi.h: sizeof and _Alignof of every public struct.
 *
 * Add a row here whenever a public header gains a struct; the Lua test also
 * scans the headers for struct definitions and fails on one missing here.
 */
#include <stdalign.h>
#include <stddef.h>

#include "cartridge.h"

static const cart_abi_struct abi_table[] = {
    {"cart_str", sizeof(cart_str), alignof(cart_str)},
    {"cart_dtype_info", sizeof(cart_dtype_info), alignof(cart_dtype_info)},
    {"cart_tensor", sizeof(cart_tensor), alignof(cart_tensor)},
    {"cart_gguf_value", sizeof(cart_gguf_value), alignof(cart_gguf_value)},
    {"cart_gguf_kv", sizeof(cart_gguf_kv), alignof(cart_gguf_kv)},
    {"cart_gguf_tensor_info", sizeof(cart_gguf_tensor_info), alignof(cart_gguf_tensor_info)},
    {"cart_st_tensor", sizeof(cart_st_tensor), alignof(cart_st_tensor)},
    {"cart_st_meta", sizeof(cart_st_meta), alignof(cart_st_meta)},
    {"cart_zip_entry", sizeof(cart_zip_entry), alignof(cart_zip_entry)},
    {"cart_pt_tensor", sizeof(cart_pt_tensor), alignof(cart_pt_tensor)},
    {"cart_pt_out_tensor", sizeof(cart_pt_out_tensor), alignof(cart_pt_out_tensor)},
    {"cart_pt_out_list", sizeof(cart_pt_out_list), alignof(cart_pt_out_list)},
    {"cart_proc_options", sizeof(cart_proc_options), alignof(cart_proc_options)},
    {"cart_rng", sizeof(cart_rng), alignof(cart_rng)},
    {"cart_weight", sizeof(cart_weight), alignof(cart_weight)},
    {"cart_model_config", sizeof(cart_model_config), alignof(cart_model_config)},
    {"cart_layer_config", sizeof(cart_layer_config), alignof(cart_layer_config)},
    {"cart_model_options", sizeof(cart_model_options), alignof(cart_model_options)},
    {"cart_sampler_params", sizeof(cart_sampler_params), alignof(cart_sampler_params)},
    {"cart_adam_params", sizeof(cart_adam_params), alignof(cart_adam_params)},
    {"cart_cartridge_save_options", sizeof(cart_cartridge_save_options), alignof(cart_cartridge_save_options)},
    {"cart_kvspill_owner", sizeof(cart_kvspill_owner), alignof(cart_kvspill_owner)},
    {"cart_distill_targets", sizeof(cart_distill_targets), alignof(cart_distill_targets)},
    {"cart_trainer_options", sizeof(cart_trainer_options), alignof(cart_trainer_options)},
    {"cart_sam_cursor", sizeof(cart_sam_cursor), alignof(cart_sam_cursor)},
    {"cart_http_options", sizeof(cart_http_options), alignof(cart_http_options)},
    {"cart_http_event", sizeof(cart_http_event), alignof(cart_http_event)},
    {"cart_http_request", sizeof(cart_http_request), alignof(cart_http_request)},
    {"cart_abi_struct", sizeof(cart_abi_struct), alignof(cart_abi_struct)},
};

int64_t cart_abi_struct_count(void) {
    return (int64_t)(sizeof abi_table / sizeof abi_table[0]);
}

const cart_abi_struct *cart_abi_struct_at(int64_t i) {
    if (i < 0 || i >= cart_abi_struct_count()) return NULL;
    return &abi_table[i];
}
