"""The producer of the namespaced-hosts scenario (run on host ``A``).

``python -m tests.netns.producer --count N --window-s W --lead-s L --out FILE``
schedules ``N`` keyed runs of :data:`tests.netns.app.WORK` (keys ``w<i>``) due
uniformly over ``W`` seconds starting ``L`` seconds from now, in batches
(``schedule_many``), and cancels every 10th key right after its batch was
accepted. A batch or an abort that fails (a broker restarting, a lossy link) is
retried until it gets an answer: keyed sends are idempotent, and aborting twice
answers ``ABORTED`` twice. When the producer falls behind its plan (a slow, lossy
link), a job whose due time passed is sent due 0.5 s ahead instead; ``shifted``
and ``max_shift_ms`` in the output say how many and by how much. What the broker answered is written to ``FILE`` as JSON:
``sent`` (key -> [msg id, status]), ``aborts`` (key -> status), the retries of
each kind, and the schedule's start and end (epoch ms).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TypeVar

from broker_adapter.errors import ChronoqError
from scheduler.handles import Call
from scheduler.receipts import ScheduledJob
from tests.netns.app import app, work

T = TypeVar("T")
BATCH = 500
#: A job whose planned due time is this close (ms) or past is sent due this far ahead.
SHIFT_MARGIN_MS = 500
#: How long one batch or abort is retried before the producer gives up.
RETRY_FOR_S = 120.0


class Retrying:
    """Counts retries of one kind of call."""

    def __init__(self) -> None:
        self.retries = 0

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried every 0.5 s on a :class:`ChronoqError` for :data:`RETRY_FOR_S`."""
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                return fn()
            except ChronoqError:
                if time.monotonic() > deadline:
                    raise
                self.retries += 1
                time.sleep(0.5)


def _send(planned: list[tuple[int, int]], shifts: list[int]) -> list[ScheduledJob]:
    """Send one batch: job ``i`` due at its planned time, or just after now when the
    producer fell behind it (a slow link); each shift is recorded in ``shifts``."""
    floor = int(time.time() * 1000) + SHIFT_MARGIN_MS
    calls = []
    for i, planned_ms in planned:
        due = max(planned_ms, floor)
        if due > planned_ms:
            shifts.append(due - planned_ms)
        at = datetime.fromtimestamp(due / 1000, UTC)
        calls.append(Call((f"w{i}", due), key=f"w{i}", at=at))
    return work.schedule_many(calls)


def main() -> None:
    """Schedule, cancel, write the answers (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--window-s", type=float, required=True)
    parser.add_argument("--lead-s", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    start_ms = int(time.time() * 1000)
    first_due = start_ms + int(args.lead_s * 1000)
    step = args.window_s * 1000 / args.count
    sends, aborts = Retrying(), Retrying()
    sent: dict[str, list[str]] = {}
    aborted: dict[str, str] = {}
    shifts: list[int] = []
    with ThreadPoolExecutor(16) as pool:
        for lo in range(0, args.count, BATCH):
            planned = [
                (i, first_due + int(i * step)) for i in range(lo, min(lo + BATCH, args.count))
            ]
            receipts = sends.call(partial(_send, planned, shifts))
            for receipt in receipts:
                assert receipt.key is not None
                sent[receipt.key] = [receipt.msg_id, receipt.status.value]
            keys = [f"w{i}" for i in range(lo, min(lo + BATCH, args.count)) if i % 10 == 0]
            answers = pool.map(lambda k: aborts.call(partial(work.cancel, key=k)), keys)
            for key, status in zip(keys, answers, strict=True):
                aborted[key] = status.value
    app.close()
    report = {
        "start_ms": start_ms,
        "end_ms": int(time.time() * 1000),
        "sent": sent,
        "aborts": aborted,
        "send_retries": sends.retries,
        "abort_retries": aborts.retries,
        "shifted": len(shifts),
        "max_shift_ms": max(shifts, default=0),
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.rename(args.out)


if __name__ == "__main__":
    main()
