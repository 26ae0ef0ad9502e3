"""ArmedOccurrences: bounded, ordered, per series; forget drops every version."""

from __future__ import annotations

from scheduler.armed import REMEMBERED, ArmedOccurrences


def test_keeps_the_latest_occurrences_in_order_without_repeats() -> None:
    armed = ArmedOccurrences()
    for t in [30, 10, 20, 20, *range(100, 100 + REMEMBERED)]:
        armed.add("nightly", t)
    assert armed.latest("nightly") == 100 + REMEMBERED - 1
    assert not armed.knows("nightly", 10)  # pushed out by the bound
    assert armed.knows("nightly", 100)
    assert armed.first_after("nightly", 100) == 101
    assert armed.first_after("nightly", 100 + REMEMBERED) is None
    assert armed.latest("other") is None and not armed.knows("other", 100)


def test_forget_drops_every_version_of_one_name_only() -> None:
    armed = ArmedOccurrences()
    armed.add("a", 1)
    armed.add("a\x003", 2)
    armed.add("a:b", 3)  # another schedule whose name starts like it
    armed.forget("a")
    assert armed.latest("a") is None and armed.latest("a\x003") is None
    assert armed.latest("a:b") == 3
