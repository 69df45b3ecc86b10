-- bench_spec.lua: every benchmark recipe runs end to end at a tiny shape and
-- prints its figures in the format its docs show, so none can silently
-- break. The figures themselves are not checked (speed is not a test);
-- bench_fleet's smoke test is in fleet_spec.lua.

local helper = require("helper")

local MODEL = helper.root .. "/models/default.gguf"

local function bench(name, ...)
    if not helper.exists(MODEL) then
        pending(MODEL .. " not found (the build writes it: cmake --build build)")
        return nil
    end
    local rc, out, err = helper.cartridge("run", helper.root .. "/recipes/" .. name .. ".lua", ...)
    assert.are.equal(0, rc, out .. err)
    print((out:gsub("\n+$", ""):gsub("\n", "\n  "):gsub("^", "  ")))
    return out
end

local NUM = "%d+%.%d+"

describe("benchmark recipes at a tiny shape", function()
    it("bench_infer: prefill, one decode stream and lockstep streams", function()
        local out = bench("bench_infer", "--model", MODEL, "--prompt", "16", "--decode", "4", "--reps", "1",
            "--batch", "2", "--batch-steps", "2", "--threads", "2")
        if not out then return end
        assert.truthy(out:find("read bandwidth " .. NUM .. " GB/s"), out)
        assert.truthy(out:find("\nprefill %(f16%) +16 tokens +" .. NUM .. " tok/s"), out)
        assert.truthy(out:find("\ndecode  1 stream +4 steps +" .. NUM .. " tok/s +" .. NUM .. " GB/s"), out)
        assert.truthy(out:find("\ndecode  2 streams +2 steps +" .. NUM .. " tok/s aggregate"), out)
    end)

    it("bench_infer: lockstep streams after a longer history, and a bad count refused", function()
        local out = bench("bench_infer", "--model", MODEL, "--prompt", "16", "--decode", "2", "--reps", "1",
            "--batch", "9", "--batch-steps", "2", "--batch-ctx", "40")
        if not out then return end
        assert.truthy(out:find("\ndecode  9 streams +2 steps +" .. NUM .. " tok/s aggregate, " .. NUM
            .. " tok/s each %(after 40 cached tokens%)"), out)
        local rc, o, e = helper.cartridge("run", helper.root .. "/recipes/bench_infer.lua", "--model", MODEL,
            "--batch-ctx", "0")
        assert.are_not.equal(0, rc)
        assert.truthy((o .. e):find("--batch-ctx must be at least 1; got 0", 1, true), o .. e)
    end)

    it("bench_infer: several dtypes in one run end with their table (a column per batch), repacking printed", function()
        local out = bench("bench_infer", "--dtype", "q8_0,q4_K", "--preset", "default", "--prompt", "16", "--decode",
            "4", "--reps", "1", "--batch", "2", "--batch", "3", "--batch-steps", "2", "--threads", "2")
        if not out then return end
        assert.truthy(out:find("\nload +" .. NUM .. " s, of which repacking " .. NUM .. " s: " .. NUM
            .. " [KM]iB of repacked block%-type matrices"), out)
        assert.truthy(out:find("\nprefill %(q4_K%) +16 tokens"), out)
        assert.truthy(out:find("\n| weights | kernels | prefill tok/s %(x llama.cpp%) | decode tok/s", 1), out)
        assert.truthy(out:find("| 2 streams, x one stream | 3 streams, x one stream |\n", 1, true), out)
        for _, d in ipairs({ "q8_0", "q4_K" }) do
            assert.truthy(out:find("\n| " .. d .. " | %w+ | " .. NUM .. " | " .. NUM .. " | %d+%% | " .. NUM
                .. " %(" .. NUM .. "x%) | " .. NUM .. " %(" .. NUM .. "x%) |\n"), out)
        end
    end)

    it("bench_selfstudy: seconds per conversation, its breakdown and its floor", function()
        local out = bench("bench_selfstudy", "--model", MODEL, "--corpus", helper.root .. "/README.md", "--p", "64",
            "--chunk-min", "32", "--chunk-max", "64", "--max-q", "12", "--max-a", "16", "--steps", "2", "--accum", "2")
        if not out then return end
        assert.truthy(out:find("\n4 conversations, %d+ supervised answer tokens"), out)
        assert.truthy(out:find("\nmeasured +" .. NUM .. " s/conversation: bot A " .. NUM .. ", bot B " .. NUM
            .. ", teacher " .. NUM .. ", training step " .. NUM), out)
        assert.truthy(out:find("\nprobed again after the run: f32 GEMM peak %d+ GFLOP/s, read bandwidth " .. NUM
            .. " GB/s; the floor takes the better of each"), out)
        assert.truthy(out:find("\nfloor +" .. NUM .. " s/conversation at the %d+ GFLOP/s GEMM peak"), out)
        -- the floor's terms, from the work the run did: bot A decodes only what it wrote (max-q 12: at most 11
        -- tokens after the prefill's, for each of the 4 conversations, in one or two lockstep groups)
        -- each beside the phase's measured seconds and their ratio to it
        local MEASURED = " s/conversation  measured +" .. NUM .. " %(" .. NUM .. "x%) +"
        for _, term in ipairs({ "bot A prefill", "bot B prefill", "training" }) do
            assert.truthy(out:find("\n  " .. term .. " +" .. NUM .. MEASURED .. "%d+ "), out)
        end
        assert.truthy(out:find("\n  Adam +" .. NUM .. " s/conversation  measured with training +" .. NUM .. " GB"), out)
        local a_steps, a_streams = out:match("\n  bot A decode +" .. NUM .. MEASURED .. "(%d+) lockstep steps, (%d+) stream%-steps")
        assert.truthy(a_steps, out)
        assert.is_true(tonumber(a_steps) <= 2 * 11 and tonumber(a_streams) <= 4 * 11, out)
        assert.truthy(out:find("\n  teacher pass +" .. NUM .. " s/conversation  measured +" .. NUM .. " %(%-%) +none"), out)
        assert.truthy(out:find("\nmeasured / floor: " .. NUM .. "x %(bots " .. NUM .. "x, training step " .. NUM .. "x%)"), out)
    end)

    it("bench_train: the four training configurations", function()
        local out = bench("bench_train", "--model", MODEL, "--p", "8", "--seqs", "2", "--len", "16", "--answer", "8",
            "--repeat", "1")
        if not out then return end
        for _, case in ipairs({ "packed-plain", "flat-plain", "packed-recompute", "flat-recompute" }) do
            assert.truthy(out:find("\n" .. case:gsub("%-", "%%-") .. " +" .. NUM .. " s/step +" .. NUM .. " tok/s"), out)
        end
        assert.truthy(out:find("\npacked vs one at a time: " .. NUM .. "x"), out)
    end)

    it("bench_grammar: decode with and without a schema, the mask's cost", function()
        local out = bench("bench_grammar", "--model", MODEL, "--vocab-from", "", "--tokens", "8")
        if not out then return end
        assert.truthy(out:find("\ndecode without a schema: +" .. NUM .. " ms/step"), out)
        assert.truthy(out:find("\ndecode with json_schema +" .. NUM .. " ms/step"), out)
        assert.truthy(out:find("\n  mask per token: mean " .. NUM .. " ms"), out)
    end)

    it("bench_server: requests per second at each connection count", function()
        if not helper.have("curl") then return pending("curl is not installed (scripts/setup.sh installs it)") end
        local out = bench("bench_server", "--connections", "1,2", "--seconds", "1", "--max-tokens", "4",
            "--parallel", "2")
        if not out then return end
        for _, n in ipairs({ 1, 2 }) do
            assert.truthy(out:find("\n +" .. n .. " conn +%d+ answered %(" .. NUM .. "/s%)"), out)
        end
        assert.truthy(out:find("\nserver RSS: " .. NUM .. " MiB before"), out)
    end)
end)
