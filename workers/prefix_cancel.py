"""Cancel everything under a key prefix in chunks the caller can count, for
``chronoq cancel --key-prefix`` on a terminal (a progress bar of keys done).

``abort_prefix`` is one broker call however many keys it covers (the broker
works in chunks inside it, and says nothing until the end). To show progress
with the public calls only, and so on every adapter, this lists the pending
keys under the prefix first (``find_pending`` pages), splits them into
sub-prefixes of at most :data:`CHUNK_KEYS` listed keys each (by the next
character, like a trie; a key that is itself a split point is aborted by key),
aborts each chunk with ``abort_prefix`` (atomic per broker chunk, as before),
and ends with one ``abort_prefix`` of the whole prefix: it catches what was sent
meanwhile, and answers which keys had already fired, as a plain call would.
The answer is the same as one ``abort_prefix`` call's; it costs more (the listing
and the last pass: ``bench/cancel_progress.py``), which is why the command does
it only when it shows a bar.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import UnknownTopic
from broker_adapter.results import AbortStatus, PrefixAbortResult
from scheduler.progress import Progress

#: Most listed keys one chunk covers.
CHUNK_KEYS = 500
#: Keys listed per ``find_pending`` page.
LIST_PAGE = 1000


def plan_chunks(
    prefix: str, keys: Sequence[str], chunk: int = CHUNK_KEYS
) -> list[tuple[str, int, bool]]:
    """Split sorted, distinct ``keys`` (all under ``prefix``) into chunks.

    :returns: ``(sub-prefix or key, listed keys it covers, is an exact key)`` per
        chunk, in key order; no key is under two chunks.
    """
    out: list[tuple[str, int, bool]] = []

    def visit(p: str, lo: int, hi: int) -> None:
        if hi - lo <= chunk:
            if hi > lo:
                out.append((p, hi - lo, False))
            return
        if keys[lo] == p:  # the split point is a key itself: by key, or it covers them all
            out.append((p, 1, True))
            lo += 1
        depth = len(p)
        while lo < hi:
            c = keys[lo][depth]
            end = lo + 1
            while end < hi and keys[end][depth] == c:  # sorted: one run per next character
                end += 1
            visit(p + c, lo, end)
            lo = end

    visit(prefix, 0, len(keys))
    return out


def list_keys(broker: BrokerAdapter, topic: str, prefix: str, bar: Progress) -> list[str]:
    """The keys of the pending messages of ``topic`` under ``prefix``, sorted.

    :raises UnknownTopic: for a topic the broker never had a message on.
    """
    keys: set[str] = set()
    cursor: str | None = None
    while True:
        page = broker.find_pending(topic, key_prefix=prefix, limit=LIST_PAGE, cursor=cursor)
        keys.update(v.key for v in page.messages if v.key is not None)
        bar.set_done(len(keys))
        cursor = page.cursor
        if cursor is None:
            return sorted(keys)


def cancel_prefix(
    broker: BrokerAdapter,
    topics: Sequence[str],
    prefix: str,
    bar: Progress,
    *,
    strict: bool,
) -> list[PrefixAbortResult]:
    """Abort every pending message under ``prefix`` on ``topics``, chunk by chunk,
    counting keys on ``bar``; one result per topic that has messages.

    :param strict: an unknown topic raises (a topic the user named), else is skipped.
    :raises UnknownTopic: with ``strict``, for a topic the broker never had a message on.
    """
    bar.describe(f"listing keys under {prefix!r}")
    listed: dict[str, list[str]] = {}
    for topic in topics:
        try:
            listed[topic] = list_keys(broker, topic, prefix, bar)
        except UnknownTopic:
            if strict:
                raise
    plans = {t: plan_chunks(prefix, keys) for t, keys in listed.items()}
    chunks = sum(len(p) for p in plans.values())
    bar.restart(f"cancelling {prefix!r}", sum(len(k) for k in listed.values()))
    results: list[PrefixAbortResult] = []
    done = 0
    for topic, plan in plans.items():
        aborted = 0
        for sub, covered, exact in plan:
            if exact:
                aborted += broker.abort(key=sub, topic=topic).status is AbortStatus.ABORTED
            else:
                aborted += broker.abort_prefix(topic, sub).aborted
            done += 1
            bar.update(covered)
            bar.note(f"chunk {done}/{chunks}, {aborted:,} aborted")
        last = broker.abort_prefix(topic, prefix)  # sent meanwhile; and what had fired
        results.append(
            PrefixAbortResult(
                aborted + last.aborted, last.already_delivered, last.already_delivered_count
            )
        )
    return results


__all__ = ["CHUNK_KEYS", "LIST_PAGE", "cancel_prefix", "list_keys", "plan_chunks"]
