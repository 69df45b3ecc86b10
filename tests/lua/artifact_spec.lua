-- Artifacts checked to the value: the checksum a cartridge carries, rows that
-- must be finite, and the temporary files a killed save leaves behind.

local helper = require("helper")
local cartridge = require("cartridge")
local safetensors = require("cartridge.safetensors")
local fs = require("cartridge.fs")
local ffi = require("ffi")

local tmp, m
setup(function()
    tmp = helper.tmpdir()
    m = cartridge.model.load(helper.root .. "/models/default.gguf")
end)
teardown(function()
    m:free()
    helper.rmdir(tmp)
end)

local function saved(name)
    local c = cartridge.cart.new(m, 6, 1)
    c:init_random(7, 0.5)
    local path = tmp .. "/" .. name
    c:save(path, m)
    c:free()
    return path
end

-- Rewrites a file's byte at offset (0-based) with f(old byte).
local function poke(path, offset, f)
    local bytes = helper.read_file(path)
    local b = bytes:byte(offset + 1)
    helper.write_file(path, bytes:sub(1, offset) .. string.char(f(b)) .. bytes:sub(offset + 2))
end

-- A saved file's tensors as copies (one value of tensor `name` set to
-- `value` at `index`) and its metadata without the checksum: what an older
-- writer, or a damaged file, would hold. Returns tensors, the copies' buffers
-- in file order, metadata.
local function copies_of(path, name, index, value)
    local f = safetensors.open(path)
    local tensors, keep, meta = {}, {}, {}
    for k, v in pairs(f.metadata) do
        if k ~= "cartridge.checksum" then meta[k] = v end
    end
    for _, t in ipairs(f:tensors()) do
        local copy = ffi.new("uint8_t[?]", t.nbytes)
        ffi.copy(copy, t.data, t.nbytes)
        keep[#keep + 1] = copy
        if t.name == name then ffi.cast("float *", copy)[index] = value end
        tensors[#tensors + 1] = { name = t.name, dtype = t.dtype_name, shape = t.shape, data = copy }
    end
    f:close()
    return tensors, keep, meta
end

describe("artifacts", function()
    it("carry a checksum of their tensor bytes, and a changed byte is refused naming the file", function()
        local path = saved("a.safetensors")
        local f = safetensors.open(path)
        local sum = f.metadata["cartridge.checksum"]
        assert.truthy(sum and sum:match("^cs64:%x+$") and #sum == 21, tostring(sum))
        assert.is_true(f:verify())
        local data_at = 8 + f.header_size
        f:close()
        cartridge.cart.load(path, m):free()
        -- one bit of one tensor value
        poke(path, data_at + 100, function(b) return bit.bxor(b, 1) end)
        local ok, err = pcall(cartridge.cart.load, path, m)
        assert.is_false(ok)
        print("  " .. err)
        assert.truthy(err:find(path, 1, true) and err:find("do not match the file's checksum", 1, true), err)
    end)

    it("refuses non-finite rows naming the tensor, and an older file without a checksum loads with a notice", function()
        local path = saved("nan.safetensors")
        -- rewrite as an older writer would: the same tensors, NaN in one row, no checksum
        local tensors, keep, meta = copies_of(path, "layers.2.v", 3 * 128 + 5, 0 / 0)
        local old = tmp .. "/old.safetensors"
        for i, t in ipairs(tensors) do
            if t.name == "layers.2.v" then
                local good = ffi.new("uint8_t[?]", ffi.sizeof(keep[i]))
                ffi.copy(good, keep[i], ffi.sizeof(keep[i]))
                ffi.cast("float *", good)[3 * 128 + 5] = 1
                tensors[i] = { name = t.name, dtype = t.dtype, shape = t.shape, data = good }
                safetensors.write(old, tensors, meta)
                tensors[i] = t
            end
        end
        safetensors.write(path, tensors, meta)
        local ok, err = pcall(cartridge.cart.load, path, m)
        assert.is_false(ok)
        print("  " .. err)
        assert.truthy(err:find("'layers.2.v' row 3 holds nan", 1, true), err)
        -- the older file (no checksum, finite) loads, saying it is unverified
        local rc, _, stderr = helper.cartridge("-e", ("local c = require('cartridge'); local m = c.model.load(%q); "
            .. "c.cart.load(%q, m):free()"):format(helper.root .. "/models/default.gguf", old))
        assert.are.equal(0, rc, stderr)
        assert.truthy(stderr:find("carries no checksum", 1, true), stderr)
        -- and a cartridge holding NaN is never saved
        local c = cartridge.cart.new(m, 4, 0)
        c:rows(1, 0)[2] = 0 / 0
        ok, err = pcall(c.save, c, tmp .. "/never.safetensors", m)
        assert.is_false(ok)
        assert.truthy(err:find("'layers.1.k' row 0 holds nan", 1, true), err)
        assert.is_false(helper.exists(tmp .. "/never.safetensors"))
        c:free()
    end)

    it("refuses rows beyond the f16 range and draft ids beyond the vocabulary, naming the bound", function()
        -- 3e38 is finite, but attention over it overflows (a served reply of
        -- NaN logits); rewritten without a checksum, as an older writer would
        local path = saved("huge.safetensors")
        local tensors, _, meta = copies_of(path, "layers.1.k", 2 * 128 + 7, 3e38)
        safetensors.write(path, tensors, meta)
        local ok, err = pcall(cartridge.cart.load, path, m)
        assert.is_false(ok)
        print("  " .. err)
        assert.truthy(err:find("'layers.1.k' row 2 holds 3e+38: every value must lie within +-65504", 1, true), err)
        -- such rows are never saved either
        local c = cartridge.cart.new(m, 4, 0)
        c:rows(0, 1)[3] = -70000
        ok, err = pcall(c.save, c, tmp .. "/never.safetensors", m)
        assert.is_false(ok)
        assert.truthy(err:find("'layers.0.v' row 0 holds -70000", 1, true), err)
        -- a draft reference of ids the model does not have
        local draft_path = tmp .. "/draft.safetensors"
        c:rows(0, 1)[3] = 1
        c:save(draft_path, m, { draft_reference = { 5, 2000000000, 7 } })
        c:free()
        ok, err = pcall(cartridge.cart.load, draft_path, m)
        assert.is_false(ok)
        print("  " .. err)
        assert.truthy(err:find("'draft_reference' entry 1 is token 2000000000, beyond the model's vocabulary of "
            .. m.n_vocab .. " ids", 1, true), err)
    end)

    it("removes the temporary files of dead processes beside a target, on save and on load, and says so", function()
        local path = tmp .. "/t.safetensors"
        -- a pid that has just exited, and this process's own (alive)
        local p = io.popen("sh -c 'echo $$'")
        local dead = tonumber(p:read("*l"))
        p:close()
        local own = tonumber(io.open("/proc/self/stat"):read("*l"):match("^(%d+)"))
        local stale = ("%s.tmp.%d.0"):format(path, dead)
        local live = ("%s.tmp.%d.999999"):format(path, own) -- a counter no save here reaches
        local other = tmp .. "/unrelated.tmp.1.0"
        for _, f in ipairs({ stale, live, other }) do helper.write_file(f, "half a file") end
        local lines = {}
        assert.are.equal(1, fs.sweep_temps(path, function(l) lines[#lines + 1] = l end))
        print("  " .. lines[1])
        assert.truthy(lines[1]:find("removed 1 stale temporary file beside " .. path, 1, true))
        assert.is_false(helper.exists(stale))
        assert.is_true(helper.exists(live) and helper.exists(other))
        -- the save path sweeps too
        helper.write_file(stale, "half a file")
        saved("t.safetensors")
        assert.is_false(helper.exists(stale))
        assert.are.equal("file", (fs.kind(path)))
        assert.are.equal("dir", (fs.kind(tmp)))
        assert.are.equal("missing", (fs.kind(tmp .. "/nothing")))
        os.remove(live)
    end)
end)

describe("fs.remove_tree and fs.sleep", function()
    it("remove a tree, a link without what it points to, and nothing when the path is missing", function()
        local helper = require("helper")
        local fs = require("cartridge.fs")
        local dir = helper.tmpdir()
        fs.mkdirs(dir .. "/t/a/b")
        helper.write_file(dir .. "/t/a/b/f", "x")
        helper.write_file(dir .. "/t/g", "y")
        fs.mkdirs(dir .. "/keep")
        helper.write_file(dir .. "/keep/k", "z")
        assert.are.equal(0, os.execute(("ln -s %s %s"):format(helper.q(dir .. "/keep"), helper.q(dir .. "/t/link"))))
        fs.remove_tree(dir .. "/t")
        assert.are.equal("missing", (fs.kind(dir .. "/t")))
        assert.are.equal("z", helper.read_file(dir .. "/keep/k")) -- the link went, not its target
        fs.remove_tree(dir .. "/nothing-here")
        local t0 = require("cartridge").C.cart_now_seconds()
        fs.sleep(0.05)
        local slept = require("cartridge").C.cart_now_seconds() - t0
        assert.is_true(slept >= 0.05 and slept < 1, slept)
        helper.rmdir(dir)
    end)
end)
