"""The accounting of the kill -9 soaks (``bench/soak_ledger.py``) on ledgers written
by hand: it finds a lost send, an aborted message that ran, a duplicate with no kill
between its deliveries, and settles an abort whose answer a kill cut off by asking
the broker. The slow soaks trust it to fail when something goes wrong."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bench.soak_ledger import Ledger, LedgerFile, account, expected_ids


def ledger(tmp_path: Path, lines: str, kills: Iterable[tuple[float, float]] = ()) -> Ledger:
    (tmp_path / "a.log").write_text(lines)
    f = LedgerFile(tmp_path / "kills.log")
    for t0, t1 in kills:
        f.kill(t0, t1)
    f.close()
    return Ledger.read(tmp_path)


def nothing_aborted(ids: Iterable[str]) -> set[str]:
    return set()


def test_a_clean_ledger_counts_nothing_wrong(tmp_path: Path) -> None:
    led = ledger(tmp_path, "S m1 k1 1.0\nS m2 k2 1.1\na m2 1.2\nA m2 ABORTED 1.3\nR m1 1 2.0 9\n")
    fig = account(led, nothing_aborted)
    assert (fig["acked_sends"], fig["aborted"], fig["ran"]) == (2, 1, 1)
    assert (fig["lost"], fig["aborted_but_delivered"], fig["duplicates"]) == (0, 0, 0)
    assert expected_ids(led) == {"m1"}


def test_lost_and_aborted_but_delivered_are_found(tmp_path: Path) -> None:
    led = ledger(tmp_path, "S m1 k1 1.0\nS m2 k2 1.1\nA m2 ABORTED 1.3\nR m2 1 2.0 9\n")
    fig = account(led, nothing_aborted)
    assert fig["lost"] == 1 and fig["examples"]["lost"] == ["m1"]
    assert fig["aborted_but_delivered"] == 1 and fig["examples"]["aborted_but_delivered"] == ["m2"]


def test_an_abort_cut_off_by_a_kill_is_settled_by_the_broker(tmp_path: Path) -> None:
    led = ledger(tmp_path, "S m1 k1 1.0\na m1 1.2\nS m2 k2 1.3\na m2 1.4\n")
    asked: list[str] = []

    def broker_says(ids: Iterable[str]) -> set[str]:
        asked.extend(ids)
        return {"m1"}  # m1's abort took effect, m2's never reached the broker

    fig = account(led, broker_says)
    assert asked == ["m1", "m2"]
    assert fig["abort_unknown_resolved_aborted"] == 1
    assert fig["lost"] == 1 and fig["examples"]["lost"] == ["m2"]


def test_duplicates_are_classified_by_the_kills_between_them(tmp_path: Path) -> None:
    lines = (
        "S m1 k1 1.0\nS m2 k2 1.0\nS m3 k3 1.0\n"
        "R m1 1 2.0 9\nR m1 2 6.0 10\n"  # a kill at 3-4 between, no ack: in flight
        "R m2 1 2.0 9\nK m2 2.1\nR m2 1 6.0 10\n"  # acked before the kill: not committed
        "R m3 1 5.0 10\nR m3 2 5.5 10\n"  # no kill between: unexplained
        "R m4 1 cut"  # a line cut by a kill
    )
    fig = account(ledger(tmp_path, lines, kills=[(3.0, 4.0)]), nothing_aborted)
    assert fig["duplicates"] == 3
    assert (fig["dup_in_flight_at_kill"], fig["dup_acked_before_kill"]) == (1, 1)
    assert fig["dup_unexplained"] == 1 and fig["examples"]["dup_unexplained"] == ["m3"]
    assert fig["unacknowledged_ran"] == 0 and fig["kills"] == 1


def test_a_message_pulled_again_after_a_kill_is_counted_apart_from_runs(tmp_path: Path) -> None:
    lines = (
        "S m1 k1 1.0\nS m2 k2 1.0\n"
        "P m1 1 2.0 9\nP m1 1 6.0 10\nR m1 1 2.1 77\n"  # re-read after the kill, ran once
        "P m2 1 5.0 10\nP m2 2 5.5 10\nR m2 1 5.1 77\n"  # no kill between the pulls
    )
    fig = account(ledger(tmp_path, lines, kills=[(3.0, 4.0)]), nothing_aborted)
    assert fig["pulled_again_after_kill"] == 1
    assert fig["duplicates"] == 0 and fig["ran"] == 2
