-- bench_server.lua: load on the HTTP server with wrk.
--
--   cartridge run recipes/bench_server.lua                        # 16 connections, 60 s
--   cartridge run recipes/bench_server.lua --connections 16 --seconds 60 --max-tokens 16
--
-- Starts recipes/serve.lua on a small generated qwen3 model with a cartridge,
-- drives POST /v1/chat/completions with wrk (Debian package "wrk"), and
-- prints requests/s, p50/p99 latency, errors (non-2xx and socket errors;
-- must be 0) and the server's RSS before and after (must stay flat).

local cartridge = require("cartridge")
local options = require("cartridge.options")
local randmodel = require("cartridge.randmodel")
local json = require("cartridge.json")

local opts = options.parse(arg, {
    summary = "Load the HTTP server with wrk: requests/s, latency, errors, RSS.",
    flags = {
        { "connections", type = "int", default = 16, help = "concurrent connections" },
        { "seconds", type = "int", default = 60, help = "duration" },
        { "max-tokens", type = "int", default = 16, help = "completion tokens per request" },
        { "parallel", type = "int", default = 16, help = "server slots (decoded together)" },
        { "threads", type = "int", default = 2, help = "server threads" },
        { "model", help = "GGUF (default: a generated qwen3 of 4 layers, hidden 256)" },
    },
})

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function sh(cmd)
    local p = io.popen(cmd)
    local out = p:read("*a")
    p:close()
    return out
end
if sh("command -v wrk"):match("^%s*$") then
    error("bench_server: wrk is not installed; apt-get install wrk", 0)
end

local dir = sh("mktemp -d /tmp/cartridge-bench-server.XXXXXX"):gsub("%s+$", "")
local model = opts.model
if not model then
    model = dir .. "/model.gguf"
    randmodel.write({ out = model, preset = "default", dtype = "f16", quiet = true })
end
local m = cartridge.model.load(model)
local ids = m:tokenizer():encode("The cartridge holds what the corpus says.", { add_special = true })
local c = cartridge.cart.new(m, #ids, 1)
c:capture(m, ids)
c:save(dir .. "/c.safetensors", m)
m:free()

local exe = package.loaded["cartridge.host"] and package.loaded["cartridge.host"].executable or "build/cartridge"
local log = dir .. "/serve.log"
local pid = tonumber(sh(("%s run %s/recipes/serve.lua %s --port 0 --quiet --parallel %d --threads %d --queue 256 "
    .. "--cartridge docs=%s >%s 2>&1 & echo $!"):format(q(exe), q(cartridge.root), q(model), opts.parallel, opts.threads,
    q(dir .. "/c.safetensors"), q(log))))
local port
for _ = 1, 200 do
    local f = io.open(log)
    local text = f and f:read("*a") or ""
    if f then f:close() end
    port = text:match("on http://127%.0%.0%.1:(%d+)")
    if port then break end
    os.execute("sleep 0.05")
end
if not port then error("bench_server: the server did not start:\n" .. sh("cat " .. q(log)), 0) end

local function rss_kib()
    local f = io.open("/proc/" .. pid .. "/status")
    if not f then return 0 end
    local text = f:read("*a")
    f:close()
    return tonumber(text:match("VmRSS:%s+(%d+) kB")) or 0
end

local body = json.encode({ model = "docs", max_tokens = opts.max_tokens, temperature = 0.7,
    messages = { { role = "user", content = "What does the cartridge hold?" } } })
local script = dir .. "/post.lua"
local f = assert(io.open(script, "w"))
f:write(([[
wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
local bad = 0
response = function(status, headers, body)
    if status ~= 200 then bad = bad + 1 end
end
done = function(summary, latency, requests)
    io.write(string.format("CARTRIDGE non200=%%d requests=%%d errors=%%d p50=%%d p99=%%d\n", bad,
        summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.status + summary.errors.timeout, latency:percentile(50), latency:percentile(99)))
end
]]):format(body))
f:close()
-- warm up, then measure
sh(("wrk -t1 -c2 -d2s -s %s http://127.0.0.1:%s/v1/chat/completions 2>&1"):format(q(script), port))
local before = rss_kib()
-- wrk in the background; the server's RSS sampled every 10 s meanwhile
local wrk_out = dir .. "/wrk.out"
os.execute(("wrk -t2 -c%d -d%ds --timeout 30s -s %s http://127.0.0.1:%s/v1/chat/completions > %s 2>&1 &"):format(
    opts.connections, opts.seconds, q(script), port, q(wrk_out)))
local samples = {}
for t = 10, opts.seconds, 10 do
    os.execute("sleep 10")
    samples[#samples + 1] = ("%ds %.1f"):format(t, rss_kib() / 1024)
end
os.execute("sleep 2")
local out
for _ = 1, 100 do
    out = sh("cat " .. q(wrk_out))
    if out:find("CARTRIDGE", 1, true) then break end
    os.execute("sleep 0.5")
end
local after = rss_kib()
os.execute("kill -TERM " .. pid)
local non200, requests, errors, p50, p99 = out:match("CARTRIDGE non200=(%d+) requests=(%d+) errors=(%d+) p50=(%d+) p99=(%d+)")
if not requests then error("bench_server: wrk failed:\n" .. out, 0) end
local rps = tonumber(requests) / opts.seconds
print(("kernels %s; %d connections for %d s, %d completion tokens per request, %d server slots"):format(cartridge.isa(), opts.connections,
    opts.seconds, opts.max_tokens, opts.parallel))
print(("requests: %d (%.1f/s, %.0f completion tokens/s); latency p50 %.0f ms, p99 %.0f ms"):format(tonumber(requests),
    rps, rps * opts.max_tokens, tonumber(p50) / 1000, tonumber(p99) / 1000))
print(("errors: %d socket, %d non-200"):format(tonumber(errors), tonumber(non200)))
print(("server RSS: %.1f MiB before, %.1f MiB after (%+.1f MiB); during the run: %s MiB"):format(before / 1024,
    after / 1024, (after - before) / 1024, table.concat(samples, ", ")))
os.execute("rm -rf " .. q(dir))
