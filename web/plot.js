// Line plots drawn as SVG: series of [x, y] points, optional horizontal
// reference lines, axes with a few round ticks and a legend.
"use strict";

const Plot = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const node = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // about n round values covering [lo, hi]
  function ticks(lo, hi, n) {
    if (hi <= lo) hi = lo + 1;
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((k) => k * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  // opts: series [{ name, points, color, dots, noline, width }], hlines [{ name, y, color }], xlabel, ylabel, ymin, ymax
  function draw(container, opts) {
    const W = 560, H = 260, L = 56, R = 12, T = 12, B = 40;
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
    const pts = opts.series.flatMap((s) => s.points);
    if (!pts.length) { container.replaceChildren(Object.assign(document.createElement("p"), { className: "muted", textContent: opts.empty || "no points yet" })); return; }
    const ys = pts.map((p) => p[1]).concat((opts.hlines || []).map((h) => h.y));
    let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
    let y0 = opts.ymin !== undefined ? opts.ymin : Math.min(...ys), y1 = opts.ymax !== undefined ? opts.ymax : Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), sy = (y) => T + (y1 - y) / (y1 - y0) * (H - T - B);
    for (const t of ticks(y0, y1, 4)) {
      svg.append(node("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }));
      svg.append(node("text", { x: L - 6, y: sy(t) + 4, "text-anchor": "end" }, String(t)));
    }
    for (const t of ticks(x0, x1, 6)) svg.append(node("text", { x: sx(t), y: H - B + 16, "text-anchor": "middle" }, String(t)));
    svg.append(node("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "label" }, opts.xlabel));
    svg.append(node("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", class: "label",
      transform: `rotate(-90 12 ${(T + H - B) / 2})` }, opts.ylabel));
    let legendY = T + 12;
    const legend = (name, color) => {
      svg.append(node("rect", { x: W - R - 150, y: legendY - 8, width: 10, height: 3, fill: color }));
      svg.append(node("text", { x: W - R - 136, y: legendY - 4 }, name));
      legendY += 14;
    };
    for (const h of opts.hlines || []) {
      svg.append(node("line", { x1: L, x2: W - R, y1: sy(h.y), y2: sy(h.y), stroke: h.color, "stroke-dasharray": "5 4" }));
      legend(h.name, h.color);
    }
    for (const s of opts.series) {
      if (!s.points.length) continue;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      if (!s.noline) svg.append(node("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.5 }));
      if (s.dots) for (const p of s.points) svg.append(node("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: s.color }));
      legend(s.name, s.color);
    }
    container.replaceChildren(svg);
  }

  // a trailing mean over n points (n <= 1: the points themselves)
  function smooth(points, n) {
    if (n <= 1) return points;
    let sum = 0;
    return points.map((p, i) => {
      sum += p[1];
      if (i >= n) sum -= points[i - n][1];
      return [p[0], sum / Math.min(i + 1, n)];
    });
  }

  return { draw, smooth };
})();
