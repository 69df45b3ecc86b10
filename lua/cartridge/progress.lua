-- cartridge.progress: a progress bar with ETA for long loops, drawn on stderr
-- only when stdout is a terminal (logs and pipes get the plain step lines).
--
--   local bar = progress.new(total, "self-study")
--   bar:update(done)          -- redraws "[#####.....] 5/20  ETA 1m12s"
--   bar:clear()               -- before printing a line of your own
--   bar:finish()

local ffi = require("ffi")
pcall(ffi.cdef, "int isatty(int fd);")

local progress = {}
local Bar = {}
Bar.__index = Bar

local function now()
    return require("cartridge.core").C.cart_now_seconds()
end

local function tty()
    local ok, r = pcall(function() return ffi.C.isatty(1) == 1 and ffi.C.isatty(2) == 1 end)
    return ok and r
end

local function duration(s)
    s = math.max(0, math.floor(s + 0.5))
    if s >= 3600 then return ("%dh%02dm"):format(s / 3600, (s % 3600) / 60) end
    if s >= 60 then return ("%dm%02ds"):format(s / 60, s % 60) end
    return ("%ds"):format(s)
end

function progress.new(total, label)
    return setmetatable({ total = total, label = label or "", started = now(), shown = false, on = tty() }, Bar)
end

function Bar:update(done)
    if not self.on then return end
    local width = 30
    local filled = math.floor(width * done / math.max(self.total, 1))
    local elapsed = now() - self.started
    local eta = done > 0 and elapsed / done * (self.total - done) or 0
    io.stderr:write(("\r\27[K%s [%s%s] %d/%d  %s elapsed, ETA %s"):format(self.label, ("#"):rep(filled),
        ("."):rep(width - filled), done, self.total, duration(elapsed), done > 0 and duration(eta) or "?"))
    io.stderr:flush()
    self.shown = true
end

function Bar:clear()
    if self.shown then
        io.stderr:write("\r\27[K")
        io.stderr:flush()
        self.shown = false
    end
end

function Bar:finish()
    self:clear()
end

return progress
