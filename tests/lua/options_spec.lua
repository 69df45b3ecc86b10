-- options_spec.lua: cartridge.options, the flag parser every recipe uses.

local options = require("cartridge.options")

-- The spec the examples below parse against: one of each kind of flag.
local function spec()
    return {
        summary = "Print a file's metadata.",
        positional = {
            { "file", help = "the input file", required = true },
            { "out", help = "where to write" },
        },
        flags = {
            { "max-array", type = "int", default = 8, help = "array elements shown" },
            { "p", type = "number", default = 0.9, help = "top-p mass" },
            { "model", type = "string", help = "model file" },
            { "corpus", type = "string", repeatable = true, help = "a text file" },
            { "json", type = "boolean", help = "print JSON" },
            { "tensors", type = "boolean", default = true, help = "print the tensor table" },
            { "dtype", choices = { "f16", "f32" }, default = "f32", help = "storage type" },
        },
    }
end

-- argv as the host builds it: arg[0] is the script path.
local function argv(...)
    local t = { ... }
    t[0] = "recipes/inspect.lua"
    t[-1] = "run"
    return t
end

local function parse(...)
    return options.try_parse(argv(...), spec())
end

describe("options.try_parse", function()
    it("returns the defaults when only the required positional is given", function()
        local opts = assert(parse("model.gguf"))
        assert.are.equal("model.gguf", opts.file)
        assert.is_nil(opts.out)
        assert.are.equal(8, opts.max_array)
        assert.are.equal(0.9, opts.p)
        assert.is_nil(opts.model)
        assert.are.same({}, opts.corpus)
        assert.is_false(opts.json)
        assert.is_true(opts.tensors)
        assert.are.equal("f32", opts.dtype)
    end)

    it("takes values as --flag value and as --flag=value", function()
        local opts = assert(parse("f", "--max-array", "3", "--model=m.gguf", "--p=0.5"))
        assert.are.equal(3, opts.max_array)
        assert.are.equal("m.gguf", opts.model)
        assert.are.equal(0.5, opts.p)
    end)

    it("says which flags the command line gave, a default equal to the value included", function()
        local opts = assert(parse("f", "--max-array", "8", "--json", "--corpus", "a.txt"))
        assert.is_true(options.given(opts, "max_array")) -- given, though equal to its default
        assert.is_true(options.given(opts, "json"))
        assert.is_true(options.given(opts, "corpus"))
        assert.is_false(options.given(opts, "p"))
        assert.is_false(options.given(opts, "dtype"))
        assert.is_false(options.given({}, "p")) -- a table no parse made
    end)

    it("keeps everything after the first = as the value", function()
        local opts = assert(parse("f", "--model=a=b"))
        assert.are.equal("a=b", opts.model)
    end)

    it("turns dashes in flag names into underscores in the keys", function()
        local opts = assert(parse("f", "--max-array", "2"))
        assert.are.equal(2, opts.max_array)
        assert.is_nil(opts["max-array"])
    end)

    it("accepts underscores on the command line as a spelling of dashes", function()
        local opts = assert(parse("f", "--max_array=5"))
        assert.are.equal(5, opts.max_array)
    end)

    it("collects a repeatable flag into a list in command-line order", function()
        local opts = assert(parse("f", "--corpus", "a.txt", "--corpus=b.txt", "--corpus", "c.txt"))
        assert.are.same({ "a.txt", "b.txt", "c.txt" }, opts.corpus)
    end)

    it("gives each parse its own default list for a repeatable flag", function()
        local a = assert(parse("f"))
        table.insert(a.corpus, "x")
        local b = assert(parse("f"))
        assert.are.same({}, b.corpus)
    end)

    it("keeps the last value of a non-repeatable flag given twice", function()
        local opts = assert(parse("f", "--model", "a", "--model", "b"))
        assert.are.equal("b", opts.model)
    end)

    it("sets a boolean with a bare --flag", function()
        local opts = assert(parse("f", "--json"))
        assert.is_true(opts.json)
    end)

    it("accepts --flag=true and --flag=false for booleans", function()
        local opts = assert(parse("f", "--json=true", "--tensors=false"))
        assert.is_true(opts.json)
        assert.is_false(opts.tensors)
    end)

    it("turns a boolean off with --no-flag", function()
        local opts = assert(parse("f", "--no-tensors"))
        assert.is_false(opts.tensors)
    end)

    it("does not let a boolean swallow the next argument", function()
        local opts = assert(parse("--json", "f"))
        assert.is_true(opts.json)
        assert.are.equal("f", opts.file)
    end)

    it("rejects a boolean value that is not true or false", function()
        local opts, err = parse("f", "--json=maybe")
        assert.is_nil(opts)
        assert.matches("--json expects true or false, got 'maybe'", err, 1, true)
    end)

    it("parses ints in base 10, including negative ones", function()
        assert.are.equal(-3, assert(parse("f", "--max-array", "-3")).max_array)
        assert.are.equal(10, assert(parse("f", "--max-array", "010")).max_array)
    end)

    it("rejects an int flag given 1.5, naming the flag and the value", function()
        local opts, err = parse("f", "--max-array", "1.5")
        assert.is_nil(opts)
        assert.are.equal("inspect: --max-array expects an integer, got '1.5' (see --help)", err)
    end)

    it("rejects an int flag given abc or hex", function()
        local _, err = parse("f", "--max-array=abc")
        assert.matches("--max-array expects an integer, got 'abc'", err, 1, true)
        _, err = parse("f", "--max-array=0x10")
        assert.matches("--max-array expects an integer, got '0x10'", err, 1, true)
    end)

    it("parses numbers in exponent notation", function()
        assert.are.equal(2e-3, assert(parse("f", "--p", "2e-3")).p)
        assert.are.equal(0.5, assert(parse("f", "--p=.5")).p)
        assert.are.equal(-1, assert(parse("f", "--p", "-1")).p)
    end)

    it("rejects numbers that are not decimal", function()
        for _, bad in ipairs({ "abc", "0x1p4", "1e999", "nan", "1 2", "" }) do
            local opts, err = parse("f", "--p=" .. bad)
            assert.is_nil(opts, bad)
            assert.matches("--p expects a number, got '" .. bad .. "'", err, 1, true)
        end
    end)

    it("checks a value against the flag's choices", function()
        assert.are.equal("f16", assert(parse("f", "--dtype", "f16")).dtype)
        local opts, err = parse("f", "--dtype", "q8")
        assert.is_nil(opts)
        assert.matches("--dtype must be one of f16, f32, got 'q8'", err, 1, true)
    end)

    it("fills positionals in order and leaves optional ones nil", function()
        local opts = assert(parse("in.gguf", "out.txt"))
        assert.are.equal("in.gguf", opts.file)
        assert.are.equal("out.txt", opts.out)
    end)

    it("takes positionals between and after flags", function()
        local opts = assert(parse("--json", "in.gguf", "--max-array", "1", "out.txt"))
        assert.are.equal("in.gguf", opts.file)
        assert.are.equal("out.txt", opts.out)
        assert.are.equal(1, opts.max_array)
    end)

    it("reports a missing required positional by name", function()
        local opts, err = parse("--json")
        assert.is_nil(opts)
        assert.are.equal("inspect: missing argument FILE: the input file (see --help)", err)
    end)

    it("reports extra positionals as an error", function()
        local opts, err = parse("a", "b", "c")
        assert.is_nil(opts)
        assert.matches("unexpected argument 'c'", err, 1, true)
        assert.matches("%(see %-%-help%)$", err)
    end)

    it("treats everything after -- as positional", function()
        local opts = assert(parse("--", "--json", "-x"))
        assert.are.equal("--json", opts.file)
        assert.are.equal("-x", opts.out)
        assert.is_false(opts.json)
    end)

    it("treats a lone - and negative numbers as positionals", function()
        local opts = assert(parse("-", "-2"))
        assert.are.equal("-", opts.file)
        assert.are.equal("-2", opts.out)
    end)

    it("reports an unknown flag and lists the valid ones", function()
        local opts, err = parse("f", "--foo")
        assert.is_nil(opts)
        assert.are.equal("inspect: unknown flag --foo; valid flags: --max-array, --p, --model, --corpus, "
            .. "--json, --tensors, --dtype, --help (see --help)", err)
    end)

    it("reports an unknown single-dash flag", function()
        local _, err = parse("f", "-x")
        assert.matches("unknown flag -x; valid flags: --max-array", err, 1, true)
    end)

    it("does not take --no- on a flag that is not a boolean", function()
        local _, err = parse("f", "--no-model")
        assert.matches("unknown flag --no-model", err, 1, true)
    end)

    it("reports a missing value at the end of the arguments", function()
        local opts, err = parse("f", "--p")
        assert.is_nil(opts)
        assert.are.equal("inspect: missing value for --p (expects a number) (see --help)", err)
    end)

    it("reports a missing value when the next argument is another flag", function()
        local _, err = parse("f", "--model", "--json")
        assert.matches("missing value for --model", err, 1, true)
    end)

    it("returns the help text for --help and for -h", function()
        for _, flag in ipairs({ "--help", "-h" }) do
            local opts, err, help = parse("f", flag)
            assert.is_nil(opts)
            assert.is_nil(err)
            assert.is_string(help)
        end
    end)

    it("answers --help even when the required positional is missing", function()
        local _, _, help = parse("--help")
        assert.is_string(help)
    end)

    it("names the script after spec.name when one is given", function()
        local s = spec()
        s.name = "sample"
        local _, err = options.try_parse({ "--foo" }, s)
        assert.matches("^sample: unknown flag %-%-foo", err)
    end)

    it("takes a plain list without arg[0] and names the script cartridge", function()
        local _, err = options.try_parse({ "--foo" }, spec())
        assert.matches("^cartridge: unknown flag", err)
    end)

    it("collects the rest of the words into a repeatable last positional", function()
        local s = { positional = { { "first", required = true }, { "files", repeatable = true } } }
        local opts = assert(options.try_parse({ "a", "b", "c" }, s))
        assert.are.equal("a", opts.first)
        assert.are.same({ "b", "c" }, opts.files)
        assert.are.same({}, assert(options.try_parse({ "a" }, s)).files)
        local _, err = options.try_parse({}, s)
        assert.matches("missing argument FIRST %(see %-%-help%)$", err)
    end)

    it("converts typed positionals", function()
        local s = { positional = { { "count", type = "int", required = true } } }
        assert.are.equal(4, assert(options.try_parse({ "4" }, s)).count)
        local _, err = options.try_parse({ "four" }, s)
        assert.matches("COUNT expects an integer, got 'four'", err, 1, true)
    end)

    it("rejects positionals when the script declares none", function()
        local _, err = options.try_parse({ "x" }, { flags = {} })
        assert.matches("unexpected argument 'x' (this script takes no positional arguments)", err, 1, true)
    end)

    it("raises on a spec with an unknown type", function()
        assert.has_error(function()
            options.try_parse({}, { flags = { { "x", type = "float" } } })
        end)
    end)

    it("raises on a flag declared twice", function()
        assert.has_error(function()
            options.try_parse({}, { flags = { { "a-b" }, { "a_b" } } })
        end)
    end)
end)

describe("options help text", function()
    local help = select(3, options.try_parse(argv("--help"), {
        usage = "cartridge run recipes/inspect.lua FILE [--json]",
        summary = "Print a GGUF or safetensors file's metadata and tensor table.",
        positional = { { "file", help = "GGUF or .safetensors file", required = true } },
        flags = {
            { "max-array", type = "int", default = 8, help = "array elements shown per metadata value" },
            { "corpus", type = "string", repeatable = true, help = "a corpus file" },
            { "json", type = "boolean", help = "print JSON" },
            { "temp", type = "number", default = 0.7, help = "sampling temperature" },
        },
    }))

    it("starts with the script name and its one-line summary", function()
        assert.matches("^inspect: Print a GGUF or safetensors file's metadata and tensor table%.\n", help)
    end)

    it("shows the usage line", function()
        assert.matches("\nusage: cartridge run recipes/inspect.lua FILE %[%-%-json%]\n", help)
    end)

    it("lists each flag with its type, default and help", function()
        assert.matches("%-%-max%-array INT%s+array elements shown per metadata value %(int; default: 8%)", help)
        assert.matches("%-%-corpus STRING%s+a corpus file %(string; repeatable%)", help)
        assert.matches("%-%-json%s+print JSON %(boolean%)", help)
        assert.matches("%-%-temp NUMBER%s+sampling temperature %(number; default: 0%.7%)", help)
        assert.matches("%-%-help, %-h%s+print this help and exit", help)
    end)

    it("lists the positional arguments", function()
        assert.matches("FILE%s+GGUF or .safetensors file %(required%)", help)
    end)

    it("aligns the help column", function()
        local columns = {}
        for line in help:gmatch("[^\n]+") do
            local left = line:match("^(  %S.-%S   +)%S")
            if left then
                columns[#columns + 1] = #left
            end
        end
        assert.are.equal(6, #columns)
        for i = 2, #columns do
            assert.are.equal(columns[1], columns[i])
        end
    end)

    it("generates a usage line from the positionals when the spec gives none", function()
        local text = options.help({ positional = { { "file", required = true }, { "out" } } }, "demo")
        assert.matches("usage: cartridge run recipes/demo%.lua FILE %[OUT%] %[FLAGS%]", text)
    end)
end)
