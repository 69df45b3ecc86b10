-- cartridge.dist: processes that train one cartridge together (engine/dist.h:
-- MPI when the build has it and a launcher started the process; otherwise a
-- job of one, where every call below returns at once).
--
--   local dist = require("cartridge.dist").init()  -- joins the job
--   dist.rank, dist.size                            -- 0-based rank, processes
--   dist.print(...)                                 -- print on rank 0 only
--   dist.barrier()
--   dist.broadcast(ptr, bytes, root)
--   local all = dist.allgather_doubles({ 1.5, 2 })  -- all[r + 1] = rank r's list
--   local s = dist.sum(n, max_parts)                -- the reproducible sum
--   s:part(i)                                       -- float* of part i (0-based)
--   s:reduce(k, scale, out)                         -- out = scale * sum of every rank's first k parts
--   dist.hash(ptr, bytes, h)                        -- FNV-1a, as 16 hex digits
--   local all = dist.allgather_text(s)             -- all[r + 1] = rank r's string
--   dist.agree({ { "model", fp, path }, { "corpus", fp } })  -- fingerprints: all ranks equal or an error
--   dist.fail(msg)                                  -- an error every rank raises at once
--
-- Errors every rank reaches together (a check of data they all gathered)
-- go through dist.fail: rank 0 prints it and every rank exits 1 cleanly. Any
-- other error stops the whole job from the rank that raised it, naming that
-- rank (host/main.c).

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local dist = { rank = 0, size = 1 }

-- Joins the job (once); returns the module.
function dist.init()
    core.check(C.cart_dist_init(), "dist")
    dist.rank = tonumber(C.cart_dist_rank())
    dist.size = tonumber(C.cart_dist_size())
    return dist
end

function dist.root() return dist.rank == 0 end

-- How many copies a launcher started, from its environment (Open MPI's
-- OMPI_COMM_WORLD_SIZE, MPICH's and Slurm's PMI_SIZE), whether or not this
-- process joins the job: 1 when none did. A recipe that runs in one process
-- refuses more, rather than have its copies write one output twice.
function dist.launched_size()
    return tonumber(os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("PMI_SIZE") or "") or 1
end

-- The MPI library's name and version, or that the build has none.
function dist.library() return ffi.string(C.cart_dist_library()) end
function dist.built_with_mpi() return C.cart_dist_built_with_mpi() ~= 0 end

function dist.print(...)
    if dist.rank == 0 then print(...) end
end

function dist.barrier() core.check(C.cart_dist_barrier(), "dist.barrier") end

function dist.broadcast(ptr, bytes, root)
    core.check(C.cart_dist_broadcast(ptr, bytes, root or 0), "dist.broadcast")
end

-- Every rank passes a list of the same length; returns one list per rank,
-- in rank order.
function dist.allgather_doubles(values)
    local n = #values
    local mine = ffi.new("double[?]", math.max(n, 1))
    for i = 1, n do mine[i - 1] = values[i] end
    local all = ffi.new("double[?]", math.max(n, 1) * dist.size)
    core.check(C.cart_dist_allgather(all, mine, n * 8), "dist.allgather")
    local out = {}
    for r = 0, dist.size - 1 do
        local list = {}
        for i = 1, n do list[i] = all[r * n + i - 1] end
        out[r + 1] = list
    end
    return out
end

-- An error every rank raises at the same point: rank 0 prints it, every
-- rank ends cleanly with status 1.
function dist.fail(msg)
    C.cart_dist_fail_together()
    error(msg, 0)
end

-- FNV-1a over bytes, continuing from h (a previous result, or nil), as 16
-- hex digits (uint64 cdata in and out would lose bits as Lua numbers).
function dist.hash(ptr, bytes, h)
    local start = 0ULL
    if h then start = tonumber(h:sub(1, 8), 16) * 0x100000000ULL + tonumber(h:sub(9, 16), 16) end
    local v = C.cart_dist_hash(ptr, bytes, start)
    return core.hex64(v)
end

-- Every rank passes one string; returns all of them, in rank order.
function dist.allgather_text(text)
    local lens = dist.allgather_doubles({ #text })
    local width = 1
    for _, l in ipairs(lens) do width = math.max(width, l[1]) end
    local mine = ffi.new("char[?]", width)
    ffi.copy(mine, text, #text)
    local all = ffi.new("char[?]", width * dist.size)
    core.check(C.cart_dist_allgather(all, mine, width), "dist.allgather")
    local out = {}
    for r = 0, dist.size - 1 do out[r + 1] = ffi.string(all + r * width, lens[r + 1][1]) end
    return out
end

-- Checks that every rank holds the same fingerprints: fields is a list of
-- { name, hex, label } (16 hex digits each; label optional, such as the
-- file the rank read). On a difference every rank fails together, naming
-- the ranks and the fields that differ from rank 0's, with both ranks'
-- labels, and `hint` says what to check.
function dist.agree(fields, hint)
    if dist.size == 1 then return end
    local mine = {}
    for i, f in ipairs(fields) do
        mine[2 * i - 1] = tonumber(f[2]:sub(1, 8), 16)
        mine[2 * i] = tonumber(f[2]:sub(9, 16), 16)
    end
    local all = dist.allgather_doubles(mine)
    local differ = {} -- { rank, field index }, the same list on every rank
    for r = 1, dist.size - 1 do
        for i = 1, #fields do
            local a, b = all[1], all[r + 1]
            if a[2 * i - 1] ~= b[2 * i - 1] or a[2 * i] ~= b[2 * i] then differ[#differ + 1] = { r, i } end
        end
    end
    if #differ == 0 then return end
    -- the labels travel only now, every rank having found the same differences
    local labels = {}
    for i, f in ipairs(fields) do
        if f[3] then labels[i] = dist.allgather_text(f[3]) end
    end
    local problems = {}
    for k, d in ipairs(differ) do
        local r, i = d[1], d[2]
        local a, b = all[1], all[r + 1]
        local which = labels[i] and ("rank %d read %s, rank 0 %s; "):format(r, labels[i][r + 1], labels[i][1]) or ""
        problems[k] = ("rank %d differs from rank 0 in its %s (%sfingerprint %08x%08x vs %08x%08x)")
            :format(r, fields[i][1], which, b[2 * i - 1], b[2 * i], a[2 * i - 1], a[2 * i])
    end
    dist.fail(("dist: the %d ranks do not agree: %s; %s"):format(dist.size, table.concat(problems, "; "),
        hint or "every rank must read the same files"))
end

-- The reproducible sum (engine/dist.h): scale times the sum of every rank's
-- parts, the same bits however the parts are spread over the ranks.
local Sum = {}
Sum.__index = Sum

function dist.sum(n, max_parts)
    return setmetatable({ handle = core.new("cart_dist_sum", C.cart_dist_sum_new, C.cart_dist_sum_free, "dist.sum",
        n, max_parts), n = n, max_parts = max_parts }, Sum)
end

function Sum:part(i)
    local p = C.cart_dist_sum_part(self.handle, i)
    if p == nil then error(("dist.sum: part %d of %d"):format(i, self.max_parts), 0) end
    return p
end

function Sum:reduce(k, scale, out)
    core.check(C.cart_dist_sum_reduce(self.handle, k, scale, out), "dist.sum:reduce")
end

function Sum:free() core.free(self, C.cart_dist_sum_free) end

-- What one reduce of n values moves: payload bytes and allreduce calls.
function dist.sum_traffic(n)
    local bytes, calls = ffi.new("int64_t[1]"), ffi.new("int32_t[1]")
    C.cart_dist_sum_traffic(n, bytes, calls)
    return tonumber(bytes[0]), calls[0]
end

return dist
