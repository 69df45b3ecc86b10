-- recipes/selfstudy.lua end to end with tiny budgets (stories260K: real
-- weights, plain template; the embedded demo model: ChatML template).

local helper = require("helper")
local cartridge = require("cartridge")

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

local function selfstudy(...)
    if not helper.exists(helper.bin) then return nil end
    return helper.cartridge("run", "recipes/selfstudy.lua", ...)
end

local function stories()
    return helper.fixture("models/stories260K.gguf")
end

local TINY = { "--corpus", "README.md", "--p", "64", "--accum", "2", "--chunk-min", "32", "--chunk-max", "64",
    "--max-q", "12", "--max-a", "16" }

local function args(extra) return helper.args(TINY, extra) end

local function step_losses(out)
    local losses = {}
    for l in out:gmatch("distill loss (%d+%.%d+) %(") do losses[#losses + 1] = tonumber(l) end
    return losses
end

describe("selfstudy.lua", function()
    it("trains on stories260K and prints every line in order", function()
        local model, why = stories()
        if not model then return pending(why) end
        local save = tmp .. "/a/b/s.safetensors"
        local rc, out, err = selfstudy(args({ "--model", model, "--steps", "3", "--save", save }))
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        local order = { "^model: ", "\ncorpus: 1 files, %d+ tokens", "\ncartridge initialized from the corpus opening: p = 64 rows/layer x 5 layers",
            "\nheld%-out question: ", "\nheld%-out distill loss before training: %d", "\nstep   1/3: distill loss %d+%.%d+ %(%d+ answer tokens so far, %d+%.%d s%)",
            "\nstep   3/3: ", "\nself%-study: 6 conversations, %d+ supervised answer tokens, %d+%.%d min %(%d+%.%d s/conversation%)",
            "\nheld%-out distill loss after training: %d+%.%d+ %(before %d+%.%d+%)", "\ncartridge saved to " .. save:gsub("%p", "%%%0") }
        helper.assert_in_order(out, order)
        assert.are.equal(3, #step_losses(out))
        -- the artifact loads against the model, the metrics file has a line per step
        local m = cartridge.model.load(model)
        local c, info = cartridge.cart.load(save, m)
        assert.are.equal(64, c.p)
        assert.are.equal(3, info.training.steps)
        m:free()
        local lines = 0
        for line in io.lines(tmp .. "/a/b/s.metrics.jsonl") do
            local rec = cartridge.json.decode(line)
            if rec.step then lines = lines + 1 end
        end
        assert.are.equal(3, lines)
    end)

    it("gives the same losses with recompute and with a larger generation group", function()
        local model, why = stories()
        if not model then return pending(why) end
        local _, base = selfstudy(args({ "--model", model, "--steps", "3", "--save", tmp .. "/p.safetensors" }))
        if not base then return pending("build/cartridge not built") end
        local _, grouped = selfstudy(args({ "--model", model, "--steps", "3", "--gen-batch", "6", "--save", tmp .. "/f.safetensors" }))
        local _, recompute = selfstudy(args({ "--model", model, "--steps", "3", "--checkpoint", "--save", tmp .. "/r.safetensors" }))
        local a, b, c = step_losses(base), step_losses(grouped), step_losses(recompute)
        assert.are.equal(3, #a)
        for i = 1, 3 do
            print(("  step %d: default %.4f, --gen-batch 6 %.4f, --checkpoint %.4f"):format(i, a[i], b[i], c[i]))
            assert.are.equal(a[i], b[i])
            assert.are.equal(a[i], c[i])
        end
    end)

    it("checkpoints, resumes, keeps the draft reference and serves three ways", function()
        local model, why = stories()
        if not model then return pending(why) end
        local save = tmp .. "/ck.safetensors"
        local rc, out, err = selfstudy(args({ "--model", model, "--steps", "4", "--save-every", "2", "--draft-ref", "--save", save }))
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("draft reference embedded: %d+ corpus tokens"), out)
        assert.truthy(out:find("checkpoint saved to " .. save:gsub("%p", "%%%0") .. " %(step 2%)"), out)
        assert.falsy(out:find("(step 4)", 1, true))
        rc, out, err = selfstudy(args({ "--model", model, "--steps", "2", "--resume", save, "--draft-ref", "--save", tmp .. "/ck2.safetensors" }))
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("cartridge resumed from " .. save:gsub("%p", "%%%0")
            .. " %(written after step 4%): p = 64 rows/layer x 5 layers"), out)
        assert.truthy(out:find("draft reference kept from the resumed artifact", 1, true), out)
        rc, out, err = selfstudy("--model", model, "--load", tmp .. "/ck2.safetensors", "--ask", "Lily", "--max-a", "16",
            "--corpus", "README.md", "--spec-serve")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("draft automaton over %d+ embedded corpus tokens"), out)
        assert.truthy(out:find("%[cartridge, 64 KV rows, corpus%-drafted%] %(%d+%.%d%d s, ~%d+%.%d tok/s%)"), out)
        assert.truthy(out:find("[bare model, no context]", 1, true), out)
        assert.truthy(out:find("%[ICL, %d+ KV rows — %d+%.%dx the cartridge"), out)
    end)

    it("trains the same rows as before the conversation pipeline changed, at every level and thread count", function()
        -- the sha256 of the rows (the tensor data, not the header: its metadata names paths and the
        -- generation group) of this run, made by the build before the multi-query attention kernels and
        -- the generation group's new default (--gen-batch was --accum, is now 16); the kernels give the
        -- same bits on every level, so the pin holds on any CPU with this libm
        -- (the corpus is a frozen fixture, never the live README, so that editing the README moves nothing)
        local PIN = "0b1803e5b04b0c2405dffa5165e17452a48d10e610d1d1c896b311559dc41092"
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local function rows_sha(path)
            local f = assert(io.open(path, "rb"))
            local bytes = f:read("*a")
            f:close()
            local n = 0
            for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
            local data = tmp .. "/rows.bin"
            helper.write_file(data, bytes:sub(9 + n))
            local p = io.popen("sha256sum " .. helper.q(data))
            local h = p:read("*l"):match("^(%x+)")
            p:close()
            return h
        end
        local runs = { { "", "1" }, { "CART_ISA=scalar ", "2" }, { "CART_ISA=avx2 ", "2" }, { "", "2", "--gen-batch", "2" } }
        for i, r in ipairs(runs) do
            local isa = r[1]:match("CART_ISA=(%w+)")
            local level = cartridge.ffi.new("int32_t[1]")
            if not isa or (cartridge.C.cart_isa_parse(level, isa) == 0 and cartridge.C.cart_isa_supported(level[0]) ~= 0) then
                local save = ("%s/pin%d.safetensors"):format(tmp, i)
                local cmd = { helper.q(helper.bin), "run", "recipes/selfstudy.lua", "--model",
                    helper.q(helper.root .. "/models/default.gguf"), "--steps", "3", "--threads", r[2], "--save", helper.q(save) }
                for _, a in ipairs(TINY) do
                    cmd[#cmd + 1] = helper.q(a == "README.md" and "tests/fixtures/fleet/readme-1609e47.md" or a)
                end
                for j = 3, #r do cmd[#cmd + 1] = r[j] end
                local rc, _, err = helper.run(r[1] .. table.concat(cmd, " ") .. " </dev/null")
                assert.are.equal(0, rc, err)
                local h = rows_sha(save)
                print(("  %s%d threads%s: rows sha256 %s (pinned %s)"):format(r[1], r[2], r[3] and " --gen-batch 2" or "", h, PIN))
                assert.are.equal(PIN, h)
            end
        end
    end)

    it("trains the embedded demo model through its ChatML template", function()
        local rc, out, err = selfstudy(args({ "--steps", "2", "--save", tmp .. "/d.safetensors" }))
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(err:find("using the embedded random%-weight demo model"), err)
        assert.are.equal(2, #step_losses(out))
    end)

    it("refuses bad settings with the fix in the message", function()
        local model, why = stories()
        if not model then return pending(why) end
        local cases = {
            { { "--gen-batch", "3" }, "must be a multiple of --accum" },
            { { "--chunk-min", "100", "--chunk-max", "50" }, "chunk-min <= chunk-max" },
            { { "--p", "100000" }, "CorpusTooShort" },
            { { "--steps", "0" }, "at least 1" },
            { { "--turns", "0" }, "--turns 0: give 1..64" },
            { { "--seeds", "question,quiz" }, "unknown seed instruction 'quiz'; choose from structuring," },
            -- README.md as one system message is longer than stories260K's 2048-token context
            { { "--init", "spread" }, "--init spread prefills the whole corpus" },
        }
        for _, case in ipairs(cases) do
            local a = { args(case[1]) }
            a[#a + 1], a[#a + 2] = "--model", model
            local rc, _, err = selfstudy(unpack(a))
            if not rc then return pending("build/cartridge not built") end
            assert.are_not.equal(0, rc)
            assert.truthy(err:find(case[2], 1, true), err)
        end
        local rc, _, err = selfstudy("--model", model, "--load", tmp .. "/none.safetensors")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--load needs --ask", 1, true), err)
        rc, _, err = selfstudy("--model", model, "--steps", "1")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--corpus is required", 1, true), err)
    end)

    it("--init spread starts from rows spread over the whole corpus, and trains from there", function()
        local model, why = stories()
        if not model then return pending(why) end
        local path = tmp .. "/tale.md"
        local lines = {}
        for i = 1, 30 do lines[i] = ("Tim had %d red balls and a dog named Spot."):format(i) end
        helper.write_file(path, table.concat(lines, " ") .. "\n")
        local rc, out, err = selfstudy("--model", model, "--corpus", path, "--p", "24", "--init", "spread", "--steps",
            "2", "--accum", "2", "--chunk-min", "32", "--chunk-max", "64", "--max-q", "8", "--max-a", "8", "--save",
            tmp .. "/spread.safetensors")
        if not rc then return pending("build/cartridge not built") end
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("cartridge initialized from 24 of the %d+ rows of the corpus in context %(its %d+ "
            .. "tokens in a system message%), spread evenly"), out)
        assert.are.equal(2, #step_losses(out))
    end)

    it("refuses a FIFO, an empty or blank file, and counts only document text against the length checks", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local fifo, empty, blank, short = tmp .. "/pipe.md", tmp .. "/empty.md", tmp .. "/blank.md", tmp .. "/short.md"
        os.execute("mkfifo " .. helper.q(fifo))
        helper.write_file(empty, "")
        helper.write_file(blank, "  \n\n\t\n")
        helper.write_file(short, "One line of text.")
        local cases = {
            { fifo, "is not a regular file or a directory" },
            { empty, "has no text (0 bytes" },
            { blank, "has no text (6 bytes" },
            { tmp .. "/missing.md", "No such file or directory" },
            -- 39 tokens with its header: the text alone is far below --p 32 + 2
            { short, "CorpusTooShort: the corpus text has" },
        }
        for _, case in ipairs(cases) do
            local t0 = os.time()
            local rc, _, err = helper.cartridge("run", "recipes/selfstudy.lua", "--corpus", case[1], "--p", "32",
                "--chunk-min", "8", "--chunk-max", "16", "--steps", "1", "--save", tmp .. "/never.safetensors")
            assert.are.equal(1, rc, err)
            assert.truthy(err:find(case[2], 1, true), err)
            assert.is_true(os.time() - t0 < 30)
            assert.is_false(helper.exists(tmp .. "/never.safetensors"))
        end
        local corpus = require("cartridge.corpus")
        local m = cartridge.model.load(helper.root .. "/models/default.gguf")
        local c = corpus.load({ short }, m:tokenizer())
        print(("  'One line of text.': %d document tokens, %d with the header"):format(c.text_tokens, c.n_tokens))
        assert.is_true(c.text_tokens > 0 and c.text_tokens < c.n_tokens)
        assert.are.equal(#m:tokenizer():encode("One line of text."), c.text_tokens)
        m:free()
    end)

    it("stops on a non-finite loss or update and keeps the last good checkpoint", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local out_path = tmp .. "/diverge.safetensors"
        local rc, out, err = selfstudy(args({ "--steps", "2", "--save", out_path }))
        assert.are.equal(0, rc, err)
        local before = helper.read_file(out_path)
        -- resumed with a learning rate that overflows: stops at the first update, the file untouched
        rc, out, err = selfstudy(args({ "--steps", "4", "--save-every", "1", "--lr", "1e38", "--resume", out_path,
            "--save", out_path }))
        assert.are.equal(1, rc, out .. err)
        assert.truthy(err:find("non-finite", 1, true), err)
        assert.truthy(err:find("is as it was", 1, true), err)
        print("  " .. err:match("selfstudy: [^\n]*"))
        assert.are.equal(before, helper.read_file(out_path))
        local m = cartridge.model.load(helper.root .. "/models/default.gguf")
        cartridge.cart.load(out_path, m):free()
        m:free()
    end)

    it("never writes its artifact or metrics over a FIFO, a directory or a symbolic link", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local fs = require("cartridge.fs")
        os.execute("mkfifo " .. helper.q(tmp .. "/pipe.safetensors"))
        fs.mkdirs(tmp .. "/a dir.safetensors")
        helper.write_file(tmp .. "/kept.safetensors", "precious")
        os.execute("ln -s " .. helper.q(tmp .. "/kept.safetensors") .. " " .. helper.q(tmp .. "/link.safetensors"))
        os.execute("mkfifo " .. helper.q(tmp .. "/m.metrics.jsonl"))
        local cases = {
            { tmp .. "/pipe.safetensors", "is a FIFO" },
            { tmp .. "/a dir.safetensors", "is a directory" },
            { tmp .. "/link.safetensors", "is a symbolic link" },
            { tmp .. "/m.safetensors", "m.metrics.jsonl is a FIFO" },
        }
        for _, case in ipairs(cases) do
            local rc, out, err = selfstudy(args({ "--steps", "1", "--save", case[1] }))
            assert.are_not.equal(0, rc, out)
            assert.truthy(err:find(case[2], 1, true), err)
            assert.is_nil(out:find("step 1/", 1, true), out) -- refused before any training
        end
        assert.are.equal("other", (fs.kind(tmp .. "/pipe.safetensors")))
        assert.are.equal("precious", helper.read_file(tmp .. "/link.safetensors"))
        assert.are.equal("missing", (fs.kind(tmp .. "/m.safetensors")))
    end)

    it("refuses to start when the artifact would not fit its disk, and leaves the earlier files as they were",
        function()
        local flags = table.concat({ args({ "--steps", "2", "--threads", "1" }) }, " ")
        local rc, out, err = helper.on_small_disk(tmp, "64k", ([[
printf old-rows > "$SMALL/c.safetensors"; printf old-metrics > "$SMALL/c.metrics.jsonl"
"$BIN" run recipes/selfstudy.lua %s --save "$SMALL/c.safetensors" </dev/null; rc=$?
echo "files: $(cat "$SMALL/c.safetensors") $(cat "$SMALL/c.metrics.jsonl") $(ls "$SMALL" | tr '\n' ' ')"
exit $rc]]):format(flags))
        if not rc then return pending(out) end
        print("  " .. err:gsub("\n$", ""))
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("free, and the cartridge needs", 1, true) and err:find("save elsewhere", 1, true), err)
        assert.is_nil(out:find("step   1/", 1, true), out)
        assert.truthy(out:find("files: old-rows old-metrics c.metrics.jsonl c.safetensors ", 1, true), out)
    end)

    it("saves its rows elsewhere when the disk fills during the run, and keeps the earlier artifact's metrics",
        function()
        local rescue = tmp .. "/rescue"
        require("cartridge.fs").mkdirs(rescue)
        local flags = table.concat({ args({ "--steps", "60", "--save-every", "20", "--threads", "1" }) }, " ")
        -- the run starts with room for its cartridge (256 KiB with p 64 on
        -- the demo model); once its first step is out, the disk is filled
        local rc, out, err = helper.on_small_disk(tmp, "1m", ([[
TMPDIR=%s
printf old-rows > "$SMALL/c.safetensors"; printf old-metrics > "$SMALL/c.metrics.jsonl"
TMPDIR=%s "$BIN" run recipes/selfstudy.lua %s --save "$SMALL/c.safetensors" </dev/null >"$TMPDIR/out" \
    2>"$TMPDIR/err" &
pid=$!
while ! grep -q "step   1/" "$TMPDIR/out" 2>/dev/null && kill -0 $pid 2>/dev/null; do sleep 0.05; done
dd if=/dev/zero of="$SMALL/fill" bs=4k 2>/dev/null
wait $pid; rc=$?
cat "$TMPDIR/out"; cat "$TMPDIR/err" >&2
echo "files: $(cat "$SMALL/c.safetensors") $(cat "$SMALL/c.metrics.jsonl") $(ls "$SMALL" | tr '\n' ' ')"
exit $rc]]):format(helper.q(rescue), helper.q(rescue), flags))
        if not rc then return pending(out) end
        print("  " .. err:gsub("\n$", ""):gsub("\n", "\n  "))
        assert.are_not.equal(0, rc)
        assert.truthy(out:find("step  60/60", 1, true), out) -- the run went on to its end
        assert.truthy(err:find("checkpoint of step 20 not saved", 1, true), err)
        assert.truthy(out:find("files: old-rows old-metrics ", 1, true), out) -- neither was touched
        -- the failed run's own lines went to the .partial file while there was room
        assert.truthy(out:find(" c.metrics.jsonl.partial ", 1, true), out)
        local saved = err:match("so the trained rows are in (%S+): move it")
        assert.truthy(saved and saved:find(rescue, 1, true) and err:find("--resume " .. saved, 1, true), err)
        local m = cartridge.model.load(helper.root .. "/models/default.gguf")
        local c, info = cartridge.cart.load(saved, m)
        assert.are.equal("60", info.metadata["cartridge.step"])
        c:free()
        m:free()
        local lines = 0
        for _ in io.lines(saved:gsub("%.safetensors$", "") .. ".metrics.jsonl") do lines = lines + 1 end
        assert.is_true(lines > 60)
    end)

    it("takes corpus and output paths with spaces and quotes (no shell)", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local fs = require("cartridge.fs")
        local docs = tmp .. "/my docs 'quoted' $HOME"
        fs.mkdirs(docs)
        helper.write_file(docs .. "/b note.md", helper.read_file(helper.root .. "/docs/server.md"))
        helper.write_file(docs .. "/a 'first'.md", helper.read_file(helper.root .. "/docs/formats.md"))
        helper.write_file(docs .. "/skip.txt", "not markdown")
        helper.write_file(docs .. "/c empty.md", "")
        assert.are.same({ "a 'first'.md", "b note.md", "c empty.md", "skip.txt" }, fs.list(docs))
        local out = tmp .. "/new dir/with \"quotes\"/c.safetensors"
        local rc, stdout, err = helper.cartridge("run", "recipes/selfstudy.lua", "--corpus", docs, "--p", "32", "--accum", "1",
            "--chunk-min", "16", "--chunk-max", "32", "--max-q", "8", "--max-a", "8", "--steps", "1", "--save", out)
        assert.are.equal(0, rc, err)
        assert.truthy(stdout:find("corpus: 2 files", 1, true), stdout)
        assert.truthy(err:find("corpus: skipped 1 empty .md file: " .. docs .. "/c empty.md", 1, true), err)
        assert.are.equal("file", (fs.kind(out)))
        assert.is_true(fs.same_file(out, tmp .. "/new dir/with \"quotes\"/./c.safetensors"))
        assert.is_false(fs.same_file(out, docs .. "/b note.md"))
    end)

    it("resumes on a corpus shorter than the default --p: the resumed rows set p", function()
        if not helper.exists(helper.bin) then return pending("build/cartridge not built") end
        local short = tmp .. "/short resume.md"
        helper.write_file(short, ("The river town keeps its boats in a long shed by the bridge. "):rep(6))
        local first = tmp .. "/r1.safetensors"
        local common = { "--corpus", short, "--accum", "1", "--chunk-min", "16", "--chunk-max", "32", "--max-q", "8",
            "--max-a", "8", "--steps", "1" }
        local a = { unpack(common) }
        for _, x in ipairs({ "--p", "16", "--save", first }) do a[#a + 1] = x end
        local rc, _, err = helper.cartridge("run", "recipes/selfstudy.lua", unpack(a))
        assert.are.equal(0, rc, err)
        a = { unpack(common) }
        for _, x in ipairs({ "--resume", first, "--save", tmp .. "/r2.safetensors" }) do a[#a + 1] = x end
        local out
        rc, out, err = helper.cartridge("run", "recipes/selfstudy.lua", unpack(a))
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("p = 16 rows/layer", 1, true), out)
        -- the same --p is no conflict; another --p or --frozen is refused, never overridden
        a[#a + 1], a[#a + 2] = "--p", "16"
        rc, _, err = helper.cartridge("run", "recipes/selfstudy.lua", unpack(a))
        assert.are.equal(0, rc, err)
        for _, bad in ipairs({ { "--p", "41", "--p 41 conflicts with --resume" }, { "--frozen", "4", "--frozen 4 conflicts" } }) do
            local b = { unpack(common) }
            for _, x in ipairs({ "--resume", first, "--save", tmp .. "/r3.safetensors", bad[1], bad[2] }) do b[#b + 1] = x end
            rc, out, err = helper.cartridge("run", "recipes/selfstudy.lua", unpack(b))
            assert.are_not.equal(0, rc, out)
            assert.truthy(err:find(bad[3], 1, true) and err:find("leave --", 1, true), err)
        end
    end)

    -- What the docs may claim for each equivalent setting: the rows after 3
    -- steps, compared with the default run's (Adam turns rounding-level
    -- gradient differences into row differences of up to about lr).
    for _, base in ipairs({ {}, { "--turns", "3", "--seeds", "focus,question" } }) do
    it("states what each equivalent setting changes: --teacher-pass rounding, the others nothing"
        .. (#base > 0 and " (" .. table.concat(base, " ") .. ")" or ""), function()
        local model, why = stories()
        if not model then return pending(why) end
        local function rows_after(name, extra)
            local a = { args({ "--model", model, "--steps", "3", "--save", tmp .. "/v-" .. name .. ".safetensors" }) }
            for _, x in ipairs(base) do a[#a + 1] = x end
            for _, x in ipairs(extra) do a[#a + 1] = x end
            local rc, _, err = selfstudy(unpack(a))
            assert.are.equal(0, rc, err)
            local m = cartridge.model.load(model)
            local c = cartridge.cart.load(tmp .. "/v-" .. name .. ".safetensors", m)
            m:free()
            return c
        end
        local ref = rows_after("base", {})
        local cases = { { "checkpoint", { "--checkpoint" }, 0 }, { "gen-batch", { "--gen-batch", "4" }, 0 },
            { "spec-b", { "--spec-b" }, 0 }, { "heldout-every", { "--heldout-every", "1" }, 0 },
            { "teacher-pass", { "--teacher-pass" }, 1e-2 } }
        for _, case in ipairs(cases) do
            local c = rows_after(case[1], case[2])
            local worst = 0
            for l = 0, c.n_layer - 1 do
                for w = 0, 1 do
                    local a, b = ref:rows(l, w), c:rows(l, w)
                    for i = 0, c.p * c.row - 1 do worst = math.max(worst, math.abs(a[i] - b[i])) end
                end
            end
            print(("  --%-12s max |row difference| after 3 steps %.3g (tolerance %g)"):format(case[1], worst, case[3]))
            assert.is_true(worst <= case[3])
            c:free()
        end
        ref:free()
    end)
    end
end)

