// Small SVG charts: horizontal bars, a time histogram, lines over time, a CDF.
// Every label is a text node and every tooltip a <title>, so data never becomes markup.
// Sizes are in viewBox units; CSS scales the SVG to its panel's width.

import { fmtCompact, fmtDuration } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";

/** An SVG element with attributes (set with setAttribute) and optional text. */
export function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  if (text !== null) node.textContent = String(text);
  return node;
}

function withTitle(node, text) {
  node.append(svg("title", {}, text));
  return node;
}

/** Round tick values covering [lo, hi], about count of them (whole numbers with integer). */
export function niceTicks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  if (integer) step = Math.max(1, Math.round(step)); // counts: no "0.25 messages" tick
  const first = Math.floor(lo / step) * step;
  const ticks = [];
  for (let i = 0; first + i * step < hi + step - step * 1e-9; i++) ticks.push(+(first + i * step).toPrecision(12));
  return ticks;
}

function frame(width, height, label, cls) {
  return svg("svg", {
    class: `chart ${cls}`,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": label,
    preserveAspectRatio: "xMidYMid meet",
  });
}

function emptyChart(width, height, label, message) {
  const root = frame(width, height, label, "chart-empty");
  root.append(svg("text", { x: width / 2, y: height / 2, class: "empty-text", "text-anchor": "middle" }, message));
  return root;
}

function yAxis(root, ticks, y, x0, x1, format) {
  for (const t of ticks) {
    const yy = y(t);
    root.append(svg("line", { x1: x0, x2: x1, y1: yy, y2: yy, class: "grid" }));
    root.append(svg("text", { x: x0 - 6, y: yy + 4, class: "tick", "text-anchor": "end" }, format(t)));
  }
}

/**
 * Horizontal bars, one per item: items = [{label, value, href?}], largest first.
 * Shows at most `max` rows and says how many were left out.
 */
export function barChart(items, { label = "bar chart", max = 12, width = 560, format = fmtCompact } = {}) {
  if (items.length === 0) return emptyChart(width, 80, label, "No data yet");
  const shown = items.slice(0, max);
  const rowH = 26;
  const left = 170;
  const right = 64;
  const top = 8;
  const height = top + shown.length * rowH + (items.length > max ? 22 : 6);
  const root = frame(width, height, label, "chart-bars");
  const vmax = Math.max(1, ...shown.map((i) => i.value));
  const scale = (v) => ((width - left - right) * v) / vmax;
  shown.forEach((item, i) => {
    const y = top + i * rowH;
    const name = item.label.length > 24 ? item.label.slice(0, 23) + "…" : item.label;
    root.append(withTitle(svg("text", { x: left - 8, y: y + 17, class: "bar-label", "text-anchor": "end" }, name), item.label));
    const bar = svg("rect", { x: left, y: y + 4, width: Math.max(2, scale(item.value)), height: rowH - 8, rx: 3, class: `bar ${item.cls ?? ""}` });
    root.append(withTitle(bar, `${item.label}: ${item.value}`));
    root.append(svg("text", { x: left + scale(item.value) + 6, y: y + 17, class: "bar-value" }, format(item.value)));
  });
  if (items.length > max) {
    root.append(svg("text", { x: left, y: height - 6, class: "tick" }, `+ ${items.length - max} more`));
  }
  return root;
}

/**
 * Vertical bars over equal time buckets: counts[i] covers [start + i*bucket, +bucket).
 * tickLabel(ms) names a bucket start on the x axis; every `labelEvery`-th is labelled.
 */
export function histogram(counts, { startMs, bucketMs, tickLabel, tipLabel, labelEvery = 1, label = "histogram", width = 640, height = 230 } = {}) {
  if (counts.length === 0) return emptyChart(width, height, label, "No data yet");
  const m = { left: 48, right: 12, top: 12, bottom: 30 };
  const root = frame(width, height, label, "chart-histogram");
  const ticks = niceTicks(0, Math.max(1, ...counts), 4, true);
  const ymax = ticks[ticks.length - 1];
  const y = (v) => height - m.bottom - ((height - m.top - m.bottom) * v) / ymax;
  yAxis(root, ticks, y, m.left, width - m.right, fmtCompact);
  const slot = (width - m.left - m.right) / counts.length;
  counts.forEach((c, i) => {
    const x = m.left + i * slot;
    const start = startMs + i * bucketMs;
    const h = height - m.bottom - y(c);
    const bar = svg("rect", { x: x + slot * 0.1, y: y(c) - (c > 0 && h < 2 ? 2 - h : 0), width: slot * 0.8, height: c > 0 ? Math.max(2, h) : 0, class: "bar" });
    const hit = svg("rect", { x, y: m.top, width: slot, height: height - m.top - m.bottom, class: "hit" });
    withTitle(hit, `${tipLabel(start, start + bucketMs)}: ${c} due`);
    root.append(bar, hit);
    if (i % labelEvery === 0) {
      root.append(svg("text", { x: x + slot / 2, y: height - m.bottom + 16, class: "tick", "text-anchor": "middle" }, tickLabel(start)));
    }
  });
  root.append(svg("line", { x1: m.left, x2: width - m.right, y1: height - m.bottom, y2: height - m.bottom, class: "axis" }));
  return root;
}

const clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });

/**
 * Lines over time: series = [{name, points: [[t_ms, value]...], cls}]; yFormat names a value.
 */
export function lineChart(series, { label = "line chart", width = 640, height = 220, yFormat = fmtCompact, unit = "" } = {}) {
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]));
  if (all.length === 0) return emptyChart(width, height, label, "No data yet");
  const m = { left: 56, right: 14, top: 26, bottom: 28 };
  const root = frame(width, height, label, "chart-lines");
  let t0 = Math.min(...all.map((p) => p[0]));
  let t1 = Math.max(...all.map((p) => p[0]));
  if (t1 - t0 < 1000) t0 = t1 - 60_000;
  const ticks = niceTicks(0, Math.max(...all.map((p) => p[1]), 1e-9), 4);
  const ymax = ticks[ticks.length - 1] || 1;
  const x = (t) => m.left + ((width - m.left - m.right) * (t - t0)) / (t1 - t0);
  const y = (v) => height - m.bottom - ((height - m.top - m.bottom) * v) / ymax;
  yAxis(root, ticks, y, m.left, width - m.right, yFormat);
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    root.append(svg("text", { x: x(t), y: height - 8, class: "tick", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, clock.format(new Date(t))));
  }
  root.append(svg("line", { x1: m.left, x2: width - m.right, y1: height - m.bottom, y2: height - m.bottom, class: "axis" }));
  let legendX = m.left;
  series.forEach((s, si) => {
    const cls = s.cls ?? `s${si}`;
    const pts = s.points.filter((p) => Number.isFinite(p[1]));
    if (pts.length > 0) {
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)} ${y(p[1]).toFixed(1)}`).join(" ");
      root.append(svg("path", { d, class: `line ${cls}` }));
      for (const p of pts) {
        const dot = svg("circle", { cx: x(p[0]), cy: y(p[1]), r: pts.length > 60 ? 1.6 : 2.6, class: `dot ${cls}` });
        root.append(withTitle(dot, `${s.name} at ${clock.format(new Date(p[0]))}: ${yFormat(p[1])}${unit}`));
      }
    }
    root.append(svg("rect", { x: legendX, y: 6, width: 12, height: 4, rx: 2, class: `swatch ${cls}` }));
    const text = svg("text", { x: legendX + 16, y: 12, class: "legend" }, s.name);
    root.append(text);
    legendX += 28 + s.name.length * 7;
  });
  return root;
}

/**
 * A cumulative distribution: points = [[lateness_ms, fraction]...] sorted by lateness;
 * marks = [{label, value}] drawn as vertical lines. The x axis is logarithmic when the
 * values span more than two decades (lateness tails are long).
 */
export function cdfChart(points, { marks = [], label = "CDF", width = 720, height = 320 } = {}) {
  if (points.length === 0) return emptyChart(width, height, label, "No deliveries in this window");
  const m = { left: 56, right: 20, top: 16, bottom: 40 };
  const root = frame(width, height, label, "chart-cdf");
  const xs = points.map((p) => p[0]).concat(marks.map((k) => k.value)).filter(Number.isFinite);
  const positive = xs.filter((v) => v > 0);
  const lo = positive.length ? Math.min(...positive) : 0.1;
  const hi = Math.max(...xs, lo * 10);
  const log = hi / lo > 100;
  const a = log ? Math.log10(Math.max(lo, 0.01)) : 0;
  const b = log ? Math.log10(hi) : hi;
  const pos = (v) => (log ? Math.log10(Math.max(v, 10 ** a)) : v);
  const x = (v) => m.left + ((width - m.left - m.right) * (pos(v) - a)) / (b - a || 1);
  const y = (f) => height - m.bottom - (height - m.top - m.bottom) * f;
  yAxis(root, [0, 0.25, 0.5, 0.75, 1], y, m.left, width - m.right, (f) => `${Math.round(f * 100)}%`);
  const xticks = log
    ? Array.from({ length: Math.floor(b) - Math.ceil(a) + 1 }, (_, i) => 10 ** (Math.ceil(a) + i))
    : niceTicks(0, hi, 6).filter((t) => t <= hi);
  for (const t of xticks) {
    root.append(svg("text", { x: x(t), y: height - m.bottom + 16, class: "tick", "text-anchor": "middle" }, fmtDuration(t)));
  }
  root.append(svg("text", { x: (width + m.left) / 2, y: height - 4, class: "axis-label", "text-anchor": "middle" }, `job-start lateness${log ? " (log scale)" : ""}`));
  root.append(svg("line", { x1: m.left, x2: width - m.right, y1: y(0), y2: y(0), class: "axis" }));
  // A step from 0 at the first value: no start "fell" earlier than the smallest lateness.
  const steps = [[points[0][0], 0], ...points];
  const d = steps.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)} ${y(p[1]).toFixed(1)}`).join(" ");
  root.append(svg("path", { d, class: "line s0 cdf" }));
  for (const p of points) {
    const hit = svg("circle", { cx: x(p[0]), cy: y(p[1]), r: 3, class: "hit" });
    root.append(withTitle(hit, `${(p[1] * 100).toFixed(2)}% started within ${fmtDuration(p[0])}`));
  }
  marks.forEach((mark, i) => {
    if (!Number.isFinite(mark.value)) return;
    const xx = x(mark.value);
    root.append(withTitle(svg("line", { x1: xx, x2: xx, y1: m.top, y2: y(0), class: `mark mark-${i}` }), `${mark.label}: ${fmtDuration(mark.value)}`));
    const right = xx > width * 0.75; // near the right edge: label on the line's left
    root.append(svg("text", { x: right ? xx - 4 : xx + 4, y: m.top + 12 + i * 14, "text-anchor": right ? "end" : "start", class: `mark-label mark-${i}` }, `${mark.label} ${fmtDuration(mark.value)}`));
  });
  return root;
}
