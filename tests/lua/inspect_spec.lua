-- recipes/inspect.lua through the real host binary.

local helper = require("helper")
local cartridge = require("cartridge")
local ffi = cartridge.ffi

local function need_host()
    if not helper.exists(helper.bin) then
        return nil, "skipped: " .. helper.bin .. " not built"
    end
    return true
end

describe("recipes/inspect.lua", function()
    it("prints stories260K's metadata and tensor table", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        local path, why2 = helper.fixture("models/stories260K.gguf")
        if not path then return pending(why2) end
        local rc, out, err = helper.cartridge("run", "recipes/inspect.lua", path)
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("GGUF v3", 1, true), out)
        assert.truthy(out:match("general%.architecture%s+string%s+\"llama\""), out)
        assert.truthy(out:match("llama%.block_count%s+uint32%s+5"), out)
        assert.truthy(out:match("tokenizer%.ggml%.tokens%s+array%[string x 512%]"), out)
        assert.truthy(out:find("292,800 parameters", 1, true), out)
        assert.truthy(out:match("token_embd%.weight%s+f32%s+%[512, 64%]%s+131,072"), out)
    end)

    it("works on every GGUF in the reference folder", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        local any = false
        for _, name in ipairs({ "qwen3-tiny-f32.gguf", "qwen3-tiny-f16.gguf", "qwen3-tiny-realvocab-f16.gguf" }) do
            local path = helper.fixture("reference/" .. name)
            if path then
                any = true
                local rc, out, err = helper.cartridge("run", "recipes/inspect.lua", path)
                assert.are.equal(0, rc, err)
                assert.truthy(out:match("general%.architecture%s+string%s+\"qwen3\""), out)
                assert.truthy(out:find("blk.1.ffn_down.weight", 1, true), out)
            end
        end
        if not any then pending("skipped: ../shared/reference absent") end
    end)

    it("prints a safetensors file's metadata and tensors", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        local dir = helper.tmpdir()
        local path = dir .. "/x.safetensors"
        local data = ffi.new("float[6]")
        cartridge.safetensors.write(path, {
            { name = "layers.0.k", dtype = "F32", shape = { 2, 1, 3 }, data = data },
        }, { ["cartridge.p"] = "2" })
        local rc, out, err = helper.cartridge("run", "recipes/inspect.lua", path)
        helper.rmdir(dir)
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("safetensors", 1, true), out)
        assert.truthy(out:match("cartridge%.p%s+\"2\""), out)
        assert.truthy(out:match("layers%.0%.k%s+F32%s+%[2, 1, 3%]%s+24"), out)
    end)

    it("exits non-zero with a clear message for a missing or foreign file", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        local rc, _, err = helper.cartridge("run", "recipes/inspect.lua", "/nonexistent.gguf")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("/nonexistent.gguf", 1, true), err)
        local dir = helper.tmpdir()
        helper.write_file(dir .. "/notes.txt", "hello, this is text")
        rc, _, err = helper.cartridge("run", "recipes/inspect.lua", dir .. "/notes.txt")
        helper.rmdir(dir)
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("neither GGUF", 1, true), err)
        rc, _, err = helper.cartridge("run", "recipes/inspect.lua")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("file", 1, true), err)
    end)
end)
