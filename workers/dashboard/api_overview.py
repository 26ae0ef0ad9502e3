"""Read-only API routes of the overview: ``api/config``, ``api/overview``,
``api/due``, ``api/rates`` and ``api/lateness`` (shapes in the README's Dashboard
section)."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Query

from broker_adapter.message import check_topic
from scheduler.schedule_runs import RUNS_TOPIC
from scheduler.schedule_store import SCHEDULES_TOPIC
from workers.dashboard.context import Dashboard, version
from workers.dashboard.lateness import lateness_report
from workers.job_stats import STATS_TOPIC, read_job_stats

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
#: ``range`` -> (bucket ms, buckets).
RANGES = {"hour": (MINUTE_MS, 60), "day": (HOUR_MS, 24), "week": (DAY_MS, 7)}
#: chronoq's own record topics (schedule definitions, last runs, job stats): each
#: record is a pending message no job runs for, so the totals count them apart.
INTERNAL_TOPICS = frozenset({SCHEDULES_TOPIC, RUNS_TOPIC, STATS_TOPIC})


def now_ms() -> int:
    """The wall clock, epoch ms."""
    return int(time.time() * 1000)


def overview_doc(dash: Dashboard) -> dict[str, Any]:
    """The ``api/overview`` document (one ``stats()`` call)."""
    st = dash.broker.stats()
    topics = [
        {
            "topic": name,
            "pending": t.pending,
            "fired_total": t.fired_total,
            "ready": t.ready,
            "inflight": t.inflight,
            "internal": name in INTERNAL_TOPICS,
        }
        for name, t in sorted(st.topics.items())
    ]
    records = sum(t.pending for name, t in st.topics.items() if name in INTERNAL_TOPICS)
    groups = [
        {
            "group": name,
            "ready": g.ready,
            "inflight": g.inflight,
            "dead": g.dead,
            "acked_total": g.acked_total,
        }
        for name, g in sorted(st.groups.items())
    ]
    totals = {
        "pending": st.pending - records,
        "records": records,
        "ready": sum(g.ready for g in st.groups.values()),
        "inflight": sum(g.inflight for g in st.groups.values()),
        "dead": st.dead,
        "fired_total": st.fired_total,
    }
    return {"now_ms": now_ms(), "totals": totals, "topics": topics, "groups": groups}


def due_counts(dash: Dashboard, edges: list[int], topic: str | None) -> tuple[list[int], bool]:
    """How many pending messages are due between each pair of ``edges``, and whether
    the counts are exact (the broker's ``count_pending``: bounded work, an estimate
    where counting exactly would not be cheap)."""
    counts = dash.broker.count_pending(edges, topic=topic)
    return list(counts.counts), counts.exact


def _job_samples(dash: Dashboard, since_ms: int) -> list[dict[str, Any]]:
    """The dispatchers' published job stats since ``since_ms``, merged, oldest first."""
    return [
        {
            "t_ms": s.t_ms,
            "interval_ms": s.interval_ms,
            "started": s.started,
            "succeeded": s.succeeded,
            "failed": s.failed,
            "retried": s.retried,
            "dead": s.dead,
            "lateness_p50_ms": s.lateness_p50_ms,
            "lateness_p99_ms": s.lateness_p99_ms,
        }
        for s in read_job_stats(dash.broker, since_ms=since_ms)
    ]


def routes(dash: Dashboard, token_required: bool) -> APIRouter:
    """The overview's routes on ``dash`` (``token_required``: what ``api/config`` says)."""
    router = APIRouter(prefix="/api", tags=["overview"])

    @router.get("/config")
    def config() -> dict[str, Any]:
        """What the page needs before anything else (readable without the token)."""
        return {
            "token_required": token_required,
            "broker_kind": dash.kind,
            "now_ms": now_ms(),
            "version": version(),
            "lateness_available": dash.lateness_available,
        }

    @router.get("/overview")
    def overview() -> dict[str, Any]:
        """Totals, topics and consumer groups from the broker's counters."""
        return overview_doc(dash)

    @router.get("/due")
    def due(
        span: Literal["hour", "day", "week"] = Query("hour", alias="range"),
        topic: str | None = None,
    ) -> dict[str, Any]:
        """How many pending messages fall due per bucket over the coming hour (60 x 1
        min), day (24 x 1 h) or week (7 x 1 day)."""
        if topic is not None:
            check_topic(topic)
        bucket, n = RANGES[span]
        start = now_ms() // bucket * bucket
        counts, exact = due_counts(dash, [start + i * bucket for i in range(n + 1)], topic)
        return {"start_ms": start, "bucket_ms": bucket, "counts": counts, "exact": exact}

    @router.get("/rates")
    def rates(minutes: int = Query(15, ge=1, le=60)) -> dict[str, Any]:
        """Messages fired per second (sampled here) and the dispatchers' job counts."""
        since = now_ms() - minutes * MINUTE_MS
        return {"fired": dash.sampler.rates(minutes), "jobs": _job_samples(dash, since)}

    @router.get("/lateness")
    def lateness(minutes: int = Query(60, ge=1, le=7 * 24 * 60)) -> dict[str, Any]:
        """Job-start lateness percentiles and CDF from the delivery trace."""
        return lateness_report(dash.trace, now_ms() - minutes * MINUTE_MS)

    return router


__all__ = ["INTERNAL_TOPICS", "RANGES", "due_counts", "now_ms", "overview_doc", "routes"]
