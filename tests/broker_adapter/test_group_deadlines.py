"""ConsumerGroup's deadline heap drops settled pulls early (issue 16).

Each pull puts one entry on the heap until its invisible time passes (60 s by
default). Entries of pulls whose messages were all settled are dropped whenever
the heap outgrows twice the messages in flight, so a dispatcher pulling thousands
of times a second does not keep each pull for a minute (memory the full GC walks).
A pull still holding a message is never dropped: it expires as before.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from broker_adapter.embedded.groups import ConsumerGroup, Pull
from broker_adapter.embedded.records import encode


def _record(i: int) -> bytes:
    return encode(1, 0, 1000 + i, 0, i.to_bytes(16, "big"), b"", b"", b"", b"x")


def test_settled_pulls_leave_the_heap_and_live_ones_still_expire() -> None:
    group = ConsumerGroup(1, "g", {1: b"\x00\x01"}, 0)
    # A stand-in for the EmbeddedConsumer: drop_flight only counts on it.
    consumer: Any = SimpleNamespace(held=0, held_bytes=0)
    kept: list[bytes] = []
    for i in range(5000):
        receipt = b"\x00\x01" + i.to_bytes(16, "big")
        consumer.held += 1
        group.add_pulled([receipt], [_record(i)], Pull(60_000 + i, consumer))
        if i % 100 == 0:
            kept.append(receipt)  # still in flight
        else:
            assert group.drop_flight(receipt) is not None  # acked
    assert len(group.inflight) == len(kept) == 50
    assert len(group.deadlines) <= 2 * len(group.inflight) + 65  # not 5,000
    assert sorted(f.receipt for f in group.expired(10**9)) == kept
    assert group.expired(10**9) == []
