-- helper.lua: what the Lua specs share: paths, the shared fixtures, running
-- the host binary, temporary directories.

local helper = {}

local core = require("cartridge.core")

helper.root = core.root
helper.shared = os.getenv("CARTRIDGE_SHARED") or (helper.root .. "/../shared")
helper.bin = os.getenv("CARTRIDGE_BIN") or (helper.root .. "/build/cartridge")

local exists = require("cartridge.defaults").exists
helper.exists = exists

-- The path of a shared fixture, or nil (and a printed skip reason) when
-- ../shared is not there.
function helper.fixture(relative)
    local path = helper.shared .. "/" .. relative
    if exists(path) then return path end
    return nil, ("skipped: %s not found (the ../shared fixtures are absent)"):format(path)
end

-- The independent float64 reference (tests/reference/forward.lua).
function helper.reference()
    if not package.path:find("tests/?.lua", 1, true) then
        package.path = helper.root .. "/tests/?.lua;" .. package.path
    end
    return require("reference.forward")
end

-- Runs a shell command; returns exit code, stdout, stderr.
function helper.run(cmd)
    local out_path, err_path = os.tmpname(), os.tmpname()
    local ok, how, code = os.execute(("%s >%s 2>%s"):format(cmd, out_path, err_path))
    -- LuaJIT's os.execute returns the raw wait status (exit code * 256).
    local rc
    if type(ok) == "number" then rc = ok >= 256 and math.floor(ok / 256) or ok
    else rc = code or (ok and 0 or 1) end
    local function slurp(p)
        local f = io.open(p, "rb")
        local s = f:read("*a")
        f:close()
        os.remove(p)
        return s
    end
    return rc, slurp(out_path), slurp(err_path)
end

-- Single-quotes a string for the shell.
function helper.q(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs the cartridge host with a shell-quoted argument list.
function helper.cartridge(...)
    local args = {}
    for i, a in ipairs({ ... }) do args[i] = helper.q(a) end
    return helper.run(helper.q(helper.bin) .. " " .. table.concat(args, " ") .. " </dev/null")
end

-- A fresh temporary directory (removed by helper.rmdir).
function helper.tmpdir()
    local p = io.popen("mktemp -d /tmp/cartridge-spec.XXXXXX")
    local dir = p:read("*l")
    p:close()
    return dir
end

function helper.rmdir(dir)
    if dir and dir:match("^/tmp/cartridge%-spec%.") then os.execute("rm -rf " .. helper.q(dir)) end
end

function helper.write_file(path, bytes)
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
end

function helper.read_file(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

-- Whether a shell command exists.
function helper.have(cmd)
    local rc = os.execute("command -v " .. cmd .. " >/dev/null 2>&1")
    return rc == 0 or rc == true
end

-- serve.lua processes for the specs, their logs and scratch files in tmp:
--   local servers = helper.servers(tmp)
--   local s = servers:start(model_path, "--parallel", "2")   -- { port, log, pid }
--   local status, body = servers:curl(s, "POST", "/v1/chat/completions", json_text, { "x-api-key: k" })
--   servers:stop(s)       -- SIGTERM, then waits up to 5 s for the process to end
--   servers:stop_all()    -- in teardown
local Servers = {}
Servers.__index = Servers

function helper.servers(tmp)
    return setmetatable({ tmp = tmp, list = {} }, Servers)
end

function Servers:start(model_path, ...)
    local log = self.tmp .. "/serve" .. (#self.list + 1) .. ".log"
    local args = { helper.q(helper.bin), "run", "recipes/serve.lua", helper.q(model_path), "--port", "0" }
    for _, a in ipairs({ ... }) do args[#args + 1] = helper.q(a) end
    local p = io.popen(table.concat(args, " ") .. " >" .. log .. " 2>&1 & echo $!")
    local pid = tonumber(p:read("*l"))
    p:close()
    local port
    for _ = 1, 100 do
        local text = exists(log) and helper.read_file(log) or ""
        port = text:match("on http://127%.0%.0%.1:(%d+)")
        if port then break end
        os.execute("sleep 0.05")
    end
    assert(port, "the server did not start: " .. (exists(log) and helper.read_file(log) or ""))
    local s = { port = tonumber(port), log = log, pid = pid }
    self.list[#self.list + 1] = s
    return s
end

local function alive(pid)
    local rc = os.execute("kill -0 " .. pid .. " 2>/dev/null")
    return rc == 0 or rc == true
end

function Servers:stop(s)
    os.execute("kill -TERM " .. s.pid .. " 2>/dev/null")
    for _ = 1, 100 do
        if not alive(s.pid) then return end
        os.execute("sleep 0.05")
    end
end

function Servers:stop_all()
    for _, s in ipairs(self.list) do self:stop(s) end
end

-- curl: returns status, body.
function Servers:curl(s, method, path, body, headers)
    local tmp = self.tmp
    local args = { "curl", "-s", "-o", tmp .. "/body", "-w", "'%{http_code}'", "-X", method }
    for _, h in ipairs(headers or {}) do args[#args + 1] = "-H " .. helper.q(h) end
    if body then
        helper.write_file(tmp .. "/req", body)
        args[#args + 1] = "-H 'Content-Type: application/json' --data-binary @" .. tmp .. "/req"
    end
    args[#args + 1] = helper.q(("http://127.0.0.1:%d%s"):format(s.port, path))
    local rc, out = helper.run(table.concat(args, " "))
    assert(rc == 0, "curl failed: " .. table.concat(args, " "))
    return tonumber(out), helper.read_file(tmp .. "/body")
end

-- An in-process stand-in for cartridge.http's server object, for driving
-- cartridge.server without sockets: h:add(id, path, body) queues a POST,
-- h.answers[id] = { status, body } collects the answer (streams appended),
-- h.open[id] is true until the request is answered.
function helper.fake_http()
    local h = { reqs = {}, answers = {}, open = {} }
    function h:add(id, target, body, method)
        local path, query = target:match("^([^?]*)%??(.*)$") -- as cartridge.http splits a request target
        self.reqs[id] = { id = id, method = method or "POST", path = path, query = query, body = body or "",
            header = function() return nil end }
        self.open[id] = true
    end
    function h:request(id) return self.reqs[id] end
    function h:respond(id, status, _, body)
        assert(self.open[id], "answered twice: " .. id)
        self.answers[id] = { status = status, body = body }
        self.open[id] = nil
    end
    function h:stream_begin(id, status) self.answers[id] = { status = status, body = "" } end
    function h:stream_write(id, data) self.answers[id].body = self.answers[id].body .. data end
    function h:stream_end(id) self.open[id] = nil end
    function h:is_open(id) return self.open[id] == true end
    return h
end

-- Runs a shell script in a private mount namespace with a tmpfs of `size`
-- (e.g. "1m") mounted at $SMALL (dir/small), from the repository root,
-- with $BIN the cartridge host: a disk that fills. unshare -m as root,
-- unshare -rm otherwise. Returns rc, stdout, stderr; or nil and why it
-- cannot run here (for pending).
function helper.on_small_disk(dir, size, script)
    if not helper.exists(helper.bin) then return nil, "build/cartridge not built" end
    local mnt = dir .. "/small"
    os.execute("mkdir -p " .. helper.q(mnt))
    local unshare = helper.run("test $(id -u) = 0") == 0 and "unshare -m" or "unshare -rm"
    local probe = helper.run(("%s sh -c %s"):format(unshare,
        helper.q(("mount -t tmpfs -o size=64k none %s"):format(helper.q(mnt)))))
    if probe ~= 0 then return nil, "cannot mount a small tmpfs here (" .. unshare .. ", mount -t tmpfs)" end
    local full = ("mount -t tmpfs -o size=%s none %s && cd %s && SMALL=%s BIN=%s\nexport SMALL BIN\n%s"):format(
        size, helper.q(mnt), helper.q(helper.root), helper.q(mnt), helper.q(helper.bin), script)
    return helper.run(("%s sh -c %s"):format(unshare, helper.q(full)))
end

-- The strings of the lists, one after the other, unpacked: a recipe's
-- fixed tiny flags followed by a test's own.
function helper.args(...)
    local out = {}
    for _, list in ipairs({ ... }) do
        for _, a in ipairs(list) do out[#out + 1] = a end
    end
    return unpack(out)
end

-- Asserts that the Lua patterns match in `out` one after the other.
function helper.assert_in_order(out, patterns)
    local at = 1
    for _, pattern in ipairs(patterns) do
        local s, e = out:find(pattern, at)
        assert(s, "missing or out of order: " .. pattern .. "\n" .. out)
        at = e
    end
end

-- Greedy decoding of `prompt` (a Lua list of ids) under llama.cpp's
-- penalties, computed here in float64 from the model's logits: for each
-- distinct id seen c times in the last p.repeat_last_n (default 64) tokens
-- of the history, a positive logit is divided by p.repeat_penalty (a
-- non-positive one multiplied), then c * p.frequency_penalty +
-- p.presence_penalty is subtracted; the argmax takes the lowest id on ties.
-- The history is the prompt and the output when count_prompt is true (as
-- llama.cpp's server and CLI count it), the output alone when false.
-- Returns the ids before the first end-of-generation token, at most n.
function helper.penalized_greedy(m, prompt, p, n, count_prompt)
    local tok = m:tokenizer()
    local kv = m:new_kv(#prompt + n + 1)
    local logits = m:forward(kv, prompt)
    local history, out = {}, {}
    if count_prompt then
        for i, t in ipairs(prompt) do history[i] = t end
    end
    local window, rp = p.repeat_last_n or 64, p.repeat_penalty or 1
    for step = 1, n do
        local count = {}
        for i = math.max(1, #history - window + 1), #history do count[history[i]] = (count[history[i]] or 0) + 1 end
        local best, best_l = -1, -math.huge
        for id = 0, m.n_vocab - 1 do
            local l = logits[id]
            local c = count[id]
            if c then
                l = l <= 0 and l * rp or l / rp
                l = l - c * (p.frequency_penalty or 0) - (p.presence_penalty or 0)
            end
            if l > best_l then best, best_l = id, l end
        end
        if tok:is_eog(best) then break end
        out[#out + 1], history[#history + 1] = best, best
        if step == n then break end
        logits = m:forward(kv, { best })
    end
    kv:free()
    return out
end

-- The sha256 of a file, as sha256sum prints it.
function helper.sha256(path)
    local p = io.popen("sha256sum " .. helper.q(path))
    local out = p:read("*a")
    p:close()
    return out:match("^(%x+)")
end

-- The models a build writes under models_dir and llama.cpp's fixtures of
-- them under fixtures_dir: built(name) is the model's path, or nil after
-- marking the test pending (a missing one is a build that did not finish,
-- never a pass); fixture(name) the decoded name.greedy.json.
function helper.model_fixtures(models_dir, fixtures_dir)
    local function built(name)
        local path = models_dir .. name .. ".gguf"
        if helper.exists(path) then return path end
        pending(("%s not found (the build writes it: cmake --build build)"):format(path))
    end
    local function fixture(name)
        return require("cartridge.json").decode(assert(helper.read_file(fixtures_dir .. name .. ".greedy.json")))
    end
    return built, fixture
end

-- Runs the equivalence gate (recipes/equiv.lua) on a model over the
-- README, p 48 and 40 suffix tokens with an f16 cache, and asserts that it
-- passes bitwise, the shape-sensitivity envelope (0) printed first.
function helper.assert_gate_bitwise(path)
    local assert = require("luassert")
    local rc, out = helper.cartridge("run", helper.root .. "/recipes/equiv.lua", "--model", path,
        "--corpus", helper.root .. "/README.md", "--p", "48", "--suffix-max", "40", "--kv", "f16")
    assert.are.equal(0, rc, out)
    local env = out:find("model shape-sensitivity envelope (m=40 vs m=88, no cartridge): max |dlogit| 0.000000 (bitwise)", 1, true)
    local gate = out:find("max |dlogit| 0.000000, mean 0.0000000, greedy agreement 40/40", 1, true)
    assert.is_truthy(env, out)
    assert.is_truthy(gate, out)
    assert.is_true(env < gate)
    assert.matches("PASS: .* %(bitwise%)", out)
end

-- Asserts that the model at path tokenizes every prompt of a greedy.json
-- fixture (decoded) into the fixture's prompt_token_ids.
function helper.assert_tokenizes_like(path, fx)
    local assert = require("luassert")
    local m = require("cartridge").model.load(path)
    local tok = m:tokenizer()
    for _, p in ipairs(fx.prompts) do
        local ids = tok:encode_ids(p.prompt, { add_special = true, special = p.parse_special }):list()
        assert.are.same(p.prompt_token_ids, ids)
    end
    local arch = m.config.arch
    m:free()
    return arch
end

return helper
