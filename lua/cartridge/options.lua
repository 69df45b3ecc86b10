--- cartridge.options: command-line flags for recipes.
--
-- A recipe declares its flags and positional arguments once, at the top:
--
--     local options = require("cartridge.options")
--     local opts = options.parse(arg, {
--         summary = "Print a GGUF or safetensors file's metadata and tensor table.",
--         usage = "cartridge run inspect FILE [--json]",          -- optional
--         positional = {
--             { "file", help = "GGUF or .safetensors file", required = true },
--         },
--         flags = {
--             { "max-array", type = "int", default = 8, help = "array elements shown per value" },
--             { "corpus", type = "string", repeatable = true, help = "a text file; repeat for more" },
--             { "json", type = "boolean", help = "print JSON instead of a table" },
--         },
--     })
--     -- opts.file, opts.max_array (8 unless given), opts.corpus ({} unless given), opts.json
--
-- API
--   options.parse(argv, spec) -> opts
--       argv is the `arg` table (argv[0] names the script) or any list of strings.
--       On a bad command line raises error("<name>: <what went wrong> (see --help)", 0),
--       which the host prints as "cartridge: <message>" with exit status 1.
--       On --help or -h writes the help text to stdout and calls os.exit(0).
--   options.try_parse(argv, spec) -> opts | nil, err | nil, nil, help_text
--       The same without raising or exiting: for tests and for callers that want
--       to handle the error themselves. Errors in the spec itself (a programming
--       mistake, not a user's) still raise.
--   options.given(opts, key) -> boolean
--       Whether the flag was on the command line (opts.key then holds the value
--       given, not the default).
--   options.help(spec, name) -> string
--       The help text --help prints.
--
-- The spec
--   name        the name used in messages; default: argv[0]'s file name without ".lua"
--   summary     one line saying what the recipe does
--   usage       the usage line; default: generated from the positionals
--   positional  list of { "name", help = "...", required = bool, type = "string"|"int"|"number",
--               default = value, repeatable = bool (last one only: collects the rest) }
--   flags       list of { "name", type = "string"|"int"|"number"|"boolean" (default "string"),
--               default = value, help = "...", repeatable = bool, choices = { "a", "b" },
--               metavar = "N" (the placeholder shown in the help) }
--
-- Rules
--   * Keys: dashes in names become underscores: --max-array -> opts.max_array. On the
--     command line --max_array is accepted as a spelling of --max-array too.
--   * Values: --flag value or --flag=value. A value that starts with "--" must use the
--     --flag=value form ("--model --json" is a missing value for --model).
--   * boolean: --flag sets true; --flag=true/false (also 1/0, yes/no) set either;
--     --no-flag sets false. Booleans default to false unless the spec says otherwise.
--   * int: base-10 integers only ("8", "-3"); "1.5", "abc", "0x10" are errors.
--     number: anything decimal tonumber accepts ("2e-3", ".5"), but not hex, inf or nan.
--   * repeatable flags collect a list in command-line order (default: {} unless the spec
--     gives one); a non-repeatable flag given twice keeps the last value.
--   * choices: the value must be one of the listed strings.
--   * "--" ends the flags: everything after it is positional. A lone "-" and negative
--     numbers ("-1") are positional; any other "-x" is an unknown flag.
--   * Missing required positionals, extra positionals, unknown flags and missing
--     values are errors. An unknown flag's message lists the valid ones.
local M = {}

-- for each opts table a parse made: the keys of the flags its command line gave
local GIVEN = setmetatable({}, { __mode = "k" })

local TYPES = { string = true, int = true, number = true, boolean = true }
local METAVARS = { string = "STRING", int = "INT", number = "NUMBER" }

-- The key a flag or positional name gets in the result: dashes -> underscores.
local function key_of(name)
    return (name:gsub("-", "_"))
end

local function script_name(argv, spec)
    if spec.name then
        return spec.name
    end
    local path = argv[0]
    if type(path) == "string" and path:match("%.lua$") then
        return path:match("([^/]*)%.lua$")
    end
    return "cartridge"
end

local function describe_default(v)
    if type(v) == "string" then
        return string.format("%q", v)
    elseif type(v) == "table" then
        local parts = {}
        for i = 1, #v do
            parts[i] = describe_default(v[i])
        end
        return "{" .. table.concat(parts, ", ") .. "}"
    end
    return tostring(v)
end

-- Checks the spec once per parse and indexes the flags by name. Mistakes here
-- are the recipe author's, so they raise at the caller's level.
local function compile_spec(spec)
    if type(spec) ~= "table" then
        error("options: the spec must be a table", 3)
    end
    local flags, by_name = {}, {}
    for i, f in ipairs(spec.flags or {}) do
        local name = f[1] or f.name
        if type(name) ~= "string" or not name:match("^[%w][%w_-]*$") then
            error(string.format("options: flag #%d needs a name like \"max-array\"", i), 3)
        end
        local canonical = name:gsub("_", "-")
        local ftype = f.type or "string"
        if not TYPES[ftype] then
            error(string.format("options: flag --%s has unknown type %q (string, int, number, boolean)",
                name, tostring(ftype)), 3)
        end
        if canonical == "help" or by_name[canonical] then
            error(string.format("options: flag --%s is declared twice (or is the built-in --help)", name), 3)
        end
        if ftype == "boolean" and f.repeatable then
            error(string.format("options: boolean flag --%s cannot be repeatable", name), 3)
        end
        local flag = {
            name = name,
            key = key_of(name),
            type = ftype,
            default = f.default,
            help = f.help or "",
            repeatable = f.repeatable and true or false,
            choices = f.choices,
            metavar = f.metavar or METAVARS[ftype],
        }
        flags[#flags + 1] = flag
        by_name[canonical] = flag
    end
    local positional = {}
    for i, p in ipairs(spec.positional or {}) do
        local name = p[1] or p.name
        if type(name) ~= "string" then
            error(string.format("options: positional #%d needs a name", i), 3)
        end
        local ptype = p.type or "string"
        if ptype == "boolean" or not TYPES[ptype] then
            error(string.format("options: positional %s has unsupported type %q", name, tostring(ptype)), 3)
        end
        if p.repeatable and i ~= #spec.positional then
            error(string.format("options: only the last positional can be repeatable (%s is not last)", name), 3)
        end
        positional[i] = {
            name = name,
            key = key_of(name),
            type = ptype,
            default = p.default,
            help = p.help or "",
            required = p.required and true or false,
            repeatable = p.repeatable and true or false,
            metavar = p.metavar or name:upper():gsub("-", "_"),
        }
    end
    return { flags = flags, by_name = by_name, positional = positional }
end

local function positional_synopsis(c)
    local parts = {}
    for _, p in ipairs(c.positional) do
        local s = p.metavar .. (p.repeatable and "..." or "")
        parts[#parts + 1] = p.required and s or ("[" .. s .. "]")
    end
    return table.concat(parts, " ")
end

local function usage_line(spec, c, name)
    if spec.usage then
        return spec.usage
    end
    -- one form for every recipe: the path as a user types it, positionals, flags
    local line = "cartridge run recipes/" .. name .. ".lua"
    local pos = positional_synopsis(c)
    if pos ~= "" then
        line = line .. " " .. pos
    end
    return line .. " [FLAGS]"
end

local function help_text(spec, c, name)
    local out = {}
    if spec.summary then
        out[#out + 1] = name .. ": " .. spec.summary
        out[#out + 1] = ""
    end
    out[#out + 1] = "usage: " .. usage_line(spec, c, name)

    -- Two columns: left the flag or argument, right its help; aligned.
    local rows = {}
    local function add(section, left, right)
        rows[#rows + 1] = { section = section, left = left, right = right }
    end
    for _, p in ipairs(c.positional) do
        local notes = {}
        notes[#notes + 1] = p.required and "required" or "optional"
        if p.type ~= "string" then
            notes[#notes + 1] = p.type
        end
        if p.repeatable then
            notes[#notes + 1] = "repeatable"
        end
        if p.default ~= nil then
            notes[#notes + 1] = "default: " .. describe_default(p.default)
        end
        local right = p.help .. (p.help ~= "" and " " or "") .. "(" .. table.concat(notes, ", ") .. ")"
        add("arguments", p.metavar .. (p.repeatable and "..." or ""), right)
    end
    for _, f in ipairs(c.flags) do
        local left = "--" .. f.name
        local notes = {}
        if f.type == "boolean" then
            notes[#notes + 1] = "boolean"
            if f.default == true then
                notes[#notes + 1] = "default: true; --no-" .. f.name .. " turns it off"
            end
        else
            left = left .. " " .. f.metavar
            notes[#notes + 1] = f.type
            if f.choices then
                notes[#notes + 1] = "one of " .. table.concat(f.choices, ", ")
            end
            if f.repeatable then
                notes[#notes + 1] = "repeatable"
            end
            if f.default ~= nil and not (f.repeatable and type(f.default) == "table" and #f.default == 0) then
                notes[#notes + 1] = "default: " .. describe_default(f.default)
            end
        end
        local right = f.help .. (f.help ~= "" and " " or "") .. "(" .. table.concat(notes, "; ") .. ")"
        add("flags", left, right)
    end
    add("flags", "--help, -h", "print this help and exit")

    local width = 0
    for _, r in ipairs(rows) do
        width = math.max(width, #r.left)
    end
    local section
    for _, r in ipairs(rows) do
        if r.section ~= section then
            section = r.section
            out[#out + 1] = ""
            out[#out + 1] = section .. ":"
        end
        out[#out + 1] = "  " .. r.left .. string.rep(" ", width - #r.left + 3) .. r.right
    end
    return table.concat(out, "\n") .. "\n"
end

-- Converts one command-line string to a value of the declared type.
-- Returns value, or nil and the reason (without the script name).
local function convert(what, vtype, raw, choices)
    local value
    if vtype == "string" then
        value = raw
    elseif vtype == "int" then
        if not raw:match("^[+-]?%d+$") then
            return nil, string.format("%s expects an integer, got '%s'", what, raw)
        end
        value = tonumber(raw)
        if math.abs(value) > 2 ^ 53 then
            return nil, string.format("%s: integer '%s' is too large", what, raw)
        end
    elseif vtype == "number" then
        value = tonumber(raw)
        if not raw:match("^[+-]?%.?%d") or raw:match("^[+-]?0[xX]") or raw:match("%s")
            or value == nil or value ~= value or value == math.huge or value == -math.huge then
            return nil, string.format("%s expects a number, got '%s'", what, raw)
        end
    elseif vtype == "boolean" then
        local b = ({ ["true"] = true, ["1"] = true, yes = true,
                     ["false"] = false, ["0"] = false, no = false })[raw:lower()]
        if b == nil then
            return nil, string.format("%s expects true or false, got '%s'", what, raw)
        end
        value = b
    end
    if choices then
        local ok = false
        for _, choice in ipairs(choices) do
            if value == choice then
                ok = true
                break
            end
        end
        if not ok then
            return nil, string.format("%s must be one of %s, got '%s'",
                what, table.concat(choices, ", "), raw)
        end
    end
    return value
end

local function valid_flags(c)
    local names = {}
    for _, f in ipairs(c.flags) do
        names[#names + 1] = "--" .. f.name
    end
    names[#names + 1] = "--help"
    return table.concat(names, ", ")
end

-- "missing argument FILE: a .gguf file": the help says what to pass.
local function missing(p)
    return "missing argument " .. p.metavar .. (p.help ~= "" and (": " .. p.help) or "")
end

local function copy_list(t)
    local out = {}
    for i = 1, #t do
        out[i] = t[i]
    end
    return out
end

-- The flag that the word "--NAME[=VALUE]" names (a boolean's "--no-NAME"
-- too), whether it was negated, NAME as written and VALUE (nil without =);
-- nil flag when the spec has none.
local function find_flag(c, a)
    local fname, value = a:match("^%-%-([^=]+)=(.*)$")
    fname = fname or a:sub(3)
    local canonical = fname:gsub("_", "-")
    local flag = c.by_name[canonical]
    if not flag then
        local base = canonical:match("^no%-(.+)$")
        local f = base and c.by_name[base]
        if f and f.type == "boolean" and value == nil then return f, true, fname, value end
    end
    return flag, false, fname, value
end

-- The value of flag at argv[i] (its =VALUE, else the next word for a
-- non-boolean); returns v, the index of the last word used, or nil, message.
local function flag_value(flag, negated, value, argv, i)
    local what = "--" .. flag.name
    if flag.type == "boolean" then
        if negated then return false, i end
        if value == nil then return true, i end
        local v, err = convert(what, "boolean", value)
        if err then return nil, err end
        return v, i
    end
    if value == nil then
        local nxt = argv[i + 1]
        if nxt == nil or (type(nxt) == "string" and nxt:match("^%-%-")) then
            return nil, string.format("missing value for %s (expects %s %s)", what,
                flag.type == "int" and "an" or "a", flag.type == "int" and "integer" or flag.type)
        end
        value, i = nxt, i + 1
    end
    local v, err = convert(what, flag.type, value, flag.choices)
    if err then return nil, err end
    return v, i
end

-- argv's words: the positional words in order and the flags' values by key
-- (a list each); nil, message on a bad word; nil, nil, true on --help.
local function scan_argv(argv, c)
    local seen, words = {}, {}
    local flags_done = false
    local i, n = 1, #argv
    while i <= n do
        local a = argv[i]
        if type(a) ~= "string" then
            error(string.format("options: argument #%d is a %s, not a string", i, type(a)), 3)
        end
        if flags_done or a == "-" or not a:match("^%-") or tonumber(a) then
            words[#words + 1] = a
        elseif a == "--" then
            flags_done = true
        elseif a == "--help" or a == "-h" then
            return nil, nil, true
        elseif a:match("^%-%-.") then
            local flag, negated, fname, value = find_flag(c, a)
            if not flag then
                return nil, string.format("unknown flag --%s; valid flags: %s", fname, valid_flags(c))
            end
            local v, last = flag_value(flag, negated, value, argv, i)
            if v == nil then return nil, last end
            i = last
            if flag.repeatable then
                seen[flag.key] = seen[flag.key] or {}
                local list = seen[flag.key]
                list[#list + 1] = v
            else
                seen[flag.key] = { v }
            end
        else
            return nil, string.format("unknown flag %s; valid flags: %s", a, valid_flags(c))
        end
        i = i + 1
    end
    return words, seen
end

-- opts' flags: the given values, else the defaults.
local function set_flags(opts, c, seen)
    local given_keys = {}
    for key in pairs(seen) do given_keys[key] = true end
    GIVEN[opts] = given_keys
    for _, f in ipairs(c.flags) do
        local given = seen[f.key]
        if f.repeatable then
            if given then
                opts[f.key] = given
            elseif type(f.default) == "table" then
                opts[f.key] = copy_list(f.default)
            elseif f.default ~= nil then
                opts[f.key] = { f.default }
            else
                opts[f.key] = {}
            end
        elseif given then
            opts[f.key] = given[1]
        elseif f.type == "boolean" then
            opts[f.key] = f.default == true
        else
            opts[f.key] = f.default
        end
    end
end

-- opts' positionals from the words, in order; nil, message when one is
-- missing, bad or left over.
local function set_positionals(opts, c, words)
    local w = 1
    for _, p in ipairs(c.positional) do
        if p.repeatable then
            local list = {}
            while w <= #words do
                local v, err = convert(p.metavar, p.type, words[w])
                if err then return nil, err end
                list[#list + 1] = v
                w = w + 1
            end
            if p.required and #list == 0 then return nil, missing(p) end
            opts[p.key] = list
        elseif words[w] ~= nil then
            local v, err = convert(p.metavar, p.type, words[w])
            if err then return nil, err end
            opts[p.key] = v
            w = w + 1
        elseif p.required then
            return nil, missing(p)
        else
            opts[p.key] = p.default
        end
    end
    if w <= #words then
        local takes = positional_synopsis(c)
        return nil, string.format("unexpected argument '%s' (%s)", words[w],
            takes == "" and "this script takes no positional arguments" or ("arguments: " .. takes))
    end
    return opts
end

--- Parses argv against spec without raising or exiting.
-- Returns opts on success; nil, message on a bad command line (message starts
-- with the script name and ends with "(see --help)"); nil, nil, help_text when
-- argv asks for --help or -h.
function M.try_parse(argv, spec)
    argv = argv or {}
    local c = compile_spec(spec)
    local name = script_name(argv, spec)
    local words, seen, help = scan_argv(argv, c)
    if help then return nil, nil, help_text(spec, c, name) end
    if not words then return nil, name .. ": " .. seen .. " (see --help)" end
    local opts = {}
    set_flags(opts, c, seen)
    local ok, err = set_positionals(opts, c, words)
    if not ok then return nil, name .. ": " .. err .. " (see --help)" end
    return opts
end

--- True when the flag `key` (as opts names it: "frozen", "max_q") was on
-- the command line of the parse that made opts, false when opts holds its
-- default.
function M.given(opts, key)
    local keys = GIVEN[opts]
    return keys ~= nil and keys[key] == true
end

--- Parses argv against spec; see the top of this file.
-- Raises error(message, 0) on a bad command line; prints the help and exits 0
-- on --help or -h.
function M.parse(argv, spec)
    local opts, err, help = M.try_parse(argv, spec)
    if help then
        io.stdout:write(help)
        io.stdout:flush()
        os.exit(0)
    end
    if not opts then
        error(err, 0)
    end
    return opts
end

--- The help text for spec, as --help prints it. name defaults to "cartridge".
function M.help(spec, name)
    local c = compile_spec(spec)
    return help_text(spec, c, name or spec.name or "cartridge")
end

return M
