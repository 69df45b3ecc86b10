-- cartridge.fleet: one cartridge per document, trained together so that they
-- compose (recipes/fleet.lua, docs/fleet.md).
--
--   local fleet = require("cartridge.fleet")
--   local docs = fleet.documents({ "docs/" }, tok)    -- { name, path, corpus } per file
--   local man = fleet.init(m, "out/fleet", docs, { p = 256, frozen = 1 })   -- corpus-init cartridges, manifest
--   local man = fleet.read_manifest("out/fleet")        -- fleet.json, checked field by field
--   local man = fleet.parse_manifest(text, "where")     -- the same from its text
--   fleet.write_manifest("out/fleet", man)              -- atomically
--   local mgr = fleet.manager(m, "out/fleet", man, { budget = 4, lr = 2e-3, warmup = 8 })
--   mgr:load(i); mgr:evict(i); mgr:rotate(); mgr:checkpoint()
--   local plan = fleet.plan(mgr, seed, round, { p_iso = 0.75, distract_max = 3 })
--
-- A fleet directory holds fleet.json (the manifest), and for document i
-- (0-based) doc-<iii>.safetensors (its cartridge, a standard artifact) and
-- doc-<iii>.adam.safetensors (its Adam moments and step count; a missing
-- one means fresh moments), and index.safetensors (the retrieval index,
-- cartridge.retrieval). Every file is written atomically.
--
-- The budget manager keeps at most `budget` documents resident (rows and
-- optimizer in memory). Each resident has its own Adam and the step count at
-- which it entered; its learning rate warms up over `warmup` steps from each
-- entry: lr * min(1, (steps since entry + 1) / warmup). Every `rotate_every`
-- rounds, when there are more documents than the budget, the manager saves
-- every resident and the manifest (a checkpoint), evicts the
-- max(1, ceil(evict_frac * residents)) most-stepped residents (ties: the
-- lower index) and loads the least-stepped absent documents in their place
-- (ties: the lower index). The rows and moments are stored as f32, exactly,
-- so evicting and reloading a cartridge is the same as keeping it.

local core = require("cartridge.core")
local json = require("cartridge.json")
local fs = require("cartridge.fs")
local cart = require("cartridge.cart")
local adam = require("cartridge.adam")
local corpus_mod = require("cartridge.corpus")
local selfstudy = require("cartridge.selfstudy")
local C = core.C

local fleet = {}

fleet.FORMAT = "cartridge-fleet"
fleet.VERSION = 1
fleet.MANIFEST = "fleet.json"
fleet.INDEX = "index.safetensors"
fleet.MAX_BUDGET = 64
fleet.MAX_MANIFEST_BYTES = 64 * 1024 * 1024

-- The files of document i (1-based).
function fleet.cart_file(i) return ("doc-%03d.safetensors"):format(i - 1) end
function fleet.opt_file(i) return ("doc-%03d.adam.safetensors"):format(i - 1) end

local function join(dir, name) return dir:gsub("/+$", "") .. "/" .. name end
fleet.join = join

-- ---------------------------------------------------------------------------
-- Documents

-- The documents behind --corpus arguments (files, or directories of .md
-- files), one per file, each without a header: { name, path, corpus }. A
-- document's name is its file name; two files of one name are an error.
function fleet.documents(paths, tok)
    if #paths == 0 then error("fleet: no --corpus given; pass the documents (files or directories of .md files)", 0) end
    local files = corpus_mod.expand(paths)
    local docs, by_name = {}, {}
    for _, path in ipairs(files) do
        local name = path:match("([^/]+)$")
        if by_name[name] then
            error(("fleet: two documents are named %s (%s and %s); a fleet names documents by their file names, so "
                .. "rename one"):format(name, by_name[name], path), 0)
        end
        by_name[name] = path
        local text = corpus_mod.read_text(path)
        docs[#docs + 1] = { name = name, path = path, corpus = corpus_mod.document(name, text, tok) }
    end
    if #docs == 0 then
        error("fleet: no documents found in " .. table.concat(paths, ", ") .. " (a directory contributes its "
            .. "top-level .md files)", 0)
    end
    return docs
end

-- ---------------------------------------------------------------------------
-- The manifest

local function shown(v)
    if type(v) == "string" then return ("%q"):format(#v > 40 and v:sub(1, 40) .. "..." or v) end
    if v == nil or v == json.null then return "null" end
    if type(v) == "table" then return json.kind(v) == "array" and "an array" or "an object" end
    return tostring(v)
end

local function is_int(v, lo, hi)
    return type(v) == "number" and v == math.floor(v) and v >= lo and v <= (hi or 2 ^ 53)
end

-- Checks a decoded manifest; `where` names it in errors. Returns it.
function fleet.check_manifest(man, where)
    local function bad(what)
        error(("fleet: %s: %s; the manifest is damaged: restore it from a copy, or train the fleet again into an "
            .. "empty directory"):format(where, what), 0)
    end
    if json.kind(man) ~= "object" then bad("the top level must be an object, not " .. shown(man)) end
    -- a number past a double's range (1e999) reads as infinity, which no
    -- JSON text can hold: the manifest could not be written back
    local inf_at = json.nonfinite_at(man)
    if inf_at then bad("the manifest" .. inf_at .. " is a number beyond a double's range") end
    if man.format ~= fleet.FORMAT then
        bad(("format is %s, expected %q (is this a fleet directory?)"):format(shown(man.format), fleet.FORMAT))
    end
    if man.version ~= fleet.VERSION then
        bad(("version %s is not one this build reads (%d)"):format(shown(man.version), fleet.VERSION))
    end
    local function int(key, lo, hi)
        if not is_int(man[key], lo, hi) then
            bad(("%s must be an integer in [%d, %s], not %s"):format(key, lo, hi and tostring(hi) or "2^53",
                shown(man[key])))
        end
    end
    int("p", 2, 2 ^ 31)
    int("frozen", 0, man.p - 1)
    int("rounds", 0)
    int("embed_chunk", 1, 2 ^ 31)
    int("embed_dim", 0, 2 ^ 31)
    if type(man.model_fingerprint) ~= "string" or not man.model_fingerprint:match("^%x+$")
        or #man.model_fingerprint ~= 16 then
        bad("model_fingerprint must be 16 hex digits, not " .. shown(man.model_fingerprint))
    end
    if type(man.model) ~= "string" then bad("model must be a string, not " .. shown(man.model)) end
    if man.settings ~= nil and json.kind(man.settings) ~= "object" then
        bad("settings must be an object, not " .. shown(man.settings))
    end
    if json.kind(man.docs) ~= "array" or #man.docs == 0 then
        bad("docs must be a non-empty array, not " .. shown(man.docs))
    end
    local names = {}
    for i, d in ipairs(man.docs) do
        local at = ("docs[%d]"):format(i - 1)
        if json.kind(d) ~= "object" then bad(at .. " must be an object, not " .. shown(d)) end
        if type(d.name) ~= "string" or d.name == "" or d.name:find("[/%z]") then
            bad(at .. ".name must be a file name, not " .. shown(d.name))
        end
        if names[d.name] then bad(("%s.name %s repeats docs[%d]'s"):format(at, shown(d.name), names[d.name] - 1)) end
        names[d.name] = i
        -- the file names are fixed by the index: a manifest cannot point
        -- outside the directory
        if d.cart_file ~= fleet.cart_file(i) then
            bad(("%s.cart_file must be %q, not %s"):format(at, fleet.cart_file(i), shown(d.cart_file)))
        end
        if d.opt_file ~= fleet.opt_file(i) then
            bad(("%s.opt_file must be %q, not %s"):format(at, fleet.opt_file(i), shown(d.opt_file)))
        end
        for _, key in ipairs({ "tokens", "steps" }) do
            if not is_int(d[key], 0) then
                bad(("%s.%s must be a non-negative integer, not %s"):format(at, key, shown(d[key])))
            end
        end
        if not is_int(d.rows, 1, man.p) then
            bad(("%s.rows must be an integer in [1, p = %d], not %s"):format(at, man.p, shown(d.rows)))
        end
        if not is_int(d.entered, 0, d.steps) then
            bad(("%s.entered must be an integer in [0, steps = %d], not %s"):format(at, d.steps, shown(d.entered)))
        end
        if type(d.resident) ~= "boolean" then bad(at .. ".resident must be true or false, not " .. shown(d.resident)) end
    end
    return man
end

-- The manifest of a fleet directory, checked; raises naming the problem.
function fleet.read_manifest(dir)
    local path = join(dir, fleet.MANIFEST)
    local kind, size = fs.kind(path)
    if kind == "missing" then
        error(("fleet: %s does not exist: %s is not a fleet directory (train one with --corpus FILES --fleet %s)")
            :format(path, dir, dir), 0)
    elseif kind ~= "file" then
        error(("fleet: %s is not a regular file"):format(path), 0)
    elseif size > fleet.MAX_MANIFEST_BYTES then
        error(("fleet: %s is %d bytes, above the %d a manifest may take; it is not a manifest"):format(path, size,
            fleet.MAX_MANIFEST_BYTES), 0)
    end
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    return fleet.parse_manifest(text, path)
end

-- A manifest from its JSON text, checked; `where` names it in errors.
function fleet.parse_manifest(text, where)
    local ok, man = pcall(json.decode, text)
    if not ok then
        error(("fleet: %s: %s; the manifest is damaged: restore it from a copy, or train the fleet again into an "
            .. "empty directory"):format(where, man), 0)
    end
    return fleet.check_manifest(man, where)
end

-- Writes the manifest atomically (a temporary file, fsynced, renamed).
function fleet.write_manifest(dir, man)
    fleet.check_manifest(man, "the manifest about to be written")
    fs.write_atomic(join(dir, fleet.MANIFEST), json.encode(man) .. "\n")
end

-- A new manifest for documents docs (fleet.documents) and model m; each
-- document's rows (its cartridge's p) start at opts.p, for the caller to
-- set to what its cartridge holds.
function fleet.new_manifest(m, docs, opts)
    local man = {
        format = fleet.FORMAT, version = fleet.VERSION,
        model = tostring(m.file:get("general.name") or m.path), model_fingerprint = cart.fingerprint(m),
        p = opts.p, frozen = opts.frozen, rounds = 0, embed_chunk = opts.embed_chunk or 256, embed_dim = 0,
        settings = json.object(opts.settings or {}), docs = json.array({}),
    }
    for i, d in ipairs(docs) do
        man.docs[i] = { name = d.name, cart_file = fleet.cart_file(i), opt_file = fleet.opt_file(i),
            tokens = d.corpus.n_tokens, rows = opts.p, steps = 0, entered = 0, resident = false }
    end
    return man
end

-- nil when a document's cartridge file (its metadata meta) is that
-- document's, else the message: a file of another document (swapped, or
-- linked from elsewhere) is refused, never served or trained.
function fleet.check_document(meta, d, path)
    local holds = meta["fleet.document"]
    if holds == d.name then return nil end
    return ("fleet: %s holds %s, and the manifest puts document %s there; the fleet is damaged (files swapped or "
        .. "linked from another fleet): train the fleet again, or put %s's own cartridge back"):format(path,
        holds and ("document " .. holds .. "'s cartridge") or "a cartridge of no fleet document", d.name, d.name)
end

-- The index (1-based) of the document a manifest names `name`, or nil.
function fleet.find(man, name)
    for i, d in ipairs(man.docs) do
        if d.name == name then return i end
    end
end

-- The names of a manifest's documents, comma-separated.
function fleet.names(man)
    local out = {}
    for i, d in ipairs(man.docs) do out[i] = d.name end
    return table.concat(out, ", ")
end

-- A new fleet in dir: each document's cartridge initialized from its own
-- opening (selfstudy.init_ids: the document as a system message, at most
-- opts.p rows) and saved, moments fresh, then the manifest. opts: p,
-- frozen, settings, embed_chunk, template (the model's by default).
-- Returns the manifest.
function fleet.init(m, dir, docs, opts)
    local tok = m:tokenizer()
    local template = opts.template or require("cartridge.chat").for_model(m)
    local man = fleet.new_manifest(m, docs, opts)
    for i, d in ipairs(docs) do
        fs.sweep_temps(join(dir, fleet.cart_file(i)))
        local ids = selfstudy.init_ids(tok, template, d.corpus.text, opts.p)
        if opts.frozen >= #ids then
            error(("fleet: --frozen %d must be below the %d rows %s initializes"):format(opts.frozen, #ids, d.name), 0)
        end
        local c = cart.new(m, #ids, opts.frozen)
        c:capture(m, ids)
        c:save(join(dir, fleet.cart_file(i)), m, { training = man.settings,
            extra_meta = { ["fleet.document"] = d.name, ["fleet.steps"] = 0 } })
        man.docs[i].rows = c.p
        c:free()
        os.remove(join(dir, fleet.opt_file(i))) -- fresh moments
    end
    fleet.write_manifest(dir, man)
    return man
end

-- ---------------------------------------------------------------------------
-- The budget manager

local Manager = {}
Manager.__index = Manager

-- m: the model; dir: the fleet directory; man: its manifest (the manager
-- keeps its docs' steps, entered and resident up to date); opts: budget,
-- lr, warmup, rotate_every, evict_frac, log (function(line) or nil).
function fleet.manager(m, dir, man, opts)
    fleet.check_model(m, dir, man)
    return setmetatable({ m = m, dir = dir, man = man, o = opts, resident = {}, log = opts.log or function() end },
        Manager)
end

-- Raises unless the fleet in dir (its manifest man) was trained on model m.
function fleet.check_model(m, dir, man)
    if man.model_fingerprint ~= cart.fingerprint(m) then
        error(("fleet: %s was trained on model '%s' (fingerprint %s), and %s has fingerprint %s; use the model it "
            .. "was trained with"):format(dir, man.model, man.model_fingerprint, m.path, cart.fingerprint(m)), 0)
    end
end

-- The residents' indices in increasing order.
function Manager:residents()
    local out = {}
    for i in pairs(self.resident) do out[#out + 1] = i end
    table.sort(out)
    return out
end

function Manager:count()
    local n = 0
    for _ in pairs(self.resident) do n = n + 1 end
    return n
end

function Manager:doc(i) return self.man.docs[i] end

-- Loads document i's cartridge and moments into memory. `entered`: the
-- step count its warm-up counts from (default: its current steps, a new
-- entry).
function Manager:load(i, entered)
    if self.resident[i] then return self.resident[i] end
    local d = self.man.docs[i]
    local path = join(self.dir, d.cart_file)
    local ok, c, info = pcall(cart.load, path, self.m)
    if not ok then error(("fleet: document %s: %s"):format(d.name, c), 0) end
    if c.p ~= d.rows then
        c:free()
        error(("fleet: document %s: %s holds %d rows and the manifest says %d; the fleet is damaged"):format(d.name,
            path, c.p, d.rows), 0)
    end
    local why = fleet.check_document(info.metadata, d, path)
    if why then
        c:free()
        error(why, 0)
    end
    local on_disk = tonumber(info.metadata["fleet.steps"] or "")
    if on_disk and on_disk ~= d.steps then
        -- a checkpoint interrupted between its files and its manifest
        self.log(("fleet: %s holds %d steps, the manifest says %d (an interrupted checkpoint); continuing from "
            .. "the file"):format(path, on_disk, d.steps))
        d.steps = on_disk
        d.entered = math.min(d.entered, on_disk)
    end
    local opt = adam.new(c, { lr = self.o.lr })
    local opt_path = join(self.dir, d.opt_file)
    if fs.kind(opt_path) == "file" then
        local ok2, why = pcall(opt.load, opt, opt_path)
        if not ok2 then
            c:free()
            opt:free()
            error(("fleet: document %s: %s"):format(d.name, why), 0)
        end
    end
    d.entered = entered or d.steps
    d.resident = true
    local r = { index = i, cart = c, opt = opt }
    self.resident[i] = r
    return r
end

-- Writes a resident's cartridge and moments (atomically).
function Manager:save(i)
    local r, d = assert(self.resident[i], "fleet: save of a document not resident"), self.man.docs[i]
    r.cart:save(join(self.dir, d.cart_file), self.m, { training = self.man.settings,
        extra_meta = { ["fleet.document"] = d.name, ["fleet.steps"] = d.steps } })
    r.opt:save(join(self.dir, d.opt_file))
end

-- Drops a resident from memory; with save, writes it first.
function Manager:evict(i, save)
    local r = self.resident[i]
    if not r then return end
    if save then self:save(i) end
    r.cart:free()
    r.opt:free()
    self.resident[i] = nil
    self.man.docs[i].resident = false
end

-- Saves every resident, then the manifest.
function Manager:checkpoint()
    for _, i in ipairs(self:residents()) do self:save(i) end
    fleet.write_manifest(self.dir, self.man)
end

-- Document indices ordered by steps (ascending, or descending with `most`),
-- ties to the lower index.
local function by_steps(docs, list, most)
    table.sort(list, function(a, b)
        local sa, sb = docs[a].steps, docs[b].steps
        if sa ~= sb then
            if most then return sa > sb end
            return sa < sb
        end
        return a < b
    end)
    return list
end

-- Fills the free places up to the budget with the least-stepped absent
-- documents. Returns the indices loaded.
function Manager:fill()
    local absent = {}
    for i = 1, #self.man.docs do
        if not self.resident[i] then absent[#absent + 1] = i end
    end
    by_steps(self.man.docs, absent)
    local loaded = {}
    for _, i in ipairs(absent) do
        if self:count() >= self.o.budget then break end
        self:load(i)
        loaded[#loaded + 1] = i
    end
    return loaded
end

-- Brings back the residents a manifest names (a resumed fleet continues
-- with the same ones, warming up from where they were), then fills up.
function Manager:restore()
    for i, d in ipairs(self.man.docs) do
        if d.resident and self:count() < self.o.budget then self:load(i, d.entered) else d.resident = false end
    end
    return self:fill()
end

-- The learning rate of resident i for its next step: warm-up from its entry.
function Manager:lr(i)
    local d = self.man.docs[i]
    return self.o.lr * math.min(1, (d.steps - d.entered + 1) / math.max(self.o.warmup, 1))
end

-- After a round (the manifest's rounds already counted): when it is time
-- and there are more documents than places, checkpoint, evict the
-- most-stepped residents and load the least-stepped absent ones. Returns
-- the evicted and the loaded indices, or nil when it was not time.
function Manager:rotate()
    local o = self.o
    if #self.man.docs <= o.budget or o.rotate_every < 1 or self.man.rounds % o.rotate_every ~= 0 then return nil end
    self:checkpoint()
    local residents = by_steps(self.man.docs, self:residents(), true)
    local n = math.max(1, math.ceil(o.evict_frac * #residents))
    local evicted = {}
    for k = 1, math.min(n, #residents) do
        evicted[k] = residents[k]
        self:evict(residents[k], false) -- just saved
    end
    local loaded = self:fill()
    fleet.write_manifest(self.dir, self.man)
    return evicted, loaded
end

-- Frees the residents' memory. Unlike an eviction it leaves the manifest's
-- resident flags alone: they say which documents a resumed fleet brings
-- back (Manager:restore), and a manifest written after this (the index's)
-- must still name the residents of the last checkpoint.
function Manager:free()
    for _, i in ipairs(self:residents()) do
        local r = self.resident[i]
        r.cart:free()
        r.opt:free()
        self.resident[i] = nil
    end
end

-- ---------------------------------------------------------------------------
-- A round

-- A number in [0, 1) from the generator.
local function uniform(rng)
    return rng:below(2 ^ 30) / 2 ^ 30
end

-- What round `round` trains: the target resident (chosen with probability
-- proportional to its document's tokens), alone with probability p_iso, else
-- with k ~ U[1, min(distract_max, residents - 1)] other residents as
-- distractors (without replacement), the parts in a shuffled order. The draws
-- come from a generator seeded by (seed, round) alone, so a resumed fleet
-- makes the plan an uninterrupted one would. Returns { target, parts
-- (indices in composition order), isolated }.
function fleet.plan(mgr, seed, round, opts)
    local rng = require("cartridge.rng").item(seed, round, 0)
    local residents = mgr:residents()
    local total = 0
    for _, i in ipairs(residents) do total = total + math.max(mgr:doc(i).tokens, 1) end
    local x, target = rng:below(total), residents[#residents]
    for _, i in ipairs(residents) do
        x = x - math.max(mgr:doc(i).tokens, 1)
        if x < 0 then
            target = i
            break
        end
    end
    local parts = { target }
    local most = math.min(opts.distract_max, #residents - 1)
    if most >= 1 and uniform(rng) >= opts.p_iso then
        local others = {}
        for _, i in ipairs(residents) do
            if i ~= target then others[#others + 1] = i end
        end
        rng:shuffle(others)
        for k = 1, rng:int(1, most) do parts[#parts + 1] = others[k] end
        rng:shuffle(parts)
    end
    return { target = target, parts = parts, isolated = #parts == 1 }
end

-- Trains one round's conversations (convos, made from the target's
-- document) behind the composition of the plan's parts, then steps every
-- part's optimizer at its warm-up learning rate and counts its step.
-- tr: a trainer; accum: conversations per step. Returns the distill loss and
-- the supervised answer tokens, or raises (before any update) when the loss
-- or the gradient is not finite.
function fleet.train_round(mgr, tr, plan, convos, accum)
    local carts = {}
    for k, i in ipairs(plan.parts) do carts[k] = mgr.resident[i].cart end
    local composed = cart.compose(carts)
    local stepper = selfstudy.stepper(tr, composed, accum)
    local ok, loss, tokens = pcall(stepper.step, stepper, convos)
    stepper:free()
    if not ok then
        composed:free()
        error(loss, 0)
    end
    local bad = loss ~= loss or loss == math.huge or loss == -math.huge
    if bad or C.cart_cartridge_check_finite(composed.handle, 1) ~= 0 then
        local why = bad and tostring(loss) or core.last_error()
        composed:free()
        error(("the %s is not finite (%s); stopping before the update. Lower --lr, or check the model and the "
            .. "documents"):format(bad and "distill loss" or "gradient", why), 0)
    end
    for _, c in ipairs(carts) do c:zero_grad() end
    composed:compose_grad()
    composed:free()
    for _, i in ipairs(plan.parts) do
        local r = mgr.resident[i]
        r.opt:set_lr(mgr:lr(i))
        r.opt:step()
        if C.cart_cartridge_check_finite(r.cart.handle, 0) ~= 0 then
            error(("the update made %s's rows non-finite (%s); stopping. Lower --lr"):format(mgr:doc(i).name,
                core.last_error()), 0)
        end
        mgr:doc(i).steps = mgr:doc(i).steps + 1
    end
    return loss, tokens
end

return fleet
