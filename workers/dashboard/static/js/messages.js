// Shared views of a message (the API's Msg): its decoded job call as safe text, a
// compact result row, and the bulk cancel by key prefix (preview, confirm, cancel).

import { api } from "./api.js";
import { el, fmtInt, routeLink, stateBadge, timeBlock, truncate } from "./dom.js";
import { busy, confirmDialog, flash } from "./ui.js";

/** A JSON value as one short line of text (strings quoted, so "<b>" reads as data). */
function literal(value) {
  const text = JSON.stringify(value);
  return text === undefined ? String(value) : text;
}

/**
 * The job call as text, e.g. close_order(42, reason="late"); a non-job body as its
 * preview. Never markup: callers put it in the DOM with textContent.
 */
export function callText(msg, max = 400) {
  if (!msg.job) {
    if (msg.body_preview === null || msg.body_preview === undefined) return "(no preview)";
    return truncate(msg.body_preview, max);
  }
  const parts = (msg.args ?? []).map(literal);
  for (const [k, v] of Object.entries(msg.kwargs ?? {})) parts.push(`${k}=${literal(v)}`);
  const text = truncate(`${msg.job}(${parts.join(", ")})`, max);
  return msg.truncated ? `${text} …(arguments truncated)` : text;
}

/** The result rows' table. */
export function messageTable(items, nowMs) {
  const rows = items.map((m) =>
    el(
      "tr",
      { class: "msg-row", dataset: { msgId: m.msg_id } },
      el(
        "td",
        { class: "msg-cell" },
        el("div", {}, routeLink(truncate(m.msg_id, 48), "message", m.msg_id)),
        el("div", { class: "muted small" }, "topic ", el("span", { class: "mono" }, m.topic)),
        m.key !== null && m.key !== undefined ? el("div", { class: "small" }, "key ", el("span", { class: "mono msg-key" }, truncate(m.key, 80))) : null,
      ),
      el("td", {}, stateBadge(m.state)),
      el("td", {}, timeBlock(m.deliver_at_ms, nowMs)),
      el("td", {}, el("code", { class: "call" }, callText(m, 240))),
      el("td", { class: "num" }, fmtInt(m.attempts ?? 0)),
      el("td", { class: "error-cell" }, m.error ? truncate(m.error, 200) : el("span", { class: "muted" }, "–")),
    ),
  );
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      { id: "results", class: "results" },
      el("thead", {}, el("tr", {}, ["Message", "State", "Due (yours / UTC)", "Job call", "Attempts", "Last error"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows),
    ),
  );
}

/**
 * Cancel every pending message under key_prefix (on topic, or every topic) after an
 * in-page confirmation that shows the preview count. Resolves to the cancel answer, or
 * null when the user declined or nothing matched.
 */
export async function cancelPrefix(button, keyPrefix, topic) {
  const body = { key_prefix: keyPrefix };
  if (topic) body.topic = topic;
  return busy(button, async () => {
    const preview = await api("api/cancel-prefix/preview", body);
    if (preview.count === 0) {
      flash(`Nothing pending under the prefix “${keyPrefix}”.`, "info");
      return null;
    }
    const count = `${preview.exact ? "" : "at least "}${fmtInt(preview.count)}`;
    const ok = await confirmDialog({
      title: "Cancel by key prefix",
      text: `Cancel ${count} pending message${preview.count === 1 ? "" : "s"} whose key starts with “${keyPrefix}”${topic ? ` on topic ${topic}` : " on every topic"}? This cannot be undone.`,
      ok: `Cancel ${count}`,
    });
    if (!ok) return null;
    const result = await api("api/cancel-prefix", body);
    const late = result.already_delivered_count ? `; ${fmtInt(result.already_delivered_count)} had already fired` : "";
    flash(`Cancelled ${fmtInt(result.aborted)}${late}.`, "ok");
    return result;
  });
}
