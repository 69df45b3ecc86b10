-- cartridge.chat: bad messages are refused with a clear message (found by
-- tests/fuzz, fuzz_template: a number as a message and a message without a
-- role used to raise Lua's own "attempt to index/concatenate" errors, or
-- render a nil role with the plain template).

local chat = require("cartridge.chat")

describe("chat.render", function()
    it("refuses a message that is not a table, naming it", function()
        for _, name in ipairs({ "chatml", "llama3", "plain" }) do
            local ok, err = pcall(chat.render, name, { { role = "user", content = "a" }, 5 })
            assert.is_false(ok)
            assert.are.equal("chat.render: message 2 is a number, not a table", err)
        end
    end)

    -- fuzz_template, CI of stop 45: the system-message check indexed the
    -- first message before it was known to be a table
    it("refuses a first message that is not a table, before reading its role", function()
        for _, name in ipairs({ "chatml", "llama3", "plain", "qwen2" }) do
            local ok, err = pcall(chat.render, name, { 7, { role = "user", content = "a" } })
            assert.is_false(ok)
            assert.are.equal("chat.render: message 1 is a number, not a table", err)
        end
        local ok, err = pcall(chat.render, "chatml", { { role = "assistant", content = "", tool_calls = 3 } },
            { add_generation_prompt = false })
        assert.is_false(ok)
        assert.are.equal("chat.render: message 1 has tool_calls that are not a list", err)
    end)

    it("refuses a message without a string role in every template", function()
        for _, name in ipairs({ "chatml", "llama3", "plain" }) do
            local ok, err = pcall(chat.render, name, { { content = "a" } })
            assert.is_false(ok)
            assert.are.equal("chat.render: message 1 has no string role", err)
            ok, err = pcall(chat.render, chat.templates[name], { { role = 1, content = "a" } })
            assert.are.equal("chat.render: message 1 has no string role", err)
        end
    end)

    it("still renders well-formed messages", function()
        assert.are.equal("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
            chat.render("chatml", { { role = "user", content = "hi" } }))
    end)
end)
