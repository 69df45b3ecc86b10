-- cartridge.json: JSON encoding and strict decoding in plain Lua.
--
--   json.encode({ ids = { 1, 2 }, text = "hi" })   --> {"ids":[1,2],"text":"hi"}
--   json.decode('{"a":[1,true,null]}')             --> { a = { 1, true, json.null } }
--
-- Encoding: tables with keys 1..n (n >= 1) are arrays, other tables objects
-- with keys sorted (so output is deterministic) -- or, with
-- json.encode(v, { ordered = true }), in the order a decoded object's keys
-- had in its source (sorted for tables built in Lua); { python = true } adds
-- Python json.dumps's default separators ", " and ": " to that order, which
-- is how a Hugging Face chat template's tojson writes tools into a prompt; json.array({}) marks an empty
-- table as [] and json.object({}) as {}. Strings are written as UTF-8 with
-- control characters, quotes and backslashes escaped; integers without a
-- decimal point; other numbers in the shortest of 15-17 digits that reads back exactly; nan/inf raise.
--
-- Decoding (RFC 8259): raises "json: <what> at byte N" on anything malformed,
-- including ill-formed UTF-8, trailing garbage, invalid escapes, unpaired surrogates, depth
-- beyond 200 and duplicate keys are kept last-wins. null decodes to json.null
-- (a unique value) so that arrays keep their length. json.kind(v) tells a
-- decoded [] from {} ("array", "object", "string", "number", "boolean",
-- "null"). A number whose text does not survive the conversion to a double
-- (beyond 2^53 in magnitude, or so large it reads as infinity) keeps its
-- source text, which json.number_text(container, key) returns, so that an
-- error message can quote what the client sent.
--
-- Why not cJSON, which the engine links for safetensors headers: cJSON 1.7
-- accepts what RFC 8259 forbids (01, 1., raw bytes that are not UTF-8) and
-- keeps only a double of each number (1e400 reads as inf, 2^53 + 1 as 2^53),
-- so a request parsed by it could not be refused, or quoted, as this parser
-- does. tests/lua/json_spec.lua holds the cases; tests/fuzz/fuzz_request
-- fuzzes it through the server's request path.

local json = {}

json.null = setmetatable({}, { __tostring = function() return "null" end })

local ARRAY, OBJECT = {}, {}
local kind_of = setmetatable({}, { __mode = "k" })
local key_order = setmetatable({}, { __mode = "k" }) -- decoded object -> its keys as they came

function json.array(t)
    t = t or {}
    kind_of[t] = ARRAY
    return t
end

function json.object(t)
    t = t or {}
    kind_of[t] = OBJECT
    return t
end

local escapes = {
    ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
    ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}

local function encode_string(s)
    return '"' .. s:gsub('[%c"\\]', function(c)
        return escapes[c] or ("\\u%04x"):format(c:byte())
    end) .. '"'
end

local function is_array(t)
    local mark = kind_of[t]
    if mark then return mark == ARRAY end
    local n = #t
    if n == 0 then return false end
    local count = 0
    for _ in pairs(t) do count = count + 1 end
    return count == n
end

local encode_value

-- style: nil (sorted, compact) or { ordered, comma, colon }
local function encode_table(t, out, depth, py)
    if depth > 200 then error("json.encode: nesting deeper than 200", 0) end
    local comma, colon = py and py.comma or ",", py and py.colon or ":"
    if is_array(t) then
        out[#out + 1] = "["
        for i = 1, #t do
            if i > 1 then out[#out + 1] = comma end
            encode_value(t[i], out, depth + 1, py)
        end
        out[#out + 1] = "]"
        return
    end
    local keys = {}
    for k in pairs(t) do
        if type(k) ~= "string" then
            error("json.encode: object key " .. tostring(k) .. " is not a string", 0)
        end
        keys[#keys + 1] = k
    end
    local order = py and py.ordered and key_order[t]
    if order then
        local rank = {}
        for i, k in ipairs(order) do rank[k] = rank[k] or i end
        table.sort(keys, function(a, b)
            local ra, rb = rank[a] or math.huge, rank[b] or math.huge
            if ra ~= rb then return ra < rb end
            return a < b
        end)
    else
        table.sort(keys)
    end
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = comma end
        out[#out + 1] = encode_string(k)
        out[#out + 1] = colon
        encode_value(t[k], out, depth + 1, py)
    end
    out[#out + 1] = "}"
end

function encode_value(v, out, depth, py)
    local t = type(v)
    if v == json.null or v == nil then
        out[#out + 1] = "null"
    elseif t == "boolean" then
        out[#out + 1] = v and "true" or "false"
    elseif t == "number" then
        if v ~= v or v == math.huge or v == -math.huge then
            error("json.encode: cannot encode " .. tostring(v), 0)
        end
        if v == math.floor(v) and math.abs(v) < 2 ^ 53 then
            out[#out + 1] = ("%d"):format(v)
        else
            local text
            for digits = 15, 17 do -- the shortest form that reads back exactly
                text = ("%." .. digits .. "g"):format(v)
                if tonumber(text) == v then break end
            end
            out[#out + 1] = text
        end
    elseif t == "string" then
        out[#out + 1] = encode_string(v)
    elseif t == "table" then
        encode_table(v, out, depth, py)
    elseif t == "cdata" and tonumber(v) then
        out[#out + 1] = tostring(tonumber(v))
    else
        error("json.encode: cannot encode a " .. t, 0)
    end
end

-- Where a decoded value holds a number no JSON text can (1e999 reads as
-- infinity, and json.encode would refuse it): its path below v as
-- ".key[index]..." (indices from 0), or nil when every number is finite.
function json.nonfinite_at(v)
    if type(v) == "number" then
        if v ~= v or v == math.huge or v == -math.huge then return "" end
    elseif type(v) == "table" then
        for k, x in pairs(v) do
            local at = json.nonfinite_at(x)
            if at then return (type(k) == "number" and ("[%d]"):format(k - 1) or "." .. tostring(k)) .. at end
        end
    end
    return nil
end

function json.encode(v, opts)
    local out = {}
    local style = false
    if opts and opts.python then style = { ordered = true, comma = ", ", colon = ": " }
    elseif opts and opts.ordered then style = { ordered = true, comma = ",", colon = ":" } end
    encode_value(v, out, 0, style)
    return table.concat(out)
end

-- ---------------------------------------------------------------------------

local function fail(what, pos)
    error(("json: %s at byte %d"):format(what, pos), 0)
end

local function skip_ws(s, pos)
    return s:find("[^ \t\r\n]", pos) or #s + 1
end

local function utf8_char(cp)
    if cp < 0x80 then return string.char(cp) end
    if cp < 0x800 then return string.char(0xc0 + math.floor(cp / 64), 0x80 + cp % 64) end
    if cp < 0x10000 then
        return string.char(0xe0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
    end
    return string.char(0xf0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64,
        0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local decode_value

local function decode_string(s, pos)
    -- pos is at the opening quote
    local parts, i = {}, pos + 1
    while true do
        -- %c would also stop at DEL (0x7f), which RFC 8259 lets a string hold as it is
        local j = s:find('["\\%z\1-\31]', i)
        if not j then fail("unterminated string", pos) end
        parts[#parts + 1] = s:sub(i, j - 1)
        local c = s:sub(j, j)
        if c == '"' then return table.concat(parts), j + 1 end
        if c ~= "\\" then fail("control character in string", j) end
        local e = s:sub(j + 1, j + 1)
        if e == "u" then
            local hex = s:sub(j + 2, j + 5)
            if not hex:match("^%x%x%x%x$") then fail("bad \\u escape", j) end
            local cp = tonumber(hex, 16)
            local next_i = j + 6
            if cp >= 0xd800 and cp <= 0xdbff then
                local lo = s:match("^\\u(%x%x%x%x)", next_i)
                local low = lo and tonumber(lo, 16)
                if not low or low < 0xdc00 or low > 0xdfff then fail("unpaired surrogate", j) end
                cp = 0x10000 + (cp - 0xd800) * 0x400 + (low - 0xdc00)
                next_i = next_i + 6
            elseif cp >= 0xdc00 and cp <= 0xdfff then
                fail("unpaired surrogate", j)
            end
            parts[#parts + 1] = utf8_char(cp)
            i = next_i
        else
            local map = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
            if not map[e] then fail("bad escape \\" .. e, j) end
            parts[#parts + 1] = map[e]
            i = j + 2
        end
    end
end

-- container -> { key -> source text } for the numbers a double cannot hold.
local number_texts = setmetatable({}, { __mode = "k" })

function json.number_text(t, key)
    local texts = number_texts[t]
    return texts and texts[key]
end

function json.kind(v)
    if v == json.null or v == nil then return "null" end
    local t = type(v)
    if t == "table" then return is_array(v) and "array" or "object" end
    return t
end

local function keep_text(t, key, v, text)
    local texts = number_texts[t]
    if text and (v ~= v or math.abs(v) >= 2 ^ 53) then
        if not texts then
            texts = {}
            number_texts[t] = texts
        end
        texts[key] = text
    elseif texts then
        texts[key] = nil -- a duplicate key: the last value wins
    end
end

local function decode_number(s, pos)
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or not num:match("^-?0$") and not num:match("^-?[1-9]") and not num:match("^-?0[.eE]") then
        fail("bad number", pos)
    end
    if not num:match("^-?%d+$") and not num:match("^-?%d+%.%d+$") and not num:match("^-?%d+%.%d+[eE][-+]?%d+$")
        and not num:match("^-?%d+[eE][-+]?%d+$") then
        fail("bad number", pos)
    end
    local v = tonumber(num)
    if v == nil then
        -- LuaJIT reads no number at all when the exponent has too many
        -- digits: the value is 0 (a negative exponent or a zero mantissa),
        -- else infinite, as a double would hold it
        local neg, mantissa, exp_sign = num:match("^(-?)([%d.]+)[eE]([-+]?)")
        v = (exp_sign == "-" or not mantissa:find("[1-9]")) and 0 or math.huge
        if neg == "-" then v = -v end
    end
    return v, pos + #num, num
end

-- depth: the containers around this value; at most 200 may be open at once
function decode_value(s, pos, depth)
    pos = skip_ws(s, pos)
    local c = s:sub(pos, pos)
    if (c == "{" or c == "[") and depth >= 200 then fail("nesting deeper than 200", pos) end
    if c == "{" then
        local obj, order = json.object({}), {}
        key_order[obj] = order
        pos = skip_ws(s, pos + 1)
        if s:sub(pos, pos) == "}" then return obj, pos + 1 end
        while true do
            if s:sub(pos, pos) ~= '"' then fail("expected a string key", pos) end
            local key
            key, pos = decode_string(s, pos)
            pos = skip_ws(s, pos)
            if s:sub(pos, pos) ~= ":" then fail("expected ':'", pos) end
            local v, text
            v, pos, text = decode_value(s, pos + 1, depth + 1)
            obj[key] = v
            order[#order + 1] = key
            keep_text(obj, key, v, text)
            pos = skip_ws(s, pos)
            local d = s:sub(pos, pos)
            if d == "}" then return obj, pos + 1 end
            if d ~= "," then fail("expected ',' or '}'", pos) end
            pos = skip_ws(s, pos + 1)
        end
    elseif c == "[" then
        local arr, n = json.array({}), 0
        pos = skip_ws(s, pos + 1)
        if s:sub(pos, pos) == "]" then return arr, pos + 1 end
        while true do
            n = n + 1
            local v, text
            v, pos, text = decode_value(s, pos, depth + 1)
            arr[n] = v
            keep_text(arr, n, v, text)
            pos = skip_ws(s, pos)
            local d = s:sub(pos, pos)
            if d == "]" then return arr, pos + 1 end
            if d ~= "," then fail("expected ',' or ']'", pos) end
            pos = pos + 1
        end
    elseif c == '"' then
        return decode_string(s, pos)
    elseif c == "-" or c:match("%d") then
        return decode_number(s, pos)
    elseif s:sub(pos, pos + 3) == "true" then
        return true, pos + 4
    elseif s:sub(pos, pos + 4) == "false" then
        return false, pos + 5
    elseif s:sub(pos, pos + 3) == "null" then
        return json.null, pos + 4
    end
    if c == "" then fail("unexpected end of input", pos) end
    fail("unexpected character '" .. c .. "'", pos)
end

local utf8_invalid_offset
function json.decode(s)
    if type(s) ~= "string" then error("json.decode: expected a string, got " .. type(s), 0) end
    -- JSON text is UTF-8 (RFC 8259 section 8.1): refuse ill-formed bytes
    -- anywhere, as strict parsers do, rather than pass them into strings
    utf8_invalid_offset = utf8_invalid_offset or require("cartridge.core").C.cart_utf8_invalid_offset
    local bad = tonumber(utf8_invalid_offset(s, #s))
    if bad >= 0 then fail(("invalid UTF-8 (byte 0x%02x)"):format(s:byte(bad + 1)), bad + 1) end
    local value, pos = decode_value(s, 1, 0)
    pos = skip_ws(s, pos)
    if pos <= #s then fail("trailing characters", pos) end
    return value
end

return json
