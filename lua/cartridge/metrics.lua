-- cartridge.metrics: counters, gauges and histograms, written in the
-- Prometheus text exposition format, version 0.0.4 (what GET /metrics of
-- the server answers; docs/server.md shows its output).
--
--   local reg = metrics.registry()
--   local req = reg:counter("app_requests_total", "Requests answered.", { "route", "status" })
--   req:inc(1, "/v1/chat/completions", "200")
--   local q = reg:gauge("app_queue_depth", "Requests waiting.")
--   q:set(3)
--   local h = reg:histogram("app_latency_seconds", "Latency.", { 0.1, 0.5, 1 })
--   h:observe(0.27)
--   reg:render()   --> "# HELP app_requests_total Requests answered.\n# TYPE ... counter\n..."
--
-- The text: for each family in the order it was made, a "# HELP" line
-- (backslashes and line feeds escaped), a "# TYPE" line, then its samples
-- in the order their label sets first appeared, label values escaped
-- (backslash, double quote, line feed). A histogram writes cumulative
-- name_bucket{le="..."} lines ending with le="+Inf", then name_sum and
-- name_count. Values are written so that they read back exactly: integers
-- as integers, other numbers with up to 17 significant digits, +Inf, -Inf
-- and NaN as the format spells them.

local metrics = {}
metrics.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

local NAME = "^[%a_:][%w_:]*$"
local LABEL = "^[%a_][%w_]*$"

-- A number as the text format writes it.
local function number_text(v)
    if v ~= v then return "NaN" end
    if v == math.huge then return "+Inf" end
    if v == -math.huge then return "-Inf" end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%.0f"):format(v) end
    local s = ("%.15g"):format(v)
    if tonumber(s) ~= v then s = ("%.17g"):format(v) end
    return s
end
metrics.number_text = number_text

local function escape_label(s)
    return (tostring(s):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function escape_help(s)
    return (tostring(s):gsub("[\\\n]", { ["\\"] = "\\\\", ["\n"] = "\\n" }))
end

-- {a="x",b="y"} for label names and values (pairs in order); "" when none.
local function label_text(names, values, extra_name, extra_value)
    local parts = {}
    for i, n in ipairs(names) do parts[#parts + 1] = n .. '="' .. escape_label(values[i]) .. '"' end
    if extra_name then parts[#parts + 1] = extra_name .. '="' .. escape_label(extra_value) .. '"' end
    if #parts == 0 then return "" end
    return "{" .. table.concat(parts, ",") .. "}"
end

local Family = {}
Family.__index = Family

-- The sample for label values (...), made on first use.
function Family:sample(...)
    local values = { ... }
    if #values ~= #self.labels then
        error(("metrics: %s takes %d label values (%s), got %d"):format(self.name, #self.labels,
            table.concat(self.labels, ", "), #values), 2)
    end
    for i, v in ipairs(values) do values[i] = tostring(v) end
    local key = table.concat(values, "\0")
    local s = self.by_key[key]
    if not s then
        s = { values = values, value = 0 }
        self.by_key[key] = s
        self.order[#self.order + 1] = s
    end
    return s
end

-- Counters: adds n (>= 0) to the sample of the label values.
function Family:inc(n, ...)
    if not (n >= 0) then error(("metrics: counter %s cannot go down (inc %s)"):format(self.name, tostring(n)), 2) end
    local s = self:sample(...)
    s.value = s.value + n
end

-- Gauges: sets the sample of the label values to v.
function Family:set(v, ...)
    self:sample(...).value = v
end

-- Histograms: counts one observation of v.
function Family:observe(v)
    for i, le in ipairs(self.buckets) do
        if v <= le then
            self.counts[i] = self.counts[i] + 1
            break
        end
    end
    self.sum = self.sum + v
    self.count = self.count + 1
end

function Family:write(out)
    out[#out + 1] = ("# HELP %s %s\n"):format(self.name, escape_help(self.help))
    out[#out + 1] = ("# TYPE %s %s\n"):format(self.name, self.type)
    if self.type == "histogram" then
        local cum = 0
        for i, le in ipairs(self.buckets) do
            cum = cum + self.counts[i]
            out[#out + 1] = ("%s_bucket{le=\"%s\"} %s\n"):format(self.name, number_text(le), number_text(cum))
        end
        out[#out + 1] = ("%s_bucket{le=\"+Inf\"} %s\n"):format(self.name, number_text(self.count))
        out[#out + 1] = ("%s_sum %s\n"):format(self.name, number_text(self.sum))
        out[#out + 1] = ("%s_count %s\n"):format(self.name, number_text(self.count))
        return
    end
    for _, s in ipairs(self.order) do
        out[#out + 1] = ("%s%s %s\n"):format(self.name, label_text(self.labels, s.values), number_text(s.value))
    end
end

local Registry = {}
Registry.__index = Registry

function metrics.registry()
    return setmetatable({ families = {}, by_name = {} }, Registry)
end

local function family(self, kind, name, help, labels)
    if type(name) ~= "string" or not name:find(NAME) then error("metrics: bad metric name " .. tostring(name), 3) end
    if self.by_name[name] then error("metrics: " .. name .. " is registered twice", 3) end
    for _, l in ipairs(labels or {}) do
        if not l:find(LABEL) or l:sub(1, 2) == "__" or (kind == "histogram" and l == "le") then
            error(("metrics: bad label name %s on %s"):format(l, name), 3)
        end
    end
    local f = setmetatable({ name = name, help = help, type = kind, labels = labels or {}, by_key = {}, order = {} },
        Family)
    self.by_name[name] = f
    self.families[#self.families + 1] = f
    if #f.labels == 0 and kind ~= "histogram" then f:sample() end -- written as 0 from the start
    return f
end

function Registry:counter(name, help, labels) return family(self, "counter", name, help, labels) end
function Registry:gauge(name, help, labels) return family(self, "gauge", name, help, labels) end

-- buckets: upper bounds in increasing order (the +Inf bucket is implied).
function Registry:histogram(name, help, buckets)
    local f = family(self, "histogram", name, help)
    for i = 2, #buckets do
        if not (buckets[i] > buckets[i - 1]) then error("metrics: " .. name .. ": buckets must increase", 2) end
    end
    f.buckets, f.counts, f.sum, f.count = buckets, {}, 0, 0
    for i = 1, #buckets do f.counts[i] = 0 end
    return f
end

-- The whole exposition text.
function Registry:render()
    local out = {}
    for _, f in ipairs(self.families) do f:write(out) end
    return table.concat(out)
end

-- ---------------------------------------------------------------------------
-- The server's metrics

-- Seconds from a request's arrival to its first sampled token (after
-- prefill), and between consecutive tokens of one request.
metrics.TTFT_BUCKETS = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 }
metrics.TPOT_BUCKETS = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5 }
metrics.REQUEST_BUCKETS = { 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600 }

-- The disk tier's counters: the kvstore stats field each one reads.
local DISK_COUNTERS = {
    { "hits", "cartridge_kv_disk_hits_total", "Requests that adopted a conversation's rows from the disk tier." },
    { "hit_tokens", "cartridge_kv_disk_hit_tokens_total", "Prompt tokens whose rows came from the disk tier." },
    { "misses", "cartridge_kv_disk_misses_total", "Requests that found no file in the disk tier worth adopting." },
    { "spills", "cartridge_kv_disk_spills_total", "Conversations written to the disk tier." },
    { "spill_bytes", "cartridge_kv_disk_spilled_bytes_total", "Bytes written to the disk tier." },
    { "evictions", "cartridge_kv_disk_evictions_total", "Files removed to keep the disk tier within --kv-cache-max." },
    { "skipped", "cartridge_kv_disk_skipped_files_total",
        "Files of the disk tier skipped: damaged, or for another model or cartridge." },
}

-- The fleet's counters (cartridge.fleetserve stats): key, name, help.
local FLEET_COUNTERS = {
    { "retrievals", "cartridge_fleet_retrievals_total", "Conversations whose cartridges retrieval picked." },
    { "sticky_hits", "cartridge_fleet_sticky_hits_total",
        "Requests that went behind the cartridges their conversation already had." },
    { "maps", "cartridge_fleet_maps_total", "Cartridges mapped from the fleet directory." },
    { "unmaps", "cartridge_fleet_unmaps_total", "Cartridges unmapped to stay within --budget." },
}

local ServerMetrics = {}
ServerMetrics.__index = ServerMetrics

-- The metrics of a cartridge server: start_time (seconds since the epoch),
-- disk (true when the disk tier is on), fleet (true when it serves a fleet).
function metrics.server(opts)
    local reg = metrics.registry()
    local self = setmetatable({ reg = reg, routes = {} }, ServerMetrics)
    self.requests = reg:counter("cartridge_requests_total",
        "HTTP requests answered by the server, by route (other: an unknown path) and status code.",
        { "route", "status" })
    self.prompt = reg:counter("cartridge_prompt_tokens_total", "Prompt tokens of the requests that ran.")
    self.cached = reg:counter("cartridge_prompt_tokens_cached_total",
        "Prompt tokens reused from a slot's cache or the disk tier instead of prefilled.")
    self.completion = reg:counter("cartridge_completion_tokens_total", "Tokens generated.")
    self.waiting = reg:gauge("cartridge_requests_waiting", "Requests waiting for a slot (queue depth).")
    self.busy = reg:gauge("cartridge_slots_busy", "Slots running a request.")
    self.slots = reg:gauge("cartridge_slots_total", "Slots (--parallel).")
    if opts.disk then
        self.disk = {}
        for _, d in ipairs(DISK_COUNTERS) do self.disk[d[1]] = reg:counter(d[2], d[3]) end
        self.disk_files = reg:gauge("cartridge_kv_disk_files", "Files in the disk tier.")
        self.disk_bytes = reg:gauge("cartridge_kv_disk_bytes", "Bytes in the disk tier.")
        self.disk_max = reg:gauge("cartridge_kv_disk_max_bytes", "The disk tier's bound (--kv-cache-max).")
    end
    if opts.fleet then
        self.fleet = {}
        for _, d in ipairs(FLEET_COUNTERS) do self.fleet[d[1]] = reg:counter(d[2], d[3]) end
        self.fleet_mapped = reg:gauge("cartridge_fleet_mapped", "Cartridges of the fleet mapped now.")
        self.fleet_budget = reg:gauge("cartridge_fleet_budget", "The most cartridges mapped at once (--budget).")
    end
    self.ttft = reg:histogram("cartridge_time_to_first_token_seconds",
        "Seconds from a request's arrival to its first token (queueing and prefill included).", metrics.TTFT_BUCKETS)
    self.tpot = reg:histogram("cartridge_time_per_output_token_seconds",
        "Seconds between consecutive tokens of one request.", metrics.TPOT_BUCKETS)
    self.duration = reg:histogram("cartridge_request_duration_seconds",
        "Seconds from a request's arrival to its last token.", metrics.REQUEST_BUCKETS)
    reg:gauge("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds.")
        :set(opts.start_time or os.time())
    return self
end

-- The route a request went to (nil: an unknown path), until it is answered.
function ServerMetrics:route(id, route)
    self.routes[id] = route or "other"
end

-- A request was answered (or its stream begun) with status.
function ServerMetrics:answered(id, status)
    local route = self.routes[id]
    if not route then return end
    self.routes[id] = nil
    self.requests:inc(1, route, tostring(status))
end

-- A request went away unanswered.
function ServerMetrics:closed(id)
    self.routes[id] = nil
end

-- A job's first token was sampled at time t.
function ServerMetrics:first_token(job, t)
    self.ttft:observe(t - job.received)
    job.token_at = t
end

-- Another token of a job was sampled at time t.
function ServerMetrics:next_token(job, t)
    if job.token_at then self.tpot:observe(t - job.token_at) end
    job.token_at = t
end

-- A job that had a slot ended (finished, cancelled or failed) at time t.
function ServerMetrics:finished(job, t)
    self.prompt:inc(#job.prompt)
    self.cached:inc(job.cached or 0)
    self.completion:inc(#job.out_ids)
    if job.token_at then self.duration:observe(t - job.received) end
end

-- The exposition text of the server srv (gauges read now).
function ServerMetrics:render(srv)
    local busy = 0
    for _, slot in ipairs(srv.slots) do
        if slot.job then busy = busy + 1 end
    end
    self.waiting:set(#srv.queue)
    self.busy:set(busy)
    self.slots:set(#srv.slots)
    local store = srv.store
    if store and self.disk then
        for key, counter in pairs(self.disk) do counter:inc(store.stats[key] - counter:sample().value) end
        local files, bytes = store:usage()
        self.disk_files:set(files)
        self.disk_bytes:set(bytes)
        self.disk_max:set(store.max_bytes)
    end
    local fleet = srv.fleet
    if fleet and self.fleet then
        for key, counter in pairs(self.fleet) do counter:inc(fleet.stats[key] - counter:sample().value) end
        self.fleet_mapped:set(fleet.mapped)
        self.fleet_budget:set(fleet.budget)
    end
    return self.reg:render()
end

return metrics
