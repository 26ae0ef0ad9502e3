"""RateBuckets (GCRA) and LeaseSemaphores (broker_adapter/coordination.py) on a
ManualClock: the state behind acquire_rate/acquire_slot of in-process brokers."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from broker_adapter.clock import ManualClock
from broker_adapter.coordination import SWEEP_FLOOR, LeaseSemaphores, RateBuckets
from tests.conftest import START_MS


def test_a_fresh_bucket_allows_a_burst_of_limit_then_one_per_interval() -> None:
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    assert [rates.acquire("b", 3, 1_000) for _ in range(3)] == [0, 0, 0]
    wait = rates.acquire("b", 3, 1_000)
    assert wait == 334  # T = 333.3 ms, rounded up: asking again then succeeds
    assert rates.acquire("b", 3, 1_000) == 334  # a refusal takes nothing
    clock.advance(333)
    assert rates.acquire("b", 3, 1_000) == 1
    clock.advance(1)
    assert rates.acquire("b", 3, 1_000) == 0
    assert rates.acquire("b", 3, 1_000) > 0


def test_buckets_are_independent_and_refill_after_a_period() -> None:
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    assert rates.acquire("a", 1, 60_000) == 0
    assert rates.acquire("a", 1, 60_000) == 60_000
    assert rates.acquire("b", 1, 60_000) == 0
    clock.advance(60_000)
    assert rates.acquire("a", 1, 60_000) == 0


@given(
    limit=st.integers(1, 50),
    period=st.integers(1, 10_000),
    steps=st.lists(st.integers(0, 500), min_size=1, max_size=60),
)
def test_permits_never_outrun_a_burst_of_limit_plus_the_rate(
    limit: int, period: int, steps: list[int]
) -> None:
    """GCRA's promise: between any two permits ``d`` ms apart there are at most
    ``limit + d * limit / period`` permits (a burst of ``limit``, then the rate)."""
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    granted: list[int] = []
    for step in steps:
        clock.advance(step)
        while rates.acquire("b", limit, period) == 0:
            granted.append(clock.now_ms())
    for i, first in enumerate(granted):
        for j in range(i, len(granted)):
            assert (j - i + 1) * period <= limit * period + (granted[j] - first) * limit
    if steps[-1] >= period:  # a full period idle before the last step: a whole burst
        assert granted[-limit:] == [clock.now_ms()] * limit


def test_a_wait_is_exact_enough_to_succeed_when_asked_again() -> None:
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    for _ in range(200):
        wait = rates.acquire("b", 7, 1_000)
        if wait:
            clock.advance(wait)
            assert rates.acquire("b", 7, 1_000) == 0


def test_idle_buckets_are_dropped() -> None:
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    for i in range(SWEEP_FLOOR * 3):
        rates.acquire(f"b{i}", 10, 1_000)
        clock.advance(1)
    assert len(rates) < SWEEP_FLOOR * 2  # only those active in the last second stay


def test_threads_share_one_bucket_without_losing_or_granting_extra() -> None:
    clock = ManualClock(START_MS)
    rates = RateBuckets(clock)
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(500):
            if rates.acquire("b", 100, 60_000) == 0:
                with lock:
                    got.append(1)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 100


def test_a_semaphore_admits_limit_holders_and_renews_a_holder() -> None:
    clock = ManualClock(START_MS)
    slots = LeaseSemaphores(clock)
    assert slots.acquire("s", 2, "a", 1_000)
    assert slots.acquire("s", 2, "b", 1_000)
    assert not slots.acquire("s", 2, "c", 1_000)
    clock.advance(900)
    assert slots.acquire("s", 2, "a", 1_000)  # held: renewed until +1900
    clock.advance(200)  # b's lease expired, a's not
    assert slots.holders("s") == ["a"]
    assert slots.acquire("s", 2, "c", 1_000)
    assert not slots.acquire("s", 2, "d", 1_000)


def test_release_frees_a_slot_once_and_an_expired_lease_is_not_released() -> None:
    clock = ManualClock(START_MS)
    slots = LeaseSemaphores(clock)
    assert slots.acquire("s", 1, "a", 1_000)
    assert slots.release("s", "a")
    assert not slots.release("s", "a")
    assert slots.acquire("s", 1, "b", 1_000)
    clock.advance(1_000)
    assert not slots.release("s", "b")  # expired: it counts as released already
    assert not slots.release("other", "b")
    assert len(slots) == 0


def test_semaphores_whose_leases_expired_are_dropped() -> None:
    clock = ManualClock(START_MS)
    slots = LeaseSemaphores(clock)
    for i in range(SWEEP_FLOOR * 3):
        slots.acquire(f"s{i}", 1, "h", 10)
        clock.advance(1)
    assert len(slots) < SWEEP_FLOOR * 2


def test_threads_never_hold_more_than_limit() -> None:
    clock = ManualClock(START_MS)
    slots = LeaseSemaphores(clock)
    held = 0
    most = 0
    lock = threading.Lock()

    def work(me: str) -> None:
        nonlocal held, most
        for _ in range(300):
            if slots.acquire("s", 3, me, 60_000):
                with lock:
                    held += 1
                    most = max(most, held)
                with lock:
                    held -= 1
                assert slots.release("s", me)

    threads = [threading.Thread(target=work, args=(f"h{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= most <= 3
    assert slots.holders("s") == []
