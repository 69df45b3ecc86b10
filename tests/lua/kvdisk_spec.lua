-- The server's disk tier of KV caches (cartridge.kvstore, serve.lua
-- --kv-cache-dir) and GET /metrics (cartridge.metrics), on the embedded
-- random-weight model the build writes (models/default.gguf), so that
-- nothing here needs ../shared: the store in process (round trip, hostile
-- files, the size bound), then serve.lua over real HTTP on loopback
-- (restarts, skipped files, least-recently-used eviction, the metrics).

local helper = require("helper")
local cartridge = require("cartridge")
local kvstore = require("cartridge.kvstore")
local metrics = require("cartridge.metrics")
local safetensors = require("cartridge.safetensors")
local fs = require("cartridge.fs")
local json = cartridge.json
local ffi = require("ffi")

local MODEL = helper.root .. "/models/default.gguf"
local tmp, servers, cart_path, cart2_path

local function ready(http)
    if not helper.exists(MODEL) then return false, MODEL .. " is absent: build first (cmake --build build)" end
    if http and not helper.exists(helper.bin) then return false, "build/cartridge not built" end
    if http and not helper.have("curl") then return false, "curl is not installed (scripts/setup.sh installs it)" end
    return true
end

setup(function()
    tmp = helper.tmpdir()
    servers = helper.servers(tmp)
    if not helper.exists(MODEL) then return end
    local m = cartridge.model.load(MODEL)
    cart_path, cart2_path = tmp .. "/a.safetensors", tmp .. "/b.safetensors"
    cartridge.cart.from_text(m, "Cartridges are trained KV prefixes."):save(cart_path, m)
    cartridge.cart.from_text(m, "Another corpus entirely."):save(cart2_path, m)
    m:free()
end)

teardown(function()
    servers:stop_all()
    helper.rmdir(tmp)
end)

local function spill_files(dir)
    local out = {}
    for _, name in ipairs(fs.list(dir)) do
        if name:find("^kv%-%x+%.safetensors$") then out[#out + 1] = name end
    end
    return out
end

local function copy_file(from, to, edit)
    local bytes = helper.read_file(from)
    helper.write_file(to, edit and edit(bytes) or bytes)
end

-- ---------------------------------------------------------------------------
-- The store in process

describe("cartridge.kvstore", function()
    local m, c, lines, model_hash

    local function open_store(dir, max_bytes, carts)
        lines = {}
        model_hash = model_hash or kvstore.model_hash(m)
        return kvstore.open({ dir = dir, max_bytes = max_bytes or 2 ^ 30, model = m, kv = "f16",
            cartridges = carts or { a = c }, model_name = "default", model_hash = model_hash,
            log = function(l) lines[#lines + 1] = l end })
    end

    -- A slot-like cache: the cartridge's rows, then the rows of `ids`.
    local function filled(ids)
        local kv = m:new_kv(c.p + 512, "f16")
        c:append_to(kv)
        m:forward(kv, ids)
        return kv
    end

    local function ids_of(text) return m:tokenizer():encode(text, { special = true }) end

    -- A store over a fresh directory with one conversation spilled: the
    -- store, the directory, the token ids and the cache they came from.
    local function spilled(name, text)
        local dir = tmp .. "/" .. name
        local store = open_store(dir)
        local ids = ids_of(text)
        local kv = filled(ids)
        assert.is_true(store:spill(c, ids, kv))
        return store, dir, ids, kv
    end

    local function rows_equal(a, b, from, n)
        local rb = a:row_bytes()
        for l = 0, m.config.n_layer - 1 do
            for which = 0, 1 do
                if ffi.C.memcmp(a:raw_rows(l, which) + from * rb, b:raw_rows(l, which) + from * rb, n * rb) ~= 0 then
                    return false
                end
            end
        end
        return true
    end

    before_each(function()
        if not ready() then return end
        m = m or cartridge.model.load(MODEL)
        c = c or cartridge.cart.load(cart_path, m)
    end)

    pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

    it("reads sizes as bytes or with binary K, M, G and T", function()
        assert.are.equal(2 * 2 ^ 30, kvstore.parse_size("2G"))
        assert.are.equal(512 * 2 ^ 20, kvstore.parse_size("512M"))
        assert.are.equal(1536 * 2 ^ 20, kvstore.parse_size("1.5GiB"))
        assert.are.equal(65536, kvstore.parse_size("64k"))
        assert.are.equal(1000, kvstore.parse_size("1000"))
        for _, bad in ipairs({ "", "G", "-1G", "2X", "0", "1e9", "two" }) do
            local v, why = kvstore.parse_size(bad)
            assert.is_nil(v, bad)
            assert.truthy(why:find("size", 1, true), why)
        end
    end)

    it("spills a conversation and adopts its rows back bit for bit, in another store over the same directory", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local store, dir, ids, kv = spilled("store1",
            "<|im_start|>user\nWhat do cartridges hold?<|im_end|>\n<|im_start|>assistant\n")
        assert.are.equal(1, #spill_files(dir))
        -- spilling the same tokens (or a prefix of them) again writes nothing
        assert.is_false(store:spill(c, { table.unpack(ids, 1, #ids - 3) }, kv))
        assert.are.equal(1, store.stats.spills)
        -- a new store (a restarted server) finds it, and a longer prompt matches it
        local again = open_store(dir)
        assert.truthy(lines[1]:find("1 spill file", 1, true), lines[1])
        local prompt = {}
        for i, id in ipairs(ids) do prompt[i] = id end
        prompt[#prompt + 1] = 65
        local entry, n = again:match(c, prompt)
        assert.are.equal(#ids, n)
        assert.is_nil((again:match(nil, prompt))) -- not for the bare model
        local kv2 = m:new_kv(c.p + 512, "f16")
        c:append_to(kv2)
        -- a prefix of the file, or all of it
        assert.is_true(again:adopt(entry, kv2, c, n - 2))
        assert.are.equal(c.p + n - 2, kv2:len())
        assert.is_true(rows_equal(kv, kv2, 0, c.p + n - 2))
        kv2:truncate(c.p)
        assert.is_true(again:adopt(entry, kv2, c, n))
        assert.is_true(rows_equal(kv, kv2, 0, c.p + n))
        print(("  %d tokens spilled and adopted: rows identical; %s"):format(n, lines[#lines]))
        -- the same continuation decodes the same logits from both caches
        local logits, l1 = m:forward(kv, { 65 }), {}
        for i = 0, m.n_vocab - 1 do l1[i] = logits[i] end
        local l2 = m:forward(kv2, { 65 })
        local max = 0
        for i = 0, m.n_vocab - 1 do max = math.max(max, math.abs(l1[i] - l2[i])) end
        print(("  next-token logits after adoption vs the original cache: max |diff| %g (tolerance 0)"):format(max))
        assert.are.equal(0, max)
        kv:free()
        kv2:free()
    end)

    it("skips damaged files (removed) and foreign ones (kept) with a log line, and never raises on mutated bytes", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local _, dir, ids, kv = spilled("store2", "<|im_start|>user\nA question long enough to spill.<|im_end|>\n")
        local good = dir .. "/" .. spill_files(dir)[1]
        local bytes = helper.read_file(good)
        local n_header = 8 + tonumber(ffi.cast("const uint64_t *", bytes)[0])
        copy_file(good, dir .. "/kv-0000000000000001.safetensors", function(b) return b:sub(1, #b - 100) end)
        helper.write_file(dir .. "/kv-0000000000000002.safetensors", "not a spill file at all")
        copy_file(good, dir .. "/kv-0000000000000003.safetensors", function(b) -- a byte of the last rows
            return b:sub(1, #b - 50) .. string.char((b:byte(#b - 49) + 1) % 256) .. b:sub(#b - 48)
        end)
        os.remove(good)
        -- the store of a server that does not serve cartridge a
        local other = open_store(dir, nil, { b = cartridge.cart.load(cart2_path, m) })
        local text = table.concat(lines, "\n")
        print("  " .. text:gsub("\n", "\n  "))
        assert.truthy(text:find("kv%-0000000000000001%.safetensors: .*removed it"), text)
        assert.truthy(text:find("kv%-0000000000000002%.safetensors: .*removed it"), text)
        assert.truthy(text:find("kv%-0000000000000003%.safetensors: for cartridge 'a' .*left in place"), text)
        assert.are.equal(3, other.stats.skipped)
        assert.are.same({ "kv-0000000000000003.safetensors" }, spill_files(dir))
        -- a server for cartridge a sees it, but adopting checks every byte
        local mine = open_store(dir)
        local entry, n = mine:match(c, ids)
        assert.are.equal(#ids, n)
        local kv2 = m:new_kv(c.p + 512, "f16")
        c:append_to(kv2)
        assert.is_false(mine:adopt(entry, kv2, c, n))
        assert.are.equal(c.p, kv2:len())
        assert.truthy(lines[#lines]:find("do not match its checksum.*removed it"), lines[#lines])
        assert.are.same({}, spill_files(dir))
        -- mutations anywhere: refused, or adopted with exactly the spilled rows
        local clean = open_store(dir)
        clean:spill(c, ids, kv)
        local clean_path = dir .. "/" .. spill_files(dir)[1]
        bytes = helper.read_file(clean_path)
        os.remove(clean_path)
        local state = 12345
        local function rand(k) -- a fixed linear congruential sequence
            state = (state * 1103515245 + 12345) % 2147483648
            return state % k
        end
        local adopted, skipped, unmatched = 0, 0, 0
        for trial = 1, 200 do
            local b = bytes -- a third of the trials in the header only
            for _ = 1, 1 + rand(3) do
                local at = 1 + rand(trial % 3 == 0 and n_header or #b)
                b = b:sub(1, at - 1) .. string.char(rand(256)) .. b:sub(at + 1)
            end
            local path = dir .. "/kv-00000000000000ff.safetensors"
            helper.write_file(path, b)
            local st = open_store(dir)
            local e, k = st:match(c, ids)
            local kv3 = m:new_kv(c.p + 512, "f16")
            c:append_to(kv3)
            if e and st:adopt(e, kv3, c, k) then
                adopted = adopted + 1
                assert.is_true(rows_equal(kv, kv3, 0, c.p + k))
            elseif st.stats.skipped == 1 then
                skipped = skipped + 1
                assert.truthy(table.concat(lines, "\n"):find("kv-cache: skipped " .. path, 1, true))
            else
                unmatched = unmatched + 1 -- its (changed) tokens share nothing with the prompt
            end
            kv3:free()
            os.remove(path)
        end
        print(("  200 mutated files: %d skipped with a log line, %d never matched (their first token changed), "
            .. "%d adopted, each of those with exactly the spilled rows"):format(skipped, unmatched, adopted))
        assert.are.equal(200, skipped + unmatched + adopted)
        assert.is_true(skipped > 150)
        kv:free()
        kv2:free()
    end)

    it("keeps the directory within its bound, evicting the least recently used file", function()
        local ok, why = ready()
        if not ok then return pending(why) end
        local dir = tmp .. "/store3"
        local texts = { "first conversation of equal size", "second conversation, equal size", "third conversation of equal size" }
        local probe = open_store(dir)
        local kvs, idss = {}, {}
        for i, t in ipairs(texts) do
            idss[i] = ids_of(("%-40s"):format(t))
            kvs[i] = filled(idss[i])
        end
        probe:spill(c, idss[1], kvs[1])
        local _, one = fs.kind(dir .. "/" .. spill_files(dir)[1])
        os.remove(dir .. "/" .. spill_files(dir)[1])
        local store = open_store(dir, math.floor(2.5 * one))
        store:spill(c, idss[1], kvs[1])
        store:spill(c, idss[2], kvs[2])
        local first, second = store.entries[1].name, store.entries[2].name
        -- adopting the first makes it the most recently used
        local kv = m:new_kv(c.p + 512, "f16")
        c:append_to(kv)
        assert.is_true(store:adopt(store.entries[1], kv, c, #idss[1] - 1))
        store:spill(c, idss[3], kvs[3])
        local left = spill_files(dir)
        table.sort(left)
        print(("  bound %d bytes, files of %d: %s"):format(math.floor(2.5 * one), one, table.concat(left, ", ")))
        assert.are.equal(2, #left)
        assert.are.equal(1, store.stats.evictions)
        assert.truthy(helper.exists(dir .. "/" .. first))
        assert.is_false(helper.exists(dir .. "/" .. second))
        -- the order survives a restart (the files' modification times, whose
        -- clock ticks every few ms): use the first again, then reopen with
        -- room for one file
        os.execute("sleep 0.05")
        kv:truncate(c.p)
        assert.is_true(store:adopt(store:match(c, idss[1]), kv, c, #idss[1] - 1))
        local again = open_store(dir, math.floor(1.5 * one))
        assert.are.same({ first }, spill_files(dir))
        assert.are.equal(1, again.stats.evictions)
        -- a conversation larger than the bound is not written
        local tiny = open_store(dir, 1000)
        assert.is_false(tiny:spill(c, idss[1], kvs[1]))
        assert.truthy(lines[#lines]:find("above --kv-cache-max", 1, true), lines[#lines])
        for _, k in ipairs(kvs) do k:free() end
        kv:free()
    end)
end)

-- ---------------------------------------------------------------------------
-- The Prometheus text format, read strictly

-- Parses an exposition text (version 0.0.4) and fails on anything the format
-- does not allow: every line a HELP, TYPE or sample line ending in "\n";
-- names and label names of the allowed characters; label values quoted with
-- only \\, \" and \n escaped; values numbers, +Inf, -Inf or NaN; one HELP and
-- one TYPE per family, the TYPE before its samples; a family's samples
-- together; no sample twice; histograms with buckets in increasing le,
-- cumulative, ending at le="+Inf" equal to _count, and a _sum; counters
-- never negative. Returns { name = { type, help, samples = { { name,
-- labels = {}, value } } } }.
local function parse_prometheus(text)
    assert(text:sub(-1) == "\n", "the text must end with a line feed")
    local fams, done, current, seen = {}, {}, nil, {}
    local function fam(name)
        fams[name] = fams[name] or { samples = {} }
        return fams[name]
    end
    local function unescape(s, allowed, where)
        return (s:gsub("\\(.?)", function(ch)
            assert(allowed:find(ch, 1, true) and ch ~= "", ("bad escape \\%s in %s"):format(ch, where))
            return ch == "n" and "\n" or ch
        end))
    end
    local function number(s, line)
        if s == "+Inf" then return math.huge elseif s == "-Inf" then return -math.huge elseif s == "NaN" then return 0 / 0 end
        assert(s:find("^[-+]?%d+%.?%d*$") or s:find("^[-+]?%d+%.?%d*[eE][-+]?%d+$") or s:find("^[-+]?%.%d+$"),
            "not a number: " .. s .. " in " .. line)
        return tonumber(s)
    end
    for line in text:gmatch("([^\n]*)\n") do
        if line:sub(1, 1) == "#" then
            local kind, name, rest = line:match("^# (%u+) ([%a_:][%w_:]*) (.*)$")
            assert(kind == "HELP" or kind == "TYPE", "not a HELP or TYPE line: " .. line)
            local f = fam(name)
            if kind == "HELP" then
                assert(not f.help, "two HELP lines for " .. name)
                f.help = unescape(rest, "\\n", line)
            else
                assert(not f.type, "two TYPE lines for " .. name)
                assert(#f.samples == 0, "TYPE after samples of " .. name)
                assert(({ counter = 1, gauge = 1, histogram = 1, summary = 1, untyped = 1 })[rest], "bad type " .. rest)
                f.type = rest
            end
        else
            local name, after = line:match("^([%a_:][%w_:]*)(.*)$")
            assert(name, "not a sample line: " .. line)
            local labels, keys = {}, {}
            if after:sub(1, 1) == "{" then
                local pos = 2
                while after:sub(pos, pos) ~= "}" do
                    local lname, q = after:match("^([%a_][%w_]*)=()\"", pos)
                    assert(lname, "bad label at byte " .. pos .. " of " .. line)
                    assert(lname:sub(1, 2) ~= "__", "reserved label name " .. lname)
                    local i, raw = q + 1, {}
                    while true do
                        local ch = after:sub(i, i)
                        assert(ch ~= "" and ch ~= "\n", "unterminated label value in " .. line)
                        if ch == "\\" then raw[#raw + 1] = after:sub(i, i + 1); i = i + 2
                        elseif ch == '"' then break
                        else raw[#raw + 1] = ch; i = i + 1 end
                    end
                    assert(labels[lname] == nil, "label " .. lname .. " twice in " .. line)
                    labels[lname] = unescape(table.concat(raw), "\\\"n", line)
                    keys[#keys + 1] = lname .. "=" .. labels[lname]
                    pos = i + 1
                    if after:sub(pos, pos) == "," then pos = pos + 1 end
                end
                after = after:sub(pos + 1)
            end
            local value, ts = after:match("^ (%S+)$")
            if not value then value, ts = after:match("^ (%S+) (%-?%d+)$") end
            assert(value, "bad value part in: " .. line)
            local base = name
            local f = fams[name]
            if not (f and f.type) then
                base = name:match("^(.*)_bucket$") or name:match("^(.*)_sum$") or name:match("^(.*)_count$")
                f = base and fams[base]
                assert(f and f.type == "histogram", "a sample of " .. name .. " without a TYPE line before it")
            end
            assert(f.type, "a sample of " .. name .. " without a TYPE line before it")
            if current ~= base then
                assert(not done[base], "the samples of " .. base .. " are not together")
                if current then done[current] = true end
                current = base
            end
            table.sort(keys)
            local key = name .. "{" .. table.concat(keys, ",") .. "}"
            assert(not seen[key], "sample twice: " .. key)
            seen[key] = true
            f.samples[#f.samples + 1] = { name = name, labels = labels, value = number(value, line) }
        end
    end
    for name, f in pairs(fams) do
        assert(f.type, name .. " has no TYPE")
        if f.type == "counter" then
            for _, s in ipairs(f.samples) do assert(s.value >= 0, name .. " is negative") end
        elseif f.type == "histogram" then
            local last_le, last, count, sum, inf = -math.huge, 0, nil, nil, nil
            for _, s in ipairs(f.samples) do
                if s.name == name .. "_bucket" then
                    local le = number(assert(s.labels.le, "a bucket without le"), "le")
                    assert(le > last_le, name .. ": le not increasing")
                    assert(s.value >= last, name .. ": buckets not cumulative")
                    last_le, last = le, s.value
                    if le == math.huge then inf = s.value end
                elseif s.name == name .. "_count" then count = s.value
                elseif s.name == name .. "_sum" then sum = s.value
                else error("stray sample " .. s.name .. " in histogram " .. name) end
            end
            assert(inf ~= nil and count ~= nil and sum ~= nil, name .. ": +Inf bucket, _count and _sum needed")
            assert.are.equal(count, inf)
        end
    end
    return fams
end

local function value_of(fams, name, labels)
    local f = fams[name] or fams[name:match("^(.*)_bucket$") or name:match("^(.*)_sum$") or name:match("^(.*)_count$")]
    for _, s in ipairs(f and f.samples or {}) do
        local match = s.name == name
        for k, v in pairs(labels or {}) do match = match and s.labels[k] == v end
        if match then return s.value end
    end
    return 0
end

describe("cartridge.metrics", function()
    it("writes the Prometheus text format: escapes, exact numbers, cumulative histograms", function()
        local reg = metrics.registry()
        local c = reg:counter("t_requests_total", "Requests.\nA second line with a \\ backslash.", { "route", "status" })
        c:inc(2, '/odd"path\\with\nnewline', "200")
        c:inc(1, "/v1/chat/completions", "400")
        local g = reg:gauge("t_temperature", "A gauge.")
        g:set(0.1)
        local h = reg:histogram("t_latency_seconds", "A histogram.", { 0.005, 0.25, 1 })
        for _, v in ipairs({ 0.001, 0.005, 0.3, 7, 0.2 }) do h:observe(v) end
        local text = reg:render()
        print("  " .. text:gsub("\n(.)", "\n  %1"))
        local fams = parse_prometheus(text)
        assert.are.equal("Requests.\nA second line with a \\ backslash.", fams.t_requests_total.help)
        assert.are.equal(2, value_of(fams, "t_requests_total", { route = '/odd"path\\with\nnewline' }))
        assert.are.equal(0.1, value_of(fams, "t_temperature"))
        assert.are.equal(2, value_of(fams, "t_latency_seconds_bucket", { le = "0.005" }))
        assert.are.equal(3, value_of(fams, "t_latency_seconds_bucket", { le = "0.25" }))
        assert.are.equal(5, value_of(fams, "t_latency_seconds_count"))
        assert.are.equal(7.506, value_of(fams, "t_latency_seconds_sum"))
        assert.are.equal("0.1", metrics.number_text(0.1))
        assert.are.equal("+Inf", metrics.number_text(math.huge))
        assert.are.equal("NaN", metrics.number_text(0 / 0))
        assert.are.equal(1 / 3, tonumber(metrics.number_text(1 / 3)))
        assert.has_error(function() c:inc(-1, "a", "b") end)
        assert.has_error(function() reg:counter("t_requests_total", "again") end)
        assert.has_error(function() reg:counter("bad-name", "x") end)
        -- the strict reader refuses what the format does not allow
        for _, bad in ipairs({
            "x 1", "# TYPE x counter\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n", "x 1\n", "# TYPE x counter\nx{a=1} 1\n",
            "# TYPE x counter\nx{a=\"\\t\"} 1\n", "# TYPE x gauge\nx one\n", "# TYPE x counter\n# TYPE x counter\n",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n",
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 1\nh_sum 1\n",
            "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"b\"} 2\n",
        }) do
            assert.has_error(function() parse_prometheus(bad) end, nil, bad)
        end
    end)
end)

-- ---------------------------------------------------------------------------
-- serve.lua over HTTP

local function chat(s, body, headers)
    local status, text = servers:curl(s, "POST", "/v1/chat/completions", json.encode(body), headers)
    assert.are.equal(200, status, text)
    return json.decode(text)
end

-- A conversation the client holds (the random model's replies are bytes
-- that do not survive a round trip through text, so its history is fixed).
local TURN1 = {
    { role = "user", content = "Here is a question that is long enough to be worth keeping on disk." },
    { role = "assistant", content = "An earlier answer, sent back by the client." },
    { role = "user", content = "And a second question?" },
}
local TURN2 = { TURN1[1], TURN1[2], TURN1[3], { role = "assistant", content = "A second answer." },
    { role = "user", content = "Then a third one, please." } }

local function scrape(s, headers)
    local status, text = servers:curl(s, "GET", "/metrics", nil, headers)
    assert.are.equal(200, status, text)
    return parse_prometheus(text), text
end

describe("serve.lua --kv-cache-dir", function()
    it("keeps a conversation across a restart: cached_tokens from disk, the same greedy answer as without the tier",
        function()
            local ok, why = ready(true)
            if not ok then return pending(why) end
            local dir = tmp .. "/serve-kv"
            local args = { "--cartridge", "a=" .. cart_path, "--cartridge", "b=" .. cart2_path, "--kv-cache-dir", dir,
                "--parallel", "1" }
            local s1 = servers:start(MODEL, table.unpack(args))
            local r1 = chat(s1, { model = "a", messages = TURN1, max_tokens = 8, temperature = 0 })
            assert.are.equal(0, r1.usage.prompt_tokens_details.cached_tokens)
            servers:stop(s1)
            local log1 = helper.read_file(s1.log)
            assert.truthy(log1:find("kv%-cache: spilled %d+ tokens of 'a'"), log1)
            assert.are.equal(1, #spill_files(dir))

            local s2 = servers:start(MODEL, table.unpack(args))
            local follow = { model = "a", messages = TURN2, max_tokens = 12, temperature = 0 }
            local r2 = chat(s2, follow)
            local cached = r2.usage.prompt_tokens_details.cached_tokens
            print(("  after a restart: %d prompt tokens, %d cached from disk (the first turn had %d)"):format(
                r2.usage.prompt_tokens, cached, r1.usage.prompt_tokens))
            assert.is_true(cached > 0)
            local fams = scrape(s2)
            assert.are.equal(1, value_of(fams, "cartridge_kv_disk_hits_total"))
            assert.are.equal(cached, value_of(fams, "cartridge_kv_disk_hit_tokens_total"))

            -- another cartridge takes the only slot (the conversation spills),
            -- then the Anthropic and Responses routes continue it from disk
            chat(s2, { model = "b", messages = { { role = "user", content = "Something else entirely, at length." } },
                max_tokens = 4, temperature = 0 })
            local turn3 = {}
            for i, msg in ipairs(TURN2) do turn3[i] = msg end
            turn3[#turn3 + 1] = { role = "assistant", content = "A third answer." }
            turn3[#turn3 + 1] = { role = "user", content = "One more." }
            local status, text = servers:curl(s2, "POST", "/v1/messages", json.encode({ model = "a", messages = turn3,
                max_tokens = 4 }))
            assert.are.equal(200, status, text)
            local usage = json.decode(text).usage
            print(("  Anthropic: %d input tokens prefilled, %d read from the cache"):format(usage.input_tokens,
                usage.cache_read_input_tokens))
            assert.is_true(usage.cache_read_input_tokens >= cached)
            chat(s2, { model = "b", messages = { { role = "user", content = "A different topic, and not short either." } },
                max_tokens = 4, temperature = 0 })
            local input = {}
            for i, msg in ipairs(turn3) do input[i] = { role = msg.role, content = msg.content } end
            status, text = servers:curl(s2, "POST", "/v1/responses", json.encode({ model = "a", input = input,
                max_output_tokens = 4 }))
            assert.are.equal(200, status, text)
            local rusage = json.decode(text).usage
            print(("  Responses: %d input tokens, %d cached"):format(rusage.input_tokens,
                rusage.input_tokens_details.cached_tokens))
            assert.is_true(rusage.input_tokens_details.cached_tokens >= cached)
            fams = scrape(s2)
            assert.are.equal(3, value_of(fams, "cartridge_kv_disk_hits_total"))
            assert.is_true(value_of(fams, "cartridge_kv_disk_spills_total") >= 2)
            servers:stop(s2)

            -- the same conversation on a server without the disk tier that never
            -- stopped: the follow-up reuses the same tokens from memory, and
            -- the answer is the same
            local s3 = servers:start(MODEL, "--cartridge", "a=" .. cart_path, "--parallel", "1")
            chat(s3, { model = "a", messages = TURN1, max_tokens = 8, temperature = 0 })
            local r3 = chat(s3, follow)
            print(("  without the disk tier, no restart: %d cached; the answers are %s"):format(
                r3.usage.prompt_tokens_details.cached_tokens,
                r3.choices[1].message.content == r2.choices[1].message.content and "identical" or "different"))
            assert.are.equal(r3.usage.prompt_tokens_details.cached_tokens, cached)
            assert.are.equal(r3.choices[1].message.content, r2.choices[1].message.content)
            assert.are.equal(r3.usage.completion_tokens, r2.usage.completion_tokens)
            servers:stop(s3)
        end)

    it("skips a corrupt, a truncated and a foreign file with a log line and keeps serving", function()
        local ok, why = ready(true)
        if not ok then return pending(why) end
        local dir = tmp .. "/serve-bad"
        local s1 = servers:start(MODEL, "--cartridge", "a=" .. cart_path, "--kv-cache-dir", dir, "--parallel", "1")
        local r1 = chat(s1, { model = "a", messages = TURN1, max_tokens = 8, temperature = 0 })
        servers:stop(s1)
        local good = dir .. "/" .. spill_files(dir)[1]
        local bytes = helper.read_file(good)
        os.remove(good)
        -- a flipped byte in the rows (found by the checksum when adopted), a
        -- truncated copy, and bytes that are no spill file
        helper.write_file(dir .. "/kv-00000000000000c0.safetensors",
            bytes:sub(1, #bytes - 10) .. string.char((bytes:byte(#bytes - 9) + 1) % 256) .. bytes:sub(#bytes - 8))
        helper.write_file(dir .. "/kv-00000000000000c1.safetensors", bytes:sub(1, math.floor(#bytes / 2)))
        helper.write_file(dir .. "/kv-00000000000000c2.safetensors", "\1\2\3 garbage")
        -- a file for another model: a random model of the same shape, another seed
        local other_model = tmp .. "/other.gguf"
        require("cartridge.randmodel").write({ preset = "qwen3-tiny", layers = 4, embd = 256, ff = 768, heads = 4,
            kv_heads = 2, head_dim = 64, dtype = "f16", seed = 99, out = other_model, quiet = true })
        local other_dir = tmp .. "/serve-other"
        local so = servers:start(other_model, "--kv-cache-dir", other_dir, "--parallel", "1")
        chat(so, { messages = TURN1, max_tokens = 8, temperature = 0 })
        servers:stop(so)
        local foreign = spill_files(other_dir)[1]
        copy_file(other_dir .. "/" .. foreign, dir .. "/" .. foreign)

        local s2 = servers:start(MODEL, "--cartridge", "a=" .. cart_path, "--kv-cache-dir", dir, "--parallel", "1")
        local r2 = chat(s2, { model = "a", messages = TURN1, max_tokens = 8, temperature = 0 })
        assert.are.equal(0, r2.usage.prompt_tokens_details.cached_tokens)
        assert.are.equal(r1.choices[1].message.content, r2.choices[1].message.content)
        local fams = scrape(s2)
        assert.are.equal(4, value_of(fams, "cartridge_kv_disk_skipped_files_total"))
        assert.are.equal(0, value_of(fams, "cartridge_kv_disk_hits_total"))
        servers:stop(s2)
        local log = helper.read_file(s2.log)
        print("  " .. table.concat((function()
            local t = {}
            for l in log:gmatch("[^\n]+") do if l:find("skipped", 1, true) then t[#t + 1] = l end end
            return t
        end)(), "\n  "))
        assert.truthy(log:find("kv%-00000000000000c0%.safetensors: its bytes do not match its checksum.*removed it"), log)
        assert.truthy(log:find("kv%-00000000000000c1%.safetensors: .*removed it"), log)
        assert.truthy(log:find("kv%-00000000000000c2%.safetensors: .*removed it"), log)
        assert.truthy(log:find(foreign:gsub("%-", "%%-"):gsub("%.", "%%.") .. ": written for another model.*left in place"),
            log)
        assert.truthy(helper.exists(dir .. "/" .. foreign))
        for _, name in ipairs({ "c0", "c1", "c2" }) do
            assert.is_false(helper.exists(dir .. "/kv-00000000000000" .. name .. ".safetensors"))
        end
    end)

    it("keeps --kv-cache-max by evicting the least recently used file", function()
        local ok, why = ready(true)
        if not ok then return pending(why) end
        local dir = tmp .. "/serve-lru"
        local function conv(text) return { { role = "user", content = ("%-60s"):format(text) } } end
        -- one conversation's file: 4 layers x (K + V) x 2 heads x 64 dims x 2 bytes = 2 KiB a token
        local s = servers:start(MODEL, "--kv-cache-dir", dir, "--parallel", "1", "--kv-cache-max", "420K")
        local function ask(text) return chat(s, { messages = conv(text), max_tokens = 4, temperature = 0 }) end
        ask("conversation A")
        ask("conversation B") -- A spills
        local a = spill_files(dir)[1]
        ask("conversation A") -- B spills; A is adopted from disk, the most recently used now
        local b
        for _, name in ipairs(spill_files(dir)) do if name ~= a then b = name end end
        ask("conversation C") -- A is on disk already; C takes the slot
        ask("conversation D") -- C spills: three files do not fit, B goes
        local left = spill_files(dir)
        local fams = scrape(s)
        print(("  files left under 420K: %s; %d evicted, %d bytes in the tier"):format(table.concat(left, ", "),
            value_of(fams, "cartridge_kv_disk_evictions_total"), value_of(fams, "cartridge_kv_disk_bytes")))
        assert.are.equal(1, value_of(fams, "cartridge_kv_disk_hits_total"))
        assert.are.equal(1, value_of(fams, "cartridge_kv_disk_evictions_total"))
        assert.are.equal(2, #left)
        assert.is_true(value_of(fams, "cartridge_kv_disk_bytes") <= 420 * 1024)
        assert.truthy(helper.exists(dir .. "/" .. a))
        assert.is_false(helper.exists(dir .. "/" .. b))
        servers:stop(s)
        assert.truthy(helper.read_file(s.log):find("evicted " .. b:gsub("%-", "%%-"):gsub("%.", "%%."), 1), s.log)
    end)
end)

describe("GET /metrics", function()
    it("answers strict Prometheus text whose counters move with the requests, behind the API key", function()
        local ok, why = ready(true)
        if not ok then return pending(why) end
        local s = servers:start(MODEL, "--api-key", "sekrit", "--kv-cache-dir", tmp .. "/serve-metrics")
        local auth = { "Authorization: Bearer sekrit" }
        local status, text = servers:curl(s, "GET", "/metrics")
        assert.are.equal(401, status)
        assert.truthy(text:find("invalid_api_key", 1, true), text)
        status = servers:curl(s, "GET", "/metrics", nil, { "Authorization: Bearer wrong" })
        assert.are.equal(401, status)
        local rc, head = helper.run(("curl -s -D - -o /dev/null -H 'x-api-key: sekrit' http://127.0.0.1:%d/metrics")
            :format(s.port))
        assert.are.equal(0, rc)
        assert.truthy(head:lower():find("content%-type: text/plain; version=0%.0%.4; charset=utf%-8\r\n"), head)
        local before = scrape(s, auth)
        local r = chat(s, { messages = TURN1, max_tokens = 6, temperature = 0 }, auth)
        chat(s, { messages = TURN1, max_tokens = 6, temperature = 0 }, auth)
        status = servers:curl(s, "POST", "/v1/chat/completions", json.encode({ messages = "no" }), auth)
        assert.are.equal(400, status)
        status = servers:curl(s, "GET", "/no/such/route", nil, auth)
        assert.are.equal(404, status)
        local after, out = scrape(s, auth)
        servers:stop(s)
        local function moved(name, labels) return value_of(after, name, labels) - value_of(before, name, labels) end
        local chat_ok = { route = "/v1/chat/completions", status = "200" }
        assert.are.equal(2, moved("cartridge_requests_total", chat_ok))
        assert.are.equal(1, moved("cartridge_requests_total", { route = "/v1/chat/completions", status = "400" }))
        assert.are.equal(1, moved("cartridge_requests_total", { route = "other", status = "404" }))
        assert.are.equal(1, moved("cartridge_requests_total", { route = "/metrics", status = "200" }))
        assert.are.equal(2, value_of(after, "cartridge_requests_total", { route = "/metrics", status = "401" }))
        assert.are.equal(2 * r.usage.prompt_tokens, moved("cartridge_prompt_tokens_total"))
        assert.are.equal(r.usage.prompt_tokens - 1, moved("cartridge_prompt_tokens_cached_total"))
        local completion = r.usage.completion_tokens
        assert.are.equal(2 * completion, moved("cartridge_completion_tokens_total"))
        assert.are.equal(2, moved("cartridge_time_to_first_token_seconds_count"))
        -- a token after the first of each request (and the end-of-text token, if one came)
        local tpot = moved("cartridge_time_per_output_token_seconds_count")
        assert.is_true(tpot == 2 * (completion - 1) or tpot == 2 * completion, tostring(tpot))
        assert.are.equal(2, moved("cartridge_request_duration_seconds_count"))
        assert.are.equal(0, value_of(after, "cartridge_requests_waiting"))
        assert.are.equal(0, value_of(after, "cartridge_slots_busy"))
        assert.are.equal(4, value_of(after, "cartridge_slots_total"))
        assert.are.equal(2, moved("cartridge_kv_disk_misses_total"))
        assert.is_true(math.abs(value_of(after, "process_start_time_seconds") - os.time()) < 120)
        print(("  %d lines of metrics; the chat requests' part:"):format(select(2, out:gsub("\n", ""))))
        for line in out:gmatch("[^\n]+") do
            if line:find("^cartridge_requests_total") then print("  " .. line) end
        end
    end)
end)
