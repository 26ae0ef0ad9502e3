"""What a pull's round trip carries of the queued acks (``AckBatcher.carried``): on a
cluster only the acks of the masters the trip calls anyway, so an ack of another
master never adds that master to the trip (issue 19)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Scripts


def test_a_trip_carries_only_the_acks_of_the_shards_it_names(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keyspace.build("cq", 4)
    scripts = Scripts(client)
    scripts.load()
    batcher = AckBatcher(scripts, keys)
    carried_some = 0
    try:
        for round_ in range(20):
            for s in range(4):
                batcher.add(s, "g", b"%d" % (round_ * 4 + s), b"1:1")
            # the batcher's own thread may write them first (then nothing is carried)
            with batcher.carried("g", {0, 1}) as step:
                if step is not None:
                    carried_some += 1
                    assert set(step[1]) <= {0, 1}, step[1]
            batcher.flush()  # the rest is written by the batcher, as after any trip
    finally:
        batcher.close()
        client.close()
    assert carried_some > 0


def test_while_pulls_carry_the_acks_the_thread_writes_none(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like a dispatcher at ~3k jobs/s: a pull every ~1 ms carries the group's acks,
    and the jobs it handed out ack right after it. The acks queued since the last pull
    are always there, but the next pull takes them: the thread leaves them (before, it
    wrote them every few ms, a round trip each); it writes what no pull takes."""
    client = redis.Redis.from_url(redis_url)
    keys = Keyspace.build("cq", 1)
    scripts = Scripts(client)
    scripts.load()
    batcher = AckBatcher(scripts, keys)
    written: list[int] = []  # by the thread: it writes only through flush()
    real_flush = batcher.flush

    def counting_flush() -> None:
        if threading.current_thread().name == "chronoq-redis-acks":
            written.append(1)
        real_flush()

    monkeypatch.setattr(batcher, "flush", counting_flush)
    carries = 0
    try:
        n = 0
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            with batcher.carried("g") as step:
                if step is not None:
                    carries += 1
                    scripts.fan_steps(keys.due_keys, [step])  # as a pull's trip writes it
            for _ in range(3):  # the pull's jobs ack
                n += 1
                batcher.add(0, "g", b"%d" % n, b"1:1")
            time.sleep(0.001)
        assert carries > 100
        assert len(written) < carries // 10, (len(written), carries)
        # acks no pull takes (another group's) are written by the thread
        before = len(written)
        batcher.add(0, "other", b"1", b"1:1")
        time.sleep(1.0)  # two gatherings are ~25 ms
        with batcher.carried("other") as step:
            assert step is None  # written already
        assert len(written) > before
    finally:
        batcher.close()
        client.close()
