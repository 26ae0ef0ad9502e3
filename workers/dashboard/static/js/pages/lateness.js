// Lateness: the CDF of job-start lateness (start minus due) from the delivery trace
// for a chosen window, with P50, P99 and P99.9 marked.

import { api, withQuery } from "../api.js";
import { cdfChart } from "../charts.js";
import { el, clear, widthOf, fmtDuration, fmtInt, panel } from "../dom.js";

export const title = "Lateness";

const WINDOWS = [
  [15, "15 min"],
  [60, "1 hour"],
  [360, "6 hours"],
  [1440, "1 day"],
  [10080, "1 week"],
];

function stat(id, label, value) {
  return el("div", { class: "card", id }, el("span", { class: "card-label" }, label), el("span", { class: "card-value" }, value));
}

export async function render(view, ctx) {
  const minutes = Number(ctx.route.query.get("minutes")) || 60;
  const select = el("select", { id: "lateness-window", "aria-label": "Window" }, WINDOWS.map(([m, label]) => el("option", { value: m, selected: m === minutes }, `last ${label}`)));
  select.addEventListener("change", () => {
    location.hash = `#/lateness?minutes=${select.value}`;
  });
  const stats = el("div", { class: "cards", id: "lateness-stats" });
  const chart = el("div", { class: "chart-box", id: "cdf-chart" });
  view.append(el("div", { class: "page-head" }, el("h1", {}, "Job-start lateness")), stats, panel("Cumulative distribution", chart, { wide: true, tools: select }));

  if (!ctx.config.lateness_available) {
    chart.append(el("p", { class: "empty", id: "lateness-off" }, "No delivery trace: run the dispatchers with chronoq run --trace DIR and start the dashboard with --trace-dir DIR."));
    return;
  }
  const data = await api(withQuery("api/lateness", { minutes }));
  if (!ctx.alive) return;
  if (!data.available || data.count === 0) {
    chart.append(el("p", { class: "empty", id: "lateness-off" }, data.available ? "No job started in this window." : "The trace is not readable right now."));
    return;
  }
  stats.append(
    stat("lat-count", "Job starts", fmtInt(data.count)),
    stat("lat-p50", "P50", fmtDuration(data.p50_ms)),
    stat("lat-p99", "P99", fmtDuration(data.p99_ms)),
    stat("lat-p999", "P99.9", fmtDuration(data.p999_ms)),
    stat("lat-max", "Max", fmtDuration(data.max_ms)),
  );
  clear(chart).append(
    cdfChart(data.cdf, {
      marks: [
        { label: "P50", value: data.p50_ms },
        { label: "P99", value: data.p99_ms },
        { label: "P99.9", value: data.p999_ms },
      ],
      label: `job-start lateness CDF, last ${minutes} minutes`,
      width: widthOf(chart),
      height: 380,
    }),
  );
}
