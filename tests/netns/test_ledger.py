"""The rules of the namespaced-hosts ledger (``tests/netns/ledger.py``) on runs
written by hand: a repeat is the fault's only when every earlier run was on a
faulted host around the fault, for keyed jobs and interval occurrences alike. The
slow fault tests trust it to fail when something goes wrong, and not otherwise."""

from __future__ import annotations

from typing import Any

from tests.netns.app import TICK, WORK
from tests.netns.ledger import Fault, judge

KILL_MS = 100_000  # when the fault struck (epoch ms)
KILL_B = Fault("kill_b", KILL_MS, KILL_MS + 50, ("b",))


def producer(*keys: str) -> dict[str, Any]:
    """A producer's answers: ``keys`` sent, nothing cancelled."""
    return {
        "sent": {k: [f"id-{k}", "OK"] for k in keys},
        "aborts": {},
        "send_retries": 0,
        "abort_retries": 0,
        "shifted": 0,
        "max_shift_ms": 0,
    }


def tick(host: str, t: int, fire_ms: int) -> dict[str, Any]:
    return {"j": TICK, "m": f"cron:{fire_ms}", "a": 1, "h": host, "p": 1, "t": t, "f": fire_ms}


def work(host: str, t: int, key: str, end: bool = False) -> dict[str, Any]:
    run = {"j": WORK, "m": f"id-{key}", "a": 1, "h": host, "p": 1, "t": t, "k": key}
    return {**run, "e": 1} if end else {**run, "d": t}


def test_an_occurrence_run_on_the_killed_host_and_again_later_is_the_faults() -> None:
    # Given ticks every 2 s; the one of 98,000 ran on B 0.5 s before B was killed (its
    # ack not yet sent) and again on A once its invisible time passed
    runs = [tick("a", 96_000, 96_000), tick("b", 99_500, 98_000), tick("a", 160_000, 98_000)]
    runs.append(tick("a", 100_000, 100_000))
    verdict = judge(producer(), runs, KILL_B)
    # Then it is a repeat the fault explains, not a broken rule
    assert verdict.tick_dups_explained == [98_000] and verdict.tick_dups == []
    assert verdict.failures() == []
    assert "dups 1 at the fault, 0 unexplained" in verdict.summary()


def test_an_occurrence_run_twice_without_a_fault_to_explain_it_fails() -> None:
    twice_on_a = [tick("a", 96_000, 96_000), tick("a", 96_010, 96_000)]  # A was not killed
    long_before = [tick("b", 50_000, 50_000), tick("a", 52_000, 50_000)]  # acked long ago
    for runs, fault in [
        (twice_on_a, KILL_B),
        (long_before, KILL_B),
        (twice_on_a, Fault("none")),
    ]:
        verdict = judge(producer(), runs, fault)
        assert verdict.tick_dups == [runs[0]["f"]], (runs, fault)
        assert any("interval occurrences ran more than once" in f for f in verdict.failures())


def test_keyed_repeats_follow_the_same_rule() -> None:
    runs = [
        work("b", 99_000, "w1"),  # started on B, cut short by the kill
        work("a", 160_000, "w1"),
        work("a", 160_100, "w1", end=True),
        work("a", 90_000, "w2"),  # ran twice on A: nothing explains it
        work("a", 90_100, "w2", end=True),
        work("a", 91_000, "w2"),
        work("a", 91_100, "w2", end=True),
    ]
    verdict = judge(producer("w1", "w2"), runs, KILL_B)
    assert (verdict.dup_explained, verdict.dup_unexplained, verdict.lost) == (["w1"], ["w2"], [])
