-- cartridge.bpe: learning a byte-level BPE vocabulary (GPT-2 style, as
-- llama.cpp's "gpt2" tokenizer model reads it) from sample text.
--
--   local bpe = require("cartridge.bpe")
--   local v = bpe.train({ text1, text2, ... }, 1500)   -- up to 1500 merges
--   v.tokens  -- 256 byte symbols, then one token per merge, in merge order
--   v.merges  -- { "Ġ t", "Ġt he", ... } in GPT-2's printable-byte form
--
-- Training splits text into words as a GPT-2 pre-tokenizer does (an
-- optional leading space and a run of letters, single digits, runs of other
-- symbols, whitespace), counts them, and merges the most frequent adjacent
-- pair of symbols until n merges are made or no pair occurs twice; ties go to
-- the pair that sorts first, so the same text gives the same vocabulary. The
-- split only decides which merges are worth learning: the engine's tokenizer
-- applies them within its own pre-tokenizer's pieces when it encodes.

local bpe = {}

-- GPT-2's byte -> printable-unicode mapping: bytes that are not printable
-- Latin-1 characters are shifted to U+0100 and up. symbols[b + 1] is the
-- UTF-8 text of byte b's symbol.
function bpe.byte_symbols()
    local printable, symbols = {}, {}
    for b = 33, 126 do printable[b] = true end
    for b = 161, 172 do printable[b] = true end
    for b = 174, 255 do printable[b] = true end
    local extra = 0
    for b = 0, 255 do
        local cp = b
        if not printable[b] then
            cp = 256 + extra
            extra = extra + 1
        end
        if cp < 0x80 then symbols[b + 1] = string.char(cp)
        else symbols[b + 1] = string.char(0xc0 + math.floor(cp / 64), 0x80 + cp % 64) end
    end
    return symbols
end

-- The words of a text as a GPT-2-style pre-tokenizer cuts them.
local function words(text, counts)
    local i, n = 1, #text
    while i <= n do
        local s, e = text:find("^ ?%a+", i)
        if not s then s, e = text:find("^%d", i) end
        if not s then s, e = text:find("^ ?[^%s%w]+", i) end
        if not s then s, e = text:find("^%s+", i) end
        if not s then s, e = i, i end
        local w = text:sub(s, e)
        counts[w] = (counts[w] or 0) + 1
        i = e + 1
    end
end

-- Merges the most frequent adjacent pair of symbols of `list` ({ s = the
-- symbols of a distinct word, c = its count }, changed in place) n_merges
-- times, or until no pair occurs min_count times; ties go to the pair that
-- sorts first. Returns the merges, "left right", in order.
function bpe.learn(list, n_merges, min_count)
    local merges = {}
    for _ = 1, n_merges do
        local pairs_count = {}
        for _, item in ipairs(list) do
            local s = item.s
            for k = 1, #s - 1 do
                local key = s[k] .. " " .. s[k + 1]
                pairs_count[key] = (pairs_count[key] or 0) + item.c
            end
        end
        local best, best_n = nil, min_count - 1
        for key, c in pairs(pairs_count) do
            if c > best_n or (c == best_n and best and key < best) then best, best_n = key, c end
        end
        if not best then break end
        local left, right = best:match("^(.-) (.*)$")
        local joined = left .. right
        merges[#merges + 1] = best
        for _, item in ipairs(list) do
            local s, out, k = item.s, {}, 1
            local changed = false
            while k <= #s do
                if k < #s and s[k] == left and s[k + 1] == right then
                    out[#out + 1] = joined
                    k = k + 2
                    changed = true
                else
                    out[#out + 1] = s[k]
                    k = k + 1
                end
            end
            if changed then item.s = out end
        end
    end
    return merges
end

function bpe.train(texts, n_merges)
    local sym = bpe.byte_symbols()
    local counts = {}
    for _, t in ipairs(texts) do words(t, counts) end
    -- each distinct word as a list of symbols, with its count
    local list = {}
    for w, c in pairs(counts) do
        local s = {}
        for k = 1, #w do s[k] = sym[w:byte(k) + 1] end
        list[#list + 1] = { s = s, c = c, w = w }
    end
    table.sort(list, function(a, b) return a.w < b.w end)
    local tokens, have = {}, {}
    for b = 1, 256 do tokens[b], have[sym[b]] = sym[b], true end
    local merges = bpe.learn(list, n_merges, 2)
    for _, m in ipairs(merges) do
        local joined = m:gsub(" ", "", 1)
        if not have[joined] then -- two splits of one string make one token
            tokens[#tokens + 1], have[joined] = joined, true
        end
    end
    return { tokens = tokens, merges = merges }
end

return bpe
