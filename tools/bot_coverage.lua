-- bot_coverage.lua: how well self-study's bots cover a fact document.
-- Synthesizes conversations as selfstudy.lua would (same chunking, same
-- seeds) and counts the questions that are exactly one of qa.jsonl's, how
-- many distinct facts those ask about, and how many bot B answered right.
--
--   build/cartridge run tools/bot_coverage.lua --model models/reader.gguf \
--       --corpus out/facts/doc.md --qa out/facts/qa.jsonl --chunk-min 82 --chunk-max 163 --groups 8

local cartridge = require("cartridge")
local options = require("cartridge.options")
local corpus_mod = require("cartridge.corpus")
local facts = require("cartridge.facts")

local opts = options.parse(arg, {
    summary = "Count the self-study conversations that ask a document's own questions, and answer them right.",
    flags = {
        { "model", help = "GGUF model (required)" },
        { "corpus", help = "the fact document (required)" },
        { "qa", help = "its qa.jsonl (required)" },
        { "chunk-min", type = "int", default = 82, help = "shortest chunk, tokens" },
        { "chunk-max", type = "int", default = 163, help = "longest chunk, tokens" },
        { "max-q", type = "int", default = 32, help = "bot A's budget, tokens" },
        { "max-a", type = "int", default = 32, help = "bot B's budget, tokens" },
        { "groups", type = "int", default = 8, help = "groups of 16 conversations (steps 1..N)" },
        { "seed", type = "int", default = 42, help = "selfstudy.lua's --seed" },
        { "seeds", help = "selfstudy.lua's --seeds (default: the seven)" },
        { "turns", type = "int", default = 1, help = "selfstudy.lua's --turns (each turn's question counts)" },
        { "show", type = "int", default = 0, help = "print the first N conversations" },
    },
})
for _, k in ipairs({ "model", "corpus", "qa" }) do
    if not opts[k] then error("bot_coverage: --" .. k .. " is required (see --help)", 0) end
end
local m = cartridge.model.load(opts.model)
local corpus = corpus_mod.load({ opts.corpus }, m:tokenizer())
local r = facts.bot_coverage(m, facts.read_qa(opts.qa), { corpus = corpus, chunk_min = opts.chunk_min,
    chunk_max = opts.chunk_max, max_q = opts.max_q, max_a = opts.max_a, seed = opts.seed, groups = opts.groups,
    seeds = opts.seeds, turns = opts.turns,
    show = opts.show > 0 and function(i, q, a)
        if i <= opts.show then print(("%3d Q: %s\n    A: %s"):format(i, q:gsub("\n", " "), a:gsub("\n", " "))) end
    end or nil })
print(("%d questions: %d ask one of the document's questions exactly (%d distinct of %d); bot B answered %d of those right")
    :format(r.n, r.valid, r.distinct, r.facts, r.right))
