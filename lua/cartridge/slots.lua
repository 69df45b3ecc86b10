-- cartridge.slots: llama-server's slot routes (cartridge.server_utility
-- routes them).
--
--   GET  /slots                              each slot: id, n_ctx, is_processing, model, n_tokens
--   POST /slots/{id}?action=save    {"filename"}  the slot's conversation to --slot-save-path/filename
--   POST /slots/{id}?action=restore {"filename"}  a saved conversation into the slot
--   POST /slots/{id}?action=erase                  forget what the slot holds
--
-- A slot holds a conversation: the rows of its cartridge (if any), then the
-- rows of the tokens it has seen. save writes those tokens and their rows as
-- a KV spill file (cartridge.kvstore, docs/formats.md: the disk tier's
-- format, naming the model and the cartridge by hashes, with a checksum);
-- restore reads one back, the disk tier's spill files too, after every
-- check, and a later request whose prompt starts with its tokens reuses
-- them, as after any request. A file for another model, another cartridge
-- this server does not serve, or another cache dtype, or a damaged one, is
-- a 400 that says which; nothing is removed. Slot ids count from 0, as
-- llama-server's. A busy slot is a 409.

local json = require("cartridge.json")
local core = require("cartridge.core")
local fs = require("cartridge.fs")
local C = core.C

local slots = {}

local function now_ms() return C.cart_now_seconds() * 1000 end

function slots.list(srv)
    local out = json.array()
    for i, s in ipairs(srv.slots) do
        local name = srv.model_name
        for n, c in pairs(srv.cartridges) do if c == s.cart then name = n end end
        out[i] = { id = i - 1, n_ctx = srv.ctx, is_processing = s.job ~= nil, model = name,
            n_tokens = s.loaded and #s.tokens or 0 }
    end
    return json.encode(out)
end

-- A file name for --slot-save-path: one plain name, nothing that leaves
-- the directory.
local function check_filename(srv, body)
    local u = srv.util
    local f = body.filename
    if type(f) ~= "string" or f == "" then
        u.reject(400, "filename must be a non-empty string; got " .. u.shown(f, body, "filename"), "filename")
    end
    u.check_utf8(f, "filename")
    if #f > 255 or f:find("[/\\%z\1-\31]") or f:sub(1, 1) == "." then
        u.reject(400, ("filename %s must be a plain file name (no / or \\, no control characters, not starting "
            .. "with '.', at most 255 bytes)"):format(u.shown(f)), "filename")
    end
    return srv.slot_save_path .. "/" .. f
end

local function save(srv, slot, body)
    local path = check_filename(srv, body)
    local t0 = now_ms()
    local n = slot.loaded and #slot.tokens or 0
    if n == 0 then srv.util.reject(400, "the slot holds no conversation to save", "id_slot") end
    local store = srv:slot_store()
    local ok, err = pcall(function()
        store:write_file(path, slot.cart, slot.tokens, slot.kv)
    end)
    if not ok then
        srv.util.reject(507, ("could not write %s (is the disk full?): %s"):format(path, tostring(err)), "filename")
    end
    local _, bytes = fs.kind(path)
    return { id_slot = slot.id - 1, filename = body.filename, n_saved = n, n_written = bytes,
        timings = { save_ms = now_ms() - t0 } }
end

local function restore(srv, slot, body)
    local path = check_filename(srv, body)
    local u = srv.util
    local t0 = now_ms()
    local kind, bytes = fs.kind(path)
    if kind ~= "file" then
        u.reject(404, ("%s: no such saved slot in --slot-save-path"):format(u.shown(body.filename)), "filename")
    end
    local store = srv:slot_store()
    local d, why_kind, why = store:inspect(path)
    if not d then u.reject(400, ("%s cannot be restored (%s): %s"):format(body.filename, why_kind, why), "filename") end
    local cart = store.cart_of[d.cart_hash].cart or nil
    if d.p + d.n > slot.kv:capacity() then
        u.reject(400, ("%s holds %d rows; a slot holds %d (--ctx)"):format(body.filename, d.p + d.n,
            slot.kv:capacity()), "filename")
    end
    slot.kv:truncate(0)
    if cart then cart:append_to(slot.kv) end
    local ok, err = pcall(store.load_rows, store, path, slot.kv, cart, d.n)
    if not ok then
        slot.loaded, slot.tokens = false, {}
        slot.kv:truncate(0)
        u.reject(400, ("%s cannot be restored (%s): %s"):format(body.filename, type(err) == "table" and err.kind
            or "damaged", type(err) == "table" and err.why or tostring(err)), "filename")
    end
    slot.cart, slot.tokens, slot.loaded, slot.last_used = cart, d.tokens, true, C.cart_now_seconds()
    return { id_slot = slot.id - 1, filename = body.filename, n_restored = d.n, n_read = bytes,
        timings = { restore_ms = now_ms() - t0 } }
end

local function erase(_, slot)
    local n = slot.loaded and #slot.tokens or 0
    slot.kv:truncate(0)
    slot.loaded, slot.tokens, slot.cart = false, {}, nil
    return { id_slot = slot.id - 1, n_erased = n }
end

local ACTIONS = { save = save, restore = restore, erase = erase }

function slots.action(srv, req, body)
    local u = srv.util
    local id = tonumber(req.model_id)
    local slot = id and srv.slots[id + 1]
    if not slot then
        u.reject(404, ("slot %s does not exist; this server has slots 0 to %d"):format(u.shown(req.model_id),
            #srv.slots - 1), "id_slot")
    end
    local action = (req.query or ""):match("action=([%w_]+)")
    local fn = ACTIONS[action]
    if not fn then
        u.reject(400, ("action must be save, restore or erase (?action=...); got %s"):format(u.shown(action)),
            "action")
    end
    if action ~= "erase" and not srv.slot_save_path then
        u.reject(501, "saving and restoring slots needs serve.lua --slot-save-path DIR", "action")
    end
    if slot.job then
        u.reject(409, ("slot %d is processing a request; try again when it is idle"):format(id), "id_slot")
    end
    return json.encode(fn(srv, slot, body or {}))
end

return slots
