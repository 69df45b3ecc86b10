-- cartridge.corpus: the documents a cartridge is made from, as text and ids.
--
--   local corpus = require("cartridge.corpus")
--   local c = corpus.load({ "README.md", "docs/" }, tok)
--   c.text, c.ids (a cartridge.ids sequence), c.n_tokens, c.files ({ path, start, bytes, tokens })
--   c.text_tokens                -- tokens of the documents' own text (no headers)
--   c:file_of(token_index)      -- the path of the document a token belongs to
--   local d = corpus.document("a.md", text, tok)   -- one document, no header (a fleet's)
--
-- Each path is a UTF-8 text file of any extension (at most 16 MiB) or a
-- directory whose top-level .md files are taken in sorted order (other entries
-- are ignored). A FIFO, socket or device is refused, never opened (it could
-- block forever), and so is an empty or blank file named on its own (one in
-- a directory is skipped, in one line on stderr): the length checks count
-- the documents' own text only, never the headers the corpus adds.
-- Every file becomes the block "\n\n# Document: <path>\n\n<text>";
-- blocks are tokenized one at a time (special-token text inside them is
-- matched as such, as the model would see it) and their ids concatenated.

local core = require("cartridge.core")
local fs = require("cartridge.fs")
local ids_mod = require("cartridge.ids")
local C = core.C

local corpus = {}

corpus.MAX_FILE_BYTES = 16 * 1024 * 1024

local Corpus = {}
Corpus.__index = Corpus

local function list_md(dir)
    local names = {}
    for _, name in ipairs(fs.list(dir)) do
        if name:lower():match("%.md$") then
            local full = dir:gsub("/+$", "") .. "/" .. name
            if fs.kind(full) == "file" then names[#names + 1] = full end
        end
    end
    table.sort(names) -- bytewise
    return names
end

local function read_text(path)
    local kind = fs.kind(path)
    if kind == "missing" then
        error(("corpus: %s; check the path"):format(core.last_error()), 0)
    elseif kind ~= "file" then
        error(("corpus: %s is not a regular file or a directory (a FIFO, socket or device); save its "
            .. "content to a file and pass that"):format(path), 0)
    end
    local f, err = io.open(path, "rb")
    if not f then error(("corpus: cannot open %s: %s"):format(path, tostring(err)), 0) end
    local size = f:seek("end")
    if size and size > corpus.MAX_FILE_BYTES then
        f:close()
        error(("corpus: %s is %d bytes, above the limit of %d (16 MiB) per file; split it into "
            .. "smaller files"):format(path, size, corpus.MAX_FILE_BYTES), 0)
    end
    f:seek("set", 0)
    local text = f:read("*a")
    f:close()
    if not text then error(("corpus: cannot read %s (is it a directory?)"):format(path), 0) end
    local bad = tonumber(C.cart_utf8_invalid_offset(text, #text))
    if bad >= 0 then
        error(("corpus: %s is not valid UTF-8: byte offset %d (0x%02x); convert it to UTF-8 "
            .. "(iconv -f <encoding> -t UTF-8)"):format(path, bad, text:byte(bad + 1)), 0)
    end
    return text
end

-- The files behind a list of --corpus arguments, in order.
-- Also returns the set of files that came from a directory listing.
function corpus.expand(paths)
    local files, listed = {}, {}
    for _, path in ipairs(paths) do
        if fs.kind(path) == "dir" then
            for _, f in ipairs(list_md(path)) do
                files[#files + 1] = f
                listed[f] = true
            end
        else
            files[#files + 1] = path
        end
    end
    return files, listed
end

-- Appends one document as its block; counts its own tokens apart from the
-- header's.
function Corpus:add(path, text, tok)
    local header = "\n\n# Document: " .. path .. "\n\n"
    local block = header .. text
    self.parts[#self.parts + 1] = block
    local start = #self.ids
    tok:encode_ids(block, { special = true }, self.ids)
    local _, header_tokens = tok:encode_buffer(header, { special = true })
    local own = math.max(0, #self.ids - start - header_tokens)
    self.files[#self.files + 1] = { path = path, start = start, bytes = #text, tokens = own }
    self.text_tokens = self.text_tokens + own
end

-- Loads and tokenizes the corpus. paths: a list of files and directories.
function corpus.load(paths, tok)
    if #paths == 0 then error("corpus: no --corpus given; pass a text file or a directory of .md files", 0) end
    local files, listed = corpus.expand(paths)
    if #files == 0 then
        error("corpus: no documents found in " .. table.concat(paths, ", ") ..
            " (a directory contributes its top-level .md files)", 0)
    end
    local self = setmetatable({ files = {}, ids = ids_mod.new(), parts = {}, text_tokens = 0 }, Corpus)
    local skipped = {}
    for _, path in ipairs(files) do
        local text = read_text(path)
        if text:find("%S") then
            self:add(path, text, tok)
        elseif listed[path] then
            skipped[#skipped + 1] = path
        else
            error(("corpus: %s has no text (%d bytes, all whitespace or none); remove it from the corpus or "
                .. "write the document"):format(path, #text), 0)
        end
    end
    if #skipped > 0 then
        io.stderr:write(("corpus: skipped %d empty .md file%s: %s\n"):format(#skipped, #skipped == 1 and "" or "s",
            table.concat(skipped, ", ")))
    end
    if #self.files == 0 then
        error("corpus: every document in " .. table.concat(paths, ", ") .. " is empty; add text", 0)
    end
    self.text = table.concat(self.parts)
    self.parts = nil
    self.n_tokens = #self.ids
    return self
end

-- One document alone as a corpus, without the document header: the text's
-- own ids, and `name` as the path its chunks name (a fleet's documents, each
-- trained into a cartridge of its own). The text must not be blank.
function corpus.document(name, text, tok)
    if not text:find("%S") then
        error(("corpus: %s has no text (%d bytes, all whitespace or none); remove it or write the document")
            :format(name, #text), 0)
    end
    local self = setmetatable({ ids = ids_mod.new(), text = text }, Corpus)
    tok:encode_ids(text, { special = true }, self.ids)
    self.n_tokens = #self.ids
    self.text_tokens = self.n_tokens
    self.files = { { path = name, start = 0, bytes = #text, tokens = self.n_tokens } }
    return self
end

-- The text of one corpus file, with the checks corpus.load makes (a regular
-- file, at most MAX_FILE_BYTES, UTF-8).
corpus.read_text = read_text

-- The path of the document token i (0-based) belongs to.
function Corpus:file_of(i)
    local found = self.files[1].path
    for _, f in ipairs(self.files) do
        if f.start <= i then found = f.path else break end
    end
    return found
end

-- A clear error unless the documents' own text has at least `need` tokens
-- (the headers the corpus adds do not count).
function Corpus:require_tokens(need, hint)
    if self.text_tokens < need then
        error(("CorpusTooShort: the corpus text has %d tokens (%d with its document headers) and this needs at "
            .. "least %d; %s"):format(self.text_tokens, self.n_tokens, need, hint), 0)
    end
end

return corpus
