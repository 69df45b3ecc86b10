// A small Markdown renderer for model replies. Everything is escaped first,
// so no reply can put markup, scripts or handlers into the page; then fenced
// code, headings, lists, quotes, paragraphs and inline code, bold, italic and
// http(s) links are recognised.
"use strict";

const MD = (() => {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

  // inline markup of one escaped line; code spans are kept out of the rest
  function inline(text) {
    const spans = [];
    text = text.replace(/`([^`]+)`/g, (_, code) => `\u0000${spans.push(code) - 1}\u0000`);
    text = text
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
      .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
    return text.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${spans[i]}</code>`);
  }

  function render(src) {
    const lines = escape(src).split("\n");
    const out = [];
    let para = [], list = null, fence = null;
    const flushPara = () => { if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`); para = []; };
    const flushList = () => { if (list) out.push(`<${list.tag}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`); list = null; };
    for (const line of lines) {
      if (fence !== null) {
        if (/^```/.test(line)) { out.push(`<pre><code>${fence.join("\n")}</code></pre>`); fence = null; }
        else fence.push(line);
        continue;
      }
      let m;
      if (/^```/.test(line)) { flushPara(); flushList(); fence = []; }
      else if ((m = line.match(/^(#{1,4})\s+(.*)$/))) { flushPara(); flushList(); out.push(`<h${m[1].length + 2}>${inline(m[2])}</h${m[1].length + 2}>`); }
      else if ((m = line.match(/^\s*([-*]|\d+[.)])\s+(.*)$/))) {
        flushPara();
        const tag = /\d/.test(m[1]) ? "ol" : "ul";
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push(m[2]);
      }
      else if ((m = line.match(/^&gt;\s?(.*)$/))) { flushPara(); flushList(); out.push(`<blockquote>${inline(m[1])}</blockquote>`); }
      else if (!line.trim()) { flushPara(); flushList(); }
      else { flushList(); para.push(line); }
    }
    if (fence !== null) out.push(`<pre><code>${fence.join("\n")}</code></pre>`);
    flushPara(); flushList();
    return out.join("");
  }

  return { render, escape };
})();
