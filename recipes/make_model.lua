-- make_model.lua: write a deterministic random-weight GGUF.
--
--   cartridge run recipes/make_model.lua --out /tmp/tiny.gguf
--   cartridge run recipes/make_model.lua --preset qwen3-0.6b --dtype f16 --out q06.gguf \
--       --tokenizer-from ../shared/reference/qwen3-tiny-realvocab-f16.gguf
--   cartridge run recipes/make_model.lua --arch gemma4 --preset tiny-moe --dtype q8_0 --out g.gguf
--   cartridge run recipes/make_model.lua --arch gemma4 --tokenizer-model gemma4 --dtype f32 --out g.gguf
--
-- The same flags and seed give the same bytes. Weights are normal with std
-- 1/sqrt(fan_in) (embeddings too, since they double as the tied head), norm
-- weights 1 + N(0, 0.1) and the final norm scaled by --out-scale, so a random
-- model's logits have a spread of a few units: its next-token distribution is
-- neither flat nor a spike. The tokenizer is copied from another GGUF, or a
-- small built-in byte-level BPE (256 byte tokens + ChatML specials, no merges)
-- that needs no download.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")

local opts = options.parse(arg, {
    summary = "Write a deterministic random-weight qwen3, llama or gemma4 GGUF.",
    flags = {
        { "out", help = "output .gguf path (required)" },
        { "preset", default = "default", choices = { "default", "qwen3-0.6b", "qwen3-tiny", "qwen2-tiny", "llama-tiny",
            "tiny-dense", "tiny-moe", "26b-a4b" },
          help = "starting shape; the flags below override it (tiny-dense, tiny-moe and 26b-a4b are gemma4's)" },
        { "arch", choices = { "qwen3", "qwen2", "llama", "gemma4" }, help = "architecture (gemma4: its presets, default tiny-dense)" },
        { "layers", type = "int", help = "transformer blocks" },
        { "embd", type = "int", help = "hidden size" },
        { "ff", type = "int", help = "feed-forward size" },
        { "heads", type = "int", help = "query heads" },
        { "kv-heads", type = "int", help = "key/value heads" },
        { "head-dim", type = "int", help = "dims per head (qwen3: free; llama: embd / heads)" },
        { "vocab", type = "int", help = "embedding rows (>= the tokenizer's size; extra rows are [PAD] tokens)" },
        { "ctx", type = "int", help = "context_length" },
        { "rope-theta", type = "number", help = "rope.freq_base (default 1e6 qwen3, 1e4 llama)" },
        { "eps", type = "number", default = 1e-6, help = "RMSNorm epsilon" },
        { "dtype", default = "f16", help = "matrix dtype: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K q6_K" },
        { "tied", type = "boolean", default = true, help = "reuse token_embd as the output head (--no-tied: separate output.weight)" },
        { "seed", type = "int", default = 1, help = "random seed" },
        { "std-scale", type = "number", default = 1.0, help = "multiplies every weight std" },
        { "out-scale", type = "number", default = 4.0, help = "scale of the final norm (sharper logits)" },
        { "tokenizer-from", help = "copy tokenizer.* metadata (and vocab size) from this GGUF" },
        { "tokenizer-model", choices = { "llama", "gemma4" },
          help = "gemma4 only: the built-in vocabulary's kind, SentencePiece (llama, the default) or gemma 4's own BPE (gemma4)" },
        { "name", help = "general.name (default: derived from the shape)" },
    },
})

if not opts.out then error("make_model: --out is required (see --help)", 0) end
randmodel.write(opts)
