-- Self-study across processes (cartridge.dist, engine/dist.h, docs/scale-out.md):
-- the reproducible sum in this process, and recipes/selfstudy.lua under
-- `mpirun -np 2 --oversubscribe` on stories260K: the same artifact, bit for
-- bit, as one process; ranks that disagree (another corpus, flags, model,
-- or one weight byte) stop at start; a rank that dies or fails stops the
-- job, named, and the last checkpoint resumes with any number of ranks. The
-- mpirun cases skip, saying why, without Open MPI's mpirun, a build with
-- MPI, or ../shared.

local helper = require("helper")
local cartridge = require("cartridge")
local dist = require("cartridge.dist")
local ffi = cartridge.ffi
local C = cartridge.C

local tmp
setup(function() tmp = helper.tmpdir() end)
teardown(function() helper.rmdir(tmp) end)

describe("cartridge.dist alone", function()
    it("is a job of one whose sum is the exact sum rounded once", function()
        dist.init()
        assert.are.equal(0, dist.rank)
        assert.are.equal(1, dist.size)
        print("  " .. dist.library())
        local n = 5
        local s = dist.sum(n, 3)
        local want = { 0, 0, 0, 0, 0 }
        for i = 0, 2 do
            local part = s:part(i)
            for j = 0, n - 1 do
                part[j] = (i + 1) * 0.25 + j * 2 ^ -(10 * i) -- exact in float; the sum exact in double
                want[j + 1] = want[j + 1] + part[j]
            end
        end
        local out = ffi.new("float[?]", n)
        s:reduce(3, 0.5, out)
        local worst = 0
        for j = 0, n - 1 do worst = math.max(worst, math.abs(out[j] - want[j + 1] * 0.5)) end
        print(("  3 parts: max |sum - exact| %.3g (tolerance 0)"):format(worst))
        assert.are.equal(0, worst)
        assert.has_error(function() s:part(3) end, "dist.sum: part 3 of 3")
        s:free()
        local bytes, calls = dist.sum_traffic(1000)
        assert.are.equal(8 + 1000 * 10, bytes)
        assert.are.equal(3, calls)
        assert.are.equal("a430d84680aabd0b", dist.hash("hello", 5)) -- FNV-1a 64 of "hello"
        assert.are.equal(dist.hash("hello", 5), dist.hash("llo", 3, dist.hash("he", 2)))
        local all = dist.allgather_doubles({ 1.5, -2 })
        assert.are.same({ { 1.5, -2 } }, all)
        assert.are.same({ "a/model.gguf" }, dist.allgather_text("a/model.gguf"))
        assert.are.same({ "" }, dist.allgather_text(""))
        dist.agree({ { "model", "0123456789abcdef" } }) -- one rank agrees with itself
    end)
end)

-- ---------------------------------------------------------------------------
-- Under mpirun

local function mpirun_path()
    local p = io.popen("command -v mpirun 2>/dev/null")
    local path = p:read("*l")
    p:close()
    return path
end

-- Why the mpirun cases cannot run here, or nil.
local function cannot()
    if not helper.exists(helper.bin) then return "build/cartridge not built" end
    if C.cart_dist_built_with_mpi() == 0 then return "skipped: this build has no MPI (install libopenmpi-dev, rebuild)" end
    if not mpirun_path() then return "skipped: no mpirun (install openmpi-bin)" end
    local _, why = helper.fixture("models/stories260K.gguf")
    return why
end

-- As root Open MPI wants its two confirmation variables; one thread per rank.
local MPIRUN = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe"

local function quoted(list)
    local out = {}
    for i, a in ipairs(list) do out[i] = helper.q(a) end
    return table.concat(out, " ")
end

local function selfstudy_cmd(args)
    return helper.q(helper.bin) .. " run recipes/selfstudy.lua " .. quoted(args)
end

-- Tiny stories260K settings; extra flags appended.
local function tiny(extra)
    local a = { "--model", helper.shared .. "/models/stories260K.gguf", "--corpus", "README.md", "--p", "64",
        "--chunk-min", "32", "--chunk-max", "64", "--max-q", "12", "--max-a", "16" }
    for _, x in ipairs(extra) do a[#a + 1] = x end
    return a
end

local function one(args) return helper.run(selfstudy_cmd(args) .. " </dev/null") end
local function ranks(n, args)
    return helper.run(("%s -np %d %s </dev/null"):format(MPIRUN, n, selfstudy_cmd(args)))
end

local function sha256(path)
    local p = io.popen("sha256sum " .. helper.q(path))
    local line = p:read("*l") or ""
    p:close()
    return line:match("^(%x+)")
end

local function losses(out)
    local list = {}
    for l in out:gmatch("distill loss (%d+%.%d+) %(") do list[#list + 1] = l end
    return table.concat(list, " ")
end

describe("selfstudy.lua under mpirun", function()
    for _, extra in ipairs({ {}, { "--turns", "2", "--seeds", "focus,question" } }) do
    it("writes the artifact of one process, bit for bit, with 2 ranks"
        .. (#extra > 0 and " (" .. table.concat(extra, " ") .. ")" or ""), function()
        local why = cannot()
        if why then return pending(why) end
        -- 3 conversations a step: the ranks hold 2 and 1; generation groups of 2 steps
        local common = { "--accum", "3", "--gen-batch", "6", "--steps", "3", "--save-every", "2" }
        for _, x in ipairs(extra) do common[#common + 1] = x end
        local a = tiny(common)
        a[#a + 1], a[#a + 2] = "--save", tmp .. "/one.safetensors"
        local rc, out1, err = one(a)
        assert.are.equal(0, rc, err)
        local b = tiny(common)
        for _, x in ipairs({ "--threads", "1", "--save", tmp .. "/two.safetensors" }) do b[#b + 1] = x end
        local out2
        rc, out2, err = ranks(2, b)
        assert.are.equal(0, rc, out2 .. err)
        assert.truthy(out2:find("^dist: 2 ranks %(Open MPI"), out2)
        assert.truthy(out2:find("each step's 3 conversations split unevenly", 1, true), out2)
        -- rank 0 alone prints: one line per step, one checkpoint line
        local _, steps = out2:gsub("\nstep +%d+/3: distill loss", "")
        local _, checkpoints = out2:gsub("checkpoint saved to", "")
        assert.are.same({ 3, 1 }, { steps, checkpoints })
        local h1, h2 = sha256(tmp .. "/one.safetensors"), sha256(tmp .. "/two.safetensors")
        print(("  sha256: 1 process %s, 2 ranks %s"):format(h1, h2))
        print(("  losses: 1 process %s; 2 ranks %s"):format(losses(out1), losses(out2)))
        assert.are.equal(h1, h2)
        assert.are.equal(losses(out1), losses(out2))
    end)
    end

    it("is what bench_selfstudy --ranks measures, and it prints the projection (figures unchecked)", function()
        local why = cannot()
        if why then return pending(why) end
        local rc, out, err = helper.cartridge("run", "recipes/bench_selfstudy.lua", "--model",
            helper.shared .. "/models/stories260K.gguf", "--corpus", "README.md", "--p", "64", "--chunk-min", "32",
            "--chunk-max", "64", "--max-q", "12", "--max-a", "16", "--steps", "2", "--accum", "2", "--ranks", "2")
        assert.are.equal(0, rc, out .. err)
        assert.truthy(out:find("N = 2: +%d+%.%d s of steps, %d+%.%d+ conversations/s"), out)
        assert.truthy(out:find("speed%-up %d+%.%d+x, efficiency %d+%.%d+ %(goal 0.90%)"), out)
        assert.truthy(out:find("one process of 2 threads: +%d+%.%d s of steps, %d+%.%d+ conversations/s; 2 ranks of "
            .. "one thread are %d+%.%d+x it"), out)
        assert.truthy(out:find("artifacts: the same bits, all three", 1, true), out)
        assert.truthy(out:find("= 78.75 KiB; the reproducible sum sends 196.88 KiB", 1, true), out)
        for _, hosts in ipairs({ 8, 64, 512 }) do
            assert.truthy(out:find(("\n +%d +%d +%%d+%%.%%d+ s +%%d+%%.%%d+ s +%%d+%%.%%dx +%%d%%.%%d+"):format(hosts,
                hosts)), out)
        end
    end)

    it("stops at start, naming the rank, when ranks read another corpus or flags", function()
        local why = cannot()
        if why then return pending(why) end
        local a = tiny({ "--accum", "2", "--steps", "2", "--threads", "1", "--save", tmp .. "/never.safetensors" })
        local b = tiny({ "--accum", "2", "--steps", "2", "--threads", "1", "--save", tmp .. "/never.safetensors",
            "--corpus", "docs/engine.md", "--lr", "1e-3" })
        local rc, out, err = helper.run(("%s -np 1 %s : -np 1 %s </dev/null"):format(MPIRUN, selfstudy_cmd(a),
            selfstudy_cmd(b)))
        assert.are_not.equal(0, rc)
        local line = err:match("cartridge: dist: [^\n]*") or ""
        print("  " .. line)
        assert.truthy(line:find("rank 1 differs from rank 0 in its corpus", 1, true), err)
        assert.truthy(line:find("rank 1 differs from rank 0 in its flags", 1, true), err)
        -- printed once (by rank 0), before any step
        local _, times = err:gsub("the 2 ranks do not agree", "")
        assert.are.equal(1, times)
        assert.falsy(out:find("step ", 1, true))
        assert.is_false(helper.exists(tmp .. "/never.safetensors"))
    end)

    -- rank 0 reads stories260K, rank 1 `other`; the job must stop at the
    -- start check, naming the model files and the rank, before any step
    local function other_model(other)
        local a = tiny({ "--accum", "2", "--steps", "2", "--threads", "1", "--save", tmp .. "/never.safetensors" })
        local b = tiny({ "--accum", "2", "--steps", "2", "--threads", "1", "--save", tmp .. "/never.safetensors",
            "--model", other })
        local rc, out, err = helper.run(("%s -np 1 %s : -np 1 %s </dev/null"):format(MPIRUN, selfstudy_cmd(a),
            selfstudy_cmd(b)))
        assert.are_not.equal(0, rc)
        local line = err:match("cartridge: dist: [^\n]*") or ""
        print("  " .. line)
        assert.truthy(line:find(("rank 1 differs from rank 0 in its model (rank 1 read %s, rank 0 %s/models/"
            .. "stories260K.gguf; fingerprint "):format(other, helper.shared), 1, true), err)
        local _, times = err:gsub("the 2 ranks do not agree", "")
        assert.are.equal(1, times)
        assert.falsy(out:find("step ", 1, true))
        assert.falsy(out:find("agree on every weight byte", 1, true))
        assert.is_false(helper.exists(tmp .. "/never.safetensors"))
        return line
    end

    it("stops at start, naming the model and the rank, when rank 1's copy differs in one weight byte", function()
        local why = cannot()
        if why then return pending(why) end
        -- the copy: one byte flipped in the middle of the largest tensor's data,
        -- where the sampled fingerprint (4 KiB at each end) does not look
        local original = helper.shared .. "/models/stories260K.gguf"
        local file = cartridge.gguf.open(original)
        local big
        for _, t in ipairs(file:tensors()) do
            if not big or t.nbytes > big.nbytes then big = t end
        end
        local at = file.data_offset + big.offset + math.floor(big.nbytes / 2)
        file:close()
        assert.is_true(big.nbytes >= 3 * 4096, big.name)
        local bytes = helper.read_file(original)
        local copy = tmp .. "/flipped.gguf"
        helper.write_file(copy, bytes:sub(1, at) .. string.char(bit.bxor(bytes:byte(at + 1), 0x10))
            .. bytes:sub(at + 2))
        local m0, m1 = cartridge.model.load(original), cartridge.model.load(copy)
        local h0, h1 = m0:content_hash(), m1:content_hash()
        print(("  byte %d of %s (%d bytes) flipped: fingerprint %s and %s, content hash %s and %s"):format(
            at - file.data_offset - big.offset, big.name, big.nbytes, cartridge.cart.fingerprint(m0),
            cartridge.cart.fingerprint(m1), h0, h1))
        assert.are.equal(cartridge.cart.fingerprint(m0), cartridge.cart.fingerprint(m1))
        assert.are_not.equal(h0, h1)
        m0:free()
        m1:free()
        local line = other_model(copy)
        -- the only difference: the corpus is tokenized the same, the flags agree
        assert.falsy(line:find("in its corpus", 1, true))
        assert.falsy(line:find("in its flags", 1, true))
    end)

    it("stops at start, naming the model and the rank, when rank 1 reads another model", function()
        local why = cannot()
        if why then return pending(why) end
        local other, missing = helper.fixture("reference/qwen3-tiny-f32.gguf")
        if not other then return pending(missing) end
        other_model(other)
    end)

    it("says at start that the ranks agree on every weight byte", function()
        local why = cannot()
        if why then return pending(why) end
        local rc, out, err = ranks(2, tiny({ "--accum", "2", "--steps", "1", "--threads", "1", "--save",
            tmp .. "/agree.safetensors" }))
        assert.are.equal(0, rc, out .. err)
        local line = out:match("dist: the 2 ranks agree[^\n]*") or ""
        print("  " .. line)
        assert.truthy(line:find("^dist: the 2 ranks agree on every weight byte %(1%.12 MiB hashed in %d+%.%d%d s on "
            .. "rank 0%), the corpus and the flags$"), out)
    end)

    it("stops the job when one rank fails, naming it", function()
        local why = cannot()
        if why then return pending(why) end
        -- rank 0 fails at start: a directory sits where its artifact goes
        local save = tmp .. "/taken.safetensors"
        os.execute("mkdir -p " .. helper.q(save))
        local rc, out, err = ranks(2, tiny({ "--accum", "2", "--steps", "4", "--save-every", "2", "--threads", "1",
            "--save", save }))
        assert.are_not.equal(0, rc)
        local line = err:match("cartridge: rank 0 of 2: [^\n]*") or ""
        print("  " .. line)
        assert.truthy(line:find("taken.safetensors is a directory: an artifact replaces only a regular file", 1, true),
            out .. err)
    end)

    it("stops when a rank dies, keeps the last checkpoint, and resumes with another number of ranks", function()
        local why = cannot()
        if why then return pending(why) end
        local save = tmp .. "/ck.safetensors"
        local job = tmp .. "/job"
        -- a long run; rank 1 is killed as soon as the first checkpoint is written
        local cmd = ("(CARTRIDGE_SPEC_JOB=%s %s -np 2 %s </dev/null >%s 2>%s; echo $? >%s) & echo $!"):format(
            helper.q(job), MPIRUN, selfstudy_cmd(tiny({ "--accum", "2", "--steps", "400", "--save-every", "2",
                "--threads", "1", "--save", save })), helper.q(job .. ".out"), helper.q(job .. ".err"),
            helper.q(job .. ".rc"))
        local p = io.popen(cmd)
        p:read("*l")
        p:close()
        local fs = require("cartridge.fs")
        local function rank1()
            for _, name in ipairs(fs.list("/proc")) do
                if name:match("^%d+$") then
                    local f = io.open("/proc/" .. name .. "/environ", "rb")
                    local env = f and f:read("*a") or ""
                    if f then f:close() end
                    if env:find("%zCARTRIDGE_SPEC_JOB=" .. job:gsub("%p", "%%%0") .. "%z")
                        and env:find("%zOMPI_COMM_WORLD_RANK=1%z") and env:find("%zOMPI_COMM_WORLD_SIZE=2%z") then
                        return name
                    end
                end
            end
        end
        local killed
        for _ = 1, 2400 do -- 120 s at most
            if helper.exists(job .. ".rc") then break end
            if not killed and helper.exists(save) then
                killed = rank1()
                if killed then os.execute("kill -9 " .. killed) end
            end
            os.execute("sleep 0.05")
        end
        for _ = 1, 600 do
            if helper.exists(job .. ".rc") then break end
            os.execute("sleep 0.05")
        end
        local rc = tonumber(helper.read_file(job .. ".rc"))
        local out, err = helper.read_file(job .. ".out"), helper.read_file(job .. ".err")
        assert.truthy(killed, "found rank 1 to kill\n" .. out .. err)
        assert.are_not.equal(0, rc)
        local notice = err:match("[^\n]*process rank 1[^\n]*") or ""
        print(("  rank 1 (pid %s) killed; mpirun exit %d: %s"):format(killed, rc, notice))
        assert.truthy(notice:find("exited on signal 9", 1, true), err)
        assert.falsy(out:find("cartridge saved to", 1, true))
        -- the checkpoint is whole: it loads, its checksum verified, and says its step
        local m = cartridge.model.load(helper.shared .. "/models/stories260K.gguf")
        local c, info = cartridge.cart.load(save, m)
        local step = tonumber(info.metadata["cartridge.step"])
        print(("  the checkpoint on disk: step %d of 400"):format(step))
        assert.is_true(step >= 2 and step % 2 == 0 and step < 400)
        c:free()
        m:free()
        -- resumed by one process and by 2 ranks: the same bits
        local rest = { "--accum", "2", "--steps", "3", "--resume", save }
        local a = tiny(rest)
        a[#a + 1], a[#a + 2] = "--save", tmp .. "/r1.safetensors"
        local rc1, o1, e1 = one(a)
        assert.are.equal(0, rc1, e1)
        assert.truthy(o1:find("(written after step " .. step .. ")", 1, true), o1)
        local b = tiny(rest)
        for _, x in ipairs({ "--threads", "1", "--save", tmp .. "/r2.safetensors" }) do b[#b + 1] = x end
        local rc2, o2, e2 = ranks(2, b)
        assert.are.equal(0, rc2, o2 .. e2)
        local h1, h2 = sha256(tmp .. "/r1.safetensors"), sha256(tmp .. "/r2.safetensors")
        print(("  resumed: 1 process %s, 2 ranks %s"):format(h1, h2))
        assert.are.equal(h1, h2)
    end)
end)
