"""A dispatcher rides out a broker restart: it keeps pulling (with back-off) and runs
what falls due after the broker is back (issue 19: before, a ``chronoq run`` on
``redis://`` exited at the first pull that found Redis down, and never came back)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from broker_adapter.errors import ConnectionFailed
from scheduler.scheduler import Scheduler
from tests.helpers import eventually
from tests.redis_server import RedisServer
from workers.broker_outage import MAX_WAIT_S, BrokerOutage
from workers.dispatcher import Dispatcher


@pytest.mark.external_service
def test_dispatcher_keeps_pulling_across_a_redis_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis", aof=True).start()
    ran: list[str] = []
    app = Scheduler(server.url, max_workers=2, prefetch=4)

    @app.job(name="outage.mark")
    def mark(tag: str) -> None:
        ran.append(tag)

    dispatcher = Dispatcher(app)
    thread = threading.Thread(target=dispatcher.run_forever, kwargs={"poll_ms": 100})
    try:
        thread.start()
        mark.schedule("before", delay=0)
        eventually(lambda: "before" in ran, 10, "the job before the restart")
        # When redis-server dies (kill -9) while the dispatcher pulls, and comes back
        server.kill()
        with caplog.at_level(logging.INFO, "chronoq.workers.Dispatcher"):
            eventually(lambda: "broker unreachable" in caplog.text, 10, "the outage WARNING")
            assert thread.is_alive()
            server.start()  # same port, same append-only file
            mark.schedule("after", delay=0)
            # Then the same dispatcher runs what is scheduled after the restart
            eventually(lambda: "after" in ran, 3 * MAX_WAIT_S, "the job after the restart")
            eventually(lambda: "broker reachable again" in caplog.text, 10, "the INFO line")
        assert thread.is_alive()
        assert caplog.text.count("broker unreachable") == 1  # one line per outage
    finally:
        dispatcher.stop()
        thread.join(30)
        app.close()
        server.stop()
    assert ran.count("before") == 1 and ran.count("after") == 1


def test_backoff_doubles_to_its_bound_and_resets() -> None:
    outage = BrokerOutage(logging.getLogger("test.outage"), "group g")
    error = ConnectionFailed("down")
    waits = [outage.failed(error) for _ in range(6)]
    assert waits == [0.5, 1.0, 2.0, 4.0, MAX_WAIT_S, MAX_WAIT_S]
    assert outage.ongoing
    outage.succeeded()
    assert not outage.ongoing
    assert outage.failed(error) == 0.5
