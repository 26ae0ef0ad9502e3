"""The ledger of the kill -9 soaks (``bench/soak_kill9.py``): what the producers were
told, what ran, when the kills were, and the accounting made of it.

Every process of a soak appends lines to its own file in one ledger directory
(one ``os.write`` per line on an ``O_APPEND`` descriptor, so a line is whole or,
when a kill cut it, dropped by the reader):

``S id key t``
    a send the broker acknowledged (``OK``, or ``DUPLICATE`` of a retried keyed send).
``a id t`` then ``A id STATUS t``
    an abort about to be asked, then its answer. A kill between the two leaves the
    answer unknown; the accounting then asks the broker (``query``) at the end.
``R id attempt t pid``
    a delivery (a consumer's pull) or a job run, written when it starts.
``P id attempt t pid``
    a message a dispatcher pulled (the Celery-executor soak's dispatcher only: its
    job runs elsewhere, so a message it re-reads after a kill and settles from the
    result backend shows here and not among the runs).
``K id t``
    an ack that returned (only where the soak's own consumer acks; a dispatcher
    acks inside itself and writes none).
``X t0 t1``
    a ``kill -9``: sent after ``t0``, the process reaped by ``t1``.

Times are ``time.time()`` of one machine. A duplicate (an id delivered twice) is
*in flight at a kill* when a kill fell between the start of one delivery and the
start of the next one: the broker is at-least-once across a crash, not across
nothing. Of those, the ones whose earlier delivery had an ack recorded before that
kill are counted apart (``acked_before_kill``): the embedded broker commits acks
as a cursor at most every 50 ms (``group_registry.COMMIT_INTERVAL_S``), and a
cursor cannot pass an earlier message still in flight, so a kill may deliver
again what was acked since the last commit. A duplicate with no kill between its
deliveries is *unexplained*: a bug.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Abort answers, as ``AbortStatus.value``.
ABORTED = "ABORTED"


class LedgerFile:
    """One process's ledger file, appended to line by line.

    :param path: the file (created if missing).
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _put(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(map(str, fields)) + "\n").encode())

    def sent(self, msg_id: str, key: str) -> None:
        """Record an acknowledged send."""
        self._put("S", msg_id, key, f"{time.time():.6f}")

    def abort_asked(self, msg_id: str) -> None:
        """Record that an abort of ``msg_id`` is about to be asked."""
        self._put("a", msg_id, f"{time.time():.6f}")

    def abort_answer(self, msg_id: str, status: str) -> None:
        """Record the answer of an abort (an ``AbortStatus`` value)."""
        self._put("A", msg_id, status, f"{time.time():.6f}")

    def run(self, msg_id: str, attempt: int, at: float | None = None) -> None:
        """Record a delivery or a job run starting (``at``: when, default now)."""
        self._put("R", msg_id, attempt, f"{time.time() if at is None else at:.6f}", os.getpid())

    def pulled(self, msg_id: str, attempt: int) -> None:
        """Record a message a dispatcher pulled."""
        self._put("P", msg_id, attempt, f"{time.time():.6f}", os.getpid())

    def acked(self, msg_id: str) -> None:
        """Record an ack that returned."""
        self._put("K", msg_id, f"{time.time():.6f}")

    def kill(self, t0: float, t1: float) -> None:
        """Record a ``kill -9`` sent after ``t0`` and reaped by ``t1``."""
        self._put("X", f"{t0:.6f}", f"{t1:.6f}")

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self._fd)


@dataclass
class Ledger:
    """Everything the ledger files of one directory say."""

    sends: dict[str, str] = field(default_factory=dict)  # id -> key
    abort_asked: set[str] = field(default_factory=set)
    abort_answers: dict[str, str] = field(default_factory=dict)
    runs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    pulls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    acks: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    kills: list[tuple[float, float]] = field(default_factory=list)

    @classmethod
    def read(cls, directory: Path) -> Ledger:
        """Read every ``*.log`` of ``directory``; lines cut by a kill are skipped."""
        led = cls()
        for path in sorted(directory.glob("*.log")):
            for line in path.read_text(errors="replace").splitlines():
                led._line(line.split())
        for times in (*led.runs.values(), *led.pulls.values()):
            times.sort()
        led.kills.sort()
        return led

    def _line(self, f: list[str]) -> None:
        try:
            if f[0] == "S" and len(f) == 4:
                self.sends[f[1]] = f[2]
            elif f[0] == "a" and len(f) == 3:
                self.abort_asked.add(f[1])
            elif f[0] == "A" and len(f) == 4:
                # an ABORTED answer stands even if a later retry of the call said otherwise
                if self.abort_answers.get(f[1]) != ABORTED:
                    self.abort_answers[f[1]] = f[2]
            elif f[0] == "R" and len(f) == 5:
                self.runs[f[1]].append(float(f[3]))
            elif f[0] == "P" and len(f) == 5:
                self.pulls[f[1]].append(float(f[3]))
            elif f[0] == "K" and len(f) == 3:
                self.acks[f[1]].append(float(f[2]))
            elif f[0] == "X" and len(f) == 3:
                self.kills.append((float(f[1]), float(f[2])))
        except (IndexError, ValueError):
            pass  # a line cut by a kill

    def kill_between(self, start: float, end: float) -> tuple[float, float] | None:
        """The first kill that may have fallen between ``start`` and ``end``."""
        for t0, t1 in self.kills:
            if start < t1 and t0 < end:
                return t0, t1
        return None


def account(led: Ledger, aborted_now: Callable[[Iterable[str]], set[str]]) -> dict[str, Any]:
    """The soak's figures.

    :param aborted_now: given ids, those the broker reports ``ABORTED`` now (it
        settles the aborts whose answer a kill cut off).
    :returns: ``acked_sends``, ``aborts_asked``, ``aborted`` (answered ``ABORTED``),
        ``abort_unknown_resolved_aborted``, ``ran`` (acknowledged ids that ran),
        ``duplicates`` (deliveries beyond the first, each classified as one of the three
        ``dup_*``),
        ``unacknowledged_ran`` (ran, but the producer never recorded the ack: it was
        killed first), ``pulled_again_after_kill`` (ids a dispatcher pulled again
        after a kill, from ``P`` lines), ``lost``, ``aborted_but_delivered``, ``dup_in_flight_at_kill``, ``dup_acked_before_kill``, ``dup_unexplained``,
        ``kills`` and a few example ids.
    """
    acked = set(led.sends)
    aborted = {i for i, s in led.abort_answers.items() if s == ABORTED}
    unknown = (led.abort_asked - set(led.abort_answers)) & acked
    missing = acked - aborted - set(led.runs)
    resolved = aborted_now(sorted(missing & unknown)) if missing & unknown else set()
    lost = sorted(missing - resolved)
    aborted_delivered = sorted(i for i in aborted if i in led.runs)
    in_flight = acked_before = 0
    unexplained: list[str] = []
    dups = [i for i, ts in led.runs.items() if len(ts) > 1]
    pulled_again = sum(
        1
        for ts in led.pulls.values()
        if any(led.kill_between(a, b) for a, b in itertools.pairwise(ts))
    )
    for msg_id in dups:
        times = led.runs[msg_id]
        for first, second in itertools.pairwise(times):
            kill = led.kill_between(first, second)
            if kill is None:
                unexplained.append(msg_id)
            elif any(first <= t <= kill[1] for t in led.acks.get(msg_id, ())):
                acked_before += 1
            else:
                in_flight += 1
    return {
        "acked_sends": len(acked),
        "aborts_asked": len(led.abort_asked),
        "aborted": len(aborted),
        "abort_unknown_resolved_aborted": len(resolved),
        "ran": len(acked & set(led.runs)),
        "unacknowledged_ran": len(set(led.runs) - acked),
        "lost": len(lost),
        "aborted_but_delivered": len(aborted_delivered),
        "pulled_again_after_kill": pulled_again,
        "duplicates": sum(len(led.runs[i]) - 1 for i in dups),
        "dup_in_flight_at_kill": in_flight,
        "dup_acked_before_kill": acked_before,
        "dup_unexplained": len(unexplained),
        "kills": len(led.kills),
        "examples": {
            "lost": lost[:5],
            "aborted_but_delivered": aborted_delivered[:5],
            "dup_unexplained": unexplained[:5],
        },
    }


def expected_ids(led: Ledger) -> set[str]:
    """The ids that must still run: acknowledged and not answered ``ABORTED``."""
    aborted = {i for i, s in led.abort_answers.items() if s == ABORTED}
    return set(led.sends) - aborted
