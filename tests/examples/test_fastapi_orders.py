"""examples/fastapi_orders under a real ``uvicorn --workers 2`` and a real dispatcher.

Both open the same ``rocksdb://`` directory (``CHRONOQ_BROKER_URL``). The test
runs both start orders:

* ``dispatcher_first``: ``chronoq run`` owns the directory; both web workers are
  its clients over ``DIR/chronoq.sock``;
* ``web_first``: one uvicorn worker owns it (its wheel fires the auto-closes),
  the other worker and the dispatcher are its clients; stopping uvicorn hands
  the directory over to the dispatcher.

Then 40 orders over HTTP, spread over both workers (each request on its own
connection), every third paid at once, one paid after its auto-close ran
(:func:`tests.examples.webapps.run_orders` checks the rest), and a clean stop.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.examples.webapps import (
    Service,
    dispatcher_argv,
    free_port,
    python_env,
    run_orders,
    wait_http,
)

pytest.importorskip("fastapi", reason="needs the fastapi extra")
pytest.importorskip("uvicorn", reason="needs the fastapi extra")

TARGET = "examples.fastapi_orders.jobs:app"
ORDERS = 40


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """The processes a test starts; whatever still runs is stopped at teardown."""
    started: list[Service] = []
    yield started
    for service in reversed(started):
        service.stop()


@pytest.mark.timeout(150)
# dispatcher_first runs with -m slow only (the suite's budget): the Django example's
# test covers that start order by default, and web_first here also covers the handover
@pytest.mark.parametrize(
    "first", [pytest.param("dispatcher_first", marks=pytest.mark.slow), "web_first"]
)
def test_orders_on_two_uvicorn_workers(first: str, tmp_path: Path, services: list[Service]) -> None:
    env = python_env(
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'broker'}",
        ORDERS_DATA_DIR=str(tmp_path / "orders"),
        ORDERS_CLOSE_AFTER_S="5",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    uvicorn_argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "examples.fastapi_orders.app:app",
        "--workers",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]

    def start_dispatcher() -> Service:
        dispatcher = Service(
            "dispatcher", dispatcher_argv(TARGET), env, tmp_path, tmp_path / "d.log"
        )
        services.append(dispatcher)
        dispatcher.wait_for_output("dispatcher joined group")
        return dispatcher

    def start_web() -> Service:
        web = Service("uvicorn", uvicorn_argv, env, tmp_path, tmp_path / "web.log")
        services.append(web)
        web.wait_for_output(" ready: broker ", count=2)  # both workers opened the broker
        wait_http(f"{base}/health", services)
        return web

    if first == "dispatcher_first":
        dispatcher = start_dispatcher()
        web = start_web()
    else:
        web = start_web()
        dispatcher = start_dispatcher()

    out = run_orders(
        base, tmp_path / "orders" / "orders.sqlite3", services, count=ORDERS, workers=2
    )

    web_pids = set(out.creators)
    assert len(web_pids) == 2 and set(out.roles) == web_pids, (out.creators, out.roles)
    if first == "dispatcher_first":
        assert sorted(out.roles.values()) == ["client", "client"], out.roles
        assert "is a client of the owner" not in dispatcher.output()
    else:
        assert sorted(out.roles.values()) == ["client", "owner"], out.roles
        assert "is a client of the owner" in dispatcher.output()

    # A clean stop: the lifespan's app.aclose() in both workers, then the dispatcher.
    assert web.stop() == 0, web.output()
    assert "Application shutdown complete." in web.output()
    for bad in ("Traceback", "ERROR"):
        assert bad not in web.output(), web.output()
    assert dispatcher.stop() == 0, dispatcher.output()
    assert "Traceback" not in dispatcher.output(), dispatcher.output()
