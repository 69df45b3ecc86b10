-- cartridge.rng: a Lua view of the engine's seeded generator (engine/rng.h),
-- the one every recipe draws from, so that a seed gives the same documents,
-- conversations and fleet plans everywhere.
--
--   local g = rng.new(42)              -- cart_rng_seed
--   local g = rng.item(seed, a, b)     -- cart_rng_seed_item: a stream of its own for (seed, a, b)
--   g:int(1, 6), g:below(n), g:u64(), g:pick(list), g:shuffle(list)

local core = require("cartridge.core")
local ffi = core.ffi
local C = core.C

local rng = {}

local Rng = {}
Rng.__index = Rng

function rng.new(seed)
    local r = ffi.new("cart_rng")
    C.cart_rng_seed(r, seed)
    return setmetatable({ r = r }, Rng)
end

-- The generator seeded by (seed, a, b) alone: an item's own stream, the same
-- whatever was drawn for the items before it.
function rng.item(seed, a, b)
    local r = ffi.new("cart_rng")
    C.cart_rng_seed_item(r, seed, a, b)
    return setmetatable({ r = r }, Rng)
end

-- Reseeds in place as rng.item (no allocation, for a loop over items).
function Rng:seed_item(seed, a, b)
    C.cart_rng_seed_item(self.r, seed, a, b)
    return self
end

-- an integer in [lo, hi]
function Rng:int(lo, hi) return lo + tonumber(C.cart_rng_below(self.r, hi - lo + 1)) end
function Rng:below(n) return tonumber(C.cart_rng_below(self.r, n)) end
function Rng:u64() return C.cart_rng_next(self.r) end
-- an element of a list, and a list shuffled in place (Fisher-Yates)
function Rng:pick(list) return list[self:below(#list) + 1] end
function Rng:shuffle(t)
    for i = #t, 2, -1 do
        local j = self:below(i) + 1
        t[i], t[j] = t[j], t[i]
    end
    return t
end

return rng
