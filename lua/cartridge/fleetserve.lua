-- cartridge.fleetserve: a fleet behind the HTTP server (recipes/serve.lua
-- --fleet, docs/fleet.md).
--
--   local fleetserve = require("cartridge.fleetserve")
--   local f = fleetserve.open(m, "out/fleet", { name = "fleet", budget = 8, rag_docs = 2, rag_chunks = 8 })
--   local prefix = f:select({ "first user message", "second" })   -- sticky per conversation
--   if prefix:acquire() then ... prefix:append_to(kv) ... prefix:release() end
--
-- A request for the fleet's model name gets the documents retrieval picks
-- for its user messages (all of them, joined by newlines), at most rag_docs
-- among the documents of the rag_chunks best chunks. The choice is sticky
-- per conversation: it is remembered under the first user message, so every
-- later turn of a conversation goes behind the same composed prefix and
-- reuses the rows its slot already holds. A prefix is one object per set of
-- documents (in order), which is how the server's slots tell that two
-- requests share their cartridge rows.
--
-- Cartridges are mapped from the fleet directory when a request needs them
-- (cart.map: the rows stay in the page cache, not copied), and at most
-- `budget` are mapped at once: a request whose documents do not fit waits
-- until running requests release theirs, and the least recently used
-- mapping that no running request holds is the one dropped (ties: the
-- lower document).

local fleet = require("cartridge.fleet")
local retrieval = require("cartridge.retrieval")
local cart = require("cartridge.cart")

local fleetserve = {}

fleetserve.STICKY_MAX = 4096 -- conversations whose choice is remembered

local Fleet = {}
Fleet.__index = Fleet

local Prefix = {}
Prefix.__index = Prefix

-- opts: name (the model name requests use), budget (most cartridges mapped
-- at once, at least rag_docs), rag_docs, rag_chunks, log (function(line)).
function fleetserve.open(m, dir, opts)
    local man = fleet.read_manifest(dir)
    fleet.check_model(m, dir, man)
    local index = retrieval.load(fleet.join(dir, fleet.INDEX), m, #man.docs)
    if opts.budget < opts.rag_docs then
        error(("fleetserve: --budget %d is below --rag-docs %d: one request composes up to %d cartridges, and all of "
            .. "them must be mapped at once"):format(opts.budget, opts.rag_docs, opts.rag_docs), 0)
    end
    local self = setmetatable({ m = m, dir = dir, man = man, index = index, name = opts.name or "fleet",
        budget = opts.budget, rag_docs = opts.rag_docs, rag_chunks = opts.rag_chunks,
        log = opts.log or function() end, maps = {}, mapped = 0, pins = {}, used = {}, clock = 0, prefixes = {},
        sticky = {}, sticky_keys = {}, stats = { retrievals = 0, sticky_hits = 0, maps = 0, unmaps = 0 } }, Fleet)
    -- the most rows a composition can take: the rag_docs largest cartridges
    local rows = {}
    for i, d in ipairs(man.docs) do rows[i] = d.rows end
    table.sort(rows, function(a, b) return a > b end)
    self.max_rows = 0
    for k = 1, math.min(opts.rag_docs, #rows) do self.max_rows = self.max_rows + rows[k] end
    return self
end

-- The prefix of documents docs (a list of 1-based indices, in order): one
-- object per list.
function Fleet:prefix(docs)
    local key = table.concat(docs, ",")
    local p = self.prefixes[key]
    if p then return p end
    local rows, names = 0, {}
    for k, i in ipairs(docs) do
        rows = rows + self.man.docs[i].rows
        names[k] = self.man.docs[i].name
    end
    p = setmetatable({ fleet = self, docs = docs, p = rows, key = key, names = names }, Prefix)
    self.prefixes[key] = p
    return p
end

-- The prefix for a conversation: users is the list of its user messages'
-- texts (at least one). The first request of a conversation retrieves; the
-- later ones (the same first user message) get what it got.
function Fleet:select(users)
    local key = users[1]
    local docs = self.sticky[key]
    if docs then
        self.stats.sticky_hits = self.stats.sticky_hits + 1
    else
        local hits = self.index:top_docs(self.index:query(self.m, table.concat(users, "\n")), self.rag_chunks,
            self.rag_docs)
        docs = {}
        for k, h in ipairs(hits) do docs[k] = h.doc end
        self.stats.retrievals = self.stats.retrievals + 1
        self.sticky[key] = docs
        local keys = self.sticky_keys
        keys[#keys + 1] = key
        if #keys > fleetserve.STICKY_MAX then self.sticky[table.remove(keys, 1)] = nil end
    end
    return self:prefix(docs)
end

-- Maps document i (counted against the budget).
function Fleet:map(i)
    local d = self.man.docs[i]
    local c = cart.map(fleet.join(self.dir, d.cart_file), self.m)
    if c.p ~= d.rows then
        c:free()
        error(("fleetserve: %s holds %d rows and the manifest says %d; the fleet is damaged"):format(
            fleet.join(self.dir, d.cart_file), c.p, d.rows), 0)
    end
    local why = fleet.check_document(c.metadata, d, fleet.join(self.dir, d.cart_file))
    if why then
        c:free()
        error(why, 0)
    end
    self.maps[i], self.mapped = c, self.mapped + 1
    self.stats.maps = self.stats.maps + 1
end

function Fleet:unmap(i)
    self.maps[i]:free()
    self.maps[i], self.mapped = nil, self.mapped - 1
    self.stats.unmaps = self.stats.unmaps + 1
end

-- Maps the prefix's documents and holds them for a request: false (nothing
-- changed) when the budget cannot make room while other requests hold
-- theirs. Release with :release().
function Prefix:acquire()
    local f, wanted = self.fleet, {}
    for _, i in ipairs(self.docs) do wanted[i] = true end
    local need = 0
    for _, i in ipairs(self.docs) do
        if not f.maps[i] then need = need + 1 end
    end
    if f.mapped + need > f.budget then
        -- the least recently used mappings that no request holds, until there is room
        local idle = {}
        for i in pairs(f.maps) do
            if (f.pins[i] or 0) == 0 and not wanted[i] then idle[#idle + 1] = i end
        end
        if f.mapped + need - #idle > f.budget then return false end
        table.sort(idle, function(a, b)
            if f.used[a] ~= f.used[b] then return f.used[a] < f.used[b] end
            return a < b
        end)
        for k = 1, f.mapped + need - f.budget do f:unmap(idle[k]) end
    end
    -- map first, pin after: a document that cannot be mapped leaves nothing
    -- pinned and nothing this call mapped (the error names the file)
    local mapped_now = {}
    for _, i in ipairs(self.docs) do
        if not f.maps[i] then
            local ok, err = pcall(f.map, f, i)
            if not ok then
                for _, j in ipairs(mapped_now) do f:unmap(j) end
                error(err, 0)
            end
            mapped_now[#mapped_now + 1] = i
        end
    end
    f.clock = f.clock + 1
    for _, i in ipairs(self.docs) do
        f.pins[i] = (f.pins[i] or 0) + 1
        f.used[i] = f.clock
    end
    return true
end

function Prefix:release()
    for _, i in ipairs(self.docs) do self.fleet.pins[i] = self.fleet.pins[i] - 1 end
end

-- Writes the documents' rows into a cache, one after the other (held with
-- :acquire first).
function Prefix:append_to(kv)
    for _, i in ipairs(self.docs) do
        local c = self.fleet.maps[i]
        if not c then error("fleetserve: " .. self.fleet.man.docs[i].name .. " is not mapped; acquire it first", 0) end
        c:append_to(kv)
    end
end

function Fleet:free()
    for i in pairs(self.maps) do self:unmap(i) end
end

return fleetserve
