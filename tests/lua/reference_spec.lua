-- reference_spec.lua: checks the independent float64 reference forward pass
-- (tests/reference/) against llama.cpp's greedy fixtures in
-- ../shared/reference, so that later specs can trust it as the yardstick
-- for the engine. It uses none of the engine's modules.

-- The repository root: two levels above this file (tests/lua/..).
local function repo_root()
    local src = debug.getinfo(1, "S").source:gsub("^@", "")
    local dir = src:match("^(.*)/tests/lua/[^/]*$")
    if dir == nil or dir == "" then dir = "." end
    return dir
end

local root = repo_root()
if not package.path:find("tests/?.lua", 1, true) then
    package.path = root .. "/tests/?.lua;" .. package.path
end

local ref = require("reference.forward")
local gguf = require("reference.gguf_reader")
local json = require("dkjson")

local shared = os.getenv("CARTRIDGE_SHARED") or (root .. "/../shared")

local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
end

local function read_json(path)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    local doc, _, err = json.decode(text)
    assert(doc, ("%s: %s"):format(path, tostring(err)))
    return doc
end

-- The fixtures: model, greedy file, tolerance on |Δlogit|, f16 rounding.
local cases = {
    { model = "models/stories260K.gguf", greedy = "reference/stories260K.greedy.json",
      tol = 1e-3, f16_round = false },
    { model = "reference/qwen3-tiny-f32.gguf", greedy = "reference/qwen3-tiny-f32.greedy.json",
      tol = 1e-3, f16_round = false },
    { model = "reference/qwen3-tiny-f16.gguf", greedy = "reference/qwen3-tiny-f16.greedy.json",
      tol = 1e-2, f16_round = true },
    { model = "reference/qwen3-tiny-realvocab-f16.gguf",
      greedy = "reference/qwen3-tiny-realvocab-f16.greedy.json",
      tol = 1e-2, f16_round = true },
}

-- Teacher-forces one greedy prompt (prompt ids, then llama.cpp's generated
-- ids) through the reference and compares every step's top-10 logits and
-- log-probs, the argmax and, where present, last_prompt_logits. Returns a
-- stats table; never asserts (the caller does, after printing).
local function check_prompt(model, prompt, tol)
    local st = { max_logit = 0, max_logprob = 0, steps = 0, flips = {}, bad_argmax = {} }
    local np = #prompt.prompt_token_ids
    local tokens, want = {}, {}
    for i, id in ipairs(prompt.prompt_token_ids) do tokens[i] = id end
    local n_steps = #prompt.steps
    for s = 1, n_steps - 1 do tokens[np + s] = prompt.generated_token_ids[s] end
    for s = 0, n_steps - 1 do want[np + s] = true end
    local logits = model:logits(tokens, { logits = want })
    local V = model.n_vocab

    if prompt.last_prompt_logits then
        local row = logits[np]
        assert(#prompt.last_prompt_logits == V, "last_prompt_logits has the wrong length")
        for id = 0, V - 1 do
            local d = math.abs(row[id] - gguf.round_f32(prompt.last_prompt_logits[id + 1]))
            if d > st.max_logit then st.max_logit = d end
        end
    end

    for s = 0, n_steps - 1 do
        local step = prompt.steps[s + 1]
        assert(step.step == s and step.pos == np + s, "unexpected step layout")
        local row = logits[np + s]
        local lse = ref.logsumexp(row, V)
        for _, top in ipairs(step.top) do
            local id, logit = top[1], gguf.round_f32(top[2])
            local d = math.abs(row[id] - logit)
            if d > st.max_logit then st.max_logit = d end
            local dl = math.abs((row[id] - lse) - (logit - step.lse))
            if dl > st.max_logprob then st.max_logprob = dl end
        end
        local am = ref.argmax(row, V)
        if am ~= step.token then
            -- Acceptable only at a near-tie: each logit within tol of the
            -- reference can swap two tokens whose margin is below 2 * tol.
            local info = ("step %d: ours %d, llama.cpp %d, margin %.4g"):format(
                s, am, step.token, step.margin)
            if step.margin < 2 * tol then
                st.flips[#st.flips + 1] = info
            else
                st.bad_argmax[#st.bad_argmax + 1] = info
            end
        end
        st.steps = st.steps + 1
    end
    return st
end

describe("reference forward (tests/reference)", function()
    local have_shared = exists(shared .. "/reference/README.md")

    it("converts f16 bit patterns and rounds to f16 with ties to even", function()
        assert.are.equal(1.0, gguf.f16_to_f64(0x3C00))
        assert.are.equal(-2.0, gguf.f16_to_f64(0xC000))
        assert.are.equal(65504, gguf.f16_to_f64(0x7BFF))
        assert.are.equal(2 ^ -24, gguf.f16_to_f64(0x0001))
        assert.are.equal(2 ^ -14, gguf.f16_to_f64(0x0400))
        assert.are.equal(math.huge, gguf.f16_to_f64(0x7C00))
        assert.is_true(gguf.f16_to_f64(0x7E00) ~= gguf.f16_to_f64(0x7E00))
        assert.are.equal(1.0, gguf.round_f16(1 + 2 ^ -11))             -- tie, to even
        assert.are.equal(1 + 2 ^ -9, gguf.round_f16(1 + 3 * 2 ^ -11))  -- tie, to even
        assert.are.equal(1 + 2 ^ -10, gguf.round_f16(1 + 2 ^ -11 + 2 ^ -30))
        assert.are.equal(-(2 ^ -24), gguf.round_f16(-(2 ^ -24) * 0.75))
        assert.are.equal(0, gguf.round_f16(2 ^ -26))
        assert.are.equal(65504, gguf.round_f16(65519))
        assert.are.equal(math.huge, gguf.round_f16(65520))
        -- Every finite half value rounds to itself.
        for h = 0, 0x7BFF do
            local x = gguf.f16_to_f64(h)
            if gguf.round_f16(x) ~= x then error(("0x%04x does not round to itself"):format(h)) end
        end
    end)

    for _, c in ipairs(cases) do
        local name = c.greedy:match("([^/]+)%.greedy%.json$")
        it(("matches llama.cpp's top-10 logits and greedy ids for %s"):format(name), function()
            if not have_shared then
                pending(("skipped: %s/reference not found (set CARTRIDGE_SHARED)"):format(shared))
                return
            end
            local t0 = os.clock()
            local model = ref.load(shared .. "/" .. c.model, { f16_round = c.f16_round })
            local doc = read_json(shared .. "/" .. c.greedy)
            local total = { max_logit = 0, max_logprob = 0, steps = 0, flips = {}, bad = {} }
            for pi, prompt in ipairs(doc.prompts) do
                if prompt.evaluated ~= false and #prompt.prompt_token_ids > 0 then
                    local st = check_prompt(model, prompt, c.tol)
                    total.max_logit = math.max(total.max_logit, st.max_logit)
                    total.max_logprob = math.max(total.max_logprob, st.max_logprob)
                    total.steps = total.steps + st.steps
                    for _, f in ipairs(st.flips) do total.flips[#total.flips + 1] = ("prompt %d %s"):format(pi, f) end
                    for _, f in ipairs(st.bad_argmax) do total.bad[#total.bad + 1] = ("prompt %d %s"):format(pi, f) end
                end
            end
            print(("\n[reference] %-28s f16_round=%-5s steps=%d max|dlogit|=%.3g max|dlogprob|=%.3g tol=%g near-tie flips=%d (%.2fs)")
                :format(name, tostring(c.f16_round), total.steps, total.max_logit,
                    total.max_logprob, c.tol, #total.flips, os.clock() - t0))
            for _, f in ipairs(total.flips) do print("[reference]   near-tie " .. f) end
            assert.is_true(total.steps > 0)
            assert.are.same({}, total.bad)
            assert.is_true(total.max_logit <= c.tol,
                ("max |dlogit| %.3g > tol %g"):format(total.max_logit, c.tol))
            assert.is_true(total.max_logprob <= c.tol,
                ("max |dlogprob| %.3g > tol %g"):format(total.max_logprob, c.tol))
        end)
    end

    for _, c in ipairs({ cases[1], cases[2] }) do
        local name = c.model:match("([^/]+)%.gguf$")
        it(("gives the plain forward's logits when the first tokens' K/V rows are a prefix (%s)")
            :format(name), function()
            if not have_shared then
                pending(("skipped: %s not found (set CARTRIDGE_SHARED)"):format(shared))
                return
            end
            local model = ref.load(shared .. "/" .. c.model)
            local tokens = { 1, 203, 207, 261, 278, 9, 42, 290, 17, 5, 88, 120 }
            local n, p = #tokens, 5
            local full = model:forward(tokens, { capture = true })
            local head, tail = {}, {}
            for i = 1, p do head[i] = tokens[i] end
            for i = p + 1, n do tail[#tail + 1] = tokens[i] end
            local pre = model:forward(head, { capture = true, logits = "none" })
            local with = model:forward(tail, {
                prefix = { n = p, k = pre.k, v = pre.v }, capture = true })
            local V, kv_dim = model.n_vocab, model:kv_dim()
            local max_d = 0
            for i = 1, n - p do
                local a, b = with.logits[i], full.logits[p + i]
                for id = 0, V - 1 do max_d = math.max(max_d, math.abs(a[id] - b[id])) end
            end
            -- The captured rows of the tail are the full forward's rows p.. too.
            local max_kv = 0
            for l = 1, model.n_layer do
                for j = 0, (n - p) * kv_dim - 1 do
                    max_kv = math.max(max_kv,
                        math.abs(with.k[l][j] - full.k[l][p * kv_dim + j]),
                        math.abs(with.v[l][j] - full.v[l][p * kv_dim + j]))
                end
            end
            print(("\n[reference] prefix %s: p=%d max|dlogit|=%.3g max|dkv|=%.3g tol=1e-12")
                :format(name, p, max_d, max_kv))
            assert.is_true(max_d <= 1e-12)
            assert.is_true(max_kv <= 1e-12)
            -- And the prefix really matters: without it the logits differ.
            local alone = model:logits(tail, { logits = "last" })
            local diff = 0
            for id = 0, V - 1 do
                diff = math.max(diff, math.abs(alone[n - p][id] - full.logits[n][id]))
            end
            assert.is_true(diff > 1e-3)
        end)
    end
end)
