// Overview: totals, what is due when, pending per topic, group lag, and live lines of
// the fire rate, job-start lateness and job outcomes (polled every 2 s).

import { api, withQuery } from "../api.js";
import { barChart, histogram, lineChart } from "../charts.js";
import { el, clear, fmtDuration, fmtInt, panel, routeLink, routeWithQuery, table, widthOf } from "../dom.js";

export const title = "Overview";

const POLL_MS = 2000;
const RETRY_PREFIX = "%RETRY%";
const DLQ_PREFIX = "%DLQ%";

const RANGES = {
  hour: { name: "Next hour", every: 10, tick: { hour: "2-digit", minute: "2-digit", hourCycle: "h23" } },
  day: { name: "Next day", every: 3, tick: { hour: "2-digit", minute: "2-digit", hourCycle: "h23" } },
  week: { name: "Next week", every: 1, tick: { weekday: "short", day: "numeric" } },
};

const CARDS = [
  ["pending", "Pending", "waiting for their due time"],
  ["ready", "Ready", "due, waiting for a consumer"],
  ["inflight", "In flight", "pulled, not yet acked"],
  ["retrying", "Retrying", "pending on %RETRY% topics"],
  ["dead", "Dead", "in dead-letter queues"],
  ["fired_total", "Fired", "delivered since the broker started"],
];

function card([key, label, sub]) {
  return el(
    "div",
    { class: `card card-${key}`, id: `card-${key}` },
    el("span", { class: "card-label" }, label),
    el("span", { class: "card-value" }, "…"),
    el("span", { class: "card-sub" }, sub),
  );
}

function setCard(root, key, value) {
  root.querySelector(`#card-${key} .card-value`).textContent = fmtInt(value);
}

function rangeTabs(current, onPick) {
  return el(
    "div",
    { class: "segmented", role: "tablist", "aria-label": "Due range" },
    Object.entries(RANGES).map(([key, r]) =>
      el("button", { type: "button", id: `due-${key}`, role: "tab", "aria-selected": String(key === current), class: key === current ? "active" : "", onclick: () => onPick(key) }, r.name),
    ),
  );
}

export async function render(view, ctx) {
  let range = "hour";
  let dueTopic = ""; // "" = every topic
  let topicNames = [];
  let topicNode = null; // the due histogram's topic select
  const cards = el("div", { class: "cards" }, CARDS.map(card));
  const dueBody = el("div", { class: "chart-box", id: "due-chart" });
  const dueNote = el("span", { class: "muted small", id: "due-note" });
  const dueTools = el("div", { class: "tools" });
  const topicsChart = el("div", { class: "chart-box", id: "topics-chart" });
  const lagChart = el("div", { class: "chart-box", id: "lag-chart" });
  const fireChart = el("div", { class: "chart-box", id: "fire-chart" });
  const latenessChart = el("div", { class: "chart-box", id: "lateness-chart" });
  const jobsChart = el("div", { class: "chart-box", id: "jobs-chart" });
  const topicsTable = el("div", { id: "topics-table" });
  const groupsTable = el("div", { id: "groups-table" });
  const updated = el("span", { class: "muted small live", id: "updated" }, "live");

  view.append(
    el("div", { class: "page-head" }, el("h1", {}, "Overview"), updated),
    cards,
    el(
      "div",
      { class: "grid" },
      panel("Fire rate", fireChart, { id: "fire-panel" }),
      panel("Job-start lateness", latenessChart, { id: "lateness-panel" }),
      panel("What is due", el("div", {}, dueBody, dueNote), { tools: dueTools, wide: true, id: "due-panel" }),
      panel("Pending per topic", topicsChart, { id: "topics-panel" }),
      panel("Consumer group lag (ready)", lagChart, { id: "lag-panel" }),
      panel("Jobs per interval", jobsChart, { wide: true, id: "jobs-panel" }),
      panel("Topics", topicsTable, { id: "topics-list" }),
      panel("Consumer groups", groupsTable, { id: "groups-list" }),
    ),
  );

  async function loadDue() {
    const data = await api(withQuery("api/due", { range, topic: dueTopic }));
    if (!ctx.alive) return;
    const r = RANGES[range];
    const tickFmt = new Intl.DateTimeFormat(undefined, r.tick);
    const tipFmt = new Intl.DateTimeFormat(undefined, { weekday: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    const chart = histogram(data.counts, {
      startMs: data.start_ms,
      bucketMs: data.bucket_ms,
      labelEvery: r.every,
      tickLabel: (ms) => tickFmt.format(new Date(ms)),
      tipLabel: (a, b) => `${tipFmt.format(new Date(a))} – ${tipFmt.format(new Date(b))}`,
      label: `messages due per ${fmtDuration(data.bucket_ms)}, ${r.name.toLowerCase()}`,
      width: widthOf(dueBody),
      height: 190,
    });
    clear(dueBody).append(chart);
    const total = data.counts.reduce((a, b) => a + b, 0);
    dueNote.textContent = `${fmtInt(total)} due ${r.name.toLowerCase()}${dueTopic ? ` on ${dueTopic}` : ""}, one bar per ${fmtDuration(data.bucket_ms)}${data.exact ? "" : " (estimated: the count was bounded)"}`;
    topicNode = topicSelect();
    clear(dueTools).append(topicNode, rangeTabs(range, pick));
  }

  function topicSelect() {
    const names = [...new Set([...topicNames, dueTopic].filter(Boolean))].sort();
    const select = el(
      "select",
      { id: "due-topic", "aria-label": "Topic" },
      el("option", { value: "" }, "every topic"),
      names.map((t) => el("option", { value: t, selected: t === dueTopic }, t)),
    );
    select.addEventListener("change", () => {
      dueTopic = select.value;
      loadDue();
    });
    return select;
  }

  function pick(key) {
    range = key;
    loadDue();
  }

  function renderOverview(o) {
    const retrying = o.topics.filter((t) => t.topic.startsWith(RETRY_PREFIX)).reduce((a, t) => a + t.pending, 0);
    for (const key of ["pending", "ready", "inflight", "dead", "fired_total"]) setCard(cards, key, o.totals[key]);
    setCard(cards, "retrying", retrying);
    const topics = [...o.topics].sort((a, b) => b.pending - a.pending);
    const names = o.topics.map((t) => t.topic);
    if (names.join("\n") !== topicNames.join("\n")) {
      topicNames = names; // a new topic: offer it in the histogram's select too
      if (topicNode) {
        const fresh = topicSelect();
        topicNode.replaceWith(fresh);
        topicNode = fresh;
      }
    }
    clear(topicsChart).append(
      barChart(
        topics.filter((t) => t.pending > 0 && !t.internal).map((t) => ({ label: t.topic, value: t.pending, cls: t.topic.startsWith(RETRY_PREFIX) ? "retry" : "" })),
        { label: "pending messages per topic", width: widthOf(topicsChart) },
      ),
    );
    const groups = [...o.groups].sort((a, b) => b.ready - a.ready);
    clear(lagChart).append(barChart(groups.map((g) => ({ label: g.group, value: g.ready, cls: "lag" })), { label: "ready messages per consumer group", width: widthOf(lagChart) }));
    clear(topicsTable).append(
      table(
        ["Topic", "Pending", "Ready", "In flight", "Fired"],
        topics.map((t) => [
          el("span", {}, el("a", { href: routeWithQuery("search", { mode: "range", topic: t.topic }) }, t.topic), t.topic.startsWith(RETRY_PREFIX) ? el("span", { class: "badge state-retry" }, "retry") : null, t.topic.startsWith(DLQ_PREFIX) ? el("span", { class: "badge state-dead" }, "dead") : null, t.internal ? el("span", { class: "badge", title: "chronoq's own records (schedules, last runs, job stats): not jobs" }, "internal") : null),
          fmtInt(t.pending),
          fmtInt(t.ready),
          fmtInt(t.inflight),
          fmtInt(t.fired_total),
        ]),
        { empty: "No topics yet.", id: "topics" },
      ),
    );
    clear(groupsTable).append(
      table(
        ["Group", "Lag (ready)", "In flight", "Dead", "Acked"],
        groups.map((g) => [g.group, fmtInt(g.ready), fmtInt(g.inflight), g.dead > 0 ? routeLink(fmtInt(g.dead), "dead", g.group) : "0", fmtInt(g.acked_total)]),
        { empty: "No consumer groups yet.", id: "groups" },
      ),
    );
  }

  function renderRates(r) {
    clear(fireChart).append(lineChart([{ name: "fired / s", points: r.fired.map((p) => [p.t_ms, p.per_s]) }], { label: "messages fired per second", width: widthOf(fireChart), height: 180 }));
    clear(latenessChart).append(
      lineChart(
        [
          { name: "P50", points: r.jobs.map((p) => [p.t_ms, p.lateness_p50_ms]) },
          { name: "P99", points: r.jobs.map((p) => [p.t_ms, p.lateness_p99_ms]), cls: "s3" },
        ],
        { label: "job-start lateness P50 and P99", yFormat: fmtDuration, width: widthOf(latenessChart), height: 180 },
      ),
    );
    const kinds = [
      ["started", "s0"],
      ["succeeded", "s1"],
      ["failed", "s3"],
      ["retried", "s2"],
      ["dead", "s4"],
    ];
    clear(jobsChart).append(lineChart(kinds.map(([k, cls]) => ({ name: k, cls, points: r.jobs.map((p) => [p.t_ms, p[k]]) })), { label: "jobs started, succeeded, failed, retried, dead", width: widthOf(jobsChart), height: 200 }));
  }

  async function refresh() {
    const [o, r] = await Promise.all([api("api/overview"), api(withQuery("api/rates", { minutes: 15 }))]);
    if (!ctx.alive) return;
    renderOverview(o);
    renderRates(r);
    updated.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  }

  await Promise.all([ctx.poll(loadDue, 15_000), ctx.poll(refresh, POLL_MS)]);
}
