-- fuzz_cartridge.lua: libFuzzer target (through lua_harness.c) for the
-- cartridge loader, require("cartridge.cart").load(path, m), on top of the
-- safetensors reader.
--
-- Each input is the bytes of a cartridge file. It is loaded twice: against
-- the fuzz model (fuzz_util.model_path(); seeds saved with Cart:save against
-- it pass the geometry and fingerprint checks and reach the copy), and with
-- no model (the geometry comes from the file alone). A load that fails must
-- raise a string naming the loader ("cart.load: ", "safetensors.open: ",
-- "cart.new: "); any other error, or a non-string one, is a finding. A load
-- that succeeds must give a cartridge whose geometry is consistent, that
-- matches the model when one was given, and that can be appended to a KV
-- cache of the model. Seeds come with and without the checksum Cart:save
-- stores: a mutated tensor byte fails the checksum, so the checksum-less
-- ones are what lets mutations reach the structure checks behind it.

local util = require("fuzz_util")
local cart = require("cartridge.cart")
local model = require("cartridge.model")

local m = model.load(util.model_path())
local file = util.memfile()
local REJECTIONS = { "cart.load: ", "safetensors.open: ", "cart.new: " }

local function check_loaded(c, info, with_model)
    if not (c.p >= 1 and c.frozen >= 0 and c.frozen < c.p and c.n_layer >= 1 and c.kv_heads >= 1
            and c.head_dim >= 1) then
        util.finding("cart.load accepted p %s, frozen %s, %s layers x %s heads x %s dims", tostring(c.p),
            tostring(c.frozen), tostring(c.n_layer), tostring(c.kv_heads), tostring(c.head_dim))
    end
    if type(info) ~= "table" or type(info.metadata) ~= "table" then
        util.finding("cart.load returned no metadata table")
    end
    if info.draft_reference ~= nil then
        local ids = require("cartridge.ids")
        if not ids.is(info.draft_reference) then
            util.finding("draft_reference is a %s, not a cartridge.ids sequence", type(info.draft_reference))
        end
        for i = 0, #info.draft_reference - 1 do
            local id = info.draft_reference:get(i)
            if id < 0 then util.finding("draft_reference[%d] is %d, not a token id", i, id) end
        end
    end
    if with_model then
        local mc = m.config
        if c.n_layer ~= mc.n_layer or c.kv_heads ~= mc.n_head_kv or c.head_dim ~= mc.head_dim then
            util.finding("cart.load accepted a %d x %d x %d cartridge for a %d x %d x %d model", c.n_layer,
                c.kv_heads, c.head_dim, mc.n_layer, mc.n_head_kv, mc.head_dim)
        end
        if c.p <= 4096 then
            local kv = m:new_kv(c.p + 1, "f32")
            c:append_to(kv)
            if kv:len() ~= c.p then util.finding("append_to gave %d rows for p = %d", kv:len(), c.p) end
            kv:free()
        end
    end
    c:free()
end

-- cart.load prints a notice for a file without a checksum; it goes here
-- instead of flooding the fuzzer's output.
local notices = { write = function(self, ...)
    for i = 1, select("#", ...) do
        if type(select(i, ...)) ~= "string" then util.finding("cart.load wrote a non-string to stderr") end
    end
    return self
end }

return function(data)
    file:set(data)
    for _, with_model in ipairs({ true, false }) do
        local stderr = io.stderr
        io.stderr = notices
        local ok, c, info = pcall(cart.load, file.path, with_model and m or nil)
        io.stderr = stderr
        if ok then
            check_loaded(c, info, with_model)
        else
            util.expect_rejection(c, REJECTIONS, "cart.load")
        end
    end
end
