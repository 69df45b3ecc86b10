-- qwen2_spec.lua: the qwen2 models the build writes (models/qwen2), their
-- tokenizer and Qwen2.5's chat template, against the llama.cpp fixtures in
-- tests/fixtures/qwen2 (test_qwen2.c checks the logits), and the
-- equivalence gate on them.

local helper = require("helper")
local cartridge = require("cartridge")
local chat = require("cartridge.chat")

local MODELS = helper.root .. "/models/qwen2/"
local FIXTURES = helper.root .. "/tests/fixtures/qwen2/"

local built, fixture = helper.model_fixtures(MODELS, FIXTURES)
local sha256 = helper.sha256

describe("the qwen2 models", function()
    it("are the bytes the llama.cpp fixtures were made from", function()
        for _, dtype in ipairs({ "f32", "f16", "q8_0" }) do
            local name = "qwen2-tiny-" .. dtype
            local path = built(name)
            if path then
                assert.are.equal(fixture(name).model.sha256, sha256(path),
                    name .. ": make_model.lua changed; run tools/greedy_fixtures.mjs --set qwen2 again")
            end
        end
    end)

    it("tokenize the fixture prompts as llama.cpp does, no BOS", function()
        local path = built("qwen2-tiny-f32")
        if not path then return end
        assert.are.equal("qwen2", helper.assert_tokenizes_like(path, fixture("qwen2-tiny-f32")))
    end)

    it("render Qwen2.5's chat template: its default system message, no think block", function()
        local path = built("qwen2-tiny-f32")
        if not path then return end
        local m = cartridge.model.load(path)
        local template = chat.for_model(m)
        assert.are.equal("qwen2", template.name)
        assert.are.equal("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            .. "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            chat.render(template, { { role = "user", content = "Hi" } }))
        assert.are.equal("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            .. "<|im_start|>assistant\n",
            chat.render(template, { { role = "system", content = "Be terse." }, { role = "user", content = "Hi" } }))
        -- the fixture's chat prompt is what the template writes after a system message
        local p = fixture("qwen2-tiny-f32").prompts[3]
        assert.is_truthy(p.prompt:find("<|im_start|>assistant\n", 1, true))
        m:free()
    end)

    it("pass the equivalence gate bitwise, the envelope printed first", function()
        for _, name in ipairs({ "qwen2-tiny-f32", "qwen2-tiny-f16", "qwen2-tiny-q8_0" }) do
            local path = built(name)
            if not path then goto next_model end
            helper.assert_gate_bitwise(path)
            ::next_model::
        end
    end)
end)
