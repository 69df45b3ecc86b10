-- oracle_selfstudy.lua: a diagnostic. Runs recipes/selfstudy.lua with bot A's
-- questions replaced by a qa.jsonl's own, drawn evenly (question k of the
-- run is number (7919 k mod n) + 1, which visits all 40 of a 40-fact file in
-- turn), to separate what the distillation can learn from what bot A asks.
-- Bot A still prefills its turn (one token is generated and dropped), so
-- the cache holds what bot B expects. With chunks of the whole document,
-- bot B always sees the answer.
--
--   ORACLE_QA=out/facts/qa.jsonl build/cartridge run tools/oracle_selfstudy.lua \
--       --model models/reader.gguf --corpus out/facts/doc.md --p 41 --lr 0.1 --steps 100 --accum 4 \
--       --chunk-min 300 --chunk-max 325 --max-q 32 --max-a 32 --qa out/facts/qa.jsonl --qa-every 25
--
-- On the first committed reader (before its focus stage) and make_facts --seed 1001: 0, 4, 14, 24, 30/40
-- at 0..400 conversations (the real bot A: 6/40 at 400).
local selfstudy = require("cartridge.selfstudy")
local facts = require("cartridge.facts")
local ids_mod = require("cartridge.ids")
local qa_path = os.getenv("ORACLE_QA")
if not qa_path then error("oracle_selfstudy: set ORACLE_QA to a qa.jsonl (see the header)", 0) end
local qa = facts.read_qa(qa_path)
local k = 0
local orig = selfstudy.synthesizer
selfstudy.synthesizer = function(m, tok, corpus, o)
    local s = orig(m, tok, corpus, o)
    local mt = getmetatable(s)
    if not mt.patched then
        mt.patched = true
        local g = mt.generate
        mt.generate = function(self, streams)
            if streams[1] and streams[1].sampler then
                for _, st in ipairs(streams) do st.max = 1 end
                g(self, streams)
                for _, st in ipairs(streams) do
                    k = k + 1
                    local q = qa[(k * 7919) % #qa + 1].question
                    st.out = ids_mod.new(64)
                    self.tok:encode_ids(q, { special = false }, st.out)
                    st.stopped = true
                end
                return
            end
            return g(self, streams)
        end
    end
    return s
end
dofile("recipes/selfstudy.lua")
