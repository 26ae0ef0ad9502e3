"""The delivery trace's file format: where its files live, their names, their lines.

The dispatcher writes the trace (:class:`workers.trace.DeliveryTrace`); the
delivery report reads it (:mod:`spark_tasks.pipelines.delivery_report`). The
format lives here, below both.

Files: ``<dir>/trace-<start_ms>-<n>.jsonl`` (:func:`trace_file_name`), where
``<dir>`` defaults to ``<data dir>/trace`` of a ``rocksdb://`` broker
(:func:`default_trace_dir`). Lines are written whole, so readers may read files
while they grow (at worst missing the last lines).

Schema, version 1 (every line one JSON object with :data:`FIELDS` in order;
times are epoch ms of the dispatcher's clock, ``null`` when unknown)::

    v              1
    topic          the message's topic
    job            the job name (null for an undecodable body)
    group          the consumer group that handled it
    msg_id         the broker message id (hex)
    key            its business key, or null
    attempt        which delivery this is to the group, 1 on the first
    sent_ms        when the broker accepted the message (its born time)
    deliver_at_ms  when this delivery was due (the retry's time for a retry)
    fired_ms       when the pull that delivered it returned (the broker's own
                   fire instant is not exposed; the long poll returns within
                   about a millisecond of it while the dispatcher keeps up)
    dispatched_ms  when it was handed to its executor (null if never)
    started_ms     when the job body started (null if it never did)
    finished_ms    when the message was settled
    outcome        "ok" | "retry" | "dead" | "released" | "skipped"
    error          the failure reason (retry, dead, released), else null

Lateness, as the delivery report computes it, is ``started_ms - deliver_at_ms``
(``dispatched_ms`` when the body never started).
"""

from __future__ import annotations

from pathlib import Path

from broker_adapter.urls import split_url

TRACE_VERSION = 1
#: The fields of a line, in order (the schema above).
FIELDS = (
    "v",
    "topic",
    "job",
    "group",
    "msg_id",
    "key",
    "attempt",
    "sent_ms",
    "deliver_at_ms",
    "fired_ms",
    "dispatched_ms",
    "started_ms",
    "finished_ms",
    "outcome",
    "error",
)
#: The values of a line's ``outcome``.
TRACE_OUTCOMES = ("ok", "retry", "dead", "released", "skipped")
#: Matches the trace files of a directory.
FILE_GLOB = "trace-*.jsonl"


def trace_file_name(start_ms: int, n: int) -> str:
    """The name of the ``n``-th file of a trace started at ``start_ms``."""
    return f"trace-{start_ms}-{n:05d}.jsonl"


def default_trace_dir(broker_url: str) -> Path | None:
    """``<data dir>/trace`` for a ``rocksdb://`` URL, else ``None`` (give a directory)."""
    scheme, rest, _ = split_url(broker_url)
    if scheme != "rocksdb" or not rest:
        return None
    return Path(rest) / "trace"


__all__ = [
    "FIELDS",
    "FILE_GLOB",
    "TRACE_OUTCOMES",
    "TRACE_VERSION",
    "default_trace_dir",
    "trace_file_name",
]
