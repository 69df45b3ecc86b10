-- cartridge.retrieval: a fleet's retrieval index, built from the model's
-- own final hidden states (docs/fleet.md).
--
--   local retrieval = require("cartridge.retrieval")
--   local index = retrieval.build(m, docs, 256)       -- docs: { corpus } per document
--   index:save("out/fleet/index.safetensors", m)
--   local index = retrieval.load("out/fleet/index.safetensors", m, n_docs)
--   local q = index:query(m, "How are cartridges composed?")
--   for _, hit in ipairs(index:top_docs(q, 8, 2)) do print(hit.doc, hit.score) end
--
-- Each document is cut into chunks of `chunk` tokens (a last, shorter piece
-- is kept only when it has at least MIN_TAIL tokens or is the document's
-- only one). A chunk's embedding is the final hidden state (after the output
-- norm) of the last token of: BOS when the model adds one, the chunk's ids,
-- then SUFFIX tokenized on its own -- a line asking for the topic of the text
-- above, so that the last position sums the chunk up. Rows are L2-normalized;
-- then their centroid is subtracted from every row and the rows normalized
-- again (what all chunks share says nothing about which one a question
-- comes from). A query is embedded the same way (its last `chunk` tokens at
-- most), centred with the stored centroid and normalized. Scores are dot
-- products.
--
-- index.safetensors: "embeddings" F32 [n, dim], "centroid" F32 [dim],
-- "chunk_doc" I64 [n] (the 0-based document of each row); metadata: the
-- format, the model's fingerprint, the chunk size and the suffix.

local core = require("cartridge.core")
local safetensors = require("cartridge.safetensors")
local ids_mod = require("cartridge.ids")
local cart = require("cartridge.cart")
local ffi = core.ffi
local C = core.C

local retrieval = {}

retrieval.FORMAT = "cartridge-fleet-index"
retrieval.SUFFIX = "\nThe main topic of the text above, in one word:"
retrieval.MIN_TAIL = 32
retrieval.BATCH = 8 -- chunks embedded in one lockstep pass

local Index = {}
Index.__index = Index

-- The chunks of a document of n tokens: a list of { start, len }.
function retrieval.chunks(n, size)
    local out = {}
    for start = 0, n - 1, size do
        local len = math.min(size, n - start)
        if start == 0 or len >= retrieval.MIN_TAIL then out[#out + 1] = { start, len } end
    end
    return out
end

-- The ids embedded for a span of ids: BOS as the model adds it, the span,
-- the suffix.
local function piece(m, ids, start, len)
    local tok = m:tokenizer()
    local out = ids_mod.new(len + 16)
    if tok.adds_bos and tok.bos then out:push(tok.bos) end
    out:extend(ids.data + start, len)
    return out:extend(tok:encode_ids(retrieval.SUFFIX))
end

-- Scales a row of dim floats to unit length (a zero row stays zero).
function retrieval.normalize(x, dim)
    local s = 0
    for i = 0, dim - 1 do s = s + x[i] * x[i] end
    if s > 0 then
        local inv = 1 / math.sqrt(s)
        for i = 0, dim - 1 do x[i] = x[i] * inv end
    end
end

-- The raw embeddings of pieces (a list of id sequences) into out (float
-- [#pieces * dim]), BATCH pieces per forward pass.
local function embed_into(m, pieces, out)
    local dim = m.config.n_embd
    for first = 1, #pieces, retrieval.BATCH do
        local kvs, ids = {}, {}
        for k = first, math.min(first + retrieval.BATCH - 1, #pieces) do
            kvs[#kvs + 1] = m:new_kv(#pieces[k], "f16")
            ids[#ids + 1] = pieces[k]
        end
        local rows = m:forward_batch(kvs, ids, "last", nil, true)
        ffi.copy(out + (first - 1) * dim, rows, #ids * dim * 4)
        for _, kv in ipairs(kvs) do kv:free() end
    end
end

local function new_index(n, dim, chunk)
    return setmetatable({ n = n, dim = dim, chunk = chunk, rows = ffi.new("float[?]", math.max(n, 1) * dim),
        centroid = ffi.new("float[?]", dim), chunk_doc = {} }, Index)
end

-- Builds the index of documents docs (a list of { corpus }, as
-- cartridge.fleet.documents gives) with chunks of `chunk` tokens.
function retrieval.build(m, docs, chunk)
    local pieces, owner = {}, {}
    for i, d in ipairs(docs) do
        for _, c in ipairs(retrieval.chunks(d.corpus.n_tokens, chunk)) do
            pieces[#pieces + 1] = piece(m, d.corpus.ids, c[1], c[2])
            owner[#owner + 1] = i
        end
    end
    local dim = m.config.n_embd
    local index = new_index(#pieces, dim, chunk)
    embed_into(m, pieces, index.rows)
    for r = 0, index.n - 1 do
        retrieval.normalize(index.rows + r * dim, dim)
        index.chunk_doc[r + 1] = owner[r + 1]
    end
    for r = 0, index.n - 1 do
        for i = 0, dim - 1 do index.centroid[i] = index.centroid[i] + index.rows[r * dim + i] end
    end
    for i = 0, dim - 1 do index.centroid[i] = index.centroid[i] / index.n end
    for r = 0, index.n - 1 do
        local x = index.rows + r * dim
        for i = 0, dim - 1 do x[i] = x[i] - index.centroid[i] end
        retrieval.normalize(x, dim)
    end
    return index
end

-- A query's vector (float [dim]): the text embedded as a chunk is, centred
-- with the index's centroid, normalized.
function Index:query(m, text)
    local ids = m:tokenizer():encode_ids(text)
    local q = ffi.new("float[?]", self.dim)
    -- a chunk's worth at most, the last one (where a question ends): the
    -- rows were embedded from chunks that long, and a query's cost stays
    -- bounded whatever the request's length
    local len = math.min(#ids, self.chunk)
    embed_into(m, { piece(m, ids, #ids - len, len) }, q)
    retrieval.normalize(q, self.dim)
    for i = 0, self.dim - 1 do q[i] = q[i] - self.centroid[i] end
    retrieval.normalize(q, self.dim)
    return q
end

-- The documents of the k_chunks best chunks (ties: the lower chunk), each
-- once, in the order of its best chunk, at most max_docs of them: a list of
-- { doc (1-based), score (its best chunk's), chunk (0-based) }.
function Index:top_docs(q, k_chunks, max_docs)
    local best = {} -- { row, score } in descending score
    for r = 0, self.n - 1 do
        local x, s = self.rows + r * self.dim, 0
        for i = 0, self.dim - 1 do s = s + x[i] * q[i] end
        if #best < k_chunks or s > best[#best][2] then
            local at = #best + 1
            while at > 1 and s > best[at - 1][2] do at = at - 1 end
            table.insert(best, at, { r, s })
            if #best > k_chunks then best[#best] = nil end
        end
    end
    local out, seen = {}, {}
    for _, b in ipairs(best) do
        local doc = self.chunk_doc[b[1] + 1]
        if not seen[doc] and #out < max_docs then
            seen[doc] = true
            out[#out + 1] = { doc = doc, score = b[2], chunk = b[1] }
        end
    end
    return out
end

-- Writes the index atomically, with its checksum unless opts.checksum is
-- false (the fuzz seeds want one without).
function Index:save(path, m, opts)
    local docs = ffi.new("int64_t[?]", math.max(self.n, 1))
    for r = 1, self.n do docs[r - 1] = self.chunk_doc[r] - 1 end
    safetensors.write(path, {
        { name = "embeddings", dtype = "F32", shape = { self.n, self.dim }, data = self.rows },
        { name = "centroid", dtype = "F32", shape = { self.dim }, data = self.centroid },
        { name = "chunk_doc", dtype = "I64", shape = { self.n }, data = docs },
    }, { ["index.format"] = retrieval.FORMAT, ["index.model_fingerprint"] = cart.fingerprint(m),
        ["index.embed_chunk"] = tostring(self.chunk), ["index.suffix"] = retrieval.SUFFIX },
        { checksum = not (opts and opts.checksum == false) })
    return path
end

-- Reads an index for model m (nil: no model checks) over n_docs documents;
-- raises naming the file and what is wrong with it.
function retrieval.load(path, m, n_docs)
    local function fail(what)
        error(("retrieval: %s: %s; rebuild the index (recipes/fleet.lua --fleet DIR --resume --rounds 0 with the "
            .. "fleet's documents)"):format(path, what), 0)
    end
    local ok, f = pcall(safetensors.open, path)
    if not ok then fail(f) end
    local ok2, why = pcall(f.verify, f)
    if not ok2 then
        f:close()
        fail(why)
    end
    local meta = f.metadata
    local function check(cond, what)
        if not cond then
            f:close()
            fail(what)
        end
    end
    check(meta["index.format"] == retrieval.FORMAT, ("index.format is %q, expected %q"):format(
        tostring(meta["index.format"]), retrieval.FORMAT))
    if m then
        check(meta["index.model_fingerprint"] == cart.fingerprint(m), ("it was built with the model of fingerprint "
            .. "%s, and %s has %s"):format(tostring(meta["index.model_fingerprint"]), m.path, cart.fingerprint(m)))
    end
    local chunk = tonumber(meta["index.embed_chunk"] or "")
    check(chunk and chunk >= 1 and chunk == math.floor(chunk), "index.embed_chunk is not a positive integer")
    local emb, cen, doc = f:tensor("embeddings"), f:tensor("centroid"), f:tensor("chunk_doc")
    check(#f:tensors() == 3 and emb and cen and doc, "it must hold exactly 'embeddings', 'centroid' and 'chunk_doc'")
    check(emb.dtype_name == "F32" and #emb.shape == 2 and emb.shape[1] >= 1 and emb.shape[2] >= 1,
        "'embeddings' must be F32 [n >= 1, dim >= 1]")
    local n, dim = emb.shape[1], emb.shape[2]
    if m then check(dim == m.config.n_embd, ("its rows have %d dims, the model %d"):format(dim, m.config.n_embd)) end
    check(cen.dtype_name == "F32" and #cen.shape == 1 and cen.shape[1] == dim, ("'centroid' must be F32 [%d]"):format(dim))
    check(doc.dtype_name == "I64" and #doc.shape == 1 and doc.shape[1] == n, ("'chunk_doc' must be I64 [%d]"):format(n))
    local index = new_index(n, dim, chunk)
    ffi.copy(index.rows, emb.data, emb.nbytes)
    ffi.copy(index.centroid, cen.data, cen.nbytes)
    local d64 = ffi.cast("const int64_t *", doc.data)
    for r = 0, n - 1 do
        local v = tonumber(d64[r])
        check(v >= 0 and v < (n_docs or 2 ^ 53), ("chunk_doc[%d] is %d, not a document of the fleet's %s"):format(r, v,
            tostring(n_docs)))
        index.chunk_doc[r + 1] = v + 1
    end
    f:close()
    local bad = tonumber(C.cart_f32_first_nonfinite(index.rows, n * dim))
    if bad >= 0 then fail(("embeddings row %d is not finite"):format(math.floor(bad / dim))) end
    if C.cart_f32_first_nonfinite(index.centroid, dim) >= 0 then fail("the centroid is not finite") end
    return index
end

return retrieval
