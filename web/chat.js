// Chat: a multi-turn conversation with the bare model, a cartridge or the
// fleet, streamed, with a stop button, sampling settings, the cached tokens
// and KV rows of each reply, copy, and Markdown.
"use strict";

(() => {
  const { $, el } = UI;
  const history = []; // { role, content }
  let controller = null;

  function modelInfo() {
    const m = UI.model($("chat-model").value);
    const info = $("chat-model-info");
    if (!m) { info.textContent = $("chat-model").value ? "(not in GET /v1/models: the server decides)" : ""; return; }
    if (m.cartridge) info.textContent = `cartridge: ${m.cartridge.p} KV rows (${UI.bytes(m.cartridge.kv_bytes || 0)}) over ${m.cartridge.base_model}`;
    else if (m.fleet) info.textContent = `fleet of ${m.fleet.documents} documents: retrieval composes up to ${m.fleet.rag_docs} cartridges`;
    else if (m.alias_of) info.textContent = `another name of ${m.alias_of}`;
    else info.textContent = "the bare model: no rows in front";
  }

  UI.onModels((models) => {
    const input = $("chat-model");
    if (!input.value || !UI.model(input.value)) {
      const first = models.find((m) => m.cartridge) || models[0];
      input.value = first ? first.id : "";
    }
    modelInfo();
  });
  $("chat-model").addEventListener("input", modelInfo);

  function bubble(role, text) {
    const body = el("div", { class: "body" });
    if (role === "assistant") body.innerHTML = MD.render(text); else body.textContent = text;
    const b = el("div", { class: "msg " + role }, el("div", { class: "who", text: role }), body);
    $("chat-log").append(b);
    b.scrollIntoView({ block: "end" });
    return b;
  }

  function request() {
    const num = (id) => { const v = $(id).value; return v === "" ? undefined : Number(v); };
    const msgs = [];
    const system = $("chat-system").value.trim();
    if (system) msgs.push({ role: "system", content: system });
    const body = { model: $("chat-model").value || undefined, messages: msgs.concat(history),
      temperature: num("chat-temperature"), top_p: num("chat-top-p"), max_tokens: num("chat-max-tokens"),
      seed: num("chat-seed") };
    const extra = $("chat-extra").value.trim();
    if (extra) Object.assign(body, JSON.parse(extra)); // a bad object is the user's error, shown below
    return body;
  }

  async function send(text) {
    history.push({ role: "user", content: text });
    bubble("user", text);
    const b = bubble("assistant", "");
    b.classList.add("streaming");
    const body = b.querySelector(".body");
    const stats = el("div", { class: "stats muted" });
    b.append(stats);
    controller = new AbortController();
    $("chat-send").disabled = true; $("chat-stop").disabled = false;
    let shown = "";
    try {
      const req = request();
      const r = await UI.streamChat(req, (_, out) => { shown = out.text; body.innerHTML = MD.render(shown); }, controller.signal);
      history.push({ role: "assistant", content: r.text });
      const m = UI.model(req.model || "");
      const rows = m && m.cartridge ? m.cartridge.kv_rows : m && !m.fleet ? 0 : undefined;
      stats.textContent = UI.statsText(r, rows, m && m.cartridge ? m.cartridge.kv_bytes : 0)
        + (r.documents ? ` · composed: ${r.documents.join(", ")}` : "");
      const copy = el("button", { class: "copy", type: "button", text: "Copy" });
      copy.addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(r.text));
      b.append(copy);
    } catch (e) {
      if (e.name === "AbortError") {
        stats.textContent = "stopped";
        if (shown) history.push({ role: "assistant", content: shown }); else history.pop();
      } else {
        history.pop();
        b.classList.add("failed");
        stats.textContent = "";
        b.append(el("div", { class: "error", text: e.message }));
      }
    } finally {
      b.classList.remove("streaming");
      controller = null;
      $("chat-send").disabled = false; $("chat-stop").disabled = true;
    }
  }

  $("chat-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("chat-input").value;
    if (!text.trim() || controller) return;
    $("chat-input").value = "";
    send(text);
  });
  $("chat-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("chat-form").requestSubmit(); }
  });
  $("chat-stop").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => { if (controller) controller.abort(); history.length = 0; $("chat-log").replaceChildren(); });
})();
