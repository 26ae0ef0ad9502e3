// Dead letters: the groups with their counts, and per group its dead messages with the
// error; requeue one or all, purge one or all (purging asks first).

import { api, withQuery } from "../api.js";
import { barChart } from "../charts.js";
import { el, clear, widthOf, fmtInt, panel, routeLink, stateBadge, table, timeBlock, truncate } from "../dom.js";
import { callText } from "../messages.js";
import { busy, confirmDialog, flash } from "../ui.js";

export const title = "Dead letters";

const PAGE = 50;

export async function render(view, ctx) {
  const group = ctx.route.parts[0] ?? null;
  const chart = el("div", { class: "chart-box", id: "dead-chart" });
  const groupsBox = el("div", { id: "dead-groups" });
  const items = el("div", { id: "dead-items" });
  const tools = el("div", { class: "tools" });
  view.append(
    el("div", { class: "page-head" }, el("h1", {}, "Dead letters")),
    el(
      "div",
      { class: "grid" },
      panel("Dead per consumer group", el("div", {}, chart, groupsBox), { wide: !group }),
      group ? panel(`Group ${group}`, items, { tools, id: "dead-group-panel", wide: true }) : null,
    ),
  );

  const body = (extra) => ({ group, ...extra });

  async function bulk(button, action, extra, question) {
    if (question) {
      const ok = await confirmDialog(question);
      if (!ok) return;
    }
    const answer = await busy(button, () => api(`api/dead/${action}`, body(extra)));
    if (answer === undefined) return;
    flash(action === "requeue" ? `Requeued ${fmtInt(answer.requeued)}.` : `Purged ${fmtInt(answer.purged)}.`, "ok");
    await load([null]);
  }

  async function load(cursors) {
    const cursor = cursors[cursors.length - 1];
    const data = await api(withQuery("api/dead", { group, cursor, limit: group ? PAGE : null }));
    if (!ctx.alive) return;
    const groups = [...data.groups].sort((a, b) => b.dead - a.dead);
    clear(chart).append(barChart(groups.map((g) => ({ label: g.group, value: g.dead, cls: "dead" })), { label: "dead messages per group", width: widthOf(chart) }));
    clear(groupsBox).append(
      table(
        ["Group", "Dead"],
        groups.map((g) => [routeLink(g.group, "dead", g.group), fmtInt(g.dead)]),
        { empty: "No dead letters.", id: "dead-groups-table" },
      ),
    );
    if (!group) return;
    const total = groups.find((g) => g.group === group)?.dead ?? 0;
    clear(tools);
    if (total > 0) {
      const requeueAll = el("button", { type: "button", class: "primary", id: "requeue-all" }, `Requeue all ${fmtInt(total)}`);
      requeueAll.addEventListener("click", () => bulk(requeueAll, "requeue", { all: true }, { title: "Requeue every dead letter?", text: `All ${fmtInt(total)} dead messages of ${group} go back to be run again now.`, ok: "Requeue all", danger: false }));
      const purgeAll = el("button", { type: "button", class: "danger", id: "purge-all" }, "Purge all…");
      purgeAll.addEventListener("click", () => bulk(purgeAll, "purge", { all: true }, { title: "Purge every dead letter?", text: `Delete all ${fmtInt(total)} dead messages of ${group} for good? This cannot be undone.`, ok: "Purge all" }));
      tools.append(requeueAll, purgeAll);
    }
    const rows = data.items.map((m) => {
      const requeue = el("button", { type: "button", class: "secondary small-button", dataset: { action: "requeue", msgId: m.msg_id } }, "Requeue");
      requeue.addEventListener("click", () => bulk(requeue, "requeue", { msg_ids: [m.msg_id] }, null));
      const purge = el("button", { type: "button", class: "danger small-button", dataset: { action: "purge", msgId: m.msg_id } }, "Purge");
      purge.addEventListener("click", () => bulk(purge, "purge", { msg_ids: [m.msg_id] }, { title: "Purge this dead letter?", text: `Delete ${m.msg_id} for good?`, ok: "Purge" }));
      return [
        el("div", {}, routeLink(truncate(m.msg_id, 40), "message", m.msg_id), el("div", { class: "muted small mono" }, m.topic)),
        el("code", { class: "call" }, callText(m, 200)),
        m.error ? el("span", { class: "error-text" }, truncate(m.error, 300)) : el("span", { class: "muted" }, "–"),
        el("div", {}, stateBadge(m.state), el("div", { class: "muted small" }, `${fmtInt(m.attempts ?? 0)} attempts`)),
        timeBlock(m.deliver_at_ms),
        el("div", { class: "action-row" }, requeue, purge),
      ];
    });
    const pager = el("div", { class: "pager" });
    if (cursors.length > 1) pager.append(el("button", { type: "button", class: "secondary", onclick: () => load(cursors.slice(0, -1)) }, "← Previous page"));
    if (data.cursor) pager.append(el("button", { type: "button", class: "secondary", id: "dead-next", onclick: () => load([...cursors, data.cursor]) }, "Next page →"));
    clear(items).append(table(["Message", "Job call", "Error", "State", "Was due", ""], rows, { empty: "No dead messages in this group.", id: "dead-table" }), pager);
  }

  await load([null]);
}
