-- cartridge.plot and recipes/plot.lua: metrics JSONL in, SVG and PNG out.
--
-- The PNG checks decode the file with code written here (chunk walk, CRC-32,
-- stored-block inflate, Adler-32), not with the module's own encoder helpers.

local helper = require("helper")
local plot = require("cartridge.plot")
local bit = require("bit")

-- ---------------------------------------------------------------------------
-- Fixtures

-- A metrics file like the training recipe writes: a start event, held-out
-- before, `steps` step lines with a falling loss, held-out after.
local function write_run(path, steps, opts)
    opts = opts or {}
    local lines = { '{"event":"start","settings":{"lr":0.002,"steps":' .. steps .. '}}' }
    if opts.before ~= false then lines[#lines + 1] = '{"event":"heldout_before","loss":2.5}' end
    for s = 1, steps do
        local loss = (opts.base or 2.3) - 0.03 * s + 0.01 * (s % 3)
        lines[#lines + 1] = ('{"step":%d,"steps":%d,"loss":%.4f,"answer_tokens":%d,"seconds":1.5,'
            .. '"lr":0.002,"conversations":4,"future_field":[1,2]}'):format(s, steps, loss, 800 * s)
    end
    if opts.after ~= false then lines[#lines + 1] = '{"event":"heldout_after","loss":1.9}' end
    helper.write_file(path, table.concat(lines, "\n") .. "\n")
end

local function count(haystack, needle)
    local n, pos = 0, 1
    while true do
        local i = haystack:find(needle, pos, true)
        if not i then return n end
        n, pos = n + 1, i + #needle
    end
end

-- ---------------------------------------------------------------------------
-- An independent PNG reader

local function be32(s, i)
    local a, b, c, d = s:byte(i, i + 3)
    return ((a * 256 + b) * 256 + c) * 256 + d
end

-- Bitwise CRC-32 (reflected 0xEDB88320), no table: slow but plainly right.
local function crc32(s)
    local crc = 0xffffffff
    for i = 1, #s do
        crc = bit.bxor(crc, s:byte(i))
        for _ = 1, 8 do
            local lsb = bit.band(crc, 1)
            crc = bit.rshift(crc, 1)
            if lsb == 1 then crc = bit.bxor(crc, 0xedb88320) end
        end
    end
    return bit.bnot(crc) % 4294967296
end

local function adler32(s)
    local a, b = 1, 0
    for i = 1, #s do
        a = (a + s:byte(i)) % 65521
        b = (b + a) % 65521
    end
    return b * 65536 + a
end

-- Walks the chunks, checking each CRC; returns { {type=, data=}, ... }.
local function png_chunks(bytes)
    assert.are.equal("\137PNG\r\n\26\n", bytes:sub(1, 8), "PNG signature")
    local chunks, pos = {}, 9
    while pos <= #bytes do
        local len = be32(bytes, pos)
        local kind = bytes:sub(pos + 4, pos + 7)
        local data = bytes:sub(pos + 8, pos + 7 + len)
        assert.are.equal(len, #data, kind .. " chunk is truncated")
        assert.are.equal(crc32(kind .. data), be32(bytes, pos + 8 + len), kind .. " CRC")
        chunks[#chunks + 1] = { type = kind, data = data }
        pos = pos + 12 + len
    end
    return chunks
end

-- Inflates a zlib stream made of stored (BTYPE 00) deflate blocks; fails on
-- anything else. Checks the header and the Adler-32 trailer.
local function inflate_stored(z)
    local cmf, flg = z:byte(1, 2)
    assert.are.equal(8, cmf % 16, "zlib method is deflate")
    assert.are.equal(0, (cmf * 256 + flg) % 31, "zlib header check bits")
    local out, pos = {}, 3
    while true do
        local header = z:byte(pos)
        local final, btype = header % 2, math.floor(header / 2) % 4
        assert.are.equal(0, btype, "only stored blocks are expected")
        local len = z:byte(pos + 1) + 256 * z:byte(pos + 2)
        local nlen = z:byte(pos + 3) + 256 * z:byte(pos + 4)
        assert.are.equal(65535, len + nlen, "LEN and NLEN are complements")
        assert.is_true(len <= 65535)
        out[#out + 1] = z:sub(pos + 5, pos + 4 + len)
        pos = pos + 5 + len
        if final == 1 then break end
    end
    local raw = table.concat(out)
    assert.are.equal(adler32(raw), be32(z, pos), "Adler-32 of the inflated data")
    assert.are.equal(#z, pos + 3, "nothing after the Adler-32")
    return raw
end

-- Inflates a zlib stream: stored blocks by the reader above; compressed
-- ones by the system's zlib (uncompress), told the size to expect.
local ffi = require("ffi")
local libz = plot.zlib_available and ffi.load("libz.so.1")
pcall(ffi.cdef, "int uncompress(uint8_t *dest, unsigned long *dest_len, const uint8_t *source, unsigned long source_len);")
local function inflate(z, size)
    local btype = math.floor(z:byte(3) / 2) % 4
    if btype == 0 then return inflate_stored(z) end
    assert.truthy(libz, "a compressed stream, and no zlib here to read it")
    local out, len = ffi.new("uint8_t[?]", size), ffi.new("unsigned long[1]", size)
    assert.are.equal(0, libz.uncompress(out, len, z, #z), "zlib inflates the stream")
    return ffi.string(out, len[0])
end

-- Decodes an 8-bit RGB, non-interlaced PNG with filter 0 rows (what the
-- module writes). Returns width, height, pixel(x, y) -> r, g, b, and the
-- size of its zlib stream.
local function decode_png(bytes)
    local chunks = png_chunks(bytes)
    assert.are.equal("IHDR", chunks[1].type)
    assert.are.equal("IEND", chunks[#chunks].type)
    local ihdr = chunks[1].data
    assert.are.equal(13, #ihdr)
    local w, h = be32(ihdr, 1), be32(ihdr, 5)
    assert.are.same({ 8, 2, 0, 0, 0 }, { ihdr:byte(9, 13) }, "8-bit RGB, deflate, no interlace")
    local idat = {}
    for _, c in ipairs(chunks) do
        if c.type == "IDAT" then idat[#idat + 1] = c.data end
    end
    local stride = w * 3 + 1
    local z = table.concat(idat)
    local raw = inflate(z, h * stride)
    assert.are.equal(h * stride, #raw, "one filter byte and width*3 bytes per row")
    for y = 0, h - 1 do
        assert.are.equal(0, raw:byte(y * stride + 1), "filter type of row " .. y)
    end
    return w, h, function(x, y)
        local i = y * stride + 2 + x * 3
        return raw:byte(i, i + 2)
    end, #z
end

-- ---------------------------------------------------------------------------

describe("cartridge.plot", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    it("reads step lines and held-out events and ignores other lines and fields", function()
        write_run(dir .. "/a.jsonl", 5)
        local run = plot.read_run(dir .. "/a.jsonl")
        assert.are.equal(5, run.steps)
        assert.are.equal(5, #run.points)
        assert.are.same({ 1, 2.28 }, run.points[1])
        assert.are.equal(2.5, run.heldout_before)
        assert.are.equal(1.9, run.heldout_after)
        assert.are.equal(dir .. "/a.jsonl", run.label)
    end)

    it("plots answer tokens as recorded (already a running total) and seconds summed", function()
        -- selfstudy.lua writes answer_tokens so far, and seconds per step
        write_run(dir .. "/a.jsonl", 3)
        local tokens = plot.read_run(dir .. "/a.jsonl", { x = "answer_tokens" })
        assert.are.same({ 800, 1600, 2400 }, { tokens.points[1][1], tokens.points[2][1], tokens.points[3][1] })
        local secs = plot.read_run(dir .. "/a.jsonl", { x = "seconds", metric = "lr" })
        assert.are.same({ 4.5, 0.002 }, secs.points[3])
        assert.is_nil(secs.heldout_before) -- held-out lines carry loss, not lr
    end)

    it("names the file and line of a line that is not JSON", function()
        local path = dir .. "/bad.jsonl"
        helper.write_file(path, '{"step":1,"loss":2}\n\n{"step":2,"loss":\n')
        local ok, err = pcall(plot.read_run, path)
        assert.is_false(ok)
        assert.truthy(err:find(path .. ":3: not valid JSON", 1, true), err)
    end)

    it("rejects a missing file, an empty file and a file without step lines", function()
        local ok, err = pcall(plot.read_run, dir .. "/nope.jsonl")
        assert.is_false(ok)
        assert.truthy(err:find("cannot read " .. dir .. "/nope.jsonl", 1, true), err)
        helper.write_file(dir .. "/empty.jsonl", "")
        ok, err = pcall(plot.read_run, dir .. "/empty.jsonl")
        assert.is_false(ok)
        assert.truthy(err:find(dir .. "/empty.jsonl has no step lines", 1, true), err)
        helper.write_file(dir .. "/events.jsonl", '{"event":"heldout_before","loss":2}\n[1,2]\n')
        ok, err = pcall(plot.read_run, dir .. "/events.jsonl")
        assert.is_false(ok)
        assert.truthy(err:find("events.jsonl has no step lines", 1, true), err)
        helper.write_file(dir .. "/nometric.jsonl", '{"step":1,"loss":2}\n')
        ok, err = pcall(plot.read_run, dir .. "/nometric.jsonl", { metric = "accuracy" })
        assert.is_false(ok)
        assert.truthy(err:find('nometric.jsonl: none of its 1 step lines has a numeric "accuracy"', 1, true), err)
    end)

    it("picks round tick values that cover the range", function()
        local ticks, step, lo, hi = plot.nice_ticks(1, 20, 8, true)
        assert.are.equal(2, step)
        assert.are.same({ 0, 20 }, { lo, hi })
        assert.are.equal(11, #ticks)
        ticks, step = plot.nice_ticks(1.62, 2.71, 6)
        assert.are.equal(0.2, step)
        assert.are.same({ 1.6, 2.8 }, { ticks[1], ticks[#ticks] })
        ticks, step = plot.nice_ticks(1, 3, 8, true)
        assert.are.equal(1, step, "step counts never get fractional ticks")
        ticks = plot.nice_ticks(5, 5, 4)
        assert.is_true(ticks[1] <= 5 and ticks[#ticks] >= 5, "a flat range is widened")
    end)

    it("writes an SVG with one polyline per run, the legend, title and held-out markers", function()
        local runs = {}
        for i = 1, 3 do
            write_run(("%s/run%d.jsonl"):format(dir, i), 10 + i, { base = 2 + i / 10, after = i ~= 2 })
            runs[i] = plot.read_run(("%s/run%d.jsonl"):format(dir, i))
        end
        runs[1].label, runs[2].label, runs[3].label = "alpha", "beta & <gamma>", "run3.jsonl"
        local out = dir .. "/loss.svg"
        assert.are.equal(out, plot.render({ runs = runs, out = out, title = "self-study loss",
                                            x_label = "step", y_label = "loss" }))
        assert.is_false(helper.exists(out .. ".tmp"), "the temporary file is renamed away")
        local svg = helper.read_file(out)
        assert.truthy(svg:find("^<%?xml"), svg:sub(1, 80))
        assert.truthy(svg:find('<svg xmlns="http://www.w3.org/2000/svg" width="900" height="540"', 1, true))
        assert.truthy(svg:find("</svg>\n$"))
        assert.are.equal(3, count(svg, "<polyline"))
        for i = 1, 3 do assert.truthy(svg:find(('data-run="%d"'):format(i), 1, true)) end
        assert.truthy(svg:find(">alpha</text>", 1, true))
        assert.truthy(svg:find(">beta &amp; &lt;gamma&gt;</text>", 1, true), "labels are XML-escaped")
        assert.truthy(svg:find(">run3.jsonl</text>", 1, true))
        assert.truthy(svg:find(">self-study loss</text>", 1, true))
        assert.truthy(svg:find(">held-out before</text>", 1, true))
        -- 3 rings and 2 dots on the curves, one of each in the legend.
        assert.are.equal(3 + 2 + 2, count(svg, "<circle"))
        -- Each polyline has one point per step.
        local n = 0
        for points in svg:gmatch('<polyline[^>]* points="([^"]*)"') do
            n = n + 1
            assert.are.equal(10 + n, count(points, ","))
        end
        assert.are.equal(3, n)
    end)

    it("writes a PNG that decodes to the requested size with the runs' colours", function()
        write_run(dir .. "/a.jsonl", 12)
        write_run(dir .. "/b.jsonl", 12, { base = 2.6 })
        local a, b = plot.read_run(dir .. "/a.jsonl"), plot.read_run(dir .. "/b.jsonl")
        local out = dir .. "/loss.PNG"
        plot.render({ runs = { a, b }, out = out, title = "loss", x_label = "step", y_label = "loss",
                      width = 320, height = 200 })
        assert.is_false(helper.exists(out .. ".tmp"))
        local w, h, pixel = decode_png(helper.read_file(out))
        assert.are.same({ 320, 200 }, { w, h })
        assert.are.same({ 255, 255, 255 }, { pixel(0, 0) }, "white background")
        local seen = {}
        for y = 0, h - 1 do
            for x = 0, w - 1 do
                local r, g, bl = pixel(x, y)
                seen[("%02x%02x%02x"):format(r, g, bl)] = true
            end
        end
        assert.truthy(seen["1f77b4"], "the first run's colour is drawn")
        assert.truthy(seen["ff7f0e"], "the second run's colour is drawn")
        assert.truthy(seen["222222"], "text is drawn")
    end)

    it("splits a large image into stored blocks of at most 65535 bytes without zlib", function()
        local rgb = ("\200\10\30"):rep(400 * 300)
        local w, h, pixel = decode_png(plot.encode_png(400, 300, rgb, { stored = true })) -- 300 rows of 1201 bytes: 6 blocks
        assert.are.same({ 400, 300 }, { w, h })
        assert.are.same({ 200, 10, 30 }, { pixel(399, 299) })
    end)

    it("compresses a 900x540 plot to a small file with zlib", function()
        if not plot.zlib_available then return pending("libz.so.1 is not on this system") end
        local bytes = plot.png({ runs = { { label = "x", points = { { 0, 1 }, { 1, 2 }, { 2, 1.5 } } } },
                                 width = 900, height = 540 })
        local w, h, _, zsize = decode_png(bytes)
        assert.are.same({ 900, 540 }, { w, h })
        print(("  900x540: %d bytes (%d raw)"):format(#bytes, 540 * (900 * 3 + 1)))
        assert.is_true(#bytes < 100000 and zsize < #bytes)
    end)

    it("encodes a raw RGB buffer pixel for pixel", function()
        local rgb = string.char(255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30)
        local w, h, pixel = decode_png(plot.encode_png(2, 2, rgb))
        assert.are.same({ 2, 2 }, { w, h })
        assert.are.same({ 255, 0, 0 }, { pixel(0, 0) })
        assert.are.same({ 0, 255, 0 }, { pixel(1, 0) })
        assert.are.same({ 0, 0, 255 }, { pixel(0, 1) })
        assert.are.same({ 10, 20, 30 }, { pixel(1, 1) })
    end)

    it("refuses other extensions, no runs, runs with nothing to draw and odd sizes", function()
        local run = { label = "r", points = { { 1, 2 }, { 2, 1 } } }
        local ok, err = pcall(plot.render, { runs = { run }, out = dir .. "/loss.jpg" })
        assert.is_false(ok)
        assert.truthy(err:find("supported extensions are .png and .svg", 1, true), err)
        assert.truthy(err:find("loss.jpg", 1, true), err)
        ok, err = pcall(plot.render, { runs = {}, out = dir .. "/x.svg" })
        assert.is_false(ok)
        assert.truthy(err:find("no runs", 1, true), err)
        ok, err = pcall(plot.render, { runs = { { label = "neg", points = { { 1, -1 } } } },
                                       out = dir .. "/x.svg", log_y = true })
        assert.is_false(ok)
        assert.truthy(err:find("run 1 (neg) has no points to draw (a log axis drops values <= 0)", 1, true), err)
        ok, err = pcall(plot.render, { runs = { run }, out = dir .. "/x.png", width = 50 })
        assert.is_false(ok)
        assert.truthy(err:find("50x540", 1, true), err)
        assert.is_false(helper.exists(dir .. "/x.svg") or helper.exists(dir .. "/x.png"))
    end)
end)

describe("recipes/plot.lua", function()
    local dir
    before_each(function() dir = helper.tmpdir() end)
    after_each(function() helper.rmdir(dir) end)

    local function need_host()
        if not helper.exists(helper.bin) then return nil, "skipped: " .. helper.bin .. " not built" end
        return true
    end

    it("renders two runs to SVG and PNG with file names or --label in the legend", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        write_run(dir .. "/run1.jsonl", 20)
        write_run(dir .. "/run2.jsonl", 15, { base = 2.5 })
        local rc, out, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/run1.jsonl",
            dir .. "/run2.jsonl", "--out", dir .. "/loss.svg", "--title", "my title")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("wrote " .. dir .. "/loss.svg (2 runs, 35 points)", 1, true), out)
        local svg = helper.read_file(dir .. "/loss.svg")
        assert.are.equal(2, count(svg, "<polyline"))
        assert.truthy(svg:find(">run1.jsonl</text>", 1, true))
        assert.truthy(svg:find(">run2.jsonl</text>", 1, true))
        assert.truthy(svg:find(">my title</text>", 1, true))

        rc, out, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/run1.jsonl", dir .. "/run2.jsonl",
            "--out", dir .. "/loss.png", "--label", "fast", "--label", "slow", "--x", "answer_tokens",
            "--log-y", "--width", "480", "--height", "300")
        assert.are.equal(0, rc, err)
        local w, h = decode_png(helper.read_file(dir .. "/loss.png"))
        assert.are.same({ 480, 300 }, { w, h })
    end)

    it("plots QA accuracy with ICL and bare as lines, smooths on request, and labels the y axis", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        write_run(dir .. "/qa.jsonl", 8)
        local f = io.open(dir .. "/qa.jsonl", "ab")
        f:write('{"event":"qa_reference","bare":1,"icl":40,"total":40}\n')
        for _, s in ipairs({ 0, 4, 8 }) do
            f:write(('{"event":"qa","step":%d,"conversations":%d,"right":%d,"total":40}\n'):format(s, 4 * s, 3 * s + 2))
        end
        f:close()
        local run = plot.read_run(dir .. "/qa.jsonl", { metric = "qa", x = "conversations" })
        assert.are.same({ { 0, 5 }, { 16, 35 }, { 32, 65 } }, run.points)
        assert.are.same({ { label = "ICL", y = 100 }, { label = "bare", y = 2.5 } }, run.refs)
        local rc, out, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/qa.jsonl", "--metric", "qa",
            "--x", "conversations", "--out", dir .. "/qa.svg")
        assert.are.equal(0, rc, err)
        assert.truthy(out:find("(1 run, 3 points)", 1, true), out)
        local svg = helper.read_file(dir .. "/qa.svg")
        for _, text in ipairs({ ">ICL</text>", ">bare</text>", ">QA accuracy (% of questions right)</text>",
            ">QA accuracy vs conversations</text>", ">conversations (cumulative)</text>" }) do
            assert.truthy(svg:find(text, 1, true), text)
        end
        -- the loss of the same file, smoothed over 3 steps, with its unit
        rc, out, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/qa.jsonl", "--smooth", "3",
            "--out", dir .. "/loss.svg")
        assert.are.equal(0, rc, err)
        svg = helper.read_file(dir .. "/loss.svg")
        assert.truthy(svg:find(">distill loss (nats, mean over the top-k targets), mean of 3</text>", 1, true))
        assert.are.same({ { 1, 1 }, { 2, 2 }, { 3, 3 }, { 4, 5 } }, plot.smooth({ { 1, 1 }, { 2, 3 }, { 3, 5 },
            { 4, 7 } }, 3))
        -- a run without QA lines says how to get them
        write_run(dir .. "/noqa.jsonl", 4)
        rc, _, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/noqa.jsonl", "--metric", "qa",
            "--out", dir .. "/x.svg")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("has no QA lines", 1, true) and err:find("--qa-every", 1, true), err)
        rc, _, err = helper.cartridge("run", "recipes/plot.lua", dir .. "/qa.jsonl", "--smooth", "0",
            "--out", dir .. "/x.svg")
        assert.are_not.equal(0, rc)
        assert.truthy(err:find("--smooth must be at least 1", 1, true), err)
    end)

    it("exits non-zero naming the problem for bad input", function()
        local ok, why = need_host()
        if not ok then return pending(why) end
        write_run(dir .. "/run1.jsonl", 4)
        helper.write_file(dir .. "/empty.jsonl", "")
        helper.write_file(dir .. "/broken.jsonl", '{"step":1,"loss":2}\nnot json\n')
        local cases = {
            { { dir .. "/missing.jsonl", "--out", dir .. "/x.png" }, "cannot read " .. dir .. "/missing.jsonl" },
            { { dir .. "/empty.jsonl", "--out", dir .. "/x.png" }, dir .. "/empty.jsonl has no step lines" },
            { { dir .. "/broken.jsonl", "--out", dir .. "/x.png" }, dir .. "/broken.jsonl:2: not valid JSON" },
            { { dir .. "/run1.jsonl", "--out", dir .. "/x.gif" }, "supported extensions are .png and .svg" },
            { { dir .. "/run1.jsonl" }, "--out is required" },
            { { dir .. "/run1.jsonl", "--out", dir .. "/x.svg", "--label", "a", "--label", "b" },
              "2 --label values for 1 runs" },
            { { dir .. "/run1.jsonl", "--out", dir .. "/x.svg", "--x", "tokens" }, "--x must be one of" },
        }
        for _, case in ipairs(cases) do
            local rc, _, err = helper.cartridge("run", "recipes/plot.lua", unpack(case[1]))
            assert.are_not.equal(0, rc, case[2])
            assert.truthy(err:find(case[2], 1, true), err)
        end
        assert.is_false(helper.exists(dir .. "/x.png") or helper.exists(dir .. "/x.svg"))
    end)
end)
