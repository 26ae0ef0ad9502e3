"""JobMetrics: a dispatch hook that counts what the dispatcher runs, per job, for
Prometheus (``chronoq run --metrics-port N``) and for the job stats in the broker
(:mod:`workers.job_stats`, read by the dashboard).

Per message it only adds to a few ints and one histogram bucket under one lock
(``bench/job_metrics_overhead.py`` prints the cost); the Prometheus families are
built from those totals at scrape time, and the stats are written by a thread
every 5 s. Metrics (label ``job``: a registered job's name; any other name is
counted as :data:`OTHER_JOB`, so the label set stays bounded):

=====================================  =========  =====================================
name                                   type       what
=====================================  =========  =====================================
``chronoq_job_started_total``          counter    jobs handed to their executor
``chronoq_job_succeeded_total``        counter    messages acked after their job succeeded
``chronoq_job_failed_total``           counter    failed attempts (retried or dead-lettered)
``chronoq_job_retried_total``          counter    messages sent back for another attempt
``chronoq_job_dead_total``             counter    messages dead-lettered
``chronoq_job_lateness_seconds``       histogram  body start minus due time (0.5 ms .. 60 s)
``chronoq_job_run_seconds``            histogram  body start to end (jobs run in this process)
``chronoq_job_in_flight``              gauge      jobs holding a slot (queued or running here)
``chronoq_job_awaiting``               gauge      handed-off jobs whose outcome is awaited
=====================================  =========  =====================================

A job handed to another system (Celery) counts as started and settled here, but
its lateness and run time are that system's to measure.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from broker_adapter.metrics_http import MetricsEndpoint, serve_metrics
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext
from workers.hooks import DispatchHook, Session
from workers.job_stats import LATENESS_BOUNDS_S, JobStatsLog, Totals
from workers.runs import App, Run
from workers.settlement import Settlement

#: The ``job`` label of a message whose job is not registered here (or undecodable).
OTHER_JOB = "(other)"
#: Upper bounds of the run-time buckets, seconds.
RUN_BOUNDS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.025,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
_STARTED, _SUCCEEDED, _FAILED, _RETRIED, _DEAD = range(5)
_LATE_MS = tuple(b * 1000 for b in LATENESS_BOUNDS_S)  # compared in ms: no division per job
#: The counters one settlement adds to, with a run and without one.
_OUTCOMES: dict[tuple[Settlement, bool], tuple[int, ...]] = {
    (Settlement.ACK, True): (_SUCCEEDED,),
    (Settlement.RETRY, True): (_FAILED, _RETRIED),
    (Settlement.RETRY, False): (_RETRIED,),
    (Settlement.DEAD, True): (_FAILED, _DEAD),
    (Settlement.DEAD, False): (_DEAD,),
}
_COUNTER_DOCS = (
    ("chronoq_job_started", "Jobs handed to their executor"),
    ("chronoq_job_succeeded", "Messages acked after their job succeeded"),
    ("chronoq_job_failed", "Failed attempts (retried or dead-lettered)"),
    ("chronoq_job_retried", "Messages sent back for another attempt"),
    ("chronoq_job_dead", "Messages dead-lettered"),
)


class FlowCounts(Protocol):
    """What the gauges read of a dispatcher (:class:`~workers.dispatcher.Dispatcher`)."""

    @property
    def slots_taken(self) -> int:
        """Jobs submitted here and not yet returned or handed off."""
        ...

    @property
    def awaiting(self) -> int:
        """Handed-off jobs whose outcome is awaited."""
        ...


class _Tally:
    """One job's cumulative counts and histograms (guarded by the hook's lock)."""

    __slots__ = ("counts", "late", "late_sum_ms", "run", "run_sum")

    def __init__(self) -> None:
        self.counts = [0, 0, 0, 0, 0]
        self.late = [0] * (len(LATENESS_BOUNDS_S) + 1)
        self.late_sum_ms = 0.0
        self.run = [0] * (len(RUN_BOUNDS_S) + 1)
        self.run_sum = 0.0


class JobMetrics(DispatchHook):
    """Counts one dispatcher's jobs; thread-safe. Install it as a hook
    (``Dispatcher(app, hooks=[metrics])``; :func:`~workers.runner.run_app` does).

    :param app: the app (its registry names the jobs; its broker gets the stats).
    :param stats: also publish the job stats through the broker (:mod:`workers.job_stats`).
    """

    def __init__(self, app: App, *, stats: bool = True) -> None:
        self._registry = app.registry
        self._lock = threading.Lock()
        self._tallies: dict[str, _Tally] = {n: _Tally() for n in app.registry.names()}
        self._tallies[OTHER_JOB] = _Tally()
        self._flow: FlowCounts | None = None
        self._endpoint: MetricsEndpoint | None = None
        self.stats: JobStatsLog | None = (
            JobStatsLog(
                lambda: app.broker,
                self.totals,
                lambda: int(time.time() * 1000),
                broker_now_ms=app.clock.now_ms,
            )
            if stats
            else None
        )

    def watch(self, flow: FlowCounts) -> None:
        """Read the in-flight and awaiting gauges from ``flow`` (the dispatcher)."""
        self._flow = flow

    def _tally(self, name: str | None) -> _Tally:
        """The tally of job ``name`` (call with the lock held)."""
        tally = self._tallies.get(name or OTHER_JOB)
        if tally is None:  # registered since, or a name this app does not know
            if name is not None and name in self._registry:
                tally = self._tallies[name] = _Tally()
            else:
                tally = self._tallies[OTHER_JOB]
        return tally

    # -- the hook --------------------------------------------------------------------------

    def on_open(self, session: Session) -> None:
        """Start publishing the job stats."""
        if self.stats is not None:
            self.stats.start()

    def before_start(self, run: Run, job: JobContext) -> None:
        """Count a start."""
        name = run.spec.name
        with self._lock:
            (self._tallies.get(name) or self._tally(name)).counts[_STARTED] += 1

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        """Observe the job's lateness and run time, if its body ran here."""
        started_ms, started_mono = job.started_ms, job.started_mono
        if started_ms is None or started_mono is None:
            return  # cancelled before it started, or handed off
        took = time.monotonic() - started_mono
        late_ms = started_ms - job.due_ms
        if late_ms < 0:
            late_ms = 0.0
        li = bisect.bisect_left(_LATE_MS, late_ms)
        ri = bisect.bisect_left(RUN_BOUNDS_S, took)
        name = run.spec.name
        with self._lock:
            t = self._tallies.get(name) or self._tally(name)
            t.late[li] += 1
            t.late_sum_ms += late_ms
            t.run[ri] += 1
            t.run_sum += took

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        """Count the outcome: succeeded, failed and retried, failed and dead (released,
        deferred or skipped messages, and an ack without a run, are no outcome)."""
        which = _OUTCOMES.get((settlement, run is not None))
        if which is None:
            return
        with self._lock:
            counts = (self._tallies.get(job or OTHER_JOB) or self._tally(job)).counts
            for i in which:
                counts[i] += 1

    def on_close(self) -> None:
        """Write the last job stats; stop serving metrics."""
        if self.stats is not None:
            self.stats.stop()
        self.stop_serving()

    # -- reading ---------------------------------------------------------------------------

    def totals(self) -> Totals:
        """Every job's counts and lateness buckets added up (for the job stats)."""
        with self._lock:
            tallies = list(self._tallies.values())
            counts = tuple(sum(t.counts[i] for t in tallies) for i in range(5))
            late = tuple(sum(t.late[i] for t in tallies) for i in range(len(tallies[0].late)))
        return Totals(counts, late)

    def snapshot(self) -> dict[str, tuple[list[int], list[int], float, list[int], float]]:
        """Per job that ran anything: counts, lateness buckets and sum, run-time
        buckets and sum (copies)."""
        with self._lock:
            return {
                name: (list(t.counts), list(t.late), t.late_sum_ms / 1000, list(t.run), t.run_sum)
                for name, t in self._tallies.items()
                if any(t.counts) or any(t.run) or any(t.late)
            }

    # -- Prometheus ------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1", token: str | None = None) -> str:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) until :meth:`on_close`.

        :param token: what scrapers must send off loopback (``CHRONOQ_TOKEN``).
        :returns: the endpoint's URL.
        :raises MissingExtra: without ``prometheus_client`` (``chronoq[metrics]``).
        :raises InvalidArgument: for a non-loopback ``host`` without a token.
        :raises OSError: when the port cannot be bound.
        """
        from broker_adapter.extras import require

        pc = require("prometheus_client", "metrics", "the job metrics endpoint")
        core = require("prometheus_client.core", "metrics", "the job metrics endpoint")
        registry = pc.CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, core))
        self._endpoint = serve_metrics(
            registry, port, host, token=token, feature="the job metrics endpoint"
        )
        return self._endpoint.url

    def stop_serving(self) -> None:
        """Stop the ``/metrics`` endpoint, if served."""
        if self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None

    def gauges(self) -> tuple[int, int]:
        """In flight and awaiting now (zeros before :meth:`watch`)."""
        flow = self._flow
        return (0, 0) if flow is None else (flow.slots_taken, flow.awaiting)


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, ending with ``+Inf``."""
    out, total = [], 0
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
    return out


class _Collector:
    """The ``chronoq_job_*`` families, built from the hook's totals at scrape time.

    :param metrics: the hook.
    :param core: ``prometheus_client.core`` (the metric families).
    """

    def __init__(self, metrics: JobMetrics, core: Any) -> None:
        self._metrics = metrics
        self._core = core

    def collect(self) -> Iterator[Any]:
        """Every family, read now."""
        core = self._core
        snap = self._metrics.snapshot()
        counters = [core.CounterMetricFamily(n, d, labels=["job"]) for n, d in _COUNTER_DOCS]
        late = core.HistogramMetricFamily(
            "chronoq_job_lateness_seconds", "Job body start minus due time", labels=["job"]
        )
        run = core.HistogramMetricFamily(
            "chronoq_job_run_seconds", "Job body run time", labels=["job"]
        )
        for name, (counts, late_b, late_sum, run_b, run_sum) in sorted(snap.items()):
            for family, n in zip(counters, counts, strict=True):
                family.add_metric([name], n)
            late.add_metric([name], _buckets(LATENESS_BOUNDS_S, late_b), late_sum)
            run.add_metric([name], _buckets(RUN_BOUNDS_S, run_b), run_sum)
        in_flight, awaiting = self._metrics.gauges()
        yield from counters
        yield late
        yield run
        yield core.GaugeMetricFamily(
            "chronoq_job_in_flight", "Jobs holding a slot (queued or running)", value=in_flight
        )
        yield core.GaugeMetricFamily(
            "chronoq_job_awaiting", "Handed-off jobs whose outcome is awaited", value=awaiting
        )


__all__ = ["OTHER_JOB", "RUN_BOUNDS_S", "FlowCounts", "JobMetrics"]
