-- plot.lua: draw training curves from metrics JSONL files as a PNG or SVG.
--
--   cartridge run recipes/plot.lua run1.jsonl --out loss.png
--   cartridge run recipes/plot.lua a.jsonl b.jsonl --label lr=2e-3 --label lr=5e-4 --out loss.svg --log-y
--   cartridge run recipes/plot.lua run1.jsonl --out tokens.png --x answer_tokens --title "self-study"
--
-- Each file is one run (one colour, one legend entry). Step lines
-- ({"step": 3, "loss": 2.1, "answer_tokens": 812, "seconds": 3.1, ...}) give the
-- curve; {"event": "heldout_before"|"heldout_after", "loss": v} lines give a
-- ring at the curve's start and a dot at its end. Other lines and fields are
-- ignored. --x answer_tokens plots against the answer tokens trained on so far
-- (recorded as a running total), --x seconds against the time spent so far
-- (the running total of the per-step seconds). The format follows the --out
-- extension.

local options = require("cartridge.options")
local plot = require("cartridge.plot")

local opts = options.parse(arg, {
    usage = "cartridge run recipes/plot.lua RUN.jsonl [RUN.jsonl ...] --out loss.png|loss.svg [FLAGS]",
    summary = "Draw training curves from metrics JSONL files as a PNG or SVG.",
    positional = {
        { "runs", help = "metrics JSONL files, one per run", required = true, repeatable = true,
          metavar = "RUN.jsonl" },
    },
    flags = {
        { "out", metavar = "FILE", help = "the image to write: .png or .svg (required)" },
        { "title", help = "the title above the plot (default: METRIC vs X)" },
        { "metric", default = "loss", help = "the step-line field on the y axis, or qa: the QA accuracy lines "
            .. "of selfstudy.lua --qa, with ICL and bare as horizontal lines" },
        { "x", default = "step", choices = { "step", "conversations", "answer_tokens", "seconds" },
          help = "the x axis: step number, conversations so far, or the running total of answer tokens or seconds" },
        { "smooth", type = "int", default = 1, help = "plot the trailing mean of this many points (1: as recorded)" },
        { "label", repeatable = true, help = "the legend text for each run, in order (default: file names)" },
        { "width", type = "int", default = 900, help = "image width in pixels" },
        { "height", type = "int", default = 540, help = "image height in pixels" },
        { "log-y", type = "boolean", help = "logarithmic y axis (drops values <= 0)" },
    },
})

local X_LABELS = {
    step = "step",
    conversations = "conversations (cumulative)",
    answer_tokens = "answer tokens (cumulative)",
    seconds = "seconds (cumulative)",
}

-- Legend names: file names, or the paths as given when two file names clash.
local function default_labels(paths)
    local names, count = {}, {}
    for i, p in ipairs(paths) do
        names[i] = p:match("([^/]+)$") or p
        count[names[i]] = (count[names[i]] or 0) + 1
    end
    for i, p in ipairs(paths) do
        if count[names[i]] > 1 then names[i] = p end
    end
    return names
end

local function check_options()
    if not opts.out or opts.out == "" then
        error("plot: --out is required (a .png or .svg path)", 0)
    end
    local ext = (opts.out:match("%.([^./]+)$") or ""):lower()
    if ext ~= "png" and ext ~= "svg" then
        error(("plot: --out %s: supported extensions are .png and .svg"):format(opts.out), 0)
    end
    if opts.smooth < 1 then error(("plot: --smooth must be at least 1; got %d"):format(opts.smooth), 0) end
    if opts.metric == "qa" and opts.x ~= "step" and opts.x ~= "conversations" then
        error("plot: --metric qa plots against --x step or --x conversations (QA lines record no others)", 0)
    end
    if #opts.label > 0 and #opts.label ~= #opts.runs then
        error(("plot: %d --label values for %d runs; give one per run or none"):format(
            #opts.label, #opts.runs), 0)
    end
end

check_options()
local labels = #opts.label > 0 and opts.label or default_labels(opts.runs)
local runs, points, hlines = {}, 0, {}
for i, path in ipairs(opts.runs) do
    local run = plot.read_run(path, { metric = opts.metric, x = opts.x })
    run.label = labels[i]
    if opts.smooth > 1 then run.points = plot.smooth(run.points, opts.smooth) end
    runs[i] = run
    points = points + #run.points
    for _, ref in ipairs(run.refs or {}) do
        hlines[#hlines + 1] = { y = ref.y, label = #opts.runs > 1 and (ref.label .. " (" .. labels[i] .. ")") or ref.label }
    end
end

-- what the y axis holds, with its unit
local Y_LABELS = {
    loss = "distill loss (nats, mean over the top-k targets)",
    qa = "QA accuracy (% of questions right)",
    seconds = "seconds per step",
}
local y_label = (Y_LABELS[opts.metric] or opts.metric) .. (opts.smooth > 1 and (", mean of " .. opts.smooth) or "")

plot.render({
    runs = runs,
    out = opts.out,
    title = opts.title or ((opts.metric == "qa" and "QA accuracy" or opts.metric) .. " vs "
        .. X_LABELS[opts.x]:gsub(" %(cumulative%)", "")),
    x_label = X_LABELS[opts.x],
    y_label = y_label .. (opts.log_y and " (log scale)" or ""),
    hlines = hlines,
    log_y = opts.log_y,
    width = opts.width,
    height = opts.height,
})
print(("plot: wrote %s (%d run%s, %d points)"):format(opts.out, #runs, #runs == 1 and "" or "s", points))
