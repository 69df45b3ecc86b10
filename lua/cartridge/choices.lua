-- cartridge.choices: several choices in one response -- OpenAI's n on chat
-- and completions, and completions' prompt arrays.
--
--   local http = choices.wrap(real_http)            -- the server writes through it
--   local list, n = choices.expand(route, body, ctx) -- { { prompt = p, j = j, seed = s }, ... }, n; or nil
--   local ids = choices.group(http, id, #list, n, on_done)  -- ids of child jobs answering id together
--
-- Each choice is a job of its own (its own slot, decoded in the same
-- lockstep batch as the others) with an id of its own. Writes to a child's
-- id are merged into the one response of the request: a plain answer
-- waits for every choice and lists them in index order, with the usage
-- summed (the prompt counted once per prompt); a stream passes each
-- chunk on as it comes, its choice's index set and the request's id, then
-- one usage chunk (when asked) and one [DONE] after the last choice ends.
-- A choice that fails ends the whole response with its error, and the
-- others are cancelled (their ids read as closed).
--
-- Choice index = prompt index * n + j (OpenAI's order); choice j samples
-- with seed + j, so choice j's tokens are those of a single request with
-- that seed.

local json = require("cartridge.json")

local choices = {}

choices.MAX = 64 -- most choices (prompts x n) of one request

local Proxy = {}

-- The http object the server writes through: child ids go to their group,
-- anything else to the real server.
function choices.wrap(http)
    local self = { real = http, of = {}, next_id = 2 ^ 40 }
    return setmetatable(self, {
        __index = function(t, k)
            local own = Proxy[k]
            if own then return own end
            local v = http[k]
            if type(v) == "function" then return function(_, ...) return v(http, ...) end end
            return v
        end,
        __newindex = function(_, k, v) http[k] = v end,
    })
end

-- Ids for count child jobs of request id (n choices per prompt), and the
-- group they answer together. on_done() runs once the request is answered.
function choices.group(proxy, id, count, n, on_done)
    local g = { real = id, n = count, bodies = {}, responded = 0, ended = 0, on_done = on_done,
        first_of_prompt = function(index) return index % n == 0 end }
    local ids = {}
    for i = 1, count do
        proxy.next_id = proxy.next_id + 1
        ids[i] = proxy.next_id
        proxy.of[ids[i]] = { g = g, index = i - 1 }
    end
    return ids
end

local function finish(proxy, g)
    if g.done then return end
    g.done = true
    for id, c in pairs(proxy.of) do
        if c.g == g then proxy.of[id] = nil end
    end
    if g.on_done then g.on_done() end
end

-- Sums the usage objects of the choices: completion tokens of all, prompt
-- tokens once per prompt (the first choice of each, `first` tells which).
local function add_usage(into, u, first)
    if not into then
        into = { prompt_tokens = 0, completion_tokens = 0, total_tokens = 0,
            prompt_tokens_details = { cached_tokens = 0 } }
    end
    if first then
        into.prompt_tokens = into.prompt_tokens + u.prompt_tokens
        into.prompt_tokens_details.cached_tokens = into.prompt_tokens_details.cached_tokens
            + (u.prompt_tokens_details and u.prompt_tokens_details.cached_tokens or 0)
    end
    into.completion_tokens = into.completion_tokens + u.completion_tokens
    into.total_tokens = into.prompt_tokens + into.completion_tokens
    return into
end

-- Drops the group of child id without answering (the request is refused).
function choices.forget(proxy, id)
    local c = proxy.of[id]
    if c then finish(proxy, c.g) end
end

function Proxy:is_open(id)
    local c = self.of[id]
    if not c then return self.real:is_open(id) end
    return not c.g.done and self.real:is_open(c.g.real)
end

function Proxy:respond(id, status, ctype, body, headers)
    local c = self.of[id]
    if not c then return self.real:respond(id, status, ctype, body, headers) end
    local g = c.g
    if status ~= 200 then -- the first failure answers for all
        self.real:respond(g.real, status, ctype, body, headers)
        return finish(self, g)
    end
    g.bodies[c.index + 1] = json.decode(body)
    g.responded = g.responded + 1
    if g.responded < g.n then return end
    local list, usage = json.array(), nil
    for i, b in ipairs(g.bodies) do
        list[i] = b.choices[1]
        list[i].index = i - 1
        if b.usage then usage = add_usage(usage, b.usage, g.first_of_prompt(i - 1)) end
    end
    local merged = g.bodies[1]
    merged.choices, merged.usage = list, usage
    self.real:respond(g.real, 200, ctype, json.encode(merged), headers)
    finish(self, g)
end

function Proxy:stream_begin(id, status, ctype, headers)
    local c = self.of[id]
    if not c then return self.real:stream_begin(id, status, ctype, headers) end
    if not c.g.begun then
        c.g.begun = true
        self.real:stream_begin(c.g.real, status, ctype, headers)
    end
end

-- One child's server-sent events: each chunk with its index and the
-- group's id; usage and [DONE] held for the end; an error passed on.
function Proxy:stream_write(id, data)
    local c = self.of[id]
    if not c then return self.real:stream_write(id, data) end
    local g = c.g
    if g.done then return end
    for event in data:gmatch("data: ([^\n]*)\n\n") do
        if event ~= "[DONE]" then
            local obj = json.decode(event)
            if obj.error then
                self.real:stream_write(g.real, "data: " .. event .. "\n\n")
                self.real:stream_end(g.real)
                return finish(self, g)
            end
            if #obj.choices == 0 and obj.usage then
                g.usage = add_usage(g.usage, obj.usage, g.first_of_prompt(c.index))
                g.usage_chunk = obj
            else
                g.id = g.id or obj.id
                obj.id = g.id
                obj.choices[1].index = c.index
                self.real:stream_write(g.real, "data: " .. json.encode(obj) .. "\n\n")
            end
        end
    end
end

function Proxy:stream_end(id)
    local c = self.of[id]
    if not c then return self.real:stream_end(id) end
    local g = c.g
    if g.done then return end
    g.ended = g.ended + 1
    if g.ended < g.n then return end
    if g.usage_chunk then
        g.usage_chunk.id, g.usage_chunk.usage = g.id or g.usage_chunk.id, g.usage
        self.real:stream_write(g.real, "data: " .. json.encode(g.usage_chunk) .. "\n\n")
    end
    self.real:stream_write(g.real, "data: [DONE]\n\n")
    self.real:stream_end(g.real)
    finish(self, g)
end

-- The choices a chat or completions body asks for: nil for one (the usual
-- request), else a list of { prompt (completions: the text or ids of that
-- prompt), j, seed }, in index order, and n (choices per prompt). ctx: reject, shown, slots, seed (the
-- server's default seed), n_vocab.
function choices.expand(route, body, ctx)
    if route ~= "/v1/chat/completions" and route ~= "/v1/completions" then return nil end
    local n = body.n
    if n == nil or n == json.null then n = 1 end
    if type(n) ~= "number" or n ~= math.floor(n) or n < 1 or n > ctx.slots then
        ctx.reject(400, ("n must be an integer in [1, %d] (this server's slots, --parallel); got %s"):format(ctx.slots,
            ctx.shown(n, body, "n")), "n")
    end
    local prompts = { false } -- chat: its messages
    if route == "/v1/completions" then prompts = choices.prompts(body.prompt, ctx, body) end
    if n == 1 and #prompts == 1 then return nil end
    if #prompts * n > choices.MAX then
        ctx.reject(400, ("%d prompts x n = %d is %d choices; a request may ask for at most %d"):format(#prompts, n,
            #prompts * n, choices.MAX), #prompts > 1 and "prompt" or "n")
    end
    local seed = body.seed
    if seed == nil or seed == json.null then seed = ctx.seed end
    local list = {}
    for _, p in ipairs(prompts) do
        for j = 0, n - 1 do list[#list + 1] = { prompt = p, j = j, seed = type(seed) == "number" and seed + j or seed } end
    end
    return list, n
end

-- A completions prompt as a list of prompts, each a string or a list of
-- token ids: a string, a list of strings, a list of ids, or a list of
-- lists of ids.
function choices.prompts(prompt, ctx, body)
    local function ids(v, where)
        for i, id in ipairs(v) do
            if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= ctx.n_vocab then
                ctx.reject(400, ("%s[%d] must be a token id in [0, %d); got %s"):format(where, i - 1, ctx.n_vocab,
                    ctx.shown(id, v, i)), "prompt")
            end
        end
        return v
    end
    if type(prompt) == "string" then return { prompt } end
    if json.kind(prompt) == "array" and #prompt > 0 then
        if type(prompt[1]) == "number" then return { ids(prompt, "prompt") } end
        local out = {}
        for i, p in ipairs(prompt) do
            local where = ("prompt[%d]"):format(i - 1)
            if type(p) == "string" then out[i] = p
            elseif json.kind(p) == "array" and #p > 0 then out[i] = ids(p, where)
            else
                ctx.reject(400, ("%s must be a string or a non-empty list of token ids; got %s"):format(where,
                    ctx.shown(p, prompt, i)), "prompt")
            end
        end
        return out
    end
    ctx.reject(400, "prompt must be a string, a list of strings, a list of token ids or a list of such lists; got "
        .. ctx.shown(prompt, body, "prompt"), "prompt")
end

return choices
