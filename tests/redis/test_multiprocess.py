"""Two dispatcher processes on one real Redis: exactly once per group when all goes
well, nothing lost when one is killed mid-batch. Both dispatchers also fire; the
sending process does not (``fire=0``), so firing is theirs alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from tests.helpers import eventually

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(180)]

CHILD = Path(__file__).with_name("dispatch_child.py")
ROOT = Path(__file__).resolve().parents[2]


def _spawn(url: str, out: Path, groups: str, topic: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), url, str(out), groups, topic, *extra], env=env
    )
    eventually(
        lambda: out.exists() and "ready" in out.read_text(), timeout=30, what=f"{out.name} ready"
    )
    return proc


def _lines(path: Path, kind: str) -> list[tuple[str, str, int]]:
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == kind:  # a line cut by a kill has fewer parts
            rows.append((parts[1], parts[2], int(parts[3])))
    return rows


def _stop(procs: list[subprocess.Popen[bytes]], outs: list[Path]) -> None:
    for out in outs:
        Path(str(out) + ".stop").touch()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _send(url: str, topic: str, n: int) -> set[str]:
    with RedisBroker.from_url(url + "?fire=0") as sender:
        ids: set[str] = set()
        for start in range(0, n, 200):
            # due over the next ~1.5 s, so firing happens while both dispatchers run
            batch = [
                Message(topic, b"%d" % i, delay_ms=(i * 1500) // n)
                for i in range(start, min(start + 200, n))
            ]
            ids.update(r.msg_id for r in sender.send_batch(batch))
    return ids


def test_two_dispatchers_get_every_message_exactly_once_per_group(
    redis_url: str, tmp_path: Path
) -> None:
    outs = [tmp_path / "d1.txt", tmp_path / "d2.txt"]
    procs = [_spawn(redis_url, out, "billing,audit", "jobs") for out in outs]
    try:
        ids = _send(redis_url, "jobs", 2_000)
        assert len(ids) == 2_000

        def acked() -> list[tuple[str, str, int]]:
            return [row for out in outs for row in _lines(out, "ack")]

        eventually(lambda: len(acked()) >= 4_000, timeout=60, what="4,000 acks")
    finally:
        _stop(procs, outs)
    got = [row for out in outs for row in _lines(out, "got")]
    for group in ("billing", "audit"):
        deliveries = Counter(mid for g, mid, _ in got if g == group)
        assert set(deliveries) == ids, f"group {group} missed or invented messages"
        assert max(deliveries.values()) == 1, f"group {group} got a message twice"
    per_process = [{mid for _, mid, _ in _lines(out, "got")} for out in outs]
    assert all(per_process), "one dispatcher got nothing: the work was not shared"


def test_a_dispatcher_killed_mid_batch_loses_nothing(redis_url: str, tmp_path: Path) -> None:
    slow, fast = tmp_path / "slow.txt", tmp_path / "fast.txt"
    # the slow one holds each pulled batch 30 s before acking: it dies holding one
    victim = _spawn(redis_url, slow, "g", "jobs", "--hold-s", "30", "--invisible-ms", "1500")
    ids = _send(redis_url, "jobs", 500)
    eventually(lambda: _lines(slow, "got"), timeout=30, what="the slow dispatcher pulled")
    survivor = _spawn(redis_url, fast, "g", "jobs", "--invisible-ms", "1500")
    try:
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        held = {mid for _, mid, _ in _lines(slow, "got")}
        assert held and not _lines(slow, "ack"), "the victim must die holding unacked messages"
        eventually(
            lambda: {mid for _, mid, _ in _lines(fast, "ack")} >= ids,
            timeout=60,
            what="the survivor acked every message",
        )
    finally:
        _stop([survivor], [fast])
    redelivered = {mid: att for _, mid, att in _lines(fast, "ack") if mid in held}
    assert set(redelivered) == held
    assert all(att >= 2 for att in redelivered.values()), "held messages come back as retries"
