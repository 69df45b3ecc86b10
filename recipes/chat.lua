-- chat.lua: talk to a GGUF model in the terminal, in its own chat template.
--
--   cartridge run recipes/chat.lua --model models/Qwen3-0.6B-f16.gguf --system "Be brief."
--
-- Each turn re-renders the whole conversation, keeps the cached rows of the
-- longest common token prefix and prefills only the rest, so a long chat does
-- not re-read its history. --model takes a path or a bare name looked up in
-- models/ and ../shared/models/ ("stories260K").
--
-- --load C.safetensors (repeatable) puts cartridges' rows in front of the
-- conversation, composed in order as the server composes them; the banner
-- gives their KV rows and bytes.
--
-- Commands: /help lists them, /reset forgets the conversation, /load FILE
-- and /unload change the cartridges (the conversation is prefilled again), /save FILE
-- writes it as JSON messages (atomically), /quit (or Ctrl-D) leaves; any other
-- word after "/" is refused, not sent to the model ("//text" sends "/text").
-- Ctrl-C stops a reply where it is (the part written stays in the
-- conversation) or clears the line at the prompt; the session goes on.
-- --json-schema FILE makes every reply a JSON document the schema accepts.

local cartridge = require("cartridge")
local options = require("cartridge.options")
local defaults = require("cartridge.defaults")
local generate = require("cartridge.generate")
local chat = require("cartridge.chat")
local repl = require("cartridge.repl")
local json = require("cartridge.json")
local fs = require("cartridge.fs")
local grammar = require("cartridge.grammar")

local opts = options.parse(arg, {
    summary = "Chat with a GGUF model in its chat template.",
    flags = {
        { "model", help = "GGUF model (default: " .. defaults.user_model .. ", else the embedded demo model)" },
        { "system", help = "a system message to start with" },
        { "n", type = "int", default = 512, help = "tokens per reply at most" },
        { "ctx", type = "int", default = 4096, help = "context (KV cache rows)" },
        { "temp", type = "number", default = 0.7, help = "temperature; 0 is greedy" },
        { "top-p", type = "number", default = 0.9, help = "nucleus sampling mass" },
        { "seed", type = "int", default = 0, help = "sampling seed" },
        { "json-schema", help = "every reply is a JSON document this JSON Schema file accepts" },
        { "load", repeatable = true, help = "a cartridge (.safetensors) to talk to, its rows in front of the "
            .. "conversation; repeat to compose several, in order, as the server does" },
        { "kv", default = "f16", choices = { "f16", "f32" }, help = "KV cache dtype" },
        { "threads", type = "int", default = 0, help = "threads (0: all cores)" },
        require("cartridge.cart").FOREIGN_FLAG,
    },
})
require("cartridge.cart").allow_foreign = opts.foreign_cartridge

local schema = opts.json_schema and grammar.from_file(opts.json_schema, "--json-schema")
cartridge.set_threads(opts.threads)
local m = cartridge.model.load(defaults.pick_model(opts.model))
local tok = m:tokenizer()
local template = chat.for_model(m)
-- the cartridges in front of the conversation ({ path, cart }), and P,
-- the rows they take at the start of the cache
local loaded, P = {}, 0
local cached = {} -- the token ids whose rows are in kv after the P cartridge rows, in order
local messages = {}
local kv

-- Puts the cartridges' rows at the start of a cache of --ctx rows after them.
local function refill()
    P = 0
    for _, l in ipairs(loaded) do P = P + l.cart.p end
    if kv then kv:free() end
    kv = m:new_kv(P + math.min(opts.ctx, m.config.n_ctx_train), opts.kv)
    local parts = {}
    for i, l in ipairs(loaded) do parts[i] = l.cart end
    if #parts > 0 then require("cartridge.cart").stack(parts):append_to(kv) end
    cached = {}
end

-- One line on the cartridges in front: names, rows and their bytes in the cache.
local function describe()
    if #loaded == 0 then return "no cartridge (the bare model)" end
    local names = {}
    for i, l in ipairs(loaded) do names[i] = ("%s (%d rows)"):format(l.path:match("[^/]+$"), l.cart.p) end
    local bytes = m:kv_bytes(P, opts.kv)
    return ("cartridge%s %s: %d KV rows, %s in the %s cache"):format(#loaded > 1 and "s" or "",
        table.concat(names, " + "), P, cartridge.fmt.bytes(bytes), opts.kv)
end

local function load_cartridge(path)
    loaded[#loaded + 1] = { path = path, cart = require("cartridge.cart").load(path, m) }
    refill()
end

local function reset()
    messages = {}
    if opts.system then messages[1] = { role = "system", content = opts.system } end
    kv:truncate(P)
    cached = {}
end
for _, path in ipairs(opts.load) do load_cartridge(path) end
if #loaded == 0 then refill() end
reset()

io.stderr:write(("chat with %s (%s template, %d-row cache); %s. /help for commands, Ctrl-D leaves.\n"):format(
    m.path, template.name, kv:capacity() - P, describe()))
local read_line, finish = repl.line_reader(false)
local turn = 0

local HELP = [[
/help         this list
/reset        forget the conversation
/load FILE    put a cartridge's rows in front too (after those loaded); the conversation is prefilled again
/unload       take every cartridge away (the bare model)
/save FILE    write the conversation to FILE as JSON ({"messages": [...]})
/quit         leave (Ctrl-D too)
Ctrl-C stops a reply (what was written stays); //text sends "/text".]]

local function is_interrupt(err) return tostring(err):match("interrupted$") ~= nil end

-- One command line ("/word args"); returns false to leave.
local function command(line)
    local word, rest = line:match("^/(%a+)%s*(.-)%s*$")
    if word == "quit" then return false end
    if word == "help" then
        io.stderr:write(HELP, "\n")
    elseif word == "reset" then
        reset()
        io.stderr:write("(conversation forgotten)\n")
    elseif word == "load" then
        if rest == "" then
            io.stderr:write("(/load needs a cartridge file: /load docs.safetensors)\n")
        else
            local ok, err = pcall(load_cartridge, rest)
            io.stderr:write(ok and ("(" .. describe() .. ")\n") or ("(" .. tostring(err) .. ")\n"))
        end
    elseif word == "unload" then
        for _, l in ipairs(loaded) do l.cart:free() end
        loaded = {}
        refill()
        io.stderr:write("(" .. describe() .. ")\n")
    elseif word == "save" then
        if rest == "" then
            io.stderr:write("(/save needs a file name: /save chat.json)\n")
        else
            local ok, err = pcall(fs.write_atomic, rest, json.encode({ model = m.path, messages = json.array(messages) })
                .. "\n")
            io.stderr:write(ok and ("(%d messages saved to %s)\n"):format(#messages, rest) or ("(" .. err .. ")\n"))
        end
    else
        io.stderr:write(("(unknown command %s; /help lists them)\n"):format(line:match("^%S+")))
    end
    return true
end

-- One user turn: render, reuse the cached prefix, generate the reply.
local function reply(line)
    messages[#messages + 1] = { role = "user", content = line }
    -- behind cartridge rows no BOS: the rows are the start (as the server does)
    local ids = tok:encode(chat.render(template, messages), { special = true, add_special = P == 0 })
    -- reuse the cached prefix, prefill the rest (at least one token, for fresh logits)
    local keep = 0
    while keep < #cached and keep < #ids - 1 and cached[keep + 1] == ids[keep + 1] do keep = keep + 1 end
    kv:truncate(P + keep)
    local rest = {}
    for i = keep + 1, #ids do rest[#rest + 1] = ids[i] end
    -- the reply gets what the cache has left, up to --n; a prompt that leaves
    -- no room for one token is refused
    local room = kv:capacity() - P - #ids
    if room < 1 then
        io.stderr:write(("(the conversation needs %d rows but the cache has %d; /reset or raise --ctx)\n"):format(
            #ids + 1, kv:capacity() - P))
        messages[#messages] = nil
        return
    end
    local max_tokens = math.min(opts.n, room)
    if max_tokens < opts.n then
        io.stderr:write(("(the cache has room for %d more tokens: this reply stops there; /reset or raise --ctx)\n")
            :format(max_tokens))
    end
    turn = turn + 1
    io.write("model> ")
    io.flush()
    local written = {}
    local ok, r = pcall(generate.run, {
        model = m, tokenizer = tok, prompt_ids = rest, kv = kv, max_tokens = max_tokens, grammar = schema,
        sampling = { temperature = opts.temp, top_p = opts.top_p, seed = opts.seed + turn },
        on_text = function(s)
            written[#written + 1] = s
            io.write(s)
            io.flush()
        end,
    })
    io.write("\n")
    if not ok then
        if not is_interrupt(r) then error(r, 0) end
        -- stopped mid-reply: keep what was written; the cache keeps the prompt rows
        messages[#messages + 1] = { role = "assistant", content = table.concat(written) }
        cached = {}
        for i = 1, math.min(#ids, kv:len() - P) do cached[i] = ids[i] end
        kv:truncate(P + #cached)
        io.stderr:write("(stopped; the reply so far stays in the conversation)\n")
        return
    end
    io.stderr:write(("(%d reused + %d new prompt tokens, %.1f tok/s)\n"):format(keep, #rest, r.timings.decode_tok_s))
    messages[#messages + 1] = { role = "assistant", content = r.text }
    cached = {}
    for i = 1, #ids do cached[i] = ids[i] end
    for _, id in ipairs(r.ids) do cached[#cached + 1] = id end
    -- the cache holds the prompt and the reply except the token that ended it
    -- (an end-of-turn, or the last one at --n, whose rows were never
    -- computed); the next render's reuse check sees where the two part.
    for i = #cached, kv:len() - P + 1, -1 do cached[i] = nil end
end
-- interrupts must reach the loops between forward passes: no JIT-compiled
-- loop skips the host's hook
jit.off(generate.run, true)
jit.off(reply, true)

while true do
    local ok, line = pcall(read_line, "you> ")
    if not ok then
        if not is_interrupt(line) then error(line, 0) end
        io.write("\n") -- Ctrl-C at the prompt: a fresh line
    elseif not line then
        break
    elseif line:match("^/%a") then
        if not command(line) then break end
    elseif line:match("%S") then
        reply((line:gsub("^//", "/")))
    end
end
finish()
kv:free()
for _, l in ipairs(loaded) do l.cart:free() end
m:free()
