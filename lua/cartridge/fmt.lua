-- cartridge.fmt: small formatting helpers shared by recipes.

local fmt = {}

-- 1234567 -> "1,234,567" (integers; other numbers are printed with %g).
function fmt.int(n)
    n = tonumber(n)
    if n ~= math.floor(n) then return ("%g"):format(n) end
    local s = ("%d"):format(n)
    local sign, digits = s:match("^(-?)(%d+)$")
    digits = digits:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
    return sign .. digits
end

-- A byte count with a binary unit: "1.13 MiB".
function fmt.bytes(n)
    n = tonumber(n)
    local units = { "B", "KiB", "MiB", "GiB", "TiB" }
    local i = 1
    while n >= 1024 and i < #units do
        n = n / 1024
        i = i + 1
    end
    if i == 1 then return ("%d B"):format(n) end
    return ("%.2f %s"):format(n, units[i])
end

-- {512, 64} -> "[512, 64]"
function fmt.shape(shape)
    local parts = {}
    for i, d in ipairs(shape) do parts[i] = tostring(d) end
    return "[" .. table.concat(parts, ", ") .. "]"
end

-- A Lua string as a double-quoted literal with control characters escaped,
-- cut to `max` bytes (with "..." appended) when longer.
function fmt.quote(s, max)
    local cut = false
    if max and #s > max then
        s = s:sub(1, max)
        cut = true
    end
    s = s:gsub('[%c"\\]', function(c)
        local named = { ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r", ['"'] = '\\"', ["\\"] = "\\\\" }
        return named[c] or ("\\x%02x"):format(c:byte())
    end)
    return '"' .. s .. '"' .. (cut and "..." or "")
end

-- Pads s with spaces to width w (left-aligned; right-aligned when right).
function fmt.pad(s, w, right)
    s = tostring(s)
    if #s >= w then return s end
    if right then return (" "):rep(w - #s) .. s end
    return s .. (" "):rep(w - #s)
end

return fmt
