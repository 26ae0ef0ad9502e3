// Search: by message id, exact key (+ topic), key prefix, job name or due-time range,
// paged with the API's cursor. The form's state lives in the hash, so a search is a link.

import { api, withQuery } from "../api.js";
import { el, clear, field, fromLocalInput, panel, routeWithQuery, toLocalInput } from "../dom.js";
import { cancelPrefix, messageTable } from "../messages.js";

export const title = "Search";

const MODES = {
  id: "Message id",
  key: "Exact key",
  prefix: "Key prefix",
  job: "Job name",
  range: "Due between",
};
const PAGE = 50;

/** The API query of a search (without cursor), or null when a needed field is empty. */
function apiQuery(q) {
  const topic = q.get("topic") || null;
  switch (q.get("mode")) {
    case "id":
      return q.get("id") ? { id: q.get("id") } : null;
    case "key":
      return q.get("key") ? { key: q.get("key"), topic } : null;
    case "prefix":
      return q.get("prefix") ? { key_prefix: q.get("prefix"), topic } : null;
    case "job":
      return q.get("job") ? { job: q.get("job"), topic } : null;
    case "range": {
      const start = q.get("start") ?? "0";
      const end = q.get("end") ?? String(Date.now() + 366 * 86_400_000);
      return { start, end, topic };
    }
    default:
      return null;
  }
}

export async function render(view, ctx) {
  const q = ctx.route.query;
  const mode = MODES[q.get("mode")] ? q.get("mode") : "key";
  const input = (name, attrs = {}) => el("input", { name, id: `search-${name}`, value: q.get(name) ?? "", autocomplete: "off", spellcheck: "false", ...attrs });
  const modeSelect = el("select", { id: "search-mode", name: "mode" }, Object.entries(MODES).map(([k, label]) => el("option", { value: k, selected: k === mode }, label)));
  const startMs = Number(q.get("start"));
  const endMs = Number(q.get("end"));
  const fields = {
    id: field("Message id", input("id", { placeholder: "e.g. 0193a…" })),
    key: field("Key", input("key", { placeholder: "order:42:close" })),
    prefix: field("Key prefix", input("prefix", { placeholder: "order:42:" })),
    job: field("Job name", input("job", { placeholder: "close_order" })),
    start: field("From (your time)", el("input", { type: "datetime-local", id: "search-start", name: "start", value: q.get("start") ? toLocalInput(startMs) : "" })),
    end: field("To (your time)", el("input", { type: "datetime-local", id: "search-end", name: "end", value: q.get("end") ? toLocalInput(endMs) : "" })),
    topic: field("Topic", input("topic", { placeholder: "any topic" })),
  };
  const shownFor = { id: ["id"], key: ["key", "topic"], prefix: ["prefix", "topic"], job: ["job", "topic"], range: ["start", "end", "topic"] };
  const showFields = (m) => {
    for (const [name, node] of Object.entries(fields)) node.hidden = !shownFor[m].includes(name);
  };
  showFields(mode);
  modeSelect.addEventListener("change", () => showFields(modeSelect.value));

  const form = el("form", { class: "search-form", id: "search-form" }, field("Search by", modeSelect), Object.values(fields), el("button", { type: "submit", class: "primary", id: "search-go" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const m = modeSelect.value;
    const value = (name) => (shownFor[m].includes(name) ? form.elements[name].value.trim() : "");
    const query = { mode: m, id: value("id"), key: value("key"), prefix: value("prefix"), job: value("job"), topic: value("topic") };
    if (m === "range") {
      const s = fromLocalInput(form.elements.start.value);
      const e = fromLocalInput(form.elements.end.value);
      query.start = Number.isFinite(s) ? s : "";
      query.end = Number.isFinite(e) ? e : "";
    }
    const target = routeWithQuery("search", query);
    if (location.hash === target) window.dispatchEvent(new HashChangeEvent("hashchange")); // same search: refresh
    else location.hash = target;
  });

  const results = el("div", { id: "search-results" });
  const pager = el("div", { class: "pager", id: "pager" });
  const tools = el("div", { class: "tools" });
  view.append(el("div", { class: "page-head" }, el("h1", {}, "Search")), panel("Find messages", form, { wide: true }), panel("Results", el("div", {}, results, pager), { wide: true, tools, id: "results-panel" }));

  const base = apiQuery(new URLSearchParams({ ...Object.fromEntries(q), mode }));
  if (base === null) {
    results.append(el("p", { class: "empty" }, "Fill in the form and search. Times are read in your time zone; results show it and UTC."));
    return;
  }
  if (mode === "prefix") {
    const bulk = el("button", { type: "button", class: "danger", id: "cancel-prefix" }, "Cancel all under this prefix…");
    bulk.addEventListener("click", async () => {
      if (await cancelPrefix(bulk, q.get("prefix"), q.get("topic"))) load([null]);
    });
    tools.append(bulk);
  }

  // cursors[i] opens page i; going back pops, so "previous" needs no API support.
  async function load(cursors) {
    const cursor = cursors[cursors.length - 1];
    const data = await api(withQuery("api/messages", { ...base, cursor, limit: PAGE }));
    if (!ctx.alive) return;
    clear(results);
    clear(pager);
    if (data.items.length === 0) {
      results.append(el("p", { class: "empty", id: "no-results" }, cursors.length > 1 ? "No more results." : "Nothing matches."));
    } else {
      results.append(messageTable(data.items, Date.now()));
    }
    const first = (cursors.length - 1) * PAGE + 1;
    pager.append(el("span", { class: "muted small", id: "page-info" }, data.items.length ? `results ${first}–${first + data.items.length - 1}` : ""));
    if (cursors.length > 1) pager.append(el("button", { type: "button", class: "secondary", id: "prev-page", onclick: () => load(cursors.slice(0, -1)) }, "← Previous page"));
    if (data.cursor) pager.append(el("button", { type: "button", class: "secondary", id: "next-page", onclick: () => load([...cursors, data.cursor]) }, "Next page →"));
  }
  await load([null]);
}
