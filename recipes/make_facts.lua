-- make_facts.lua: a synthetic reading task -- a document of facts about
-- fictional people and the questions it answers.
--
--   cartridge run recipes/make_facts.lua --seed 1001 --facts 40 --out out/facts
--
-- Writes DIR/doc.md (plain sentences under a title, in paragraphs) and
-- DIR/qa.jsonl (one {"question", "answer", "relation", "others", "phrasing"}
-- per line: the answer a short exact string, others what a right reply must
-- not also name -- the document's other values of the same relation, or
-- for a reverse question its other people). Every fact is asked in three
-- phrasings ("1", the form self-study's bot A is taught to write, then "2"
-- and "3", held out from it), grouped by phrasing, and then in reverse
-- ("Who lives in Braneamkris?") where the document has one answer to that;
-- report.lua --qa scores each set on its own. Names, places and numbers are drawn fresh from the
-- seed (lua/cartridge/facts.lua), so no model has seen them; the same seed
-- gives the same bytes. The reader model (recipes/pretrain.lua --preset
-- reader) trains on documents of seeds below 1000, so seeds from 1000 up are
-- held out.

local options = require("cartridge.options")
local facts = require("cartridge.facts")
local fs = require("cartridge.fs")
local json = require("cartridge.json")

local opts = options.parse(arg, {
    summary = "Write a document of invented facts and its question/answer pairs.",
    flags = {
        { "seed", type = "int", default = 1000, help = "the document's seed (the reader trains on seeds below 1000)" },
        { "facts", type = "int", default = 40, help = "facts in the document" },
        { "out", help = "directory for doc.md and qa.jsonl (required)" },
    },
})
if not opts.out then error("make_facts: --out DIR is required (see --help)", 0) end
if opts.facts < 1 or opts.facts > #facts.NAMES then
    error(("make_facts: --facts must be in 1..%d (one fact for each of the names in lua/cartridge/facts.lua)")
        :format(#facts.NAMES), 0)
end

local d = facts.document(opts.seed, opts.facts)
fs.mkdirs(opts.out)
local lines, qa = {}, facts.questions(d)
for i, e in ipairs(qa) do
    lines[i] = json.encode({ question = e.question, answer = e.answer, relation = e.relation,
        others = json.array(e.others), phrasing = e.phrasing })
end
fs.write_atomic(opts.out .. "/doc.md", d.text)
fs.write_atomic(opts.out .. "/qa.jsonl", table.concat(lines, "\n") .. "\n")
print(("wrote %s/doc.md (%d facts about %d people, %d bytes) and %s/qa.jsonl (%d questions: %d facts in 3 "
    .. "phrasings, %d in reverse); guessing without the document scores %.1f%%"):format(opts.out, #d.facts,
    #d.people, #d.text, opts.out, #qa, #d.facts, #facts.select(qa, "reverse"), 100 * facts.chance(d)))
