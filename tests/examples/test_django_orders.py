"""examples/django_orders under a real ``manage.py runserver`` and ``manage.py chronoq_run``.

``manage.py migrate`` creates the SQLite tables first; then the dispatcher
command and the development server (threaded, ``--noreload``) open the same
``rocksdb://`` directory, in both start orders:

* ``dispatcher_first``: ``chronoq_run`` owns the directory, the web server is its client;
* ``web_first``: the web server owns it (its first request opened the broker),
  ``chronoq_run`` is its client; when the server is stopped (runserver has no
  clean shutdown: SIGTERM ends it), the dispatcher takes the directory over.

Then the order scenario over HTTP (:func:`tests.examples.webapps.run_orders`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.examples.webapps import ROOT, Service, free_port, python_env, run_orders, wait_http

pytest.importorskip("django", reason="needs the django extra")

PROJECT = ROOT / "examples" / "django_orders"
ORDERS = 15


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """The processes a test starts; whatever still runs is stopped at teardown."""
    started: list[Service] = []
    yield started
    for service in reversed(started):
        service.stop()


def manage(*args: str) -> list[str]:
    """The ``manage.py`` command line with this interpreter."""
    return [sys.executable, str(PROJECT / "manage.py"), *args]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("first", ["dispatcher_first", "web_first"])
def test_orders_on_runserver_and_chronoq_run(
    first: str, tmp_path: Path, services: list[Service]
) -> None:
    env = python_env(
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'broker'}",
        ORDERS_DATA_DIR=str(tmp_path / "orders"),
        ORDERS_CLOSE_AFTER_S="4",
    )
    migrated = subprocess.run(
        manage("migrate", "--noinput"),
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert not (tmp_path / "broker").exists()  # migrate loads the jobs but opens no broker
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def start_dispatcher() -> Service:
        dispatcher = Service("chronoq_run", manage("chronoq_run"), env, PROJECT, tmp_path / "d.log")
        services.append(dispatcher)
        dispatcher.wait_for_output("dispatcher joined group")
        return dispatcher

    def start_web() -> Service:
        argv = manage("runserver", "--noreload", f"127.0.0.1:{port}")
        web = Service("runserver", argv, env, PROJECT, tmp_path / "web.log")
        services.append(web)
        wait_http(f"{base}/health", services)  # its first request opens the broker
        return web

    if first == "dispatcher_first":
        dispatcher = start_dispatcher()
        web = start_web()
    else:
        web = start_web()
        dispatcher = start_dispatcher()

    out = run_orders(base, tmp_path / "orders" / "orders.sqlite3", services, count=ORDERS)

    assert list(out.creators) == [web.proc.pid], out.creators
    if first == "dispatcher_first":
        assert out.roles == {web.proc.pid: "client"}, out.roles
        assert "is a client of the owner" not in dispatcher.output()
    else:
        assert out.roles == {web.proc.pid: "owner"}, out.roles
        assert "is a client of the owner" in dispatcher.output()

    web.stop()
    assert "Traceback" not in web.output(), web.output()
    if first == "web_first":  # the owner is gone: the dispatcher owns the directory now
        dispatcher.wait_for_output(f"this process (pid {dispatcher.proc.pid}) owns")
    assert dispatcher.stop() == 0, dispatcher.output()
    assert "Traceback" not in dispatcher.output(), dispatcher.output()
