"""The embedded broker's count_pending beyond its scan budget: buckets counted to their
end are exact; one past the budget is an estimate (``exact=False``) near the truth,
also when its start is empty; the estimates never exceed the pending counters."""

from __future__ import annotations

import random
from pathlib import Path

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.embedded.pending_counts import COUNT_BUDGET
from broker_adapter.message import Message
from tests.conftest import START_MS

HOUR = 3_600_000


def test_counts_past_the_budget_are_estimates_near_the_truth(tmp_path: Path) -> None:
    rng = random.Random(5)
    n = 2 * COUNT_BUDGET
    # the first 10 minutes of the hour are empty: a scan from the start alone would
    # see the density of an empty stretch
    dues = sorted(START_MS + HOUR // 6 + rng.randrange(5 * HOUR // 6) for _ in range(n))
    small = [START_MS + 2 * HOUR + i for i in range(50)]
    with EmbeddedBroker(tmp_path / "data", clock=ManualClock(START_MS)) as broker:
        for first in range(0, n, 5_000):
            broker.send_batch(
                [Message("t", b"", deliver_at_ms=d) for d in dues[first : first + 5_000]]
            )
        broker.send_batch([Message("u", b"", deliver_at_ms=d) for d in small])
        edges = [START_MS, START_MS + HOUR, START_MS + 3 * HOUR]
        counts = broker.count_pending(edges)
        assert not counts.exact
        assert abs(counts.counts[0] - n) <= n * 0.05
        assert counts.counts[1] == 50
        assert counts.total <= n + 50  # capped by the pending counters
        exact = broker.count_pending([START_MS + 2 * HOUR, START_MS + 3 * HOUR])
        assert (exact.counts, exact.exact) == ([50], True)
        by_topic = broker.count_pending(edges, topic="u")
        assert not by_topic.exact  # the first bucket holds too many records to read
        assert by_topic.counts == [0, 50]
