-- ask.lua: answer a question from a cartridge, and compare.
--
--   cartridge run recipes/ask.lua --load out/readme.safetensors --ask "What is a cartridge?"
--   cartridge run recipes/ask.lua --load F --ask Q --corpus README.md      # adds the ICL answer
--   cartridge run recipes/ask.lua --load F --ask Q --spec-serve            # corpus-drafted decoding
--   cartridge run recipes/ask.lua --load F --ask Q --json-schema answer.json  # answers as JSON documents
--
-- Prints the answer behind the cartridge (with its time and speed), the bare
-- model's answer with no context, and with --corpus the answer with the whole
-- corpus in context (truncated at --icl-max tokens). The cartridge's geometry
-- comes from the artifact and is checked against the model.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local corpus_mod = require("cartridge.corpus")
local answering = require("cartridge.answering")
local grammar = require("cartridge.grammar")

local opts = options.parse(arg, {
    summary = "Answer a question behind a cartridge, from the bare model, and with the corpus in context.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "load", help = "the cartridge (.safetensors) to answer from (required)" },
        { "ask", help = "the question (required)" },
        { "corpus", repeatable = true, help = "the corpus, for the ICL comparison and as a draft reference" },
        { "icl-max", type = "int", default = 4096, help = "corpus tokens given to the ICL answer at most" },
        { "max-a", type = "int", default = 192, help = "answer budget, tokens" },
        { "spec-serve", type = "boolean", help = "decode the cartridge answer speculatively, drafting from the corpus" },
        { "json-schema", help = "every answer is a JSON document this JSON Schema file accepts (not with --spec-serve)" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        require("cartridge.cart").FOREIGN_FLAG,
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge
if not opts.load or not opts.ask then error("ask: --load CARTRIDGE and --ask QUESTION are both required (see --help)", 0) end
if opts.json_schema and opts.spec_serve then
    error("ask: --json-schema and --spec-serve cannot go together (drafted tokens are not checked against the schema)", 0)
end
local schema = opts.json_schema and grammar.from_file(opts.json_schema, "--json-schema")

cartridge.set_threads(opts.threads)
local m = cartridge.model.load(defaults.pick_model(opts.model))
local corpus
if #opts.corpus > 0 then
    corpus = corpus_mod.load(opts.corpus, m:tokenizer())
    print(("corpus: %d files, %d tokens"):format(#corpus.files, corpus.n_tokens))
end
local c = cartridge.cart.load(opts.load, m)
print(("cartridge loaded from %s: p = %d (%d layers)"):format(opts.load, c.p, c.n_layer))
local spec, label
if opts.spec_serve then
    spec, label = require("cartridge.speculative").for_serving(opts.load, corpus, m)
end
answering.print_three({ model = m, cartridge = c, question = opts.ask, max_a = opts.max_a, corpus = corpus,
    icl_max = opts.icl_max, speculative = spec, spec_label = label, grammar = schema })
if spec then
    local s = spec.stats
    io.stderr:write(("speculative: %d forward passes, %d drafted, %d accepted (%.0f%%)\n"):format(s.forwards,
        s.drafted, s.accepted, s.drafted > 0 and 100 * s.accepted / s.drafted or 0))
end
