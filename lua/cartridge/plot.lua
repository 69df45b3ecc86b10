-- cartridge.plot: line plots of training curves, written as SVG or PNG in plain Lua.
--
--   local plot = require("cartridge.plot")
--   local run = plot.read_run("run1.jsonl", { metric = "loss", x = "step" })
--   run.label = "run1"
--   plot.render({ runs = { run }, out = "loss.png", title = "self-study loss",
--                 x_label = "step", y_label = "loss" })
--
-- Both formats come from one list of drawing operations (rules, polylines,
-- circles, text), so an SVG and a PNG of the same runs have the same layout.
-- SVG is hand-written XML; PNG is RGB 8-bit from a small rasterizer
-- (anti-aliased strokes and discs, a built-in 5x7 bitmap font) and an encoder
-- that compresses the pixels with the system's zlib (libz.so.1, loaded through
-- the FFI; stored deflate blocks where it is missing).
--
-- API
--   plot.read_run(path, opts) -> run
--       Reads a metrics JSONL file (one JSON object per line, as the training
--       recipe writes them). Step lines are objects with a numeric "step" and
--       no "event"; {"event":"heldout_before"|"heldout_after", <metric>: v}
--       lines give the held-out markers (last one wins). Other lines and
--       fields are ignored. opts.metric (default "loss") is the y value;
--       opts.x (default "step") is "step", "answer_tokens" (the tokens trained
--       on so far, as recorded) or "seconds" (recorded per step; its running
--       total, the time spent so far, is the x value). Step lines without a numeric metric or
--       x are skipped.
--       Returns { label = path, points = { {x, y}, ... }, heldout_before = v|nil,
--       heldout_after = v|nil, steps = <number of step lines> }.
--       Raises error("plot: ...", 0) naming the file (and line) when the file
--       cannot be read, a line is not valid JSON, it has no step lines, or no
--       step line has a numeric metric and x.
--   plot.render(spec) -> out
--       Draws spec.runs and writes spec.out atomically (a temporary file beside
--       it, then os.rename). The format is the extension of spec.out: ".svg" or
--       ".png" (any case); anything else raises an error naming both.
--       spec = { runs = { { label =, points = { {x, y}, ... }, heldout_before =,
--                heldout_after = }, ... }, out = path, title =, x_label =,
--                y_label =, log_y = bool, width = 900, height = 540 }
--       Held-out values are drawn at the x of the run's first (before, a ring)
--       and last (after, a dot) point. With log_y, points and held-out values
--       <= 0 are left out. Raises error("plot: ...", 0) on a bad spec (no runs,
--       a run with no drawable points, a size outside 200x150 .. 8192x8192).
--   plot.svg(spec) -> string        the SVG document (spec.out is not used)
--   plot.png(spec) -> string        the PNG file's bytes (spec.out is not used)
--   plot.encode_png(width, height, rgb) -> string
--       A PNG of an RGB image: rgb is width*height*3 bytes, rows top to
--       bottom, as a Lua string or a cdata pointer the caller keeps alive.
--   plot.nice_ticks(lo, hi, target[, integer]) -> ticks, step, lo, hi
--       About `target` round tick values (1, 2 or 5 times a power of ten apart)
--       covering [lo, hi], and the widened range they span. integer = true
--       keeps the step >= 1 (for step counts).

local bit = require("bit")
local ffi = require("ffi")
local json = require("cartridge.json")

local band, bxor, bnot, rshift = bit.band, bit.bxor, bit.bnot, bit.rshift
local floor, ceil, min, max, abs, sqrt = math.floor, math.ceil, math.min, math.max, math.abs, math.sqrt
local log10 = function(v) return math.log(v) / math.log(10) end

local plot = {}

-- matplotlib's "tab10": distinct on white, in the order runs get them.
local PALETTE = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
}
local INK, AXIS, GRID, PAPER = "#222222", "#444444", "#e4e4e4", "#ffffff"
local MAX_LABEL = 48 -- legend labels longer than this keep their tail
local REF_COLORS = { "#555555", "#aaaaaa" } -- reference lines (spec.hlines), dark then light gray

-- ---------------------------------------------------------------------------
-- Reading metrics files

-- x fields the metrics file records per step, plotted as their running total
-- (answer_tokens is recorded as the total so far already)
local PER_STEP = { seconds = true }

-- For --metric qa: a {"event": "qa", step, conversations, right, total}
-- line is a point (y: percent right); {"event": "qa_reference", bare, icl,
-- total} gives the run's reference lines (run.refs).
local function read_qa_line(run, obj, xfield)
    if type(obj) ~= "table" or type(obj.total) ~= "number" or obj.total <= 0 then return end
    if obj.event == "qa" and type(obj.right) == "number" then
        run.steps = run.steps + 1
        local x = obj[xfield]
        if type(x) == "number" then run.points[#run.points + 1] = { x, 100 * obj.right / obj.total } end
    elseif obj.event == "qa_reference" and type(obj.icl) == "number" and type(obj.bare) == "number" then
        run.refs = { { label = "ICL", y = 100 * obj.icl / obj.total }, { label = "bare", y = 100 * obj.bare / obj.total } }
    end
end

-- A trailing moving average over n points (n >= 1): point i becomes the
-- mean of points max(1, i - n + 1) .. i.
function plot.smooth(points, n)
    local out, sum = {}, 0
    for i, p in ipairs(points) do
        sum = sum + p[2]
        if i > n then sum = sum - points[i - n][2] end
        out[i] = { p[1], sum / math.min(i, n) }
    end
    return out
end

function plot.read_run(path, opts)
    opts = opts or {}
    local metric, xfield = opts.metric or "loss", opts.x or "step"
    local f, err = io.open(path, "rb")
    if not f then error(("plot: cannot read %s (%s)"):format(path, tostring(err)), 0) end
    local run = { label = path, points = {}, steps = 0 }
    local total, n = 0, 0
    for line in f:lines() do
        n = n + 1
        if line:find("%S") then
            local ok, obj = pcall(json.decode, line)
            if not ok then
                f:close()
                error(("plot: %s:%d: not valid JSON (%s)"):format(path, n, tostring(obj)), 0)
            end
            if metric == "qa" then
                read_qa_line(run, obj, xfield)
            elseif type(obj) == "table" and obj.event == nil and type(obj.step) == "number" then
                run.steps = run.steps + 1
                local x, y = obj[xfield], obj[metric]
                if type(x) == "number" and PER_STEP[xfield] then
                    total = total + x
                    x = total
                end
                if type(x) == "number" and type(y) == "number" then
                    run.points[#run.points + 1] = { x, y }
                end
            elseif type(obj) == "table" and type(obj[metric]) == "number" then
                if obj.event == "heldout_before" then run.heldout_before = obj[metric] end
                if obj.event == "heldout_after" then run.heldout_after = obj[metric] end
            end
        end
    end
    f:close()
    if metric == "qa" and run.steps == 0 then
        error(("plot: %s has no QA lines ({\"event\": \"qa\", ...}: selfstudy.lua --qa FILE writes them, "
            .. "--qa-every N also during the run)"):format(path), 0)
    end
    if run.steps == 0 then
        error(("plot: %s has no step lines (expected one JSON object per line with a numeric \"step\")")
            :format(path), 0)
    end
    if #run.points == 0 then
        error(("plot: %s: none of its %d step lines has a numeric %q and %q"):format(
            path, run.steps, metric, xfield), 0)
    end
    return run
end

-- ---------------------------------------------------------------------------
-- Ticks

-- 1, 2 or 5 times a power of ten, near raw: returns the step as mantissa
-- and exponent, so that tick i can be computed as i * m / 10^-e, which is the
-- double nearest the decimal (14 * 0.2 is 2.8000000000000003; 28 / 10 is 2.8).
local function nice_step(raw)
    local e = floor(log10(raw))
    local f = raw / 10 ^ e
    local m
    if f < 1.5 then m = 1 elseif f < 3 then m = 2 elseif f < 7 then m = 5 else m = 10 end
    return m, e
end

local function scaled(i, m, e)
    if e >= 0 then return i * m * 10 ^ e end
    return i * m / 10 ^ -e
end

-- Widens an empty range so that it can be divided into ticks.
local function widen(lo, hi)
    if hi > lo then return lo, hi end
    local pad = lo == 0 and 1 or abs(lo) * 0.1
    return lo - pad, hi + pad
end

function plot.nice_ticks(lo, hi, target, integer)
    lo, hi = widen(lo, hi)
    local m, e = nice_step((hi - lo) / max(1, target))
    if integer and e < 0 then m, e = 1, 0 end
    local step = scaled(1, m, e)
    local first, last = floor(lo / step + 1e-9), ceil(hi / step - 1e-9)
    local ticks = {}
    for i = first, last do
        ticks[#ticks + 1] = i == 0 and 0 or scaled(i, m, e)
    end
    return ticks, step, ticks[1], ticks[#ticks]
end

-- Tick labels for one axis: as many decimals as the step needs; in
-- thousands (k) or millions (M) when the largest tick reaches 100000 or 1e8,
-- the same unit for every tick.
local function tick_labels(ticks, step)
    local big = step
    for _, v in ipairs(ticks) do big = max(big, abs(v)) end
    local div, suffix = 1, ""
    if big >= 1e8 then div, suffix = 1e6, "M" elseif big >= 1e5 then div, suffix = 1e3, "k" end
    local decimals = max(0, -floor(log10(step / div) + 1e-9))
    local pattern = ("%%.%df"):format(min(decimals, 10))
    local labels = {}
    for i, v in ipairs(ticks) do
        labels[i] = v == 0 and "0" or (pattern:format(v / div) .. suffix)
    end
    return labels
end

-- Log-scale ticks for [lo, hi] (both > 0). Returns tick values, their labels,
-- and the axis range (in data units).
local function log_ticks(lo, hi, target)
    if hi <= lo then lo, hi = lo / 1.5, hi * 1.5 end
    local e0, e1 = floor(log10(lo) + 1e-9), ceil(log10(hi) - 1e-9)
    if e1 - e0 >= 2 then
        -- Whole decades, every k-th one.
        local k = max(1, ceil((e1 - e0) / max(1, target)))
        local ticks, labels = {}, {}
        for e = e0, e1, k do
            ticks[#ticks + 1] = 10 ^ e
            labels[#labels + 1] = ("%g"):format(10 ^ e)
        end
        return ticks, labels, 10 ^ e0, 10 ^ (e0 + k * ceil((e1 - e0) / k))
    end
    -- Less than two decades: 1, 2, 5 x 10^e inside the range, or plain linear
    -- round numbers when those are too few. The axis is the data range padded by
    -- 4% of its log width.
    local pad = (log10(hi) - log10(lo)) * 0.04
    local alo, ahi = 10 ^ (log10(lo) - pad), 10 ^ (log10(hi) + pad)
    local ticks, labels = {}, {}
    for e = e0 - 1, e1 do
        for _, m in ipairs({ 1, 2, 5 }) do
            local v = m * 10 ^ e
            if v >= alo and v <= ahi then
                ticks[#ticks + 1] = v
                labels[#labels + 1] = ("%g"):format(v)
            end
        end
    end
    if #ticks < 3 then
        local lin, step = plot.nice_ticks(alo, ahi, target)
        ticks = {}
        for _, v in ipairs(lin) do
            if v >= alo and v <= ahi then ticks[#ticks + 1] = v end
        end
        labels = tick_labels(ticks, step)
    end
    return ticks, labels, alo, ahi
end

-- ---------------------------------------------------------------------------
-- Layout: spec -> a list of drawing operations in pixel coordinates
--
--   { op = "rule", x1, y1, x2, y2, width, color }      axis-aligned, whole pixels
--   { op = "polyline", points = { x, y, x, y, ... }, width, color, run = i }
--   { op = "circle", cx, cy, r, fill, stroke, stroke_width }
--   { op = "rect", x, y, w, h, fill, stroke }
--   { op = "text", text, x, y, anchor = "start"|"middle"|"end", size = "normal"|"title",
--     rotate = bool (reads bottom to top), color }   y is the text's vertical centre

local function check_spec(spec)
    if type(spec) ~= "table" then error("plot: render expects a table", 0) end
    local runs = spec.runs
    if type(runs) ~= "table" or #runs == 0 then error("plot: no runs to draw", 0) end
    local w, h = spec.width or 900, spec.height or 540
    if type(w) ~= "number" or type(h) ~= "number" or w ~= floor(w) or h ~= floor(h)
        or w < 200 or h < 150 or w > 8192 or h > 8192 then
        error(("plot: image size %sx%s is outside 200x150 .. 8192x8192"):format(tostring(w), tostring(h)), 0)
    end
    return w, h
end

-- The points of a run that can be drawn (finite; positive on a log axis).
local function drawable(run, i, log_y)
    if type(run.points) ~= "table" then
        error(("plot: run %d (%s) has no points table"):format(i, tostring(run.label)), 0)
    end
    local function finite(v)
        return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge
    end
    local function ok(v) return finite(v) and (not log_y or v > 0) end
    local pts = {}
    for _, p in ipairs(run.points) do
        if type(p) == "table" and finite(p[1]) and ok(p[2]) then pts[#pts + 1] = p end
    end
    if #pts == 0 then
        error(("plot: run %d (%s) has no points to draw%s"):format(i, tostring(run.label or "?"),
            log_y and " (a log axis drops values <= 0)" or ""), 0)
    end
    local before = ok(run.heldout_before) and run.heldout_before or nil
    local after = ok(run.heldout_after) and run.heldout_after or nil
    return pts, before, after
end

-- Keeps the tail of a long label, where file names differ.
local function shorten(s)
    s = tostring(s)
    if #s <= MAX_LABEL then return s end
    return "..." .. s:sub(-(MAX_LABEL - 3))
end

-- The runs and reference lines to draw, and the data's ranges over the
-- drawable points, held-out values and lines: d = { series, hlines, xmin,
-- xmax, ymin, ymax, integer_x, has_markers }.
local function data_ranges(spec, log_y)
    local d = { series = {}, hlines = {}, xmin = math.huge, xmax = -math.huge, ymin = math.huge,
                ymax = -math.huge, integer_x = true, has_markers = false }
    for i, run in ipairs(spec.runs) do
        local pts, before, after = drawable(run, i, log_y)
        for _, p in ipairs(pts) do
            d.xmin, d.xmax = min(d.xmin, p[1]), max(d.xmax, p[1])
            d.ymin, d.ymax = min(d.ymin, p[2]), max(d.ymax, p[2])
            if p[1] ~= floor(p[1]) then d.integer_x = false end
        end
        for _, v in ipairs({ before or false, after or false }) do
            if v then d.ymin, d.ymax = min(d.ymin, v), max(d.ymax, v) end
        end
        d.has_markers = d.has_markers or before ~= nil or after ~= nil
        d.series[i] = { pts = pts, before = before, after = after,
                        label = shorten(run.label or ("run " .. i)), color = PALETTE[(i - 1) % #PALETTE + 1] }
    end
    -- reference lines across the plot (QA: ICL and bare)
    for k, hl in ipairs(spec.hlines or {}) do
        if type(hl.y) == "number" and hl.y == hl.y and (not log_y or hl.y > 0) then
            d.ymin, d.ymax = min(d.ymin, hl.y), max(d.ymax, hl.y)
            d.hlines[#d.hlines + 1] = { y = hl.y, label = shorten(hl.label or ("line " .. k)),
                color = hl.color or REF_COLORS[(k - 1) % #REF_COLORS + 1] }
        end
    end
    if #d.hlines > 0 and not log_y and d.ymax > d.ymin then
        -- room above and below, so that a line at the data's edge is not the frame
        local span = d.ymax - d.ymin
        d.ymin, d.ymax = d.ymin - 0.04 * span, d.ymax + 0.04 * span
    end
    return d
end

-- The plot area and its scales: g = { x0, y0, x1, y1 (the area's corners),
-- px, py (data to pixels), xticks, xlabels, yticks, ylabels, hn, ht, pad,
-- tick, gap }. The y ticks come first: their labels set the left margin.
local function axes(spec, m, d, W, H, log_y)
    local s = m.unit
    local g = { hn = m.text_h("normal"), ht = m.text_h("title"), pad = 8 * s, tick = 4 * s, gap = 3 * s }
    local hn, pad, tick, gap = g.hn, g.pad, g.tick, g.gap
    local top = spec.title and (g.ht + 2 * pad) or 2 * pad
    local bottom = tick + gap + hn + 3 * gap + hn + pad
    local plot_h = H - top - bottom
    local ylo, yhi
    local ytarget = max(2, floor(plot_h / (hn * 4)))
    if log_y then
        g.yticks, g.ylabels, ylo, yhi = log_ticks(d.ymin, d.ymax, ytarget)
    else
        local step
        g.yticks, step, ylo, yhi = plot.nice_ticks(d.ymin, d.ymax, ytarget)
        g.ylabels = tick_labels(g.yticks, step)
    end
    local label_w = 0
    for _, l in ipairs(g.ylabels) do label_w = max(label_w, m.text_w(l, "normal")) end
    local left = pad + (spec.y_label and (hn + 3 * gap) or 0) + label_w + gap + tick
    local right = pad + m.text_w("0000", "normal")
    local plot_w = W - left - right
    if plot_w < 40 * s or plot_h < 30 * s then
        error(("plot: image size %dx%d leaves no room for the plot"):format(W, H), 0)
    end
    local xtarget = max(2, floor(plot_w / m.text_w("0000000000", "normal")))
    local xstep, xlo, xhi
    g.xticks, xstep, xlo, xhi = plot.nice_ticks(d.xmin, d.xmax, xtarget, d.integer_x)
    g.xlabels = tick_labels(g.xticks, xstep)
    g.x0, g.y0 = floor(left), floor(top)                     -- plot area, top-left
    g.x1, g.y1 = floor(left + plot_w), floor(top + plot_h)   -- bottom-right
    local x0, y0, x1, y1 = g.x0, g.y0, g.x1, g.y1
    g.px = function(x) return x0 + (x - xlo) / (xhi - xlo) * (x1 - x0) end
    if log_y then
        local llo, lhi = log10(ylo), log10(yhi)
        g.py = function(y) return y1 - (log10(y) - llo) / (lhi - llo) * (y1 - y0) end
    else
        g.py = function(y) return y1 - (y - ylo) / (yhi - ylo) * (y1 - y0) end
    end
    return g
end

-- Grid, ticks and tick labels, the frame over the grid, the axis labels
-- and the title.
local function draw_frame(add, spec, g)
    local x0, y0, x1, y1, tick, gap, hn = g.x0, g.y0, g.x1, g.y1, g.tick, g.gap, g.hn
    for i, v in ipairs(g.yticks) do
        local y = floor(g.py(v) + 0.5)
        if y >= y0 and y <= y1 then
            add({ op = "rule", x1 = x0, y1 = y, x2 = x1, y2 = y, width = 1, color = GRID })
            add({ op = "rule", x1 = x0 - tick, y1 = y, x2 = x0, y2 = y, width = 1, color = AXIS })
            add({ op = "text", text = g.ylabels[i], x = x0 - tick - gap, y = y, anchor = "end",
                  size = "normal", color = INK })
        end
    end
    for i, v in ipairs(g.xticks) do
        local x = floor(g.px(v) + 0.5)
        add({ op = "rule", x1 = x, y1 = y0, x2 = x, y2 = y1, width = 1, color = GRID })
        add({ op = "rule", x1 = x, y1 = y1, x2 = x, y2 = y1 + tick, width = 1, color = AXIS })
        add({ op = "text", text = g.xlabels[i], x = x, y = y1 + tick + gap + hn / 2,
              anchor = "middle", size = "normal", color = INK })
    end
    add({ op = "rule", x1 = x0, y1 = y0, x2 = x0, y2 = y1, width = 1, color = AXIS })
    add({ op = "rule", x1 = x0, y1 = y1, x2 = x1, y2 = y1, width = 1, color = AXIS })
    add({ op = "rule", x1 = x0, y1 = y0, x2 = x1, y2 = y0, width = 1, color = AXIS })
    add({ op = "rule", x1 = x1, y1 = y0, x2 = x1, y2 = y1, width = 1, color = AXIS })
    if spec.x_label then
        add({ op = "text", text = tostring(spec.x_label), x = (x0 + x1) / 2,
              y = y1 + tick + gap + hn + 3 * gap + hn / 2, anchor = "middle", size = "normal", color = INK })
    end
    if spec.y_label then
        add({ op = "text", text = tostring(spec.y_label), x = g.pad + hn / 2, y = (y0 + y1) / 2,
              anchor = "middle", size = "normal", rotate = true, color = INK })
    end
    if spec.title then
        add({ op = "text", text = tostring(spec.title), x = (x0 + x1) / 2, y = g.pad + g.ht / 2,
              anchor = "middle", size = "title", color = INK })
    end
end

-- Curves, then held-out markers on top, then the reference lines.
local function draw_data(add, d, g, s, line_w, ring_r)
    local px, py = g.px, g.py
    for i, sr in ipairs(d.series) do
        local pts = {}
        for _, p in ipairs(sr.pts) do
            pts[#pts + 1] = px(p[1])
            pts[#pts + 1] = py(p[2])
        end
        add({ op = "polyline", points = pts, width = line_w, color = sr.color, run = i })
        if #sr.pts == 1 then
            add({ op = "circle", cx = pts[1], cy = pts[2], r = line_w * 1.5, fill = sr.color })
        end
        if sr.before then
            add({ op = "circle", cx = px(sr.pts[1][1]), cy = py(sr.before), r = ring_r,
                  fill = PAPER, stroke = sr.color, stroke_width = s })
        end
        if sr.after then
            add({ op = "circle", cx = px(sr.pts[#sr.pts][1]), cy = py(sr.after), r = ring_r,
                  fill = sr.color })
        end
    end
    for _, hl in ipairs(d.hlines) do
        local y = floor(py(hl.y) + 0.5)
        add({ op = "rule", x1 = g.x0, y1 = y, x2 = g.x1, y2 = y, width = s, color = hl.color })
    end
end

-- The legend: top-right inside the plot, where falling loss curves rarely are.
local function draw_legend(add, m, d, g, s, line_w, ring_r)
    local gap = g.gap
    local rows = {}
    for _, sr in ipairs(d.series) do rows[#rows + 1] = { kind = "line", text = sr.label, color = sr.color } end
    for _, hl in ipairs(d.hlines) do rows[#rows + 1] = { kind = "line", text = hl.label, color = hl.color } end
    if d.has_markers then
        rows[#rows + 1] = { kind = "ring", text = "held-out before", color = AXIS }
        rows[#rows + 1] = { kind = "dot", text = "held-out after", color = AXIS }
    end
    local swatch, row_h = 10 * s, g.hn + 2 * gap
    local text_w = 0
    for _, r in ipairs(rows) do text_w = max(text_w, m.text_w(r.text, "normal")) end
    local lw = gap * 2 + swatch + gap * 2 + text_w + gap * 2
    local lh = #rows * row_h + gap * 2
    local lx, ly = g.x1 - g.pad - lw, g.y0 + g.pad
    if lx <= g.x0 then return end
    add({ op = "rect", x = lx, y = ly, w = lw, h = lh, fill = PAPER, stroke = GRID })
    for i, r in ipairs(rows) do
        local cy = ly + gap + (i - 0.5) * row_h
        local sx = lx + gap * 2
        if r.kind == "line" then
            add({ op = "polyline", points = { sx, cy, sx + swatch, cy }, width = line_w * 1.5,
                  color = r.color, legend = true })
        elseif r.kind == "ring" then
            add({ op = "circle", cx = sx + swatch / 2, cy = cy, r = ring_r, fill = PAPER,
                  stroke = r.color, stroke_width = s })
        else
            add({ op = "circle", cx = sx + swatch / 2, cy = cy, r = ring_r, fill = r.color })
        end
        add({ op = "text", text = r.text, x = sx + swatch + gap * 2, y = cy, anchor = "start",
              size = "normal", color = INK })
    end
end

-- metrics: { text_w = function(s, size) -> px, text_h = function(size) -> px, unit = s }
local function layout(spec, m)
    local W, H = check_spec(spec)
    local s = m.unit
    local log_y = spec.log_y and true or false
    local ops = {}
    local function add(op) ops[#ops + 1] = op end
    local d = data_ranges(spec, log_y)
    local g = axes(spec, m, d, W, H, log_y)
    add({ op = "rect", x = 0, y = 0, w = W, h = H, fill = PAPER })
    draw_frame(add, spec, g)
    local line_w, ring_r = 1.5 * s, 3 * s + 1
    draw_data(add, d, g, s, line_w, ring_r)
    draw_legend(add, m, d, g, s, line_w, ring_r)
    return ops, W, H
end

-- The drawing unit: 1 up to 540 px on the short side, 2 up to 810, and so on.
local function unit_for(spec)
    local w, h = check_spec(spec)
    return max(1, floor(min(w, h) / 270))
end

-- ---------------------------------------------------------------------------
-- SVG

local function xml_escape(s)
    return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
                                          ['"'] = "&quot;", ["'"] = "&apos;" }))
end

-- A coordinate with at most two decimals.
local function num(v)
    local str = ("%.2f"):format(v):gsub("%.?0+$", "")
    if str == "-0" or str == "" then return "0" end
    return str
end

function plot.svg(spec)
    local s = unit_for(spec)
    local font = { normal = 6.5 * s + 1, title = 9 * s + 1 } -- font-size in px
    local m = {
        unit = s,
        text_w = function(str, size) return #tostring(str) * font[size] * 0.6 end,
        text_h = function(size) return font[size] * 0.75 end,
    }
    local ops, W, H = layout(spec, m)
    local out = {
        '<?xml version="1.0" encoding="UTF-8"?>',
        ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'):format(W, H, W, H),
    }
    for _, o in ipairs(ops) do
        local line
        if o.op == "rect" then
            line = ('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"%s/>'):format(num(o.x), num(o.y),
                num(o.w), num(o.h), o.fill, o.stroke and (' stroke="%s"'):format(o.stroke) or "")
        elseif o.op == "rule" then
            -- Whole-pixel rules sit on pixel centres.
            line = ('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s" '
                .. 'shape-rendering="crispEdges"/>'):format(num(o.x1 + 0.5), num(o.y1 + 0.5),
                num(o.x2 + 0.5), num(o.y2 + 0.5), o.color, num(o.width))
        elseif o.op == "polyline" and o.legend then
            local p = o.points
            line = ('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s" '
                .. 'stroke-linecap="round"/>'):format(num(p[1]), num(p[2]), num(p[3]), num(p[4]),
                o.color, num(o.width))
        elseif o.op == "polyline" then
            local coords = {}
            for i = 1, #o.points, 2 do coords[#coords + 1] = num(o.points[i]) .. "," .. num(o.points[i + 1]) end
            line = ('<polyline class="run" data-run="%d" fill="none" stroke="%s" stroke-width="%s" '
                .. 'stroke-linejoin="round" stroke-linecap="round" points="%s"/>'):format(o.run, o.color,
                num(o.width), table.concat(coords, " "))
        elseif o.op == "circle" then
            line = ('<circle cx="%s" cy="%s" r="%s" fill="%s"%s/>'):format(num(o.cx), num(o.cy), num(o.r),
                o.fill, o.stroke and (' stroke="%s" stroke-width="%s"'):format(o.stroke, num(o.stroke_width)) or "")
        elseif o.op == "text" then
            local rot = o.rotate and (' transform="rotate(-90 %s %s)"'):format(num(o.x), num(o.y)) or ""
            line = ('<text x="%s" y="%s" dy="0.35em" text-anchor="%s" font-size="%s" fill="%s"%s>%s</text>')
                :format(num(o.x), num(o.y), o.anchor, num(font[o.size]), o.color, rot, xml_escape(o.text))
        end
        out[#out + 1] = line
    end
    out[#out + 1] = "</svg>"
    return table.concat(out, "\n") .. "\n"
end

-- ---------------------------------------------------------------------------
-- PNG: font

-- 5 columns x 7 rows ('#' on), two more rows for descenders (g, j, p, q, y).
-- Characters without a glyph draw as '?'.
local GLYPHS = {
    [" "] = { ".....", ".....", ".....", ".....", ".....", ".....", "....." },
    ["0"] = { ".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###." },
    ["1"] = { "..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###." },
    ["2"] = { ".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####" },
    ["3"] = { "#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###." },
    ["4"] = { "...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#." },
    ["5"] = { "#####", "#....", "####.", "....#", "....#", "#...#", ".###." },
    ["6"] = { "..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###." },
    ["7"] = { "#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..." },
    ["8"] = { ".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###." },
    ["9"] = { ".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.." },
    A = { ".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#" },
    B = { "####.", "#...#", "#...#", "####.", "#...#", "#...#", "####." },
    C = { ".###.", "#...#", "#....", "#....", "#....", "#...#", ".###." },
    D = { "###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.." },
    E = { "#####", "#....", "#....", "####.", "#....", "#....", "#####" },
    F = { "#####", "#....", "#....", "####.", "#....", "#....", "#...." },
    G = { ".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####" },
    H = { "#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#" },
    I = { ".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###." },
    J = { "..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.." },
    K = { "#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#" },
    L = { "#....", "#....", "#....", "#....", "#....", "#....", "#####" },
    M = { "#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#" },
    N = { "#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#" },
    O = { ".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###." },
    P = { "####.", "#...#", "#...#", "####.", "#....", "#....", "#...." },
    Q = { ".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#" },
    R = { "####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#" },
    S = { ".####", "#....", "#....", ".###.", "....#", "....#", "####." },
    T = { "#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.." },
    U = { "#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###." },
    V = { "#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.." },
    W = { "#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#." },
    X = { "#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#" },
    Y = { "#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.." },
    Z = { "#####", "....#", "...#.", "..#..", ".#...", "#....", "#####" },
    a = { ".....", ".....", ".###.", "....#", ".####", "#...#", ".####" },
    b = { "#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####." },
    c = { ".....", ".....", ".###.", "#....", "#....", "#...#", ".###." },
    d = { "....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####" },
    e = { ".....", ".....", ".###.", "#...#", "#####", "#....", ".###." },
    f = { "..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..." },
    g = { ".....", ".....", ".####", "#...#", "#...#", "#...#", ".####", "....#", ".###." },
    h = { "#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#" },
    i = { "..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###." },
    j = { "...#.", ".....", "..##.", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.." },
    k = { "#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#." },
    l = { ".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###." },
    m = { ".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#" },
    n = { ".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#" },
    o = { ".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###." },
    p = { ".....", ".....", "####.", "#...#", "#...#", "#...#", "####.", "#....", "#...." },
    q = { ".....", ".....", ".####", "#...#", "#...#", "#...#", ".####", "....#", "....#" },
    r = { ".....", ".....", "#.##.", "##..#", "#....", "#....", "#...." },
    s = { ".....", ".....", ".####", "#....", ".###.", "....#", "####." },
    t = { ".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##." },
    u = { ".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#" },
    v = { ".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.." },
    w = { ".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#." },
    x = { ".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#" },
    y = { ".....", ".....", "#...#", "#...#", "#...#", "#...#", ".####", "....#", ".###." },
    z = { ".....", ".....", "#####", "...#.", "..#..", ".#...", "#####" },
    ["."] = { ".....", ".....", ".....", ".....", ".....", ".##..", ".##.." },
    [","] = { ".....", ".....", ".....", ".....", ".##..", "..#..", ".#..." },
    [":"] = { ".....", ".##..", ".##..", ".....", ".##..", ".##..", "....." },
    [";"] = { ".....", ".##..", ".##..", ".....", ".##..", "..#..", ".#..." },
    ["-"] = { ".....", ".....", ".....", ".###.", ".....", ".....", "....." },
    ["+"] = { ".....", "..#..", "..#..", "#####", "..#..", "..#..", "....." },
    ["="] = { ".....", ".....", "#####", ".....", "#####", ".....", "....." },
    ["_"] = { ".....", ".....", ".....", ".....", ".....", ".....", "#####" },
    ["/"] = { ".....", "....#", "...#.", "..#..", ".#...", "#....", "....." },
    ["\\"] = { ".....", "#....", ".#...", "..#..", "...#.", "....#", "....." },
    ["("] = { "...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#." },
    [")"] = { ".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..." },
    ["["] = { ".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###." },
    ["]"] = { ".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###." },
    ["<"] = { "...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#." },
    [">"] = { ".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..." },
    ["%"] = { "##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##" },
    ["#"] = { ".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#." },
    ["*"] = { ".....", "..#..", "#.#.#", ".###.", "#.#.#", "..#..", "....." },
    ["'"] = { "..#..", "..#..", ".#...", ".....", ".....", ".....", "....." },
    ['"'] = { ".#.#.", ".#.#.", ".....", ".....", ".....", ".....", "....." },
    ["!"] = { "..#..", "..#..", "..#..", "..#..", "..#..", ".....", "..#.." },
    ["?"] = { ".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.." },
    ["|"] = { "..#..", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.." },
    ["&"] = { ".##..", "#..#.", "#.#..", ".#...", "#.#.#", "#..#.", ".##.#" },
    ["@"] = { ".###.", "#...#", "#.###", "#.#.#", "#.###", "#....", ".###." },
    ["~"] = { ".....", ".....", ".#...", "#.#.#", "...#.", ".....", "....." },
}
local GLYPH_W, GLYPH_H, ADVANCE = 5, 7, 6

-- ---------------------------------------------------------------------------
-- PNG: rasterizer over an RGB byte buffer

local function parse_color(hex)
    return tonumber(hex:sub(2, 3), 16), tonumber(hex:sub(4, 5), 16), tonumber(hex:sub(6, 7), 16)
end

local Canvas = {}
Canvas.__index = Canvas

local function new_canvas(w, h)
    local n = w * h * 3
    local buf = ffi.new("uint8_t[?]", n) -- (h, w, 3) RGB, rows top to bottom
    ffi.fill(buf, n, 255)
    return setmetatable({ w = w, h = h, buf = buf }, Canvas)
end

-- Mixes colour (r, g, b) into pixel (x, y) with coverage a in [0, 1].
function Canvas:blend(x, y, r, g, b, a)
    if x < 0 or y < 0 or x >= self.w or y >= self.h or a <= 0 then return end
    local i = (y * self.w + x) * 3
    local buf = self.buf
    if a >= 1 then
        buf[i], buf[i + 1], buf[i + 2] = r, g, b
    else
        buf[i] = floor(buf[i] + (r - buf[i]) * a + 0.5)
        buf[i + 1] = floor(buf[i + 1] + (g - buf[i + 1]) * a + 0.5)
        buf[i + 2] = floor(buf[i + 2] + (b - buf[i + 2]) * a + 0.5)
    end
end

-- Fills the pixels [x, x+w) x [y, y+h), clipped to the canvas.
function Canvas:fill_rect(x, y, w, h, r, g, b)
    local xa, ya = max(0, floor(x)), max(0, floor(y))
    local xb, yb = min(self.w, floor(x + w)), min(self.h, floor(y + h))
    for py = ya, yb - 1 do
        for px = xa, xb - 1 do self:blend(px, py, r, g, b, 1) end
    end
end

-- An anti-aliased segment of the given width: each pixel gets the coverage
-- its centre's distance to the segment implies (a one-pixel soft edge).
function Canvas:segment(ax, ay, bx, by, width, r, g, b)
    local half = width / 2
    local xa, xb = max(0, floor(min(ax, bx) - half - 1)), min(self.w - 1, ceil(max(ax, bx) + half + 1))
    local ya, yb = max(0, floor(min(ay, by) - half - 1)), min(self.h - 1, ceil(max(ay, by) + half + 1))
    local dx, dy = bx - ax, by - ay
    local len2 = dx * dx + dy * dy
    for py = ya, yb do
        local cy = py + 0.5
        for px = xa, xb do
            local cx = px + 0.5
            local t = 0
            if len2 > 0 then t = min(1, max(0, ((cx - ax) * dx + (cy - ay) * dy) / len2)) end
            local ex, ey = ax + t * dx - cx, ay + t * dy - cy
            local cover = half + 0.5 - sqrt(ex * ex + ey * ey)
            if cover > 0 then self:blend(px, py, r, g, b, min(1, cover)) end
        end
    end
end

-- An anti-aliased filled disc.
function Canvas:disc(cx, cy, rad, r, g, b)
    for py = max(0, floor(cy - rad - 1)), min(self.h - 1, ceil(cy + rad + 1)) do
        for px = max(0, floor(cx - rad - 1)), min(self.w - 1, ceil(cx + rad + 1)) do
            local ex, ey = px + 0.5 - cx, py + 0.5 - cy
            local cover = rad + 0.5 - sqrt(ex * ex + ey * ey)
            if cover > 0 then self:blend(px, py, r, g, b, min(1, cover)) end
        end
    end
end

local function text_width(str, scale)
    return #str * ADVANCE * scale - scale
end

-- Draws str with the bitmap font, each font pixel a scale x scale square.
-- (x, top) is the top-left of the first glyph's 7-row body; rotated text
-- reads bottom to top and (x, top) is then its bottom-left.
function Canvas:text(str, x, top, scale, r, g, b, rotate)
    for k = 1, #str do
        local glyph = GLYPHS[str:sub(k, k)] or GLYPHS["?"]
        local gx0 = (k - 1) * ADVANCE
        for row = 1, #glyph do
            local bits = glyph[row]
            for col = 1, GLYPH_W do
                if bits:byte(col) == 35 then -- '#'
                    local u, v = gx0 + col - 1, row - 1 -- font pixel along, down the text
                    if rotate then
                        self:fill_rect(x + v * scale, top - (u + 1) * scale, scale, scale, r, g, b)
                    else
                        self:fill_rect(x + u * scale, top + v * scale, scale, scale, r, g, b)
                    end
                end
            end
        end
    end
end

-- ---------------------------------------------------------------------------
-- PNG: encoder

local CRC_TABLE = ffi.new("uint32_t[256]")
for n = 0, 255 do
    local c = n
    for _ = 1, 8 do
        if band(c, 1) ~= 0 then c = bxor(0xedb88320, rshift(c, 1)) else c = rshift(c, 1) end
    end
    CRC_TABLE[n] = c % 4294967296
end

-- CRC-32 (ISO-HDLC, as PNG uses) continued over len bytes at p.
local function crc32_update(crc, p, len)
    crc = bnot(crc)
    for i = 0, len - 1 do
        crc = bxor(rshift(crc, 8), CRC_TABLE[band(bxor(crc, p[i]), 255)])
    end
    return bnot(crc) % 4294967296
end

-- Adler-32 of len bytes at p. 5552 is the most bytes whose sums fit before
-- the modulo is due (zlib's NMAX); doubles hold them exactly.
local function adler32(p, len)
    local a, b = 1, 0
    local i = 0
    while i < len do
        local stop = min(len, i + 5552)
        for j = i, stop - 1 do
            a = a + p[j]
            b = b + a
        end
        a, b = a % 65521, b % 65521
        i = stop
    end
    return b * 65536 + a
end

local function u32be(v)
    return string.char(floor(v / 16777216) % 256, floor(v / 65536) % 256, floor(v / 256) % 256, v % 256)
end

local function chunk(kind, data)
    local crc = crc32_update(0, ffi.cast("const uint8_t *", kind), 4)
    crc = crc32_update(crc, ffi.cast("const uint8_t *", data), #data)
    return u32be(#data) .. kind .. data .. u32be(crc)
end

-- zlib (libz.so.1, part of every Debian system: the package zlib1g is
-- "required") compresses the image data when it loads; otherwise the data
-- goes into stored deflate blocks, which any PNG reader takes too.
local zlib
do
    local ok, lib = pcall(ffi.load, "libz.so.1")
    if ok then
        ok = pcall(ffi.cdef, [[
unsigned long compressBound(unsigned long source_len);
int compress2(uint8_t *dest, unsigned long *dest_len, const uint8_t *source, unsigned long source_len, int level);
]])
        zlib = lib
    end
end

-- The zlib stream of n bytes at raw: compressed by zlib when it is there,
-- else CMF 0x78 (deflate, 32K window), FLG 0x01 (makes the pair a multiple of
-- 31), stored blocks of at most 65535 bytes and the Adler-32 of the bytes.
local function zlib_stream(raw, n, stored)
    if zlib and not stored then
        local cap = ffi.new("unsigned long[1]", zlib.compressBound(n))
        local out = ffi.new("uint8_t[?]", cap[0])
        if zlib.compress2(out, cap, raw, n, 9) == 0 then return ffi.string(out, cap[0]) end
    end
    local z = { "\120\1" }
    local off = 0
    repeat
        local len = min(65535, n - off)
        local final = off + len >= n and 1 or 0
        local nlen = band(bnot(len), 0xffff)
        z[#z + 1] = string.char(final, band(len, 255), rshift(len, 8), band(nlen, 255), rshift(nlen, 8))
        z[#z + 1] = ffi.string(raw + off, len)
        off = off + len
    until off >= n
    z[#z + 1] = u32be(adler32(raw, n))
    return table.concat(z)
end
plot.zlib_available = zlib ~= nil

-- opts.stored: stored blocks even when zlib is there.
function plot.encode_png(width, height, rgb, opts)
    local src = ffi.cast("const uint8_t *", rgb)
    local stride = width * 3 + 1 -- a filter-type byte (0: none) before each row
    local n = stride * height
    local raw = ffi.new("uint8_t[?]", n) -- (height, 1 + width*3)
    for y = 0, height - 1 do
        raw[y * stride] = 0
        ffi.copy(raw + y * stride + 1, src + y * width * 3, width * 3)
    end
    local ihdr = u32be(width) .. u32be(height) .. string.char(8, 2, 0, 0, 0) -- 8-bit RGB
    return "\137PNG\r\n\26\n" .. chunk("IHDR", ihdr) .. chunk("IDAT", zlib_stream(raw, n, opts and opts.stored)) .. chunk("IEND", "")
end

function plot.png(spec)
    local s = unit_for(spec)
    local scale = { normal = s, title = s + 1 } -- font pixel size
    local m = {
        unit = s,
        text_w = function(str, size) return text_width(tostring(str), scale[size]) end,
        text_h = function(size) return GLYPH_H * scale[size] end,
    }
    local ops, W, H = layout(spec, m)
    local cv = new_canvas(W, H)
    for _, o in ipairs(ops) do
        if o.op == "rect" then
            local r, g, b = parse_color(o.fill)
            cv:fill_rect(floor(o.x + 0.5), floor(o.y + 0.5), floor(o.w + 0.5), floor(o.h + 0.5), r, g, b)
            if o.stroke then
                local x, y, w, h = floor(o.x + 0.5), floor(o.y + 0.5), floor(o.w + 0.5), floor(o.h + 0.5)
                r, g, b = parse_color(o.stroke)
                cv:fill_rect(x, y, w, 1, r, g, b)
                cv:fill_rect(x, y + h - 1, w, 1, r, g, b)
                cv:fill_rect(x, y, 1, h, r, g, b)
                cv:fill_rect(x + w - 1, y, 1, h, r, g, b)
            end
        elseif o.op == "rule" then
            local r, g, b = parse_color(o.color)
            local xa, xb = min(o.x1, o.x2), max(o.x1, o.x2)
            local ya, yb = min(o.y1, o.y2), max(o.y1, o.y2)
            cv:fill_rect(xa, ya, xb - xa + o.width, yb - ya + o.width, r, g, b)
        elseif o.op == "polyline" then
            local r, g, b = parse_color(o.color)
            local p = o.points
            -- Pixel centres are at +0.5: shift so that a point lands on one.
            for i = 1, #p - 3, 2 do
                cv:segment(p[i] + 0.5, p[i + 1] + 0.5, p[i + 2] + 0.5, p[i + 3] + 0.5, o.width, r, g, b)
            end
        elseif o.op == "circle" then
            local cx, cy = o.cx + 0.5, o.cy + 0.5
            if o.stroke then
                local r, g, b = parse_color(o.stroke)
                cv:disc(cx, cy, o.r + o.stroke_width / 2, r, g, b)
                r, g, b = parse_color(o.fill)
                cv:disc(cx, cy, o.r - o.stroke_width / 2, r, g, b)
            else
                local r, g, b = parse_color(o.fill)
                cv:disc(cx, cy, o.r, r, g, b)
            end
        elseif o.op == "text" then
            local r, g, b = parse_color(o.color)
            local sc = scale[o.size]
            local w, h = text_width(o.text, sc), GLYPH_H * sc
            local shift = (o.anchor == "middle" and w / 2) or (o.anchor == "end" and w) or 0
            if o.rotate then
                cv:text(o.text, floor(o.x - h / 2 + 0.5), floor(o.y + shift + 0.5), sc, r, g, b, true)
            else
                cv:text(o.text, floor(o.x - shift + 0.5), floor(o.y - h / 2 + 0.5), sc, r, g, b, false)
            end
        end
    end
    return plot.encode_png(W, H, cv.buf)
end

-- ---------------------------------------------------------------------------
-- Writing

local WRITERS = { svg = plot.svg, png = plot.png }

function plot.render(spec)
    check_spec(spec)
    local out = spec.out
    if type(out) ~= "string" or out == "" then error("plot: no output path (out = \"loss.png\")", 0) end
    local ext = (out:match("%.([^./]+)$") or ""):lower()
    local writer = WRITERS[ext]
    if not writer then
        error(("plot: cannot write %s: supported extensions are .png and .svg"):format(out), 0)
    end
    local bytes = writer(spec)
    local ok, err = pcall(require("cartridge.fs").write_atomic, out, bytes)
    if not ok then error("plot: " .. err, 0) end
    return out
end

return plot
