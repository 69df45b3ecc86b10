// Training: a self-study run followed live (GET /v1/training polled; the
// server reads the run's metrics as selfstudy.lua writes them), or a past
// run's metrics.jsonl opened from disk: progress with ETA, loss and held-out
// loss, QA accuracy with the bare and ICL lines, conversations per minute.
"use strict";

(() => {
  const { $, el } = UI;
  let runs = [], timer = null, current = null; // current: { name, lines, since, state, local }

  function summarize(lines) {
    const s = { steps: [], qa: [], heldout: [], start: null, before: null, after: null, reference: null };
    for (const l of lines) {
      if (l.event === "start") s.start = l.settings;
      else if (l.event === "heldout_before") s.before = l.loss;
      else if (l.event === "heldout_after") s.after = l.loss;
      else if (l.event === "heldout") s.heldout.push([l.step, l.loss]);
      else if (l.event === "qa") s.qa.push(l);
      else if (l.event === "qa_reference") s.reference = l;
      else if (typeof l.step === "number" && typeof l.loss === "number") s.steps.push(l);
    }
    return s;
  }

  function render() {
    const s = summarize(current.lines);
    const last = s.steps[s.steps.length - 1];
    const total = last ? last.steps : s.start ? s.start.steps : 0;
    const done = last ? last.step : 0;
    const secs = s.steps.reduce((a, l) => a + (l.seconds || 0), 0);
    const bar = $("train-progress");
    bar.max = total || 1; bar.value = done;
    const badge = $("train-state");
    badge.textContent = current.state; badge.className = "badge " + current.state;
    const parts = [];
    if (s.start) parts.push(`${s.start.model} · p = ${s.start.p} · lr ${s.start.lr} · ${s.start.accum} conversations per step`);
    if (total) parts.push(`step ${done} of ${total}`);
    if (done && secs > 0) {
      parts.push(`${(last.conversations / secs * 60).toFixed(1)} conversations/min`);
      if (current.state === "running" && done < total) {
        const eta = secs / done * (total - done);
        parts.push(`about ${eta < 90 ? eta.toFixed(0) + " s" : (eta / 60).toFixed(1) + " min"} left`);
      }
    }
    const summary = $("train-summary");
    summary.replaceChildren(el("div", { text: parts.join(" · ") }));
    if (last) {
      summary.append(el("div", {}, "last distill loss ",
        el("strong", { id: "train-last-loss", "data-loss": String(last.loss), "data-step": String(last.step), text: last.loss.toFixed(4) }),
        s.before !== null ? ` · held-out loss before ${s.before.toFixed(4)}` : "",
        s.after !== null ? ` · after ${s.after.toFixed(4)}` : ""));
    }
    if (current.age > 120 && current.state === "running") {
      summary.append(el("div", { class: "error", text: `no new line for ${Math.round(current.age)} s: the run may have stopped` }));
    }
    const points = s.steps.map((l) => [l.step, l.loss]);
    // held-out: before training (step 0), every --heldout-every N steps, after
    const held = (s.before !== null ? [[0, s.before]] : []).concat(s.heldout);
    if (s.after !== null && last) held.push([last.step, s.after]);
    Plot.draw($("train-loss-plot"), { xlabel: "optimizer step", ylabel: "loss (nats/token)", ymin: 0,
      series: [{ name: "distill loss", points, color: "#7aa6d8", width: 1 },
        { name: "mean of 10 steps", points: Plot.smooth(points, 10), color: "#1f5fa8" },
        { name: "held-out loss", points: held, color: "#c0392b", dots: true }] });
    const pct = (r) => 100 * r.right / r.total;
    const hl = [];
    if (s.reference) {
      hl.push({ name: "ICL", y: 100 * s.reference.icl / s.reference.total, color: "#2e8b57" });
      hl.push({ name: "bare", y: 100 * s.reference.bare / s.reference.total, color: "#999" });
    }
    Plot.draw($("train-qa-plot"), { xlabel: "conversations", ylabel: "right (%)", ymin: 0, ymax: 100, hlines: hl,
      empty: "no QA points (selfstudy.lua --qa FILE --qa-every N records them)",
      series: [{ name: "cartridge", points: s.qa.map((r) => [r.conversations, pct(r)]), color: "#1f5fa8", dots: true }] });
  }

  async function poll() {
    if (!current || current.local) return;
    try {
      const r = await UI.api(`/v1/training?run=${encodeURIComponent(current.name)}&since=${current.since}`);
      const run = r.runs[0];
      if (run.lines_total < current.since) { current.lines = []; current.since = 0; return poll(); } // a new run began
      current.lines.push(...run.lines);
      current.since = run.lines_total;
      current.state = run.state; current.age = run.age_seconds;
      render();
    } catch (e) {
      $("train-summary").replaceChildren(el("div", { class: "error", text: e.message }));
    }
  }

  function follow(name) {
    current = { name, lines: [], since: 0, state: "waiting" };
    poll();
  }

  async function shown() {
    if (!timer) timer = setInterval(poll, 1000);
    if (runs.length) return;
    try {
      runs = (await UI.api("/v1/training")).runs;
    } catch (e) {
      $("train-off").hidden = false;
      $("train-off").textContent = `No run to follow: ${e.message}. A past run's metrics file can still be opened above.`;
      return;
    }
    $("train-run").replaceChildren(...runs.map((r) => el("option", { value: r.name, text: `${r.name} (${r.path})` })));
    follow(runs[0].name);
  }

  $("train-run").addEventListener("change", () => follow($("train-run").value));
  $("train-file").addEventListener("change", async () => {
    const f = $("train-file").files[0];
    if (!f) return;
    const lines = [];
    let bad = 0;
    for (const line of (await f.text()).split("\n")) {
      if (!line.trim()) continue;
      try { lines.push(JSON.parse(line)); } catch (_) { bad += 1; }
    }
    current = { name: f.name, lines, since: 0, state: "finished", local: true };
    render();
    if (bad) $("train-summary").append(el("div", { class: "error", text: `${bad} lines of ${f.name} are not JSON` }));
  });
  UI.register("training", { shown });
})();
