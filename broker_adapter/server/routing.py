"""Where a ``chronoq://h1:p1,h2:p2`` client sends each call, and how it merges the
answers, without I/O: shared by the blocking
:class:`~broker_adapter.server.client.RemoteBroker` and the asyncio
:class:`~broker_adapter.server.async_client.AsyncRemoteBroker`, so both place keys
and read ids the same way.

A message with a key always goes to the endpoint its ``(topic, key)`` hashes to
(sends with a key stay idempotent; a batch goes where its first key does);
others go round-robin (:mod:`~broker_adapter.server.fault`). With several
endpoints a message id is ``NODE:ID`` (``NODE`` the server's 8-digit node id).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from broker_adapter.message import Message
from broker_adapter.results import (
    MAX_REPORTED_KEYS,
    AbortStatus,
    BrokerStats,
    GroupStats,
    MessageView,
    PrefixAbortResult,
    RescheduleStatus,
    TopicStats,
)

#: Which abort answer wins when several endpoints were asked (lowest first).
ABORT_RANK = {AbortStatus.ABORTED: 0, AbortStatus.ALREADY_DELIVERED: 1, AbortStatus.NOT_FOUND: 2}
#: Which reschedule answer wins when several endpoints were asked (lowest first).
RESCHEDULE_RANK = {
    RescheduleStatus.RESCHEDULED: 0,
    RescheduleStatus.ALREADY_DELIVERED: 1,
    RescheduleStatus.NOT_FOUND: 2,
}
#: The "topics" rate buckets and semaphores hash under, to pick the one endpoint that
#: keeps each (its state is that server's, so every client must ask the same one).
RATE_SPACE, SLOT_SPACE = "%RATE%", "%SLOT%"
#: Length of a server's node id, the prefix of a multi-endpoint message id.
NODE_CHARS = 8


def key_index(topic: str, key: str, endpoints: int) -> int:
    """The endpoint (of ``endpoints``) that owns ``key`` on ``topic``."""
    data = f"{topic}\x00{key}".encode("utf-8", "surrogatepass")
    return zlib.crc32(data) % endpoints


def fixed_index(messages: Sequence[Message], endpoints: int) -> int | None:
    """The endpoint a send must go to (its first keyed message's), or ``None`` when
    round-robin may choose."""
    if endpoints == 1:
        return 0
    for m in messages:
        if m.key is not None:
            return key_index(m.topic, m.key, endpoints)
    return None


def split_node_id(msg_id: str) -> tuple[str, str] | None:
    """``(node, server id)`` of a ``NODE:ID`` message id, else ``None``."""
    node, sep, raw = msg_id.partition(":")
    if sep and len(node) == NODE_CHARS:
        return node, raw
    return None


def merge_stats(answers: Iterable[dict[str, Any]]) -> BrokerStats:
    """The counters of several endpoints' ``stats`` answers, summed by name."""
    topics: dict[str, list[int]] = {}
    groups: dict[str, list[int]] = {}
    for s in answers:
        for into, part in ((topics, s["topics"]), (groups, s["groups"])):
            for name, values in part.items():
                acc = into.setdefault(name, [0, 0, 0, 0])
                for i, v in enumerate(values):
                    acc[i] += v
    return BrokerStats(
        topics={n: TopicStats(*v) for n, v in topics.items()},
        groups={n: GroupStats(*v) for n, v in groups.items()},
    )


def merge_pending(views: list[MessageView], limit: int, several: bool) -> list[MessageView]:
    """The first ``limit`` of several endpoints' pending views, by due time (one
    endpoint's answer is in order already)."""
    if several:
        views.sort(key=lambda v: v.deliver_at_ms)
    return views[:limit]


def merge_prefix_aborts(answers: Iterable[PrefixAbortResult]) -> PrefixAbortResult:
    """Several endpoints' ``abort_prefix`` answers as one: counts summed, the keys
    already delivered merged in key order (the first :data:`MAX_REPORTED_KEYS`)."""
    aborted = count = 0
    keys: list[str] = []
    for r in answers:
        aborted += r.aborted
        count += r.already_delivered_count
        keys.extend(r.already_delivered)
    keys.sort()
    return PrefixAbortResult(aborted, tuple(keys[:MAX_REPORTED_KEYS]), count)


__all__ = [
    "ABORT_RANK",
    "NODE_CHARS",
    "RATE_SPACE",
    "RESCHEDULE_RANK",
    "SLOT_SPACE",
    "fixed_index",
    "key_index",
    "merge_pending",
    "merge_prefix_aborts",
    "merge_stats",
    "split_node_id",
]
