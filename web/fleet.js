// Fleet: the fleet's documents with their cartridges' sizes and residency
// (GET /v1/fleet), and a question asked through retrieval, with the documents
// it composed.
"use strict";

(() => {
  const { $, el } = UI;
  let fleet = null;

  async function refresh() {
    try {
      fleet = await UI.api("/v1/fleet");
    } catch (e) {
      $("fleet-off").hidden = false; $("fleet-on").hidden = true;
      $("fleet-off").textContent = `No fleet: ${e.message}`;
      return;
    }
    $("fleet-off").hidden = true; $("fleet-on").hidden = false;
    $("fleet-about").textContent = `fleet '${fleet.name}' in ${fleet.dir}: ${fleet.documents.length} documents, `
      + `${fleet.mapped} of at most ${fleet.budget} cartridges mapped, up to ${fleet.rag_docs} composed per conversation`;
    const t = $("fleet-table");
    t.replaceChildren(el("tr", {}, ...["document", "tokens", "KV rows", "KV bytes", "trained steps", "mapped"]
      .map((h) => el("th", { text: h }))));
    for (const d of fleet.documents) {
      t.append(el("tr", { "data-doc": d.name }, el("td", { text: d.name }), el("td", { text: d.tokens ?? "" }),
        el("td", { text: d.rows }), el("td", { text: UI.bytes(d.kv_bytes) }), el("td", { text: d.steps ?? "" }),
        el("td", { text: d.mapped ? "yes" : "no" })));
    }
  }

  $("fleet-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const q = $("fleet-input").value.trim();
    if (!q || !fleet) return;
    const box = $("fleet-answer");
    const reply = el("div", { class: "body" }), stats = el("div", { class: "stats muted" });
    box.replaceChildren(reply, stats);
    $("fleet-send").disabled = true;
    try {
      const r = await UI.streamChat({ model: fleet.name, messages: [{ role: "user", content: q }], temperature: 0, max_tokens: 128 },
        (_, out) => { reply.innerHTML = MD.render(out.text); });
      reply.innerHTML = MD.render(r.text);
      stats.textContent = `composed: ${(r.documents || []).join(", ") || "(none)"} · ` + UI.statsText(r);
    } catch (e) {
      reply.append(el("div", { class: "error", text: e.message }));
    } finally {
      $("fleet-send").disabled = false;
      refresh();
    }
  });
  UI.register("fleet", { shown: refresh });
})();
