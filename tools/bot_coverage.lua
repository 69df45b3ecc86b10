-- bot_coverage.lua: how well self-study's bots cover a fact document.
-- Synthesizes conversations as selfstudy.lua would (same chunking, same
-- seeds) and counts those whose question is exactly one of qa.jsonl's, how
-- many distinct facts those ask about, and how many bot B answered right.
--
--   build/cartridge run tools/bot_coverage.lua --model models/reader.gguf \
--       --corpus out/facts/doc.md --qa out/facts/qa.jsonl --chunk-min 82 --chunk-max 163 --groups 8

local cartridge = require("cartridge")
local options = require("cartridge.options")
local selfstudy = require("cartridge.selfstudy")
local corpus_mod = require("cartridge.corpus")
local chat = require("cartridge.chat")
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
        { "show", type = "int", default = 0, help = "print the first N conversations" },
    },
})
for _, k in ipairs({ "model", "corpus", "qa" }) do
    if not opts[k] then error("bot_coverage: --" .. k .. " is required (see --help)", 0) end
end
local m = cartridge.model.load(opts.model)
local tok = m:tokenizer()
local corpus = corpus_mod.load({ opts.corpus }, tok)
local synth = selfstudy.synthesizer(m, tok, corpus, { chunk_min = opts.chunk_min, chunk_max = opts.chunk_max,
    max_q = opts.max_q, max_a = opts.max_a, top_k = 20, seed = opts.seed, template = chat.for_model(m) })
local qa = facts.read_qa(opts.qa)
local answer_of = {}
for _, e in ipairs(qa) do answer_of[e.question] = e.answer end
local n, valid, right, distinct, seen = 0, 0, 0, 0, {}
for s = 1, opts.groups do
    local keys = {}
    for i = 1, 16 do keys[i] = { s, i } end
    for _, c in ipairs(synth:group(keys)) do
        n = n + 1
        local answer = tok:decode(c.answer)
        if n <= opts.show then
            print(("%3d Q: %s\n    A: %s"):format(n, c.question:gsub("\n", " "), answer:gsub("\n", " ")))
        end
        local want = answer_of[c.question]
        if want then
            valid = valid + 1
            if not seen[c.question] then seen[c.question], distinct = true, distinct + 1 end
            if facts.correct(answer, want) then right = right + 1 end
        end
    end
end
print(("%d conversations: %d ask one of the document's questions exactly (%d distinct of %d); bot B answered %d of those right")
    :format(n, valid, distinct, #qa, right))
