"""Redis with AOF (``appendfsync always``) killed with SIGKILL and restarted under
load: every send that returned OK and every ack that returned True survives."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker_adapter.errors import BrokerError
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.results import MessageState, SendStatus
from tests.helpers import eventually, pull_until
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.external_service, pytest.mark.timeout(180)]


def test_redis_crash_and_restart_with_aof_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", aof=True).start()
    broker = RedisBroker.from_url(server.url)
    try:
        # Given: acked deliveries and pending messages from before the crash
        c = broker.consumer("g", ["jobs"], invisible_ms=60_000)
        done = {r.msg_id for r in broker.send_batch([Message("jobs", b"d") for _ in range(50)])}
        acked = set()
        for m in pull_until(c, 50):
            if c.ack(m):
                acked.add(m.msg_id)
        assert acked == done
        broker.flush()  # acks are written in batches: flush() waits for them too
        later = {
            r.msg_id
            for r in broker.send_batch([Message("jobs", b"l", delay_ms=2_000) for _ in range(100)])
        }

        # When: Redis is SIGKILLed while a thread keeps sending, then restarted
        ok: set[str] = set()
        stop = threading.Event()

        def keep_sending() -> None:
            i = 0
            while not stop.is_set():
                try:
                    r = broker.send(Message("jobs", b"s%d" % i, key=f"k{i}", delay_ms=1_000))
                except BrokerError:
                    time.sleep(0.01)  # Redis is down: not acknowledged, not counted
                    continue
                # DUPLICATE: the crash cut the reply of a send Redis had stored; the
                # keyed re-send finds that very message (sends with a key are idempotent)
                assert r.status in (SendStatus.OK, SendStatus.DUPLICATE)
                ok.add(r.msg_id)
                i += 1

        t = threading.Thread(target=keep_sending, daemon=True)
        t.start()
        eventually(lambda: len(ok) >= 200, what="sends before the crash")
        server.kill()
        before_restart = len(ok)
        time.sleep(0.3)
        server.start()
        eventually(
            lambda: len(ok) >= before_restart + 100, timeout=30, what="sends after the restart"
        )
        stop.set()
        t.join(10)

        # Then: every acknowledged send is there, and is delivered; acked ones stay done
        expected = later | ok
        for mid in expected:
            assert broker.query(mid) is not None, f"{mid} was acknowledged, then lost"
        got = pull_until(c, len(expected), timeout=60, max_messages=200)
        assert {m.msg_id for m in got} == expected
        assert not {m.msg_id for m in got} & acked, "an acked message came back"
        for mid in list(acked)[:10]:
            view = broker.query(mid)
            assert view is not None and view.state is MessageState.DONE
    finally:
        broker.close()
        server.stop()
