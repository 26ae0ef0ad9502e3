"""Job stats published through the broker: what every dispatcher ran, per 5 s, for
the dashboard (``read_job_stats``) without a metrics system.

Each dispatcher keeps cumulative totals (the :class:`~workers.job_metrics.JobMetrics`
hook counts each job once, for Prometheus and for this). Just after every
:data:`INTERVAL_MS` boundary of the wall clock, :class:`JobStatsLog` takes what
changed since the last boundary as one interval's sample and, only when
something happened, writes the last :data:`KEEP_MS` of samples as ONE keyed
record (:mod:`scheduler.keyed_records`) on topic :data:`STATS_TOPIC`, key
``stats:<owner>:``, replacing its previous version atomically. Body, JSON
(at most :data:`KEEP_MS` / :data:`INTERVAL_MS` = 360 samples, ~30 KB at worst)::

    {"f": 1, "iv": 5000, "s": [[t_ms, started, succeeded, failed, retried, dead,
                                [bucket, count, bucket, count, ...]], ...]}

where each bucket is an index into :data:`LATENESS_BOUNDS_S` (the last index:
above the last bound). :func:`read_job_stats` merges every dispatcher's records:
counts and lateness buckets of the same interval add up, and P50/P99 come from
the merged buckets (interpolated within a bucket, as Prometheus'
``histogram_quantile`` does), so they hold across dispatchers. A record falls due
:data:`STATS_HORIZON_MS` after its last write and is then forgotten.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import ChronoqError
from scheduler.keyed_records import iter_records, put_record
from workers.record_writer import RecordWriter, owner_id

_log = logging.getLogger("chronoq.workers.JobStatsLog")

#: The reserved topic of the stats records.
STATS_TOPIC = "chronoq.stats"
#: The key prefix of the stats records (``stats:<owner>:``).
STATS_KEY_PREFIX = "stats:"
#: The length of one sample.
INTERVAL_MS = 5000
#: How much history each dispatcher keeps and writes.
KEEP_MS = 30 * 60 * 1000
#: How far ahead a record is due after its write: a dispatcher gone that long is forgotten.
STATS_HORIZON_MS = 3600 * 1000
#: Upper bounds of the job-start lateness buckets, seconds (0.5 ms to 60 s); the
#: Prometheus histogram ``chronoq_job_lateness_seconds`` has the same.
LATENESS_BOUNDS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_FORMAT = 1
_COUNTS = 5  # started, succeeded, failed, retried, dead


def lateness_bucket(seconds: float) -> int:
    """The index of the bucket ``seconds`` falls in (``le`` bounds, as Prometheus)."""
    return bisect.bisect_left(LATENESS_BOUNDS_S, seconds)


@dataclass(frozen=True, slots=True)
class Totals:
    """One dispatcher's cumulative counts since it started.

    :param counts: started, succeeded, failed, retried, dead-lettered.
    :param lateness: job starts per lateness bucket (``len(LATENESS_BOUNDS_S) + 1``).
    """

    counts: tuple[int, ...]
    lateness: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class JobStatsSample:
    """What every dispatcher ran in one interval, merged.

    :param t_ms: the interval's start, epoch ms (a multiple of ``interval_ms``).
    :param interval_ms: its length.
    :param started: jobs handed to their executor.
    :param succeeded: messages acked after their job succeeded.
    :param failed: failed attempts (retried or dead-lettered).
    :param retried: messages sent back for another attempt.
    :param dead: messages dead-lettered.
    :param lateness_p50_ms: median job-start lateness (start minus due), or
        ``None`` when no job started in the interval.
    :param lateness_p99_ms: its 99th percentile, or ``None``.
    """

    t_ms: int
    interval_ms: int
    started: int
    succeeded: int
    failed: int
    retried: int
    dead: int
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None


def quantile_ms(buckets: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a lateness histogram, ms; ``None`` when empty.

    Linear within the bucket the rank falls in; above the last bound it is the last
    bound (the histogram knows no more).
    """
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            if i >= len(LATENESS_BOUNDS_S):
                return LATENESS_BOUNDS_S[-1] * 1000
            low = LATENESS_BOUNDS_S[i - 1] if i else 0.0
            high = LATENESS_BOUNDS_S[i]
            return (low + (high - low) * (rank - seen) / n) * 1000
        seen += n
    return LATENESS_BOUNDS_S[-1] * 1000


class JobStatsLog:
    """Turns one dispatcher's :class:`Totals` into interval samples and publishes them.

    :param broker: returns the broker to write to.
    :param totals: returns the dispatcher's totals now (thread-safe).
    :param now_ms: the wall clock, epoch ms (the samples' times).
    :param interval_ms: the sample length.
    :param broker_now_ms: the broker's clock, which the record's due time is counted
        on (``now_ms`` by default; an app on a manual clock gives its own).
    """

    def __init__(
        self,
        broker: Callable[[], BrokerAdapter],
        totals: Callable[[], Totals],
        now_ms: Callable[[], int],
        interval_ms: int = INTERVAL_MS,
        broker_now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._broker = broker
        self._totals = totals
        self._now_ms = now_ms
        self._broker_now_ms = broker_now_ms or now_ms
        self._iv = interval_ms
        self._owner = owner_id()
        self._last = totals()
        self._samples: dict[int, list[Any]] = {}  # t_ms -> [5 counts..., {bucket: n}]
        self._dirty = False
        self._lock = threading.Lock()  # the writer thread and on_close may meet
        self._writer = RecordWriter(
            self.flush,
            interval_ms / 1000,
            name="chronoq-job-stats",
            log=_log,
            aligned=True,
            last=lambda: self.flush(closing=True),
        )

    @property
    def key(self) -> str:
        """This dispatcher's record key."""
        return f"{STATS_KEY_PREFIX}{self._owner}:"

    def start(self) -> None:
        """Start writing every interval."""
        self._writer.start()

    def stop(self) -> None:
        """Stop, and write what the current interval holds so far."""
        self._writer.stop()

    def take(self, closing: bool = False) -> bool:
        """Add what changed since the last call to its interval's sample; whether
        anything did. Called just after a boundary, it belongs to the interval that
        ended; ``closing``: to the current one."""
        now = self._now_ms()
        t = now - now % self._iv
        if not closing and now % self._iv < self._iv // 2:
            t -= self._iv
        with self._lock:
            cur = self._totals()
            counts = [a - b for a, b in zip(cur.counts, self._last.counts, strict=True)]
            lat = {
                i: a - b
                for i, (a, b) in enumerate(zip(cur.lateness, self._last.lateness, strict=True))
                if a != b
            }
            self._last = cur
            if not any(counts) and not lat:
                return False
            sample = self._samples.get(t)
            if sample is None:
                self._samples[t] = [*counts, lat]
            else:
                for i, n in enumerate(counts):
                    sample[i] += n
                for i, n in lat.items():
                    sample[_COUNTS][i] = sample[_COUNTS].get(i, 0) + n
            for old in [k for k in self._samples if k < now - KEEP_MS]:
                del self._samples[old]
            self._dirty = True
            return True

    def body(self) -> bytes:
        """The record as written now."""
        with self._lock:
            rows = [
                [t, *s[:_COUNTS], [x for i, n in sorted(s[_COUNTS].items()) for x in (i, n)]]
                for t, s in sorted(self._samples.items())
            ]
        return json.dumps({"f": _FORMAT, "iv": self._iv, "s": rows}, separators=(",", ":")).encode()

    def flush(self, closing: bool = False) -> None:
        """Take the interval's sample and write the record when something changed."""
        self.take(closing)
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
        body = self.body()
        try:
            due = self._broker_now_ms() + STATS_HORIZON_MS
            put_record(self._broker(), STATS_TOPIC, self.key, body, due)
        except ChronoqError as e:  # closing or gone: the next write may do
            with self._lock:
                self._dirty = True
            _log.warning("writing the job stats failed: %s", e)


def read_job_stats(broker: BrokerAdapter, *, since_ms: int) -> list[JobStatsSample]:
    """Every dispatcher's samples of the intervals that end after ``since_ms``, merged
    (one per interval, oldest first; an interval in which nothing happened is absent).

    :param broker: the app's broker (any adapter).
    :param since_ms: epoch ms.
    """
    merged: dict[tuple[int, int], list[Any]] = {}
    for view in iter_records(broker, STATS_TOPIC, STATS_KEY_PREFIX):
        try:
            doc = json.loads(view.body or b"")
            if doc.get("f") != _FORMAT:
                continue  # written by another version of chronoq
            iv = int(doc["iv"])
            for t, *counts, pairs in doc["s"]:
                if t + iv <= since_ms:
                    continue
                into = merged.setdefault(
                    (t, iv), [0] * _COUNTS + [[0] * (len(LATENESS_BOUNDS_S) + 1)]
                )
                for i in range(_COUNTS):
                    into[i] += int(counts[i])
                for i, n in zip(pairs[::2], pairs[1::2], strict=True):
                    into[_COUNTS][i] += int(n)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            _log.warning("job stats record %s ignored: %s", view.key, e)
    return [
        JobStatsSample(
            t_ms=t,
            interval_ms=iv,
            started=m[0],
            succeeded=m[1],
            failed=m[2],
            retried=m[3],
            dead=m[4],
            lateness_p50_ms=quantile_ms(m[_COUNTS], 0.5),
            lateness_p99_ms=quantile_ms(m[_COUNTS], 0.99),
        )
        for (t, iv), m in sorted(merged.items())
    ]


__all__ = [
    "INTERVAL_MS",
    "KEEP_MS",
    "LATENESS_BOUNDS_S",
    "STATS_HORIZON_MS",
    "STATS_KEY_PREFIX",
    "STATS_TOPIC",
    "JobStatsLog",
    "JobStatsSample",
    "Totals",
    "lateness_bucket",
    "quantile_ms",
    "read_job_stats",
]
