-- bench_server.lua: the HTTP server under load, a soak and a flood.
--
--   cartridge run recipes/bench_server.lua                          # 1, 4, 16 connections, 20 s each
--   cartridge run recipes/bench_server.lua --shape 0.6b --parallel 4 --connections 1,4,16
--   cartridge run recipes/bench_server.lua --soak 600               # mixed traffic for 10 minutes
--   cartridge run recipes/bench_server.lua --flood                  # idle + slowloris sockets beside real traffic
--
-- Starts recipes/serve.lua on a generated qwen3 model (--shape small: 4
-- layers, hidden 256; --shape 0.6b: the Qwen3-0.6B shape, f16, cached under
-- models/) with a cartridge, and drives POST /v1/chat/completions from this
-- process through cartridge.netclient: closed-loop connections, each sending
-- its next request when the last one is answered.
--
-- Load: requests/s, completion tokens/s, p50/p99 latency and errors at each
-- connection count. Soak: chat, streams (a third of them dropped by the
-- client mid-stream) and bad requests mixed; it reports the answers by kind,
-- unexpected statuses (must be 0), slots still busy once the traffic stops
-- ("lost slots", must be 0), and the server's RSS and open descriptors over
-- time (must stay flat). Flood: real traffic alone, then beside --idle
-- sockets that never send a byte and --slow ones that trickle a header byte
-- every half second, reconnected as the server closes them; p50/p99 of the
-- real traffic in both phases.
--
-- The load generator shares the machine's cores with the server: the figures
-- are a floor on what the server does alone.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local json = require("cartridge.json")
local nc = require("cartridge.netclient")
local fs = require("cartridge.fs")

local opts = options.parse(arg, {
    summary = "The HTTP server under load, a soak (--soak SECONDS) and a flood (--flood).",
    flags = {
        { "connections", default = "1,4,16", help = "concurrent connections, or a comma list (one run each)" },
        { "seconds", type = "int", default = 20, help = "duration of each load run (and of each flood phase)" },
        { "max-tokens", type = "int", default = 16, help = "completion tokens per request" },
        { "parallel", type = "int", default = 16, help = "server slots (decoded together)" },
        { "threads", type = "int", default = 2, help = "server threads" },
        { "shape", default = "small", choices = { "small", "0.6b" }, help = "the generated model's shape" },
        { "model", help = "a GGUF instead of a generated model" },
        { "soak", type = "int", default = 0, help = "run the mixed soak for this many seconds instead" },
        { "flood", type = "boolean", help = "run the flood instead" },
        { "idle", type = "int", default = 1000, help = "flood: sockets that never send a byte" },
        { "slow", type = "int", default = 100, help = "flood: sockets that trickle a head" },
        { "seed", type = "int", default = 1, help = "the traffic mix's random seed" },
    },
})

local C = cartridge.C
local function now() return C.cart_now_seconds() end
local function read_file(path) -- "" until it exists
    local f = io.open(path, "rb")
    if not f then return "" end
    local text = f:read("*a")
    f:close()
    return text
end
local proc = require("cartridge.proc")

-- ---------------------------------------------------------------------------
-- The model, a cartridge and the server

local base = os.tmpname() -- an empty file of a fresh name: the directory beside it is ours alone
local dir = base .. ".d"
fs.mkdirs(dir)
local model = opts.model
if not model and opts.shape == "0.6b" then
    model = require("cartridge.defaults").bench_model(nil, "bench_server")
elseif not model then
    model = dir .. "/model.gguf"
    randmodel.write({ out = model, preset = "default", dtype = "f16", quiet = true })
end
local m = cartridge.model.load(model)
cartridge.cart.from_text(m, "The cartridge holds what the corpus says."):save(dir .. "/c.safetensors", m)
m:free()

local exe = package.loaded["cartridge.host"] and package.loaded["cartridge.host"].executable or "build/cartridge"
local log = dir .. "/serve.log"
local pid = proc.spawn({ exe, "run", cartridge.root .. "/recipes/serve.lua", model, "--port", 0, "--quiet", "--parallel",
    opts.parallel, "--threads", opts.threads, "--queue", 256, "--max-connections", 512, "--max-per-address", 2048,
    "--cartridge", "docs=" .. dir .. "/c.safetensors" }, { stdin = "/dev/null", stdout = log, stderr = log })
local port
for _ = 1, 600 do
    port = read_file(log):match("on http://127%.0%.0%.1:(%d+)")
    if port then break end
    fs.sleep(0.05)
end
if not port then error("bench_server: the server did not start:\n" .. read_file(log), 0) end
port = tonumber(port)

local function proc_status(key)
    local f = io.open("/proc/" .. pid .. "/status")
    if not f then return 0 end
    local text = f:read("*a")
    f:close()
    return tonumber(text:match(key .. ":%s+(%d+) kB")) or 0
end
local function open_fds()
    local ok, names = pcall(fs.list, "/proc/" .. pid .. "/fd")
    return ok and #names or 0
end
local function health()
    local r = nc.request("127.0.0.1", port, "GET", "/health", nil, 5)
    return r and r.status == 200 and json.decode(r.body) or nil
end

-- ---------------------------------------------------------------------------
-- Requests

local function chat_body(stream)
    return json.encode({ model = "docs", max_tokens = opts.max_tokens, temperature = 0.7, stream = stream or nil,
        messages = { { role = "user", content = "What does the cartridge hold?" } } })
end

local BAD = {
    '{"messages":[{"role":"user","content":"Hi"}],"top_k":2147483648}',
    '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1e309}',
    '{"messages":[{"role":"user","content":{"a":1}}]}',
    '{"messages":[{"role":"user","content":null}]}',
    '{"messages":[{"role":"user","content":"Hi"}],"stream_options":5}',
    '{"messages":"no"}',
    '{bad json',
    '[]',
    '{"messages":[{"role":"user","content":"Hi"}],"temperature":-1}',
    '{"messages":[{"role":"user","content":"bad \xff byte"}]}',
}

local function percentile(list, p)
    if #list == 0 then return 0 end
    table.sort(list)
    return list[math.max(1, math.ceil(#list * p / 100))]
end

-- Closed-loop traffic on `n` connections for `seconds`. pick() returns the
-- next request: { kind, body, expect (a status), drop_after (bytes, for a
-- stream the client abandons) }. tick(t) runs every 0.1 s (for floods).
-- Returns stats by kind: { n, latencies, tokens, unexpected, failed }.
local function traffic(n, seconds, pick, tick)
    local stats, workers = {}, {}
    local function stat(kind)
        stats[kind] = stats[kind] or { n = 0, latencies = {}, tokens = 0, unexpected = 0, failed = 0, why = {} }
        return stats[kind]
    end
    local stop_at, next_tick = now() + seconds, 0
    while true do
        local t = now()
        local running = t < stop_at
        local conns = {}
        for i = 1, n do
            local w = workers[i]
            if not w and running then
                local r = pick()
                local c, why = nc.connect("127.0.0.1", port, true)
                if c then
                    c:send(nc.format("POST", "/v1/chat/completions", r.body))
                    w = { c = c, r = r }
                    workers[i] = w
                else
                    stat(r.kind).failed = stat(r.kind).failed + 1
                    stat(r.kind).why[why] = true
                end
            end
            if w then conns[#conns + 1] = w.c end
        end
        if #conns == 0 and not running then break end
        nc.step(conns, 0.01)
        for i = 1, n do
            local w = workers[i]
            if w then
                local c, s = w.c, stat(w.r.kind)
                if w.r.drop_after and not c.response and c:received() >= w.r.drop_after then
                    c:close() -- the client leaves mid-stream
                    s.n = s.n + 1
                    workers[i] = nil
                elseif c.response then
                    local r = c.response
                    s.n = s.n + 1
                    if r.status ~= w.r.expect and not (w.r.expect == 400 and r.status >= 400 and r.status < 500) then
                        s.unexpected = s.unexpected + 1
                        s.why[r.status .. " " .. r.body:sub(1, 120)] = true
                    else
                        s.latencies[#s.latencies + 1] = r.seconds
                        if r.status == 200 and not w.r.stream then
                            local ok, body = pcall(json.decode, r.body)
                            if ok and body.usage then s.tokens = s.tokens + body.usage.completion_tokens end
                        end
                    end
                    c:close()
                    workers[i] = nil
                elseif c.failed then
                    s.failed = s.failed + 1
                    s.why[c.failed] = true
                    c:close()
                    workers[i] = nil
                end
            end
        end
        if tick and t >= next_tick then
            tick(t)
            next_tick = t + 0.1
        end
    end
    return stats
end

local function report(kind, s, seconds)
    if not s then return end
    local why = {}
    for k in pairs(s.why) do why[#why + 1] = k end
    print(("  %-8s %6d answered (%.1f/s)%s; p50 %.0f ms, p99 %.0f ms; %d unexpected, %d connection failures%s")
        :format(kind, s.n, s.n / seconds, s.tokens > 0 and (", %.0f completion tok/s"):format(s.tokens / seconds) or "",
            percentile(s.latencies, 50) * 1e3, percentile(s.latencies, 99) * 1e3, s.unexpected, s.failed,
            #why > 0 and (" (" .. table.concat(why, "; ") .. ")") or ""))
end

-- Waits until every slot is idle; returns the slots still busy after 30 s.
local function busy_after_traffic()
    local h
    for _ = 1, 300 do
        h = health()
        if h and h.slots_processing == 0 and h.queue == 0 then return 0 end
        fs.sleep(0.1)
    end
    return h and h.slots_processing or -1
end

print(("kernels %s; model %s; %d server slots, %d threads; %d completion tokens per chat"):format(cartridge.isa(),
    model, opts.parallel, opts.threads, opts.max_tokens))
-- warm up
traffic(2, 2, function() return { kind = "chat", body = chat_body(), expect = 200 } end)
local failed = false

if opts.soak > 0 then
    math.randomseed(opts.seed)
    local function pick()
        local x = math.random()
        if x < 0.6 then return { kind = "chat", body = chat_body(), expect = 200 } end
        if x < 0.8 then
            local drop = math.random() < 1 / 3 and math.random(1, 400) or nil
            return { kind = "stream", body = chat_body(true), expect = 200, stream = true, drop_after = drop }
        end
        return { kind = "bad", body = BAD[math.random(#BAD)], expect = 400 }
    end
    local samples, last = {}, 0
    local rss0, fds0 = proc_status("VmRSS"), open_fds()
    local conns = tonumber(opts.connections:match("(%d+)$"))
    print(("soak: %d s, %d connections: 60%% chat, 20%% streams (a third dropped mid-stream), 20%% bad requests")
        :format(opts.soak, conns))
    local stats = traffic(conns, opts.soak, pick, function(t)
        if t - last >= 10 then
            samples[#samples + 1] = { proc_status("VmRSS") / 1024, open_fds() }
            last = t
        end
    end)
    for _, kind in ipairs({ "chat", "stream", "bad" }) do report(kind, stats[kind], opts.soak) end
    local lost = busy_after_traffic()
    local rss1, fds1 = proc_status("VmRSS"), open_fds()
    -- the samples after the first (warm-up) one: flat means a narrow range
    local lo_r, hi_r, lo_f, hi_f = math.huge, 0, math.huge, 0
    for i = 2, #samples do
        lo_r, hi_r = math.min(lo_r, samples[i][1]), math.max(hi_r, samples[i][1])
        lo_f, hi_f = math.min(lo_f, samples[i][2]), math.max(hi_f, samples[i][2])
    end
    print(("lost slots: %d; server RSS %.1f -> %.1f MiB, open descriptors %d -> %d; sampled every 10 s after "
        .. "the first: RSS %.1f..%.1f MiB, descriptors %d..%d (%d samples)"):format(lost, rss0 / 1024, rss1 / 1024,
        fds0, fds1, lo_r, hi_r, lo_f, hi_f, math.max(0, #samples - 1)))
    for _, s in pairs(stats) do failed = failed or s.unexpected > 0 or s.failed > 0 end
    failed = failed or lost ~= 0
elseif opts.flood then
    local conns = tonumber(opts.connections:match("(%d+)$"))
    local function pick() return { kind = "chat", body = chat_body(), expect = 200 } end
    print(("flood: %d connections of real traffic, %d s alone, then %d s beside %d idle and %d slowloris sockets")
        :format(conns, opts.seconds, opts.seconds, opts.idle, opts.slow))
    local alone = traffic(conns, opts.seconds, pick)
    report("alone", alone.chat, opts.seconds)
    local idle, slow, reconnects, refused = {}, {}, 0, 0
    local function refill(list, want)
        for i = 1, want do
            if not list[i] or list[i].fd < 0 or not list[i]:is_open() then
                if list[i] then
                    list[i]:close()
                    reconnects = reconnects + 1
                end
                list[i] = nc.connect("127.0.0.1", port, true)
                if not list[i] then
                    refused = refused + 1
                    list[i] = { fd = -1, close = function() end, is_open = function() return false end }
                end
            end
        end
    end
    refill(idle, opts.idle)
    refill(slow, opts.slow)
    for _, c in ipairs(slow) do if c.fd >= 0 then c:send("POST /v1/chat/completions HTTP/1.1\r\nX-Slow: ") end end
    local last_byte = now()
    local beside = traffic(conns, opts.seconds, pick, function(t)
        refill(idle, opts.idle)
        refill(slow, opts.slow)
        if t - last_byte >= 0.5 then
            for _, c in ipairs(slow) do if c.fd >= 0 then c:send("a") end end
            last_byte = t
        end
    end)
    report("flooded", beside.chat, opts.seconds)
    print(("flood sockets: %d reconnects after the server closed them, %d connects refused"):format(reconnects, refused))
    for _, c in ipairs(idle) do c:close() end
    for _, c in ipairs(slow) do c:close() end
    for _, s in ipairs({ alone.chat, beside.chat }) do failed = failed or not s or s.unexpected > 0 or s.failed > 0 end
else
    local rss0 = proc_status("VmRSS")
    for n in opts.connections:gmatch("%d+") do
        n = tonumber(n)
        local stats = traffic(n, opts.seconds, function() return { kind = "chat", body = chat_body(), expect = 200 } end)
        report(("%d conn"):format(n), stats.chat, opts.seconds)
        failed = failed or not stats.chat or stats.chat.unexpected > 0 or stats.chat.failed > 0
    end
    print(("server RSS: %.1f MiB before, %.1f MiB after"):format(rss0 / 1024, proc_status("VmRSS") / 1024))
end

proc.terminate(pid)
if not proc.wait(pid, 10) then
    proc.kill(pid)
    proc.wait(pid)
end
fs.remove_tree(dir)
os.remove(base)
if failed then
    io.stderr:write("bench_server: some requests were lost or answered wrongly (see above)\n")
    os.exit(1)
end
