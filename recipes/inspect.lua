-- inspect.lua: print a GGUF's or a safetensors file's metadata and tensor table.
--
--   cartridge run recipes/inspect.lua ../shared/models/stories260K.gguf
--   cartridge run recipes/inspect.lua cart.safetensors --max-array 4
--
-- Shapes are row-major (outermost first) for both formats, so a GGUF matrix
-- with GGML dims ne = {64, 512} prints as [512, 64].

local cartridge = require("cartridge")
local options = require("cartridge.options")
local fmt = require("cartridge.fmt")

local opts = options.parse(arg, {
    usage = "cartridge run recipes/inspect.lua FILE [FLAGS]",
    summary = "Print a GGUF or safetensors file's metadata and tensor table.",
    positional = { { "file", help = "a .gguf or .safetensors file", required = true } },
    flags = {
        { "max-array", type = "int", default = 8, help = "array elements shown per metadata value" },
        { "max-string", type = "int", default = 72, help = "bytes shown per string value" },
        { "tensors", type = "boolean", default = true, help = "print the tensor table (--tensors=false hides it)" },
    },
})

-- "GGUF" magic, else safetensors (an 8-byte header length then '{').
local function detect_format(path)
    local f, err = io.open(path, "rb")
    if not f then error("inspect: cannot open " .. path .. ": " .. tostring(err), 0) end
    local head = f:read(9) or ""
    f:close()
    if head:sub(1, 4) == "GGUF" then return "gguf" end
    if #head == 9 and head:sub(9, 9) == "{" then return "safetensors" end
    error(("inspect: %s is neither GGUF (magic 'GGUF') nor safetensors (8-byte length, then '{'); "
        .. "its first bytes are %s"):format(path, fmt.quote(head:sub(1, 8))), 0)
end

-- float32 values print with the 9 digits that identify a float32, not 17.
local function show_value(v, float32)
    if type(v) == "string" then return fmt.quote(v, opts.max_string) end
    if type(v) == "number" and float32 then return ("%.9g"):format(v) end
    if type(v) ~= "table" then return tostring(v) end
    local parts = {}
    for i = 1, math.min(#v, opts.max_array) do parts[i] = show_value(v[i], float32) end
    if #v > opts.max_array then parts[#parts + 1] = ("... %s more"):format(fmt.int(#v - opts.max_array)) end
    return "[" .. table.concat(parts, ", ") .. "]"
end

-- Prints rows (lists of cells) as aligned columns; `right` marks right-aligned columns.
local function print_table(header, rows, right)
    local widths = {}
    for c, h in ipairs(header) do widths[c] = #h end
    for _, row in ipairs(rows) do
        for c, cell in ipairs(row) do widths[c] = math.max(widths[c], #cell) end
    end
    local function line(cells)
        local out = {}
        for c, cell in ipairs(cells) do out[c] = fmt.pad(cell, widths[c], right[c]) end
        print("  " .. table.concat(out, "  "):gsub("%s+$", ""))
    end
    line(header)
    for _, row in ipairs(rows) do line(row) end
end

local function print_tensors(tensors)
    local rows, params, bytes = {}, 0, 0
    for _, t in ipairs(tensors) do
        rows[#rows + 1] = { t.name, t.dtype_name, fmt.shape(t.shape), fmt.int(t.nbytes) }
        params = params + t.numel
        bytes = bytes + t.nbytes
    end
    print(("tensors: %d, %s parameters, %s (%s bytes)"):format(#tensors, fmt.int(params),
        fmt.bytes(bytes), fmt.int(bytes)))
    if opts.tensors then print_table({ "name", "dtype", "shape", "bytes" }, rows, { [4] = true }) end
end

local function inspect_gguf(path)
    local g = cartridge.gguf.open(path)
    print(("%s: GGUF v%d, %s bytes, alignment %d, tensor data at offset %s"):format(path,
        g.version, fmt.int(g.file_size), g.alignment, fmt.int(g.data_offset)))
    local meta = g:metadata()
    print(("metadata: %d keys"):format(#meta))
    local rows = {}
    for _, kv in ipairs(meta) do rows[#rows + 1] = { kv.key, kv.type, show_value(kv.value, kv.type:find("float32", 1, true)) } end
    print_table({ "key", "type", "value" }, rows, {})
    print_tensors(g:tensors())
    g:close()
end

local function inspect_safetensors(path)
    local f = cartridge.safetensors.open(path)
    local size = 8 + f.header_size
    local tensors = f:tensors()
    for _, t in ipairs(tensors) do size = size + t.nbytes end
    print(("%s: safetensors, %s bytes, header %s bytes"):format(path, fmt.int(size),
        fmt.int(f.header_size)))
    print(("metadata: %d keys"):format(#f.metadata_keys))
    local rows = {}
    for _, k in ipairs(f.metadata_keys) do rows[#rows + 1] = { k, show_value(f.metadata[k]) } end
    if #rows > 0 then print_table({ "key", "value" }, rows, {}) end
    print_tensors(tensors)
    f:close()
end

local path = opts.file
if detect_format(path) == "gguf" then
    inspect_gguf(path)
else
    inspect_safetensors(path)
end
