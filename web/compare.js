// Compare: one question, three answers side by side (the bare model, a
// cartridge, the corpus in context), each with its KV rows and bytes, time to
// first token and tok/s; and with --qa, the score table of report.lua --qa
// (the server scores each reply as report.lua does: POST /v1/qa/score).
"use strict";

(() => {
  const { $, el } = UI;
  let corpus = null, corpusError = null, qa = null, loaded = false;

  // the arms: [{ key, name, model, system, rows, bytes }]
  function arms() {
    const out = [];
    const bare = UI.bare();
    if (bare) out.push({ key: "bare", name: "bare model", model: bare.id, rows: 0, bytes: 0 });
    const c = UI.model($("compare-cartridge").value);
    if (c) out.push({ key: "cartridge", name: `cartridge ${c.id} (p=${c.cartridge.p})`, model: c.id,
      rows: c.cartridge.kv_rows, bytes: c.cartridge.kv_bytes });
    if (corpus && bare) out.push({ key: "icl", name: "ICL (corpus in context" + (corpus.truncated ? ", truncated)" : ")"),
      model: bare.id, system: corpus.system, rows: corpus.kv_rows, bytes: corpus.kv_bytes });
    return out;
  }

  const messages = (arm, question) => (arm.system ? [{ role: "system", content: arm.system }] : [])
    .concat([{ role: "user", content: question }]);

  UI.onModels((models) => {
    const sel = $("compare-cartridge");
    const carts = models.filter((m) => m.cartridge);
    sel.replaceChildren(...carts.map((m) => el("option", { value: m.id, text: `${m.id} (p=${m.cartridge.p})` })));
    if (!carts.length) sel.append(el("option", { value: "", text: "(no cartridge loaded: serve.lua --cartridge NAME=PATH)" }));
  });

  async function load() {
    if (loaded) return;
    loaded = true;
    try { corpus = await UI.api("/v1/corpus"); } catch (e) { corpusError = e; }
    $("compare-note").textContent = corpus
      ? `corpus in context: ${corpus.tokens} tokens of ${corpus.files.join(", ")} (${corpus.kv_rows} KV rows)`
      : `no corpus-in-context arm: ${corpusError.message}`;
    try { qa = await UI.api("/v1/qa"); } catch (e) {
      $("qa-off").hidden = false;
      $("qa-off").textContent = `No questions loaded: ${e.message}`;
      return;
    }
    $("qa-on").hidden = false;
    $("qa-about").textContent = `${qa.questions.length} questions from ${qa.file}, answered greedily in at most ${qa.max_tokens} tokens.`;
  }

  async function compare(question) {
    const box = $("compare-arms");
    box.replaceChildren();
    $("compare-send").disabled = true;
    const max = Number($("compare-max-tokens").value) || 64;
    try {
      for (const arm of arms()) { // one after another, so that each one's speed is its own
        const reply = el("div", { class: "body" });
        const stats = el("div", { class: "stats muted", text: `${arm.rows} KV rows (${UI.bytes(arm.bytes)})` });
        box.append(el("div", { class: "arm", "data-arm": arm.key }, el("h3", { text: arm.name }), reply, stats));
        try {
          const r = await UI.streamChat({ model: arm.model, messages: messages(arm, question), temperature: 0, max_tokens: max },
            (_, out) => { reply.innerHTML = MD.render(out.text); });
          reply.innerHTML = MD.render(r.text);
          stats.textContent = UI.statsText(r, arm.rows, arm.bytes);
        } catch (e) {
          reply.append(el("div", { class: "error", text: e.message }));
        }
      }
    } finally {
      $("compare-send").disabled = false;
    }
  }

  const SETS = [["1", "first"], ["2", "held-out"], ["3", "held-out"], ["reverse", "reverse"]];
  const setOf = (phrasing) => (SETS.find((s) => s[0] === phrasing) || [null, "first"])[1];

  async function scoreArm(arm, onDone) {
    const replies = [];
    await UI.pool(qa.questions, 4, async (q) => {
      const r = await UI.api("/v1/chat/completions", { model: arm.model, messages: messages(arm, q.question),
        temperature: 0, max_tokens: qa.max_tokens });
      replies.push({ index: q.index, reply: r.choices[0].message.content || "" });
      onDone();
    });
    const scored = await UI.api("/v1/qa/score", { replies });
    const results = [];
    for (const r of scored.results) results[r.index] = r;
    return results;
  }

  function table(rows, sets) {
    const t = $("qa-table");
    t.replaceChildren(el("tr", {}, el("th", { text: "arm" }), el("th", { text: "KV rows" }), el("th", { text: "KV bytes" }),
      ...sets.map((s) => el("th", { text: s }))));
    for (const row of rows) {
      const cells = sets.map((s) => {
        const c = row.sets[s];
        return el("td", { "data-set": s, "data-right": c.right, "data-total": c.total,
          text: `${c.right}/${c.total} ${Math.round(100 * c.right / c.total)}%` });
      });
      t.append(el("tr", { "data-arm": row.key }, el("td", { text: row.name }), el("td", { text: row.rows }),
        el("td", { text: UI.bytes(row.bytes) }), ...cells));
    }
  }

  function details(rows) {
    const t = $("qa-details");
    t.replaceChildren(el("tr", {}, el("th", { text: "question" }), el("th", { text: "expected" }),
      ...rows.map((r) => el("th", { text: r.name }))));
    for (const q of qa.questions) {
      t.append(el("tr", {}, el("td", { text: q.question }), el("td", { text: q.answer }),
        ...rows.map((r) => {
          const v = r.results[q.index];
          return el("td", { class: v.right ? "right" : "wrong", text: (v.right ? "✓ " : "✗ ") + v.reply });
        })));
    }
  }

  async function scoreAll() {
    const list = arms();
    const sets = [...new Set(qa.questions.map((q) => setOf(q.phrasing)))];
    const bar = $("qa-progress");
    bar.hidden = false; bar.max = list.length * qa.questions.length; bar.value = 0;
    $("qa-run").disabled = true;
    $("qa-status").textContent = "";
    const t0 = performance.now();
    const rows = [];
    try {
      for (const arm of list) {
        $("qa-status").textContent = `scoring ${arm.name}…`;
        const results = await scoreArm(arm, () => { bar.value += 1; });
        const row = { ...arm, results, sets: {} };
        for (const s of sets) row.sets[s] = { right: 0, total: 0 };
        for (const q of qa.questions) {
          const c = row.sets[setOf(q.phrasing)];
          c.total += 1; if (results[q.index].right) c.right += 1;
        }
        rows.push(row);
        table(rows, sets);
      }
      details(rows);
      $("qa-status").textContent = `done in ${((performance.now() - t0) / 1000).toFixed(1)} s`;
    } catch (e) {
      $("qa-status").textContent = "";
      $("qa-status").append(el("span", { class: "error", text: e.message }));
    } finally {
      bar.hidden = true;
      $("qa-run").disabled = false;
    }
  }

  $("compare-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = $("compare-input").value.trim();
    if (q) compare(q);
  });
  $("qa-run").addEventListener("click", () => qa && scoreAll());
  UI.register("compare", { shown: load });
})();
