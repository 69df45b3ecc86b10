-- generate.lua: continue a prompt with a GGUF model, streaming the text.
--
--   cartridge run recipes/generate.lua --model M --prompt "Once upon a time" --n 48
--   cartridge run recipes/generate.lua --prompt "Why is the sky blue?" --chat --temp 0.7 --seed 3
--   cartridge run recipes/generate.lua --prompt "Hi" --json     # one JSON object, nothing else
--   cartridge run recipes/generate.lua --chat --prompt "A person, as JSON" --json-schema person.json
--
-- Prints the text as it is decoded, then prompt and decode speed.
-- --json-schema FILE constrains the text to a JSON document the schema
-- accepts (engine/grammar.h: OpenAI's strict subset); decoding stops when
-- the document is complete. --json
-- prints {"prompt_ids", "ids", "text", "finish", "timings": {"prompt_tok_s",
-- "decode_tok_s", ...}} instead; scripts depend on those fields.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local generate = require("cartridge.generate")
local chat = require("cartridge.chat")
local json = require("cartridge.json")
local grammar = require("cartridge.grammar")

local opts = options.parse(arg, {
    summary = "Continue a prompt with a GGUF model, streaming the text.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "prompt", default = "", help = "the prompt text" },
        { "n", type = "int", default = 64, help = "tokens to generate at most" },
        { "chat", type = "boolean", help = "wrap the prompt as a user message in the model's chat template" },
        { "special", type = "boolean", help = "parse special-token text (<|im_start|>) in the prompt" },
        { "temp", type = "number", default = 0, help = "temperature; 0 is greedy" },
        { "top-k", type = "int", default = 0, help = "keep the k most likely tokens (0: off)" },
        { "top-p", type = "number", default = 1, help = "nucleus sampling mass (1: off)" },
        { "min-p", type = "number", default = 0, help = "drop tokens below min-p x the top probability" },
        { "repeat-penalty", type = "number", default = 1, help = "penalty for recent tokens (1: off)" },
        { "repeat-last-n", type = "int", default = 64, help = "recent tokens the penalties look at" },
        { "frequency-penalty", type = "number", default = 0, help = "subtracted per occurrence in the window (0: off)" },
        { "presence-penalty", type = "number", default = 0, help = "subtracted once per token in the window (0: off)" },
        { "seed", type = "int", default = 0, help = "sampling seed" },
        { "stop", repeatable = true, help = "stop at this text (repeatable)" },
        { "json-schema", help = "constrain the text to a JSON document this JSON Schema file accepts" },
        { "kv", default = "f16", choices = { "f16", "f32" }, help = "KV cache dtype" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        { "widen", type = "boolean", help = "keep f32 copies of the weights (faster prefill, more memory)" },
        { "json", type = "boolean", help = "print one JSON object instead of streaming" },
    },
})

-- the schema first: a bad file fails before the model loads
local schema = opts.json_schema and grammar.from_file(opts.json_schema, "--json-schema")
cartridge.set_threads(opts.threads)
local m = cartridge.model.load(defaults.pick_model(opts.model), { widen = opts.widen })
if opts.widen and not opts.json then
    io.stderr:write(("widened weights to f32: +%s\n"):format(cartridge.fmt.bytes(m.widened_bytes)))
end
local tok = m:tokenizer()
local text = opts.prompt
local special = opts.special
if opts.chat then
    text = chat.render(chat.for_model(m), { { role = "user", content = text } })
    special = true
end
local prompt_ids = tok:encode(text, { special = special, add_special = true })
if #prompt_ids == 0 then
    error("generate: the prompt is empty after tokenization; give --prompt some text", 0)
end
local ctx = m.config.n_ctx_train
if #prompt_ids + opts.n > ctx then
    error(("generate: %d prompt tokens + %d to generate exceed the model's context of %d"):format(
        #prompt_ids, opts.n, ctx), 0)
end

local result = generate.run({
    model = m,
    tokenizer = tok,
    prompt_ids = prompt_ids,
    max_tokens = opts.n,
    kv_dtype = opts.kv,
    stop = opts.stop,
    grammar = schema,
    sampling = {
        temperature = opts.temp, top_k = opts.top_k, top_p = opts.top_p, min_p = opts.min_p,
        repeat_penalty = opts.repeat_penalty, repeat_last_n = opts.repeat_last_n,
        frequency_penalty = opts.frequency_penalty, presence_penalty = opts.presence_penalty, seed = opts.seed,
    },
    on_text = not opts.json and function(s)
        io.write(s)
        io.flush()
    end or nil,
})

if opts.json then
    print(json.encode({
        prompt_ids = json.array(prompt_ids),
        ids = json.array(result.ids),
        text = result.text,
        finish = result.finish,
        timings = {
            prompt_tokens = #prompt_ids,
            prompt_s = result.timings.prompt_s,
            prompt_tok_s = result.timings.prompt_tok_s,
            decode_tokens = #result.ids,
            decode_s = result.timings.decode_s,
            decode_tok_s = result.timings.decode_tok_s,
            isa = cartridge.isa(),
            threads = cartridge.threads(),
        },
    }))
else
    io.write("\n")
    io.stderr:write(("prompt: %d tokens, %.1f tok/s | decode: %d tokens, %.1f tok/s (%s) | %s, %d threads\n"):format(
        #prompt_ids, result.timings.prompt_tok_s, #result.ids, result.timings.decode_tok_s, result.finish,
        cartridge.isa(), cartridge.threads()))
end
m:free()
