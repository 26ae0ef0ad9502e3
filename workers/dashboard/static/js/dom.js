// DOM building without markup strings: every piece of data goes in as a text node
// or an attribute value, so a key such as "<script>" shows literally and never runs.

/**
 * Create an element. props: "class", "text", on<event> (a function, added with
 * addEventListener), "dataset" (an object) and anything else as an attribute.
 * Children: nodes, strings (as text nodes), arrays of them; null/false are skipped.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "style" || name.startsWith("on")) {
      // Inline styles and handlers are refused by the CSP anyway; fail loudly here.
      throw new Error(`el(): attribute ${name} is not allowed`);
    } else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, ...children);
  return node;
}

/** Append children (nodes or strings as text) to node. */
export function append(node, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Remove every child of node. */
export function clear(node) {
  node.replaceChildren();
  return node;
}

/** An in-page link to a hash route; the path parts are URI-encoded. */
export function routeLink(text, ...parts) {
  const href = "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
  return el("a", { href }, text);
}

/** "#/search?key=a" built from an object of query parameters (empty ones left out). */
export function routeWithQuery(route, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined && v !== "") params.set(k, String(v));
  }
  const qs = params.toString();
  return `#/${route}${qs ? "?" + qs : ""}`;
}

const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });
const plain = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });

/** 1234567 -> "1.2M" (for chart labels); exact numbers use fmtInt. */
export function fmtCompact(n) {
  return Number.isFinite(n) ? compact.format(n) : "–";
}

/** 1234567 -> "1,234,567" in the viewer's locale. */
export function fmtInt(n) {
  return Number.isFinite(n) ? plain.format(n) : "–";
}

/** A duration in ms as "850 ms", "12.5 s", "3.2 min", "2.0 h", "1.5 d". */
export function fmtDuration(ms) {
  if (!Number.isFinite(ms)) return "–";
  const a = Math.abs(ms);
  if (a < 1000) return `${plain.format(ms)} ms`;
  if (a < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (a < 3_600_000) return `${(ms / 60_000).toFixed(1)} min`;
  if (a < 86_400_000) return `${(ms / 3_600_000).toFixed(1)} h`;
  return `${(ms / 86_400_000).toFixed(1)} d`;
}

const localFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "2-digit",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  hourCycle: "h23",
  timeZoneName: "short",
});

/** Epoch ms in the viewer's time zone, e.g. "Nov 27, 2026, 21:30:05 GMT+1". */
export function fmtLocal(ms) {
  return Number.isFinite(ms) ? localFormat.format(new Date(ms)) : "–";
}

/** Epoch ms in UTC, e.g. "2026-11-27 20:30:05.123 UTC". */
export function fmtUtc(ms) {
  if (!Number.isFinite(ms)) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC");
}

/** "in 5.0 min" / "12.0 s ago" relative to now_ms. */
export function fmtRelative(ms, nowMs) {
  if (!Number.isFinite(ms)) return "";
  const d = ms - nowMs;
  return d >= 0 ? `in ${fmtDuration(d)}` : `${fmtDuration(-d)} ago`;
}

/** A time cell: the viewer's zone on top, UTC below (both as text). */
export function timeBlock(ms, nowMs) {
  if (!Number.isFinite(ms)) return el("span", { class: "muted" }, "–");
  return el(
    "span",
    { class: "time", dataset: { ms: String(ms) } },
    el("span", { class: "time-local" }, fmtLocal(ms)),
    el("span", { class: "time-utc" }, fmtUtc(ms)),
    Number.isFinite(nowMs) ? el("span", { class: "time-rel" }, fmtRelative(ms, nowMs)) : null,
  );
}

/** "2026-11-27T21:30" for a datetime-local input, in the viewer's zone. */
export function toLocalInput(ms) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** Epoch ms of a datetime-local value (read in the viewer's zone); NaN when empty/bad. */
export function fromLocalInput(value) {
  if (!value) return Number.NaN;
  return new Date(value).getTime(); // no zone in the string: the browser reads it as local
}

/** A coloured badge for a message/schedule state. */
export function stateBadge(state) {
  const s = String(state ?? "UNKNOWN");
  return el("span", { class: `badge state-${s.toLowerCase().replace(/[^a-z0-9]+/g, "-")}` }, s);
}

/** Shorten text to max characters with an ellipsis. */
export function truncate(text, max) {
  const s = String(text);
  return s.length > max ? s.slice(0, max - 1) + "…" : s;
}

/** A labelled form field wrapping control. */
export function field(label, control, hint) {
  return el("label", { class: "field" }, el("span", { class: "field-label" }, label), control, hint ? el("span", { class: "hint" }, hint) : null);
}

/** A panel with a heading, optional tools on the right and a body. */
export function panel(title, body, { tools = null, id = null, wide = false } = {}) {
  return el(
    "section",
    { class: wide ? "panel wide" : "panel", id },
    el("div", { class: "panel-head" }, el("h2", {}, title), tools),
    body,
  );
}

/** A table from column headings and rows of cells (nodes or text). */
export function table(headings, rows, { empty = "Nothing here.", id = null } = {}) {
  if (rows.length === 0) return el("p", { class: "empty", id }, empty);
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      { id },
      el("thead", {}, el("tr", {}, headings.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))),
    ),
  );
}

/** The drawing width for a chart in box: its CSS width in px (so 1 unit = 1 px). */
export function widthOf(box, fallback = 640) {
  const w = Math.floor(box.getBoundingClientRect().width);
  return w >= 240 ? w : fallback;
}
