// Hand-drawn SVG charts (no library): bars (optionally stacked) and an area chart, with
// "nice" axis maxima, first/last day ticks and native <title> tooltips. Built with DOM calls.

import { h, s } from "./dom.js";

const SIZES = {
  wide: { W: 560, H: 210, PAD: { top: 12, right: 12, bottom: 26, left: 56 } },
  small: { W: 300, H: 170, PAD: { top: 10, right: 10, bottom: 24, left: 34 } },
};

export function niceMax(v) {
  if (!(v > 0)) return 1;
  const exp = Math.floor(Math.log10(v));
  const base = 10 ** exp;
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * base) return m * base;
  return 10 * base;
}

function frame(title, legend, svg, { empty } = {}) {
  return h(
    "figure",
    { class: "chart" },
    h(
      "figcaption",
      { class: "chart-head" },
      h("span", { class: "chart-title" }, title),
      legend ? h("span", { class: "chart-legend" }, legend) : null,
    ),
    empty ? h("div", { class: "chart-empty muted" }, "No data in this window") : svg,
  );
}

export function legendItem(label, cls) {
  return h("span", { class: "legend-item" }, h("span", { class: ["legend-swatch", cls] }), label);
}

function axes(svg, size, max, fmt, days, xOf, integer) {
  const { W, H, PAD } = size;
  const plotH = H - PAD.top - PAD.bottom;
  for (const f of [0, 0.5, 1]) {
    const y = PAD.top + plotH * (1 - f);
    svg.append(s("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: y, y2: y }));
    if (integer && !Number.isInteger(max * f)) continue;
    svg.append(s("text", { class: "axis-label", x: PAD.left - 6, y: y + 4, "text-anchor": "end" }, fmt(max * f)));
  }
  if (!days.length) return;
  const ticks = days.length > 2 ? [0, Math.floor((days.length - 1) / 2), days.length - 1] : [...days.keys()];
  for (const i of new Set(ticks)) {
    const anchor = days.length === 1 ? "middle" : i === 0 ? "start" : i === days.length - 1 ? "end" : "middle";
    svg.append(s("text", { class: "axis-label", x: xOf(i), y: H - 8, "text-anchor": anchor }, days[i].slice(5)));
  }
}

/**
 * @param {string[]} days
 * @param {{key: string, label: string, cls: string}[]} layers  stacked bottom-up
 * @param {object[]} rows   one per day: {[key]: number}
 */
export function barChart(title, days, layers, rows, fmt, opts = {}) {
  const { legend = layers.length > 1, integer = false } = opts;
  const size = SIZES[opts.size || "wide"];
  const { W, H, PAD } = size;
  const totals = rows.map((r) => layers.reduce((acc, l) => acc + (Number(r[l.key]) || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const slot = plotW / Math.max(days.length, 1);
  const barW = Math.max(2, Math.min(40, slot * 0.7));
  const xOf = (i) => PAD.left + slot * i + slot / 2;
  const svg = s("svg", { class: "chart-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  axes(svg, size, max, fmt, days, xOf, integer);
  rows.forEach((r, i) => {
    let y = PAD.top + plotH;
    for (const l of layers) {
      const v = Number(r[l.key]) || 0;
      if (!v) continue;
      const bh = Math.max(1, (v / max) * plotH);
      y -= bh;
      svg.append(
        s(
          "rect",
          { class: ["bar", l.cls], x: xOf(i) - barW / 2, y, width: barW, height: bh, rx: 2 },
          s("title", {}, `${days[i]} · ${l.label}: ${fmt(v)}`),
        ),
      );
    }
  });
  const legendEl = legend ? layers.map((l) => legendItem(l.label, l.cls)) : null;
  return frame(title, legendEl, svg, { empty: !totals.some((t) => t > 0) });
}

export function areaChart(title, days, values, fmt, cls = "series-cost") {
  const size = SIZES.wide;
  const { W, H, PAD } = size;
  const max = niceMax(Math.max(0, ...values.map((v) => Number(v) || 0)));
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const n = days.length;
  const xOf = (i) => (n <= 1 ? PAD.left + plotW / 2 : PAD.left + (plotW * i) / (n - 1));
  const yOf = (v) => PAD.top + plotH * (1 - (Number(v) || 0) / max);
  const svg = s("svg", { class: "chart-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  axes(svg, size, max, fmt, days, xOf, false);
  if (n) {
    const pts = values.map((v, i) => `${xOf(i).toFixed(1)},${yOf(v).toFixed(1)}`);
    const base = PAD.top + plotH;
    const area = n === 1
      ? `M${xOf(0) - 12},${base} L${xOf(0) - 12},${yOf(values[0])} L${xOf(0) + 12},${yOf(values[0])} L${xOf(0) + 12},${base} Z`
      : `M${xOf(0)},${base} L${pts.join(" L")} L${xOf(n - 1)},${base} Z`;
    svg.append(s("path", { class: ["area", cls], d: area }));
    if (n > 1) svg.append(s("path", { class: ["line", cls], d: `M${pts.join(" L")}` }));
    values.forEach((v, i) => {
      svg.append(s("circle", { class: ["dot", cls], cx: xOf(i), cy: yOf(v), r: 3 }, s("title", {}, `${days[i]}: ${fmt(Number(v) || 0)}`)));
    });
  }
  return frame(title, null, svg, { empty: !values.some((v) => Number(v) > 0) });
}
