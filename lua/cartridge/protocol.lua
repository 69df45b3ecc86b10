-- cartridge.protocol: the fixed evaluation protocol of the reading task, in
-- one place, for recipes/eval_facts.lua and recipes/compare.lua.
--
--   local protocol = require("cartridge.protocol")
--   protocol.TUNING, protocol.REPORT          -- document seeds
--   protocol.selfstudy_args(model, doc, corpus_tokens, p, opts)
--   protocol.run_selfstudy(args, save)        -- its own process; the cartridge's path
--
-- Tuning documents (seeds 1001-1010) are the ones settings may be chosen
-- on; report documents (seeds 2001-2020) are used for the reported figures
-- and nothing else. The reader itself trains on seeds below 1000 and its
-- pretraining scores itself on 1001-1020. The specs use seeds 3001 and up.
--
-- The README's self-study settings: p = n/8 (n: the document's tokens as a
-- system block), 400 conversations (--steps 100 --accum 4), --lr 0.2, chunks
-- a quarter to a half of the document, --max-q 32 --max-a 32, the focus
-- seed instruction, 12 turns, --init compact (chosen on the tuning
-- documents: docs/quality.md).

local protocol = {}

protocol.TUNING = { first = 1001, last = 1010 }
protocol.REPORT = { first = 2001, last = 2020 }
protocol.SPEC = { first = 3001 }

protocol.SETTINGS = { fraction = 8, conversations = 400, accum = 4, lr = 0.2, max_q = 32, max_a = 32,
    seeds = "focus", turns = 12, init = "compact" }

-- The seeds a --docs flag names: "report", "tuning" or "FIRST-LAST";
-- returns first, last or raises an error naming the flag's forms.
function protocol.docs_range(spec, who)
    local r = spec == "report" and protocol.REPORT or spec == "tuning" and protocol.TUNING or nil
    local first, last = r and r.first, r and r.last
    if not r then
        first, last = tostring(spec):match("^(%d+)%-(%d+)$")
        first, last = tonumber(first), tonumber(last)
    end
    if not first or last < first then
        error(("%s: --docs is report, tuning or FIRST-LAST (seeds), not %s"):format(who, tostring(spec)), 0)
    end
    return first, last
end

-- p for a document of n tokens at 1/fraction.
function protocol.p_of(n, fraction)
    return math.max(16, math.floor(n / (fraction or protocol.SETTINGS.fraction) + 0.5))
end

-- The selfstudy.lua arguments of the README's run on one document
-- (corpus_tokens: the document's own tokens, for the chunk sizes); opts
-- overrides any of SETTINGS, plus seed and threads.
function protocol.selfstudy_args(model, doc, corpus_tokens, p, opts)
    local s = {}
    for k, v in pairs(protocol.SETTINGS) do s[k] = v end
    for k, v in pairs(opts or {}) do s[k] = v end
    local quarter = math.floor(corpus_tokens / 4)
    local args = { "--model", model, "--corpus", doc, "--p", p, "--lr", s.lr, "--steps", s.conversations / s.accum,
        "--accum", s.accum, "--chunk-min", quarter, "--chunk-max", 2 * quarter, "--max-q", s.max_q, "--max-a",
        s.max_a, "--seeds", s.seeds, "--turns", s.turns, "--init", s.init }
    if s.seed then args[#args + 1], args[#args + 2] = "--seed", s.seed end
    if s.threads then args[#args + 1], args[#args + 2] = "--threads", s.threads end
    return args
end

-- Runs selfstudy.lua with args plus --save save, as its own process (its
-- output to save .. ".log"); raises an error with the log's tail if it fails.
function protocol.run_selfstudy(args, save)
    local cartridge = require("cartridge")
    local host = package.loaded["cartridge.host"]
    local exe = host and host.executable or (cartridge.root .. "/build/cartridge")
    local argv = { exe, "run", cartridge.root .. "/recipes/selfstudy.lua" }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    argv[#argv + 1], argv[#argv + 2] = "--save", save
    local status = require("cartridge.proc").run(argv, { stdout = save .. ".log", stderr = save .. ".log" })
    if status ~= 0 then
        local cmd = table.concat(argv, " ")
        local f = io.open(save .. ".log", "rb")
        local log = f and f:read("*a") or ""
        if f then f:close() end
        error(("self-study failed (%s):\n%s"):format(cmd, log:sub(-2000)), 0)
    end
    return save
end

-- Student's t quantile for a two-sided 95% interval with df degrees of
-- freedom (a table to 30, 1.96 beyond).
local T975 = { 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
    2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042 }
function protocol.t975(df) return T975[df] or 1.96 end

-- Mean, min, max and the 95% interval's half-width of a list of numbers
-- (the half-width is nil for fewer than two).
function protocol.summary(xs)
    local n, sum, lo, hi = #xs, 0, math.huge, -math.huge
    for _, x in ipairs(xs) do sum, lo, hi = sum + x, math.min(lo, x), math.max(hi, x) end
    local mean = sum / n
    if n < 2 then return { mean = mean, min = lo, max = hi, n = n } end
    local ss = 0
    for _, x in ipairs(xs) do ss = ss + (x - mean) ^ 2 end
    return { mean = mean, min = lo, max = hi, n = n, half = protocol.t975(n - 1) * math.sqrt(ss / (n - 1) / n) }
end

return protocol
