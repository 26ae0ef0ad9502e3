"""The dashboard under test: the real ``chronoq dashboard`` console script in a
subprocess (uvicorn, real HTTP) on a broker the test holds too.

:func:`dashboard` (one per test module) owns a ``rocksdb://`` directory in the test
process (``.broker``, with a :class:`~scheduler.scheduler.Scheduler` ``.app`` that has
a few jobs); the dashboard process becomes a client of it through the directory's
socket. :func:`start_dashboard` starts one on any broker URL (``chronoq://``,
``redis://`` ...). Requests go through :class:`DashboardProc`'s ``get``/``post``
(``httpx``, the token in its header unless told otherwise).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker_adapter import BrokerAdapter, open_broker
from scheduler.scheduler import Scheduler
from tests.examples.webapps import DEADLINE_S, Service, python_env

#: The installed console script (the same one users run).
CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
LISTENING = "chronoq dashboard listening on "


def make_app(broker: BrokerAdapter) -> Scheduler:
    """An app with the jobs the tests schedule: ``shop.close_order(order_id)``,
    ``shop.remind(text)`` and ``reports.nightly()`` (topic ``reports``)."""
    app = Scheduler(broker)

    @app.job(name="shop.close_order")
    def close_order(order_id: int) -> None:
        """Close an unpaid order."""

    @app.job(name="shop.remind")
    def remind(text: str, **extra: Any) -> None:
        """Remind someone."""

    @app.job(name="reports.nightly", topic="reports")
    def nightly() -> None:
        """A nightly report."""

    return app


def start_dashboard(
    url: str, log: Path, *extra: str, token: str | None = None, env: dict[str, str] | None = None
) -> tuple[Service, str]:
    """``chronoq dashboard --url URL --port 0 [--token T] EXTRA`` in a subprocess; the
    service and its base URL (``http://127.0.0.1:PORT/``) once it printed its line."""
    argv = [CHRONOQ, "dashboard", "--url", url, "--port", "0", *extra]
    if token is not None:
        argv.append(f"--token={token}")  # a token may start with "-"
    service = Service("dashboard", argv, python_env(**(env or {})), log.parent, log)
    try:
        service.wait_for_output(LISTENING, timeout=DEADLINE_S)
    except AssertionError:
        service.stop()
        raise
    line = next(ln for ln in service.output().splitlines() if ln.startswith(LISTENING))
    return service, line.removeprefix(LISTENING).strip() + "/"


@dataclass
class DashboardProc:
    """A running dashboard and what the test holds.

    :param base_url: ``http://127.0.0.1:PORT/``.
    :param broker: the broker, in the test process.
    :param app: a Scheduler with :func:`make_app`'s jobs on ``broker``.
    :param token: the dashboard's token (``None``: none).
    """

    base_url: str
    broker: BrokerAdapter
    app: Scheduler
    token: str | None
    service: Service
    data_dir: Path | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def headers(self, *, token: bool = True, **extra: str) -> dict[str, str]:
        """Request headers: the token (unless ``token`` is false) and ``extra``."""
        h = {"X-Chronoq-Token": self.token} if token and self.token else {}
        h.update(extra)
        return h

    def get(self, path: str, token: bool = True, **params: Any) -> httpx.Response:
        """``GET base_url + path`` with ``params``."""
        return self.http.get(self.base_url + path, params=params, headers=self.headers(token=token))

    def post(
        self, path: str, body: Any = None, token: bool = True, **headers: str
    ) -> httpx.Response:
        """``POST base_url + path`` with the JSON ``body`` (``{}`` by default)."""
        return self.http.post(
            self.base_url + path,
            json={} if body is None else body,
            headers=self.headers(token=token, **headers),
        )

    def ok(self, path: str, body: Any = None, **params: Any) -> Any:
        """The JSON of a GET (``body`` None) or POST that must answer 200."""
        r = self.get(path, **params) if body is None else self.post(path, body)
        assert r.status_code == 200, (path, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json")
        return r.json()

    def close(self) -> None:
        """Stop the dashboard; close the client."""
        self.http.close()
        self.service.stop()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardProc]:
    """``chronoq dashboard`` (token required) on a ``rocksdb://`` directory this test
    process owns, with a trace directory; one per test module."""
    root = tmp_path_factory.mktemp("dashboard")
    data = root / "data"
    trace = root / "trace"
    trace.mkdir()
    broker = open_broker(f"rocksdb://{data}")
    app = make_app(broker)
    token = secrets.token_urlsafe(16)
    try:
        service, base = start_dashboard(
            f"rocksdb://{data}", root / "dashboard.log", "--trace-dir", str(trace), token=token
        )
    except BaseException:
        app.close()
        broker.close()
        raise
    proc = DashboardProc(base, broker, app, token, service, data)
    try:
        yield proc
    finally:
        proc.close()
        app.close()
        broker.close()


def ids(items: Sequence[dict[str, Any]]) -> list[str]:
    """The ``msg_id`` of each item."""
    return [i["msg_id"] for i in items]


__all__ = ["CHRONOQ", "DashboardProc", "ids", "make_app", "start_dashboard"]
