// Schedules: a timeline of the next fire times of every schedule, then each schedule
// with its trigger, next fires, last run and outcome; pause, resume, run now.

import { api } from "../api.js";
import { svg } from "../charts.js";
import { el, clear, widthOf, fmtDuration, panel, stateBadge, table, timeBlock, truncate } from "../dom.js";
import { busy, flash } from "../ui.js";

export const title = "Schedules";

const POLL_MS = 5000;

/** Dots on a shared time axis, one row per schedule: when will what fire. */
function timeline(items, nowMs, width) {
  const rows = items.filter((s) => !s.paused && s.next_fire_times_ms.length);
  const left = 170;
  const right = 16;
  const rowH = 22;
  const height = 34 + rows.length * rowH;
  const root = svg("svg", { class: "chart chart-timeline", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "next fire times" });
  if (rows.length === 0) {
    root.setAttribute("viewBox", `0 0 ${width} 60`);
    root.append(svg("text", { x: width / 2, y: 34, class: "empty-text", "text-anchor": "middle" }, "Nothing scheduled to fire"));
    return root;
  }
  const last = Math.max(...rows.flatMap((s) => s.next_fire_times_ms));
  const span = Math.max(last - nowMs, 60_000);
  const x = (t) => left + ((width - left - right) * (t - nowMs)) / span;
  for (let i = 0; i <= 4; i++) {
    const t = nowMs + (span * i) / 4;
    root.append(svg("line", { x1: x(t), x2: x(t), y1: 8, y2: height - 22, class: "grid" }));
    root.append(svg("text", { x: x(t), y: height - 6, class: "tick", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, i === 0 ? "now" : `+${fmtDuration(t - nowMs)}`));
  }
  rows.forEach((s, i) => {
    const y = 14 + i * rowH;
    const label = svg("text", { x: left - 8, y: y + 4, class: "bar-label", "text-anchor": "end" }, truncate(s.name, 24));
    label.append(svg("title", {}, s.name));
    root.append(label);
    for (const t of s.next_fire_times_ms) {
      const dot = svg("circle", { cx: x(t), cy: y, r: 4.5, class: "dot s0 fire" });
      dot.append(svg("title", {}, `${s.name}: ${new Date(t).toLocaleString()}`));
      root.append(dot);
    }
  });
  return root;
}

function lastRun(run) {
  if (!run) return el("span", { class: "muted" }, "not yet");
  const ok = run.outcome === "ok";
  return el(
    "div",
    { class: "last-run" },
    el("span", { class: `badge ${ok ? "state-done" : "state-dead"}` }, truncate(run.outcome, 60)),
    " ",
    el("span", { class: "small" }, new Date(run.fire_ms).toLocaleString()),
    Number.isFinite(run.end_ms) && Number.isFinite(run.start_ms) ? el("span", { class: "muted small" }, ` · ran ${fmtDuration(run.end_ms - run.start_ms)}`) : null,
  );
}

export async function render(view, ctx) {
  const chart = el("div", { class: "chart-box", id: "schedules-timeline" });
  const list = el("div", { id: "schedules-list" });
  view.append(el("div", { class: "page-head" }, el("h1", {}, "Schedules")), el("div", { class: "grid" }, panel("Next fire times", chart, { wide: true }), panel("Every schedule", list, { wide: true })));

  async function act(button, name, action) {
    const answer = await busy(button, () => api(`api/schedules/${encodeURIComponent(name)}/${action}`, {}));
    if (answer === undefined) return;
    const done = { pause: "paused", resume: "resumed", "run-now": "will run now" }[action];
    flash(`Schedule ${name} ${done}.`, "ok");
    await refresh();
  }

  function actions(s) {
    const toggle = s.paused
      ? el("button", { type: "button", class: "primary", dataset: { action: "resume", schedule: s.name } }, "Resume")
      : el("button", { type: "button", class: "secondary", dataset: { action: "pause", schedule: s.name } }, "Pause");
    toggle.addEventListener("click", () => act(toggle, s.name, s.paused ? "resume" : "pause"));
    const run = el("button", { type: "button", class: "secondary", dataset: { action: "run-now", schedule: s.name } }, "Run now");
    run.addEventListener("click", () => act(run, s.name, "run-now"));
    return el("div", { class: "action-row" }, toggle, run);
  }

  async function refresh() {
    const data = await api("api/schedules");
    if (!ctx.alive) return;
    const now = Date.now();
    clear(chart).append(timeline(data.items, now, widthOf(chart)));
    clear(list).append(
      table(
        ["Schedule", "Trigger", "State", "Next fire times", "Last run", ""],
        data.items.map((s) => [
          el("div", { class: "schedule-name", dataset: { schedule: s.name } }, el("strong", {}, s.name), el("div", { class: "muted small" }, `${s.job} · ${s.source}`)),
          el("div", {}, el("code", {}, s.trigger), s.tz ? el("div", { class: "muted small" }, s.tz) : null),
          s.paused ? stateBadge("PAUSED") : stateBadge("ACTIVE"),
          s.next_fire_times_ms.length ? el("div", { class: "fire-times" }, timeBlock(s.next_fire_times_ms[0], now), s.next_fire_times_ms.length > 1 ? el("div", { class: "muted small" }, `then ${s.next_fire_times_ms.slice(1, 4).map((t) => new Date(t).toLocaleTimeString()).join(", ")}`) : null) : el("span", { class: "muted" }, s.paused ? "paused" : "–"),
          lastRun(s.last_run),
          actions(s),
        ]),
        { empty: "No schedules: add them with @app.cron, @app.every or app.schedules.add.", id: "schedules" },
      ),
    );
  }

  await ctx.poll(refresh, POLL_MS);
}
