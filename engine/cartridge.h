/*
 * cartridge.h - the whole public C API of the cartridge engine.
 *
 * Include this one header from C. The LuaJIT side reads it too: it follows the
 * quoted includes below in order and hands each header's declarations to
 * ffi.cdef, so the order here is the order of dependency.
 */
#ifndef CARTRIDGE_H
#define CARTRIDGE_H

#include "common.h"
#include "cpu.h"
#include "dtype.h"
#include "pool.h"
#include "blas.h"
#include "matmul.h"
#include "probe.h"
#include "tensor.h"
#include "gguf.h"
#include "fs.h"
#include "proc.h"
#include "utf8.h"
#include "tokenizer.h"
#include "safetensors.h"
#include "zip.h"
#include "torchpt.h"
#include "rng.h"
#include "kv.h"
#include "model.h"
#include "sampler.h"
#include "grammar.h"
#include "adam.h"
#include "cart.h"
#include "kvspill.h"
#include "targets.h"
#include "train.h"
#include "compact.h"
#include "params.h"
#include "draft.h"
#include "http.h"
#include "dist.h"
#include "abi.h"

#endif
