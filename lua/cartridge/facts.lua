-- cartridge.facts: a synthetic reading task. Documents state facts about
-- fictional people in plain sentences; each fact has a question whose answer
-- is a short exact string. Each document is about different people (one
-- fact each), named from a fixed list in a fresh order, with values
-- (places, pets' names, jobs, ages, ...) drawn fresh from a seeded
-- generator, so no model can know a document's facts before reading it.
--
--   local facts = require("cartridge.facts")
--   local d = facts.document(seed, 40)       -- 40 facts
--   d.text                                   -- the document, Markdown
--   d.facts[i] = { sentence, question, questions, reverse, answer, relation,
--                  person, chance }   -- question == questions[1]
--   facts.chance(d)                          -- expected accuracy of guessing
--
-- `chance` of a fact is the accuracy a reader without the document reaches
-- by guessing the most likely answer: 1 / (the size of the answer's list)
-- for listed values (jobs, colors, months, ...), about 0 for invented names
-- and numbers that it would have to guess digit by digit.

local facts = {}

-- A seeded generator (cartridge.rng over cart_rng, so the documents are the
-- same on every machine).
function facts.rng(seed) return require("cartridge.rng").new(seed) end

-- ---------------------------------------------------------------------------
-- Invented words: syllables of an onset, a vowel and sometimes a coda.

local ONSETS = { "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr",
    "st", "tr", "sh", "th", "gr", "pl" }
local VOWELS = { "a", "e", "i", "o", "u", "ai", "ou", "ea" }
local CODAS = { "", "", "", "n", "r", "l", "s", "m", "th" }

local function syllable(g)
    return g:pick(ONSETS) .. g:pick(VOWELS) .. g:pick(CODAS)
end

local function word(g, lo, hi)
    local parts = {}
    for i = 1, g:int(lo, hi) do parts[i] = syllable(g) end
    local w = table.concat(parts)
    return w:sub(1, 1):upper() .. w:sub(2)
end

-- ---------------------------------------------------------------------------
-- The relations: what a sentence states and what its question asks.

local JOBS = { "baker", "carpenter", "nurse", "teacher", "pilot", "farmer", "painter", "tailor", "miner",
    "sailor", "chemist", "librarian", "potter", "glassblower", "clockmaker", "gardener", "weaver", "mason",
    "fisher", "brewer", "jeweler", "cartographer", "beekeeper", "locksmith" }
local COLORS = { "red", "blue", "green", "yellow", "purple", "orange", "silver", "gold", "black", "white",
    "brown", "teal" }
local MONTHS = { "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December" }
local ANIMALS = { "cat", "dog", "parrot", "horse", "goat", "rabbit", "owl", "tortoise", "ferret", "donkey" }
local INSTRUMENTS = { "violin", "flute", "drum", "harp", "trumpet", "cello", "guitar", "piano", "oboe",
    "banjo", "accordion", "clarinet" }
local FOODS = { "soup", "bread", "rice", "cheese", "apples", "noodles", "beans", "fish", "plums", "honey",
    "pears", "walnuts" }

-- The people's names: a fixed list of invented two-syllable first names, the
-- same on every machine. A document draws its people from it in a fresh
-- order, so which name has which fact is new in every document. The list is
-- fixed so that a tokenizer can give each name one token (the reader's does),
-- which lets a small model look a person up by a single key.
facts.NAMES, facts.is_name = {}, {}
do
    local g = facts.rng(20261201)
    while #facts.NAMES < 160 do
        local w = syllable(g) .. syllable(g)
        w = w:sub(1, 1):upper() .. w:sub(2)
        if #w <= 7 and not facts.is_name[w] then
            facts.NAMES[#facts.NAMES + 1], facts.is_name[w] = w, true
        end
    end
end

-- Each: a value drawn from g, the sentence, the question, the answer's chance.
-- A value that is an invented word never equals a person's name.
local function invented(g, lo, hi)
    while true do
        local w = word(g, lo, hi)
        if not facts.is_name[w] then return w end
    end
end

-- Each relation asks its question in three phrasings: the first is the one
-- self-study's bot A is taught to write (and the one make_facts.lua lists
-- first), the other two are held out from bot A, and a reader learns all of
-- them. `reverse` asks for the person from the value ("Who lives in
-- Braneamkris?"); a document asks it only where that value is its only one
-- of the relation, so it has one answer.
local RELATIONS = {
    { name = "home", value = function(g) return invented(g, 2, 3) end,
        sentence = function(p, v) return ("%s lives in %s."):format(p, v) end,
        questions = { "Where does %s live?", "In which town does %s live?", "Where is the home of %s?" },
        reverse = "Who lives in %s?", chance = 0 },
    { name = "job", value = function(g) return g:pick(JOBS) end,
        sentence = function(p, v) return ("%s works as a %s."):format(p, v) end,
        questions = { "What is the job of %s?", "What does %s do for a living?", "What work does %s do?" },
        reverse = "Who works as a %s?", chance = 1 / #JOBS },
    { name = "age", value = function(g) return tostring(g:int(18, 89)) end,
        sentence = function(p, v) return ("%s is %s years old."):format(p, v) end,
        questions = { "How old is %s?", "What is the age of %s?", "How many years old is %s?" },
        reverse = "Who is %s years old?", chance = 1 / 72 },
    { name = "pet", value = function(g) return { g:pick(ANIMALS), invented(g, 1, 2) } end,
        sentence = function(p, v)
            return ("%s has %s %s named %s."):format(p, v[1]:match("^[aeiou]") and "an" or "a", v[1], v[2])
        end,
        questions = { "What is the name of the pet of %s?", "What is the pet of %s called?",
            "What name does the pet of %s have?" },
        reverse = "Whose pet is named %s?", answer = function(v) return v[2] end, chance = 0 },
    { name = "color", value = function(g) return g:pick(COLORS) end,
        sentence = function(p, v) return ("The favorite color of %s is %s."):format(p, v) end,
        questions = { "What is the favorite color of %s?", "Which color does %s like best?",
            "What color does %s like most?" },
        reverse = "Whose favorite color is %s?", chance = 1 / #COLORS },
    { name = "food", value = function(g) return g:pick(FOODS) end,
        sentence = function(p, v) return ("%s likes to eat %s."):format(p, v) end,
        questions = { "What does %s like to eat?", "What food does %s like?", "Which food does %s enjoy eating?" },
        reverse = "Who likes to eat %s?", chance = 1 / #FOODS },
    { name = "month", value = function(g) return g:pick(MONTHS) end,
        sentence = function(p, v) return ("%s was born in %s."):format(p, v) end,
        questions = { "In which month was %s born?", "What is the birth month of %s?", "When was %s born?" },
        reverse = "Who was born in %s?", chance = 1 / #MONTHS },
    { name = "instrument", value = function(g) return g:pick(INSTRUMENTS) end,
        sentence = function(p, v) return ("%s plays the %s."):format(p, v) end,
        questions = { "Which instrument does %s play?", "What does %s play?",
            "What musical instrument does %s play?" },
        reverse = "Who plays the %s?", chance = 1 / #INSTRUMENTS },
}
facts.RELATIONS = RELATIONS

local TITLES = { "Notes on the people of %s", "Who is who in %s", "A register of %s", "The families of %s" }

-- A document of n facts (1 <= n <= #facts.NAMES): one fact about each of n
-- people, named from facts.NAMES in a fresh order, with relations cycled in
-- a fresh order and values drawn fresh; the sentences in paragraphs of 3 to
-- 6 under a title. opts.relations (default all 8) draws from that many of
-- the relations only, so that even a short document can hold several facts
-- of one relation, which only the person's name tells apart. Each question names its person, who is in one sentence
-- of the document, so it has exactly one answer there.
function facts.document(seed, n, opts)
    if type(n) ~= "number" or n < 1 or n ~= math.floor(n) or n > #facts.NAMES then
        error(("facts.document: the number of facts must be an integer in 1..%d, got %s"):format(#facts.NAMES,
            tostring(n)), 0)
    end
    local k = opts and opts.relations or #RELATIONS
    if type(k) ~= "number" or k < 1 or k > #RELATIONS or k ~= math.floor(k) then
        error(("facts.document: relations must be an integer in 1..%d, got %s"):format(#RELATIONS, tostring(k)), 0)
    end
    local g = facts.rng(seed)
    local pool = {}
    for i, name in ipairs(facts.NAMES) do pool[i] = name end
    g:shuffle(pool)
    local rels = g:shuffle({ 1, 2, 3, 4, 5, 6, 7, 8 })
    for i = #rels, k + 1, -1 do rels[i] = nil end
    local list, people = {}, {}
    for i = 1, n do
        if (i - 1) % #rels == 0 and i > 1 then g:shuffle(rels) end
        local rel = RELATIONS[rels[(i - 1) % #rels + 1]]
        local v = rel.value(g)
        local p = pool[i]
        people[i] = p
        local answer = rel.answer and rel.answer(v) or v
        local questions = {}
        for j, q in ipairs(rel.questions) do questions[j] = q:format(p) end
        list[i] = { sentence = rel.sentence(p, v), question = questions[1], questions = questions, answer = answer,
            relation = rel.name, person = p, chance = rel.chance, reverse_form = rel.reverse }
    end
    -- the reverse question, where the value is the document's only one of
    -- its relation (no draws: the documents keep their bytes)
    local count = {}
    for _, f in ipairs(list) do
        local key = f.relation .. "\0" .. f.answer:lower()
        count[key] = (count[key] or 0) + 1
    end
    for _, f in ipairs(list) do
        if count[f.relation .. "\0" .. f.answer:lower()] == 1 then f.reverse = f.reverse_form:format(f.answer) end
        f.reverse_form = nil
    end
    local order = {}
    for i = 1, #list do order[i] = list[i] end
    g:shuffle(order)
    local town = invented(g, 2, 3)
    local parts = { "# " .. g:pick(TITLES):format(town), "" }
    local i = 1
    while i <= #order do
        local k = math.min(#order - i + 1, g:int(3, 6))
        local sentences = {}
        for j = i, i + k - 1 do sentences[#sentences + 1] = order[j].sentence end
        parts[#parts + 1] = table.concat(sentences, " ")
        parts[#parts + 1] = ""
        i = i + k
    end
    return { text = table.concat(parts, "\n"), facts = list, people = people, seed = seed }
end

-- The expected exact-match accuracy of answering d's questions without it.
function facts.chance(d)
    local s = 0
    for _, f in ipairs(d.facts) do s = s + f.chance end
    return s / #d.facts
end

-- ---------------------------------------------------------------------------
-- Training conversations for a reader model, in a chat template, in the
-- forms the engine's recipes put documents in front of a model: the whole
-- document as the corpus of a system message (what ICL and the cartridge's
-- initialization see), an excerpt of it under self-study's provenance line
-- (what bot B sees), and an excerpt with a seed instruction that asks for a
-- question (what bot A sees).

local function contained(d, text)
    local inside = {}
    for _, f in ipairs(d.facts) do
        if text:find(f.sentence, 1, true) then inside[#inside + 1] = f end
    end
    return inside
end

-- One conversation from document d, drawn with g: returns a list of pieces
-- { text, supervised } in order. The supervised pieces are the assistant's
-- replies with the end of turn; a conversation's text is the concatenation.
-- opts.path: the document's path in its header (default: an invented
-- docs/<word>.md). opts.bot_a: the fraction of conversations that are bot
-- A's (an excerpt, a seed instruction, a question); the rest are the whole
-- document and excerpts 7 to 2. Without it, one in ten, drawn as the first
-- readers were.
-- opts.focus: the fraction of bot A's conversations whose instruction is
-- self-study's focus instruction, quoting one complete sentence of the
-- excerpt (nil: none, drawn as before). opts.phrasings: reading turns ask
-- in any of a relation's phrasings (else the first only, as the first
-- readers learnt); opts.reverse: the fraction asked in reverse. Bot A's
-- question is always the first phrasing.
function facts.conversation(g, d, T, opts)
    local selfstudy = require("cartridge.selfstudy")
    opts = opts or {}
    local path = opts.path or ("docs/" .. word(g, 2, 3):lower() .. ".md")
    local body = "\n\n# Document: " .. path .. "\n\n" .. d.text
    local kind -- 0-6: the whole document; 7-8: an excerpt; 9: bot A
    if opts.bot_a then
        kind = g:below(1000) < opts.bot_a * 1000 and 9 or g:below(9)
    else
        kind = g:below(10)
    end
    local pieces = {}
    local function reply(text) pieces[#pieces + 1] = { text = text .. T.close, supervised = true } end
    local function ask(q) pieces[#pieces + 1] = { text = T.user_open .. q .. T.close .. T.opener(false) } end
    local pool
    if kind < 7 then
        pieces[1] = { text = selfstudy.system_block(T, body) }
        pool = {}
        for i, f in ipairs(d.facts) do pool[i] = f end
        g:shuffle(pool)
    else
        -- an excerpt of a quarter to a half of the document, cut anywhere
        local n = #body
        local len = g:int(math.floor(n / 4), math.floor(n / 2))
        local start = g:int(1, n - len + 1)
        local excerpt = body:sub(start, start + len - 1)
        pool = g:shuffle(contained(d, excerpt))
        if #pool == 0 then return facts.conversation(g, d, T, opts) end
        pieces[1] = { text = selfstudy.system_block(T, selfstudy.chunk_text(path, excerpt)) }
        if kind == 9 then -- bot A: a seed instruction, answered with a question about the excerpt
            if opts.focus and g:below(1000) < opts.focus * 1000 then
                -- the focus instruction quotes one of the excerpt's sentences;
                -- the question is that sentence's
                ask(selfstudy.focus_text(pool[1].sentence))
                reply(pool[1].question)
                return pieces
            end
            ask(selfstudy.SEEDS[g:below(#selfstudy.SEEDS) + 1].text)
            reply(pool[1].question)
            return pieces
        end
    end
    -- the whole document: most of its facts asked, so that a pass over it
    -- trains many lookups; an excerpt: a few. Each in any of its phrasings,
    -- or in reverse (opts.reverse of the time, where the document has one).
    -- A reply restates the fact's sentence ("Kinras lives in Sothhim."): it
    -- names the person it looked up, and it still contains the exact answer
    -- (value or person) that facts.correct wants.
    for i = 1, math.min(#pool, kind < 7 and g:int(8, 24) or g:int(1, 6)) do
        local f = pool[i]
        if f.reverse and opts.reverse and g:below(1000) < opts.reverse * 1000 then
            ask(f.reverse)
        else
            ask(opts.phrasings and f.questions[g:below(#f.questions) + 1] or f.question)
        end
        reply(f.sentence)
    end
    return pieces
end

-- Whether `word` occurs in `line` as a whole word: case-insensitively, with
-- no letter or digit (ASCII, or any byte of a multi-byte UTF-8 character)
-- right before or after it.
local function edge(c) return c == "" or not (c:find("^%w") or c:byte() >= 128) end

local function has_word(line, word)
    line, word = line:lower(), word:lower()
    if word == "" then return false end
    local at = 1
    while true do
        local i, j = line:find(word, at, true)
        if not i then return false end
        if edge(line:sub(i - 1, i - 1)) and edge(line:sub(j + 1, j + 1)) then return true end
        at = i + 1
    end
end
facts.has_word = has_word

-- Whether a reply answers a fact: its first line holds the expected answer
-- as a whole word (case-insensitively), and holds none of `others` (the
-- other values of the same relation in the document, when given) as a
-- whole word: a reply naming every pet of the document is not right.
function facts.correct(reply, expected, others)
    local first = reply:match("^[^\n]*") or ""
    if not has_word(first, expected) then return false end
    for _, o in ipairs(others or {}) do
        if o:lower() ~= expected:lower() and has_word(first, o) then return false end
    end
    return true
end

-- Every question of document d, as make_facts.lua writes them to
-- qa.jsonl: each fact in its phrasings 1, 2 and 3 (phrasing "1", "2",
-- "3"), then the facts that have one in reverse (phrasing "reverse", whose
-- answer is the person and whose others are the document's other people).
-- Grouped by phrasing, first phrasing first, so the first #d.facts entries
-- are the questions bot A is taught to write.
function facts.questions(d)
    local out, others = {}, facts.others(d)
    for j = 1, #RELATIONS[1].questions do
        for i, f in ipairs(d.facts) do
            out[#out + 1] = { question = f.questions[j], answer = f.answer, relation = f.relation,
                others = others[i], phrasing = tostring(j) }
        end
    end
    for _, f in ipairs(d.facts) do
        if f.reverse then
            local people = {}
            for _, p in ipairs(d.people) do if p ~= f.person then people[#people + 1] = p end end
            out[#out + 1] = { question = f.reverse, answer = f.person, relation = f.relation, others = people,
                phrasing = "reverse" }
        end
    end
    return out
end

-- The phrasing sets a --phrasing flag names: "1", "2", "3", "reverse",
-- "held-out" (2 and 3: what bot A is never taught to write), "first" (= 1)
-- and "all". An entry without a phrasing (older files) is phrasing "1".
facts.PHRASING_SETS = { "first", "held-out", "reverse" }
function facts.in_set(e, set)
    local ph = e.phrasing or "1"
    if set == "all" then return true end
    if set == "first" then return ph == "1" end
    if set == "held-out" then return ph ~= "1" and ph ~= "reverse" end
    return ph == set
end
function facts.check_set(set, who)
    for _, s in ipairs({ "all", "first", "held-out", "reverse", "1", "2", "3" }) do
        if set == s then return set end
    end
    error(("%s: --phrasing %s is not a phrasing set: give 1, 2, 3, first, held-out, reverse or all")
        :format(who, tostring(set)), 0)
end
function facts.select(qa, set)
    local out = {}
    for _, e in ipairs(qa) do if facts.in_set(e, set) then out[#out + 1] = e end end
    return out
end

-- The other values of each fact's relation in document d, for
-- facts.correct: others[i] lists the answers of d's other facts of fact
-- i's relation that differ from fact i's answer.
function facts.others(d)
    local out = {}
    for i, f in ipairs(d.facts) do
        local seen, list = { [f.answer:lower()] = true }, {}
        for _, g in ipairs(d.facts) do
            if g.relation == f.relation and not seen[g.answer:lower()] then
                seen[g.answer:lower()] = true
                list[#list + 1] = g.answer
            end
        end
        out[i] = list
    end
    return out
end

-- The questions of a JSONL file of {"question", "answer"} lines (blank
-- lines skipped); a clear error names the line that is not one.
function facts.read_qa(path)
    local json = require("cartridge.json")
    local f = io.open(path, "rb")
    if not f then error("qa: cannot open " .. path .. "; write one with recipes/make_facts.lua", 0) end
    local qa, n_line = {}, 0
    for line in f:lines() do
        n_line = n_line + 1
        if line:find("%S") then
            local ok, e = pcall(json.decode, line)
            local others_ok = ok and type(e) == "table" and (e.others == nil or type(e.others) == "table")
            if others_ok and e.others then
                for _, o in ipairs(e.others) do others_ok = others_ok and type(o) == "string" end
            end
            local phrasing_ok = ok and type(e) == "table" and (e.phrasing == nil or e.phrasing == "1"
                or e.phrasing == "2" or e.phrasing == "3" or e.phrasing == "reverse")
            if not ok or type(e) ~= "table" or type(e.question) ~= "string" or type(e.answer) ~= "string"
                or e.answer == "" or not others_ok or not phrasing_ok then
                f:close()
                error(('qa: %s line %d is not {"question": string, "answer": non-empty string, optional '
                    .. '"others": [strings], optional "phrasing": "1"|"2"|"3"|"reverse"}%s')
                    :format(path, n_line, ok and "" or (": " .. tostring(e))), 0)
            end
            qa[#qa + 1] = e
        end
    end
    f:close()
    if #qa == 0 then error("qa: " .. path .. " holds no questions", 0) end
    return qa
end

-- How many of the questions m answers right, greedily, in one arm: opts.cartridge
-- (its rows in front), opts.system (a system message, e.g. the corpus), or
-- neither (bare); opts.max_a (24) tokens at most; scored by facts.correct
-- with each question's others. Returns right, total, the KV rows in front
-- of the last question's turn, and every question's { question, expected,
-- reply, right }. The replies are serve.answer's, token for token: the
-- arm's front (cartridge rows, or the system block) is computed once and
-- copied into each question's cache, and up to 16 questions decode in one
-- lockstep batch (the engine gives each stream the bits it gets alone).
function facts.accuracy(m, qa, opts)
    local chat = require("cartridge.chat")
    local selfstudy = require("cartridge.selfstudy")
    opts = opts or {}
    local tok, T = m:tokenizer(), chat.for_model(m)
    local max_a = opts.max_a or 24
    local front, front_ids = nil, {}
    if opts.system then
        front_ids = tok:encode(selfstudy.system_block(T, opts.system), { special = true, add_special = true })
    end
    local p = opts.cartridge and opts.cartridge.p or 0
    local right, rows, replies = 0, 0, {}
    for first = 1, #qa, 16 do
        local kvs, streams, prompts = {}, {}, {}
        for i = first, math.min(#qa, first + 15) do
            local text = T.user_open .. qa[i].question .. T.close .. T.opener(false)
            local prompt = tok:encode(text, { special = true, add_special = not opts.cartridge and not opts.system })
            local kv = m:new_kv(p + #front_ids + #prompt + max_a + 16, "f16")
            if opts.cartridge then opts.cartridge:append_to(kv) end
            if opts.system then
                if not front then
                    front = m:new_kv(#front_ids + 1, "f16")
                    m:forward(front, front_ids, "none")
                end
                kv:copy_from(front)
            end
            kvs[#kvs + 1], prompts[#prompts + 1] = kv, prompt
            streams[#streams + 1] = { i = i, ids = {}, done = false }
            rows = p + #front_ids + #prompt - #tok:encode(text, { special = true }) -- + BOS, where added
        end
        local logits = m:forward_batch(kvs, prompts, "last")
        while true do
            local live_kvs, next_ids, live = {}, {}, {}
            for j, st in ipairs(streams) do
                if not st.done then
                    local id = m:argmax(logits, st.row or (j - 1))
                    if tok:is_eog(id) then st.done = true else st.ids[#st.ids + 1] = id end
                    if #st.ids == max_a then st.done = true end
                    if not st.done then
                        live_kvs[#live_kvs + 1], next_ids[#next_ids + 1], live[#live + 1] = kvs[j], { id }, st
                    end
                end
            end
            if #live == 0 then break end
            logits = m:forward_batch(live_kvs, next_ids, "last")
            for j, st in ipairs(live) do st.row = j - 1 end
            for _, st in ipairs(streams) do if st.done then st.row = nil end end
        end
        for j, st in ipairs(streams) do
            kvs[j]:free()
            local e = qa[st.i]
            local reply = selfstudy.clean(tok:decode(st.ids, { special = false }))
            local ok = facts.correct(reply, e.answer, e.others)
            if ok then right = right + 1 end
            replies[st.i] = { question = e.question, expected = e.answer, reply = reply, right = ok }
        end
    end
    if front then front:free() end
    return right, #qa, rows, replies
end

-- How well self-study's bots cover a fact document: makes `groups`
-- groups of 16 conversations as selfstudy.lua does (opts: chunk_min,
-- chunk_max, max_q, max_a, seed, and corpus, a cartridge.corpus of the
-- document; seeds and turns as selfstudy.lua's --seeds and --turns) and
-- counts the questions, every turn's, that are exactly one of qa's, the
-- distinct facts those ask, and how many bot B answered right. opts.show(i,
-- question, answer) sees each question. Returns a table { n (questions),
-- valid, distinct, right, facts }.
function facts.bot_coverage(m, qa, opts)
    local selfstudy = require("cartridge.selfstudy")
    local tok = m:tokenizer()
    local interviews = selfstudy.interviews(m, tok, opts.corpus, { chunk_min = opts.chunk_min or 82,
        chunk_max = opts.chunk_max or 163, max_q = opts.max_q or 32, max_a = opts.max_a or 32, top_k = 20,
        seed = opts.seed or 42, template = require("cartridge.chat").for_model(m), seeds = opts.seeds,
        turns = opts.turns })
    local answer_of = {}
    for _, e in ipairs(qa) do answer_of[e.question] = e.answer end
    local r = { n = 0, valid = 0, distinct = 0, right = 0, facts = #qa }
    local seen = {}
    for s = 1, opts.groups or 8 do
        local keys = {}
        for i = 1, 16 do keys[i] = { s, i } end
        for _, c in ipairs(interviews:group(keys)) do
            for _, turn in ipairs(c.turns) do
                r.n = r.n + 1
                local answer = tok:decode(turn.answer)
                if opts.show then opts.show(r.n, turn.question, answer) end
                local want = answer_of[turn.question]
                if want then
                    r.valid = r.valid + 1
                    if not seen[turn.question] then seen[turn.question], r.distinct = true, r.distinct + 1 end
                    if facts.correct(answer, want) then r.right = r.right + 1 end
                end
            end
        end
    end
    return r
end

return facts
