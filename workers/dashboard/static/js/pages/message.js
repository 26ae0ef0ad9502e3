// One message: every field the API knows, and its actions (abort, reschedule, run now),
// plus the bulk cancel by key prefix (prefilled from the key up to its last ":").

import { api } from "../api.js";
import { el, clear, field, fmtDuration, fmtInt, fromLocalInput, panel, stateBadge, timeBlock, toLocalInput } from "../dom.js";
import { callText, cancelPrefix } from "../messages.js";
import { busy, confirmDialog, flash } from "../ui.js";

export const title = "Message";

const ACTIVE = new Set(["PENDING"]);

function row(label, value) {
  return [el("dt", {}, label), el("dd", {}, value)];
}

function details(m) {
  const groups = Object.entries(m.groups ?? {});
  const tags = Array.isArray(m.tags) ? m.tags : m.tags ? [m.tags] : []; // brokers give one string
  return el(
    "dl",
    { class: "details", id: "message-details" },
    row("Message id", el("span", { class: "mono", id: "detail-id" }, m.msg_id)),
    row("State", el("span", { id: "detail-state" }, stateBadge(m.state))),
    row("Due", el("span", { id: "detail-due" }, timeBlock(m.deliver_at_ms, Date.now()))),
    row("Created", timeBlock(m.born_ms)),
    row("Topic", el("span", { class: "mono", id: "detail-topic" }, m.topic)),
    row("Key", m.key === null || m.key === undefined ? el("span", { class: "muted" }, "none") : el("span", { class: "mono", id: "detail-key" }, m.key)),
    row("Tags", tags.length ? tags.map((t) => el("span", { class: "tag" }, t)) : el("span", { class: "muted" }, "none")),
    row("Attempts", fmtInt(m.attempts ?? 0)),
    row("Last error", m.error ? el("pre", { class: "error-text", id: "detail-error" }, m.error) : el("span", { class: "muted" }, "none")),
    row("Consumer groups", groups.length ? el("span", {}, groups.map(([g, s]) => el("span", { class: "group-state" }, el("span", { class: "mono" }, g), " ", stateBadge(s)))) : el("span", { class: "muted" }, "none yet")),
    row("Body", `${fmtInt(m.body_size ?? 0)} bytes`),
    row(m.job ? "Job call" : "Body preview", el("pre", { class: "call", id: "detail-call" }, callText(m, 20_000))),
  );
}

function statusText(answer) {
  if (answer.status === "RESCHEDULED") return "Rescheduled: now due " + new Date(answer.deliver_at_ms).toLocaleString() + ".";
  if (answer.status === "ALREADY_DELIVERED") return "Too late: it had already fired.";
  if (answer.status === "NOT_FOUND") return "Not found: it was cancelled or never pending.";
  return `Answer: ${answer.status}.`;
}

export async function render(view, ctx) {
  const msgId = ctx.route.parts.join("/");
  const body = el("div", { id: "message-body" });
  const actions = el("div", { class: "actions", id: "message-actions" });
  view.append(el("div", { class: "page-head" }, el("h1", {}, "Message"), el("a", { href: "#/search", class: "small" }, "← back to search")), el("div", { class: "grid" }, panel("Details", body, { wide: true }), panel("Actions", actions, { wide: true })));

  async function load() {
    const m = await api(`api/messages/${encodeURIComponent(msgId)}`);
    if (!ctx.alive) return;
    clear(body).append(details(m));
    clear(actions).append(actionForms(m));
  }

  async function act(button, path, payload, describe) {
    const answer = await busy(button, () => api(`api/messages/${encodeURIComponent(msgId)}/${path}`, payload));
    if (answer === undefined) return;
    flash(describe(answer), answer.status === "ABORTED" || answer.status === "RESCHEDULED" ? "ok" : "info");
    await load();
  }

  function actionForms(m) {
    const pending = ACTIVE.has(m.state);
    const abort = el("button", { type: "button", class: "danger", id: "abort", disabled: !pending }, "Abort");
    abort.addEventListener("click", async () => {
      const ok = await confirmDialog({ title: "Abort this message?", text: `It will not be delivered (id ${m.msg_id}${m.key ? `, key ${m.key}` : ""}).`, ok: "Abort" });
      if (ok) await act(abort, "abort", {}, (a) => (a.status === "ABORTED" ? "Aborted." : statusText(a)));
    });
    const runNow = el("button", { type: "button", class: "secondary", id: "run-now", disabled: !pending }, "Run now");
    runNow.addEventListener("click", () => act(runNow, "run-now", {}, (a) => (a.status === "RESCHEDULED" ? "Due now: it runs as soon as a dispatcher pulls it." : statusText(a))));

    const dueDefault = Number.isFinite(m.deliver_at_ms) ? Math.max(m.deliver_at_ms, Date.now() + 60_000) : Date.now() + 600_000;
    const at = el("input", { type: "datetime-local", id: "reschedule-at", name: "at", required: true, value: toLocalInput(dueDefault), step: 60 });
    const delay = el("input", { type: "number", id: "reschedule-delay", name: "delay", min: 0, step: 1, placeholder: "seconds" });
    const reschedule = el("button", { type: "submit", class: "primary", id: "reschedule", disabled: !pending }, "Reschedule");
    const form = el(
      "form",
      { class: "inline-form", id: "reschedule-form" },
      field("New due time (your time)", at, Intl.DateTimeFormat().resolvedOptions().timeZone),
      el("span", { class: "or" }, "or"),
      field("Delay from now", delay, "seconds"),
      reschedule,
    );
    delay.addEventListener("input", () => {
      at.required = delay.value === "";
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (delay.value !== "") {
        act(reschedule, "reschedule", { delay_ms: Math.round(Number(delay.value) * 1000) }, statusText);
        return;
      }
      const atMs = fromLocalInput(at.value);
      if (!Number.isFinite(atMs)) {
        flash("Pick a new due time or a delay.", "error");
        return;
      }
      act(reschedule, "reschedule", { at_ms: atMs }, statusText);
    });

    const lastColon = (m.key ?? "").lastIndexOf(":");
    const prefix = el("input", { id: "prefix-input", value: lastColon > 0 ? m.key.slice(0, lastColon + 1) : m.key ?? "", placeholder: "order:42:", autocomplete: "off" });
    const sameTopic = el("input", { type: "checkbox", id: "prefix-same-topic", checked: true });
    const bulk = el("button", { type: "submit", class: "danger", id: "cancel-prefix" }, "Cancel all under prefix…");
    const bulkForm = el(
      "form",
      { class: "inline-form", id: "cancel-prefix-form" },
      field("Key prefix", prefix),
      el("label", { class: "check" }, sameTopic, ` only topic ${m.topic}`),
      bulk,
    );
    bulkForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!prefix.value) return flash("Give a key prefix.", "error");
      if (await cancelPrefix(bulk, prefix.value, sameTopic.checked ? m.topic : null)) await load();
    });

    return el(
      "div",
      { class: "action-groups" },
      el("div", { class: "action-row" }, abort, runNow, pending ? null : el("span", { class: "muted small" }, `Only a pending message can be changed (this one is ${m.state}).`)),
      el("h3", {}, "Reschedule"),
      form,
      el("p", { class: "muted small" }, `Now due in ${fmtDuration(m.deliver_at_ms - Date.now())}.`),
      el("h3", {}, "Bulk cancel"),
      bulkForm,
    );
  }

  await load();
}
