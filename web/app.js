// The page's common parts: the server's API (JSON calls and streamed chat
// completions), the tabs, the model list and the health line. Every view
// goes through the same public HTTP API any client uses.
"use strict";

const UI = (() => {
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") e.textContent = v; else if (k === "html") e.innerHTML = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k);
    return e;
  };

  const keyInput = $("api-key");
  keyInput.value = localStorage.getItem("cartridge.apiKey") || "";
  keyInput.addEventListener("change", () => localStorage.setItem("cartridge.apiKey", keyInput.value));

  function headers(json) {
    const h = json ? { "Content-Type": "application/json" } : {};
    if (keyInput.value) h.Authorization = "Bearer " + keyInput.value;
    return h;
  }

  // An error carrying the server's own message (OpenAI's and Anthropic's shapes).
  class ApiError extends Error {
    constructor(status, body) {
      const msg = body && body.error ? (body.error.message || JSON.stringify(body.error)) : `HTTP ${status}`;
      super(`${status}: ${msg}`);
      this.status = status;
      this.code = body && body.error && body.error.code;
    }
  }

  // A response's JSON body; a body that is not JSON becomes an error's message.
  async function bodyOf(res) {
    const text = await res.text();
    try { return JSON.parse(text); } catch (_) { return { error: { message: text.slice(0, 300) } }; }
  }

  async function api(path, body, signal) {
    const res = await fetch(path, { method: body ? "POST" : "GET", headers: headers(!!body),
      body: body ? JSON.stringify(body) : undefined, signal });
    const data = await bodyOf(res);
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }

  // POST /v1/chat/completions with stream: true. onDelta(text) for each piece;
  // resolves to { text, usage, finish, documents, ttft, seconds }.
  async function streamChat(body, onDelta, signal) {
    const t0 = performance.now();
    const res = await fetch("/v1/chat/completions", { method: "POST", headers: headers(true), signal,
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
    if (!res.ok) throw new ApiError(res.status, await bodyOf(res));
    const out = { text: "", usage: null, finish: null, documents: null, ttft: null, seconds: 0 };
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, at); buf = buf.slice(at + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ApiError(500, chunk);
          if (chunk.usage) out.usage = chunk.usage;
          if (chunk.documents) out.documents = chunk.documents;
          const c = chunk.choices && chunk.choices[0];
          if (c && c.delta && c.delta.content) {
            if (out.ttft === null) out.ttft = (performance.now() - t0) / 1000;
            out.text += c.delta.content;
            onDelta(c.delta.content, out);
          }
          if (c && c.finish_reason) out.finish = c.finish_reason;
        }
      }
    }
    out.seconds = (performance.now() - t0) / 1000;
    return out;
  }

  // Runs f over items with at most n in flight (the server's slots).
  async function pool(items, n, f) {
    let next = 0;
    const worker = async () => { while (next < items.length) { const i = next++; await f(items[i], i); } };
    await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  }

  const bytes = (n) => n >= 1048576 ? (n / 1048576).toFixed(2) + " MiB" : n >= 1024 ? (n / 1024).toFixed(2) + " KiB" : n + " B";

  // Speed and size of one reply: KV rows in front, cached tokens, TTFT, tok/s.
  function statsText(r, kvRows, kvBytes) {
    const parts = [];
    if (kvRows !== undefined) parts.push(`${kvRows} KV rows in front (${bytes(kvBytes || 0)})`);
    if (r.usage) {
      const cached = r.usage.prompt_tokens_details ? r.usage.prompt_tokens_details.cached_tokens : 0;
      parts.push(`${r.usage.prompt_tokens} prompt tokens, ${cached} cached`);
      const gen = r.usage.completion_tokens;
      parts.push(`${gen} tokens in ${r.seconds.toFixed(2)} s` + (r.seconds > 0 ? ` (${(gen / r.seconds).toFixed(1)} tok/s with the prefill)` : ""));
    }
    if (r.ttft !== null && r.ttft !== undefined) parts.push(`first token ${(r.ttft * 1000).toFixed(0)} ms`);
    if (r.finish) parts.push(`finish: ${r.finish}`);
    return parts.join(" · ");
  }

  // The models (GET /v1/models), refreshed on demand; listeners re-render.
  const state = { models: [], listeners: [] };
  async function loadModels() {
    try {
      state.models = (await api("/v1/models")).data;
    } catch (e) {
      state.models = []; state.modelsError = e.message;
    }
    const list = $("model-list");
    list.replaceChildren(...state.models.map((m) => el("option", { value: m.id })));
    for (const f of state.listeners) f(state.models);
  }
  const onModels = (f) => { state.listeners.push(f); if (state.models.length) f(state.models); };
  const bare = () => state.models.find((m) => !m.cartridge && !m.fleet && !m.alias_of);
  const model = (id) => state.models.find((m) => m.id === id);

  // tabs: #chat, #compare, #training, #fleet
  const views = {};
  function show(name) {
    if (!document.getElementById("view-" + name)) name = "chat";
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === name);
    for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== "view-" + name;
    if (location.hash !== "#" + name) history.replaceState(null, "", "#" + name);
    if (views[name] && views[name].shown) views[name].shown();
  }
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  const register = (name, view) => { views[name] = view; };

  async function health() {
    const h = $("health");
    try {
      const r = await api("/health");
      h.textContent = `server ok · ${r.slots_processing} busy / ${r.slots_idle} idle slots · ${r.queue} queued`;
      h.className = "muted";
    } catch (e) {
      h.textContent = "server unreachable: " + e.message;
      h.className = "error";
    }
  }

  window.addEventListener("DOMContentLoaded", () => {
    loadModels().then(() => show(location.hash.slice(1) || "chat"));
    health();
    setInterval(health, 3000);
  });

  return { $, el, api, streamChat, pool, bytes, statsText, loadModels, onModels, bare, model, register, ApiError };
})();
