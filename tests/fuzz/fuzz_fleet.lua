-- fuzz_fleet.lua: libFuzzer target (through lua_harness.c) for what a fleet
-- directory holds besides its cartridges (fuzz_cartridge has those): the
-- manifest (fleet.json, cartridge.fleet.parse_manifest) and the retrieval
-- index (index.safetensors, cartridge.retrieval.load).
--
-- Byte 0: even, the rest is a manifest's text; odd, the rest is an index
-- file, loaded against the fuzz model and without one, over 1 + (byte 0 / 2
-- mod 8) documents.
--
-- A manifest is refused with a "fleet: " message, or accepted: then its
-- fields hold what check_manifest promises (p >= 2, frozen < p, rows within
-- p, the file names fixed by the index, distinct names), and writing it as
-- JSON and parsing it again gives the same manifest. An index is refused
-- with a "retrieval: " message, or accepted: its rows are finite, every
-- chunk names one of the documents, and top_docs over a query of its own
-- dimension gives distinct documents among them, best first.

local util = require("fuzz_util")
local fleet = require("cartridge.fleet")
local retrieval = require("cartridge.retrieval")
local json = require("cartridge.json")
local model = require("cartridge.model")
local ffi = require("ffi")

local m = model.load(util.model_path())
local file = util.memfile()

local function check_manifest(man)
    if not (man.p >= 2 and man.frozen >= 0 and man.frozen < man.p and man.rounds >= 0 and #man.docs >= 1) then
        util.finding("parse_manifest accepted p %s, frozen %s, rounds %s, %d docs", tostring(man.p),
            tostring(man.frozen), tostring(man.rounds), #man.docs)
    end
    local names = {}
    for i, d in ipairs(man.docs) do
        if d.cart_file ~= fleet.cart_file(i) or d.opt_file ~= fleet.opt_file(i) then
            util.finding("docs[%d] points at %s and %s", i - 1, tostring(d.cart_file), tostring(d.opt_file))
        end
        if names[d.name] or d.name:find("/", 1, true) then util.finding("docs[%d].name %q accepted", i - 1, d.name) end
        names[d.name] = true
        if not (d.rows >= 1 and d.rows <= man.p and d.entered <= d.steps) then
            util.finding("docs[%d]: rows %s, entered %s, steps %s accepted", i - 1, tostring(d.rows),
                tostring(d.entered), tostring(d.steps))
        end
    end
    local ok, again = pcall(fleet.parse_manifest, json.encode(man), "again")
    if not ok then util.finding("an accepted manifest, written again, is refused: %s", tostring(again)) end
    if not util.same(man, again) then util.finding("an accepted manifest changed when written and read again") end
end

local function check_index(index, n_docs)
    for i = 0, index.n * index.dim - 1 do
        local x = index.rows[i]
        if x ~= x or x == math.huge or x == -math.huge then util.finding("retrieval.load accepted a non-finite row") end
    end
    for r = 1, index.n do
        local d = index.chunk_doc[r]
        if not (d >= 1 and d <= n_docs) then util.finding("chunk %d names document %s of %d", r - 1, tostring(d), n_docs) end
    end
    local q = ffi.new("float[?]", index.dim)
    for i = 0, index.dim - 1 do q[i] = (i % 3) - 1 end
    local hits = index:top_docs(q, 4, 3)
    local seen = {}
    for k, h in ipairs(hits) do
        if seen[h.doc] then util.finding("top_docs gave document %d twice", h.doc) end
        seen[h.doc] = true
        if k > 1 and h.score > hits[k - 1].score then util.finding("top_docs is not best first") end
    end
    if #hits == 0 or #hits > 3 then util.finding("top_docs gave %d documents (max 3, index of %d)", #hits, index.n) end
end

return function(data)
    if #data < 1 then return end
    local mode, rest = data:byte(1), data:sub(2)
    if mode % 2 == 0 then
        local ok, man = pcall(fleet.parse_manifest, rest, "fuzz.json")
        if ok then check_manifest(man) else util.expect_rejection(man, { "fleet: " }, "parse_manifest") end
        return
    end
    local n_docs = 1 + math.floor(mode / 2) % 8
    file:set(rest)
    for _, with_model in ipairs({ true, false }) do
        local ok, index = pcall(retrieval.load, file.path, with_model and m or nil, n_docs)
        if ok then
            check_index(index, n_docs)
            if with_model and index.dim ~= m.config.n_embd then
                util.finding("an index of %d dims accepted for a model of %d", index.dim, m.config.n_embd)
            end
        else
            util.expect_rejection(index, { "retrieval: " }, "retrieval.load")
        end
    end
end
