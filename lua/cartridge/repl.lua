--- cartridge.repl: the prompt `cartridge` opens when run without arguments.
--
-- What you type:
--   =expr           prints the value(s) of expr
--   expr            a bare expression is tried as `return expr` first and its
--                   values printed; otherwise the line runs as statements
--   statements      run; a chunk that is incomplete (its compile error ends in
--                   '<eof>') keeps reading lines with the ">> " prompt
--   Ctrl-C          interrupts running code (typed code runs in the interpreter,
--                   so even a runaway loop stops), or drops the lines typed
--                   so far
--   Ctrl-D          (end of input) exits
--   Tab             completes globals, fields (cartridge.mo<Tab>) and methods
--                   (m:for<Tab>) from the live values
--   help(x)         the comment above a function's definition, or a module's
--                   opening comment and fields
--
-- The environment: every chunk runs in one table, the REPL environment, whose
-- __index is _G. Globals you assign (`x = 1`, `function f() end`) land in that
-- table and persist across lines without touching _G; reads fall through to
-- _G, so print, require, string... work as usual and `_G.x = 1` still reaches
-- the real globals. `local x = 1` lasts only for its own chunk, as in lua.c.
-- The environment starts with:
--   cartridge   the engine, require("cartridge") (nil, with a one-line warning,
--               when it does not load)
--   ffi         require("ffi")
--
-- Values print readably: strings quoted, tables one or two levels deep with
-- sorted keys and at most 20 entries each, cdata and anything else through
-- tostring. Errors print their message (CARTRIDGE_TRACEBACK=1 adds the
-- traceback) and the REPL goes on.
--
-- When stdin is a terminal, lines come from libedit's readline() with history
-- in $CARTRIDGE_HISTORY or ~/.cartridge_history, written after every line
-- (skipped silently when it
-- cannot be read or written, or HOME is unset). Otherwise lines come from
-- io.read, with no banner and no prompts, so a pipe can drive it:
--   printf '=1+2\n' | cartridge        --> 3
--
-- For tests and embedding, repl.run(opts) takes:
--   read_line(prompt) -> string | nil   next line without "\n"; nil ends the REPL
--   write(s)                            output: values, banner
--   write_error(s)                      errors and warnings (default: write when
--                                       write is given, else stderr)
--   env                                 the environment table (default: repl.new_env)
--   load_engine() -> engine             default: require("cartridge")
--   banner                              print the banner (default: true on a terminal
--                                       or when read_line is given)
--   history                             history file path, or false for none
-- and returns the environment table when input ends.
local ffi = require("ffi")

local M = {}

local PROMPT, CONTINUE = "> ", ">> "
local MAX_ENTRIES = 20     -- table entries shown per table
local MAX_DEPTH = 2        -- nesting levels shown before "{...}"
local MAX_STRING = 2000    -- bytes of a string shown before "..."
local WIDTH = 80           -- a top-level table longer than this breaks into lines
local HISTORY_LINES = 1000 -- history entries kept

-- ---------------------------------------------------------------------------
-- Formatting values.

local ESCAPES = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

local function quote(s)
    local shown = s
    local suffix = ""
    if #s > MAX_STRING then
        shown = s:sub(1, MAX_STRING)
        suffix = string.format("...(%d bytes)", #s)
    end
    shown = shown:gsub('[%c\\"]', function(ch)
        return ESCAPES[ch] or string.format("\\%03d", ch:byte())
    end)
    return '"' .. shown .. '"' .. suffix
end

local function format_number(v)
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then
        return string.format("%d", v)
    end
    return tostring(v)
end

local KEYWORDS = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or
           repeat return then true until while]]):gmatch("%a+") do
    KEYWORDS[w] = true
end

local TYPE_ORDER = { number = 1, string = 2, boolean = 3 }

local function key_less(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then
        return (TYPE_ORDER[ta] or 4) < (TYPE_ORDER[tb] or 4) or
            ((TYPE_ORDER[ta] or 4) == (TYPE_ORDER[tb] or 4) and ta < tb)
    end
    if ta == "number" or ta == "string" then
        return a < b
    end
    return tostring(a) < tostring(b)
end

local format_value

local function format_key(k, depth, seen)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then
        return k
    end
    return "[" .. format_value(k, depth, seen) .. "]"
end

-- Returns the entries of t as strings ("1", "key = 2"), the array part first,
-- then the other keys sorted; and how many entries were left out.
local function table_entries(t, depth, seen)
    local entries, n = {}, #t
    local keys = {}
    for k in pairs(t) do
        if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then
            keys[#keys + 1] = k
        end
    end
    table.sort(keys, key_less)
    local total = n + #keys
    for i = 1, math.min(n, MAX_ENTRIES) do
        entries[#entries + 1] = format_value(t[i], depth + 1, seen)
    end
    for _, k in ipairs(keys) do
        if #entries >= MAX_ENTRIES then
            break
        end
        entries[#entries + 1] = format_key(k, depth + 1, seen) .. " = " .. format_value(t[k], depth + 1, seen)
    end
    return entries, total - #entries
end

format_value = function(v, depth, seen)
    local tv = type(v)
    if tv == "string" then
        return quote(v)
    elseif tv == "number" then
        return format_number(v)
    elseif tv ~= "table" then
        return tostring(v) -- nil, booleans, functions, cdata (its __tostring when it has one)
    end
    local mt = getmetatable(v)
    if type(mt) == "table" and mt.__tostring then
        return tostring(v)
    end
    if seen[v] then
        return "<cycle>"
    end
    if next(v) == nil then
        return "{}"
    end
    if depth >= MAX_DEPTH then
        return "{...}"
    end
    seen[v] = true
    local entries, more = table_entries(v, depth, seen)
    seen[v] = nil
    if more > 0 then
        entries[#entries + 1] = string.format("...(%d more)", more)
    end
    return "{ " .. table.concat(entries, ", ") .. " }"
end

--- Formats one value for the REPL: strings quoted, tables two levels deep
-- with sorted keys and at most 20 entries each, a long top-level table one
-- entry per line, everything else through tostring.
function M.format(v)
    local line = format_value(v, 0, {})
    if type(v) ~= "table" or #line <= WIDTH or line:sub(1, 1) ~= "{" then
        return line
    end
    local seen = { [v] = true }
    local entries, more = table_entries(v, 0, seen)
    if more > 0 then
        entries[#entries + 1] = string.format("...(%d more)", more)
    end
    return "{\n    " .. table.concat(entries, ",\n    ") .. "\n}"
end

-- ---------------------------------------------------------------------------
-- Reading lines.

local function cdef(decl)
    pcall(ffi.cdef, decl) -- already declared elsewhere: fine
end

cdef("int isatty(int fd);")
cdef("void free(void *ptr);")
cdef("char *readline(const char *prompt);")
cdef("int add_history(const char *line);")
cdef("int read_history(const char *filename);")
cdef("int write_history(const char *filename);")
cdef("void stifle_history(int max);")
cdef("char *strdup(const char *s);")
cdef("extern char *(*rl_completion_entry_function)(const char *text, int state);")

local function stdin_is_terminal()
    local ok, r = pcall(function()
        return ffi.C.isatty(0) == 1
    end)
    return ok and r
end

-- libedit's functions: in ffi.C inside the host (it links libedit), else
-- loaded by name; nil when neither works.
local function find_libedit()
    local ok = pcall(function()
        return ffi.C.readline
    end)
    if ok then
        return ffi.C
    end
    for _, name in ipairs({ "edit", "libedit.so.2" }) do
        local loaded, lib = pcall(ffi.load, name)
        if loaded and pcall(function()
            return lib.readline
        end) then
            return lib
        end
    end
    return nil
end

local function history_path()
    local path = os.getenv("CARTRIDGE_HISTORY")
    if path and path ~= "" then
        return path
    end
    local home = os.getenv("HOME")
    if home and home ~= "" then
        return home .. "/.cartridge_history"
    end
    return nil
end

-- Tab completion over env for readline: the callback hands out the matches
-- one by one (state 0 starts a new word), each a malloc'd copy readline frees.
local completion_callback -- kept alive while readline may call it
local function install_completion(lib, env)
    local matches = {}
    completion_callback = ffi.cast("char *(*)(const char *, int)", function(text, state)
        if state == 0 then
            local ok, list = pcall(M.complete, env, ffi.string(text))
            matches = ok and list or {}
        end
        local m = matches[state + 1]
        if not m then return nil end
        return ffi.C.strdup(m)
    end)
    pcall(function() lib.rl_completion_entry_function = completion_callback end)
end

-- Line reader over readline(); returns read_line, finish.
local function readline_reader(lib, path)
    if path then
        pcall(function()
            lib.stifle_history(HISTORY_LINES)
            lib.read_history(path)
        end)
    end
    local function read_line(prompt)
        io.stdout:flush()
        local p = lib.readline(prompt)
        if p == nil then
            return nil
        end
        local line = ffi.string(p)
        ffi.C.free(p)
        if line:match("%S") then
            lib.add_history(line)
            -- saved at once: a session that dies keeps what was typed
            if path then pcall(lib.write_history, path) end
        end
        return line
    end
    jit.off(read_line)
    local function finish()
        if path then
            pcall(lib.write_history, path) -- unwritable: skipped silently
        end
    end
    return read_line, finish
end

local function plain_reader(show_prompt)
    local function read_line(prompt)
        if show_prompt then
            io.stdout:write(prompt)
            io.stdout:flush()
        end
        return io.read("*l")
    end
    jit.off(read_line)
    return read_line
end

-- A line reader for interactive recipes (chat.lua): readline with history
-- when stdin is a terminal, plain lines otherwise. Returns read_line(prompt)
-- (nil at end of input) and finish() (saves the history). history: a file
-- path, or false for none; default: the REPL's history file.
function M.line_reader(history)
    if stdin_is_terminal() then
        local lib = find_libedit()
        if lib then
            if history == nil then history = history_path() end
            return readline_reader(lib, history or nil)
        end
    end
    return plain_reader(stdin_is_terminal()), function() end
end

-- ---------------------------------------------------------------------------
-- Tab completion and help(x).

-- The fields a value offers to completion: a table's keys (and through its
-- metatable's __index table, its methods), a string's methods.
local function fields_of(v, seen)
    local out = {}
    seen = seen or {}
    if type(v) == "string" then v = string end
    if type(v) == "table" and not seen[v] then
        seen[v] = true
        for k in pairs(v) do
            if type(k) == "string" and k:match("^[%a_][%w_]*$") then out[k] = true end
        end
    end
    local mt = (type(v) == "table" or type(v) == "userdata") and getmetatable(v)
    if type(mt) == "table" and type(rawget(mt, "__index")) == "table" then
        for k in pairs(fields_of(rawget(mt, "__index"), seen)) do out[k] = true end
    end
    -- a table whose fields load lazily names them through __fields
    if type(mt) == "table" and type(rawget(mt, "__fields")) == "function" then
        local ok, names = pcall(rawget(mt, "__fields"), v)
        for _, k in ipairs(ok and names or {}) do out[k] = true end
    end
    return out
end

-- The completions of the word `text` (a Lua name path such as "cartridge.mo"
-- or "m:for") in env, sorted: globals and keywords for a bare name, fields
-- after ".", methods after ":".
function M.complete(env, text)
    local head, sep, last = text:match("^(.*)([.:])([%w_]*)$")
    local pool
    if not head then
        last = text:match("[%a_][%w_]*$") or ""
        head = nil
        pool = fields_of(env)
        for k in pairs(fields_of(_G)) do pool[k] = true end
        for k in pairs(KEYWORDS) do pool[k] = true end
    else
        local v = env
        for part in head:gmatch("[^.:]+") do
            if type(v) ~= "table" and type(v) ~= "string" and type(v) ~= "userdata" then return {} end
            local ok, nextv = pcall(function() return v[part] end)
            if not ok or nextv == nil then return {} end
            v = nextv
        end
        pool = fields_of(v)
        if sep == ":" then
            for k in pairs(pool) do
                local ok, f = pcall(function() return v[k] end)
                if not ok or type(f) ~= "function" then pool[k] = nil end
            end
        end
    end
    local out = {}
    for k in pairs(pool) do
        if k:sub(1, #last) == last then out[#out + 1] = (head and head .. sep or "") .. k end
    end
    table.sort(out)
    return out
end

-- The comment block right above line `line` of a Lua source file.
local function comment_above(path, line)
    local f = io.open(path, "rb")
    if not f then return nil end
    local lines = {}
    for l in f:lines() do lines[#lines + 1] = l end
    f:close()
    local out = {}
    for i = line - 1, 1, -1 do
        local c = lines[i] and lines[i]:match("^%s*%-%-+ ?(.*)$")
        if not c then break end
        table.insert(out, 1, c)
    end
    return #out > 0 and table.concat(out, "\n") or nil, lines[line]
end

-- What help(x) prints: a function's signature line and the comment above
-- its definition; a table's module comment (for modules) and its fields.
function M.help_text(v)
    if type(v) == "function" then
        local info = debug.getinfo(v, "S")
        if info.what == "C" or info.source:sub(1, 1) ~= "@" then
            return "a built-in function: see the Lua 5.1 or LuaJIT manual"
        end
        local doc, def = comment_above(info.source:sub(2), info.linedefined)
        local where = ("%s:%d"):format(info.short_src, info.linedefined)
        return ((def and def:gsub("^%s+", "") or "function") .. "  (" .. where .. ")") .. (doc and ("\n" .. doc) or "")
    elseif type(v) == "table" then
        local names = {}
        for k in pairs(fields_of(v)) do names[#names + 1] = k end
        table.sort(names)
        local doc
        for _, name in ipairs(names) do
            local f = v[name]
            if type(f) == "function" then
                local info = debug.getinfo(f, "S")
                if info.source:sub(1, 1) == "@" then -- the defining file's opening comment
                    local fh = io.open(info.source:sub(2), "rb")
                    if fh then
                        local top = {}
                        for l in fh:lines() do
                            local c = l:match("^%-%-+ ?(.*)$")
                            if not c then break end
                            top[#top + 1] = c
                        end
                        fh:close()
                        doc = #top > 0 and table.concat(top, "\n") or nil
                    end
                    break
                end
            end
        end
        return (doc and (doc .. "\n\n") or "") .. "fields: " .. table.concat(names, ", ")
    end
    return ("a %s: %s"):format(type(v), tostring(v))
end

-- ---------------------------------------------------------------------------
-- Compiling and running chunks.

local function is_incomplete(err)
    return err:sub(-7) == "'<eof>'"
end

-- Compiles the lines typed so far. Returns fn; or nil, err, incomplete.
-- "=expr" compiles as "return expr". Otherwise "return <buffer>" is tried
-- first, then the buffer as statements; the statement error is the one
-- reported. Either form failing at '<eof>' means "keep reading" ("{" alone is
-- a bad statement but an unfinished expression).
local function compile(buffer, env)
    local fn, err
    if buffer:sub(1, 1) == "=" then
        fn, err = loadstring("return " .. buffer:sub(2), "=stdin")
        if not fn then
            return nil, err, is_incomplete(err)
        end
    else
        local expr_err
        fn, expr_err = loadstring("return " .. buffer, "=stdin")
        if not fn then
            fn, err = loadstring(buffer, "=stdin")
            if not fn then
                return nil, err, is_incomplete(err) or is_incomplete(expr_err)
            end
        end
    end
    setfenv(fn, env)
    -- typed code runs in the interpreter, which runs the host's Ctrl-C hook
    -- (compiled traces never do): a runaway loop typed here can always be
    -- stopped, and the session goes on
    jit.off(fn, true)
    return fn
end

local function pack(...)
    return { n = select("#", ...), ... }
end

local function error_text(e)
    if type(e) == "string" then
        return e
    end
    return "error object: " .. M.format(e)
end

local function want_traceback()
    local v = os.getenv("CARTRIDGE_TRACEBACK")
    return v ~= nil and v ~= "" and v ~= "0"
end

local function on_error(e)
    local msg = error_text(e)
    if want_traceback() then
        msg = debug.traceback(msg, 2)
    end
    return msg
end

--- A fresh REPL environment: cartridge = engine, ffi, and _G behind it.
function M.new_env(engine)
    local env = setmetatable({ cartridge = engine, ffi = ffi }, { __index = _G })
    env.help = function(v)
        if v == nil then
            print("help(x): the documentation of a function or module, e.g. help(cartridge.model.load), "
                .. "help(cartridge.cart); Tab completes names, fields and methods")
            return
        end
        print(M.help_text(v))
    end
    return env
end

local function default_load_engine()
    return require("cartridge")
end

local function first_line(s)
    return (tostring(s):match("^[^\n]*"))
end

--- Runs the REPL until input ends; see the top of this file for opts.
-- Returns the environment table.
-- The line reader: opts.read_line, else libedit's on a terminal (with
-- history), else plain reads. Returns read_line, finish, libedit or nil.
local function open_reader(opts, terminal)
    if opts.read_line then return opts.read_line, function() end, nil end
    local lib = terminal and find_libedit()
    if not lib then return plain_reader(terminal), function() end, nil end
    local path = opts.history
    if path == nil then path = history_path() end
    local read_line, finish = readline_reader(lib, path or nil)
    return read_line, finish, lib
end

-- The environment chunks run in (opts.env, else a new one with the engine
-- loaded, or a warning when it does not load) and the engine in it.
local function open_env(opts, write_error)
    if opts.env then return opts.env, rawget(opts.env, "cartridge") end
    local ok, loaded = pcall(opts.load_engine or default_load_engine)
    if not ok then
        write_error("warning: the engine did not load, `cartridge` is nil: " .. first_line(loaded) .. "\n")
        return M.new_env(nil), nil
    end
    return M.new_env(loaded), loaded
end

function M.run(opts)
    opts = opts or {}
    local terminal = not opts.read_line and stdin_is_terminal()
    local write = opts.write or function(s)
        io.stdout:write(s)
    end
    local write_error = opts.write_error or (opts.write and write) or function(s)
        io.stdout:flush() -- what the code printed before it failed comes first
        io.stderr:write(s)
    end
    local read_line, finish, lib = open_reader(opts, terminal)
    local env, engine = open_env(opts, write_error)
    if lib then install_completion(lib, env) end

    local banner = opts.banner
    if banner == nil then
        banner = terminal or opts.read_line ~= nil
    end
    if banner then
        local host = package.loaded["cartridge.host"]
        local version = (type(engine) == "table" and engine.version) or (host and host.version) or "?"
        write(string.format("cartridge %s (%s)  =expr prints; Ctrl-D exits\n", tostring(version), jit.version))
    end

    -- Runs a complete chunk; prints its values, or its error.
    local function execute(fn)
        local r = pack(xpcall(fn, on_error))
        if not r[1] then
            write_error(tostring(r[2]) .. "\n")
        elseif r.n > 1 then
            local shown = {}
            for i = 2, r.n do
                shown[#shown + 1] = M.format(r[i])
            end
            write(table.concat(shown, "\t") .. "\n")
        end
    end

    local buffer = nil -- the lines of a chunk still being typed
    while true do
        local ok, line = pcall(read_line, buffer and CONTINUE or PROMPT)
        if not ok then
            if not tostring(line):match("interrupted$") then
                finish()
                error(line, 0)
            end
            write("\n")
            buffer = nil -- Ctrl-C at the prompt drops what was typed
        elseif line == nil then
            if buffer then
                local _, err = compile(buffer, env)
                write_error((err or "incomplete input") .. "\n")
            elseif terminal then
                write("\n")
            end
            break
        else
            buffer = buffer and (buffer .. "\n" .. line) or line
            if buffer:match("^%s*$") then
                buffer = nil
            else
                local fn, err, incomplete = compile(buffer, env)
                if fn then
                    buffer = nil
                    execute(fn)
                elseif not incomplete then
                    buffer = nil
                    write_error(err .. "\n")
                end
            end
        end
    end
    finish()
    return env
end

-- The loop reads lines through FFI calls; a JIT-compiled loop would not run
-- the host's interrupt hook right after readline() returns from Ctrl-C.
jit.off(M.run, true)

return M
