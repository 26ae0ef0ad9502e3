"""The dashboard against a ``chronoq://`` server and a ``redis://`` broker: one
smoke test each (overview, search, abort checked through the broker)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import cast

import httpx

from broker_adapter import BrokerAdapter, MessageState, open_broker
from broker_adapter.urls import ADAPTERS
from tests.dashboard.conftest import make_app, start_dashboard
from tests.server.serverproc import ServerProcess
from workers.dashboard.context import broker_kind


def _smoke(url: str, broker: BrokerAdapter, kind: str, log: Path) -> None:
    app = make_app(broker)
    service, base = start_dashboard(url, log, token="smoke")
    try:
        close = app.handle("shop.close_order")
        sent = [
            close.schedule(n, delay=timedelta(hours=1, minutes=n), key=f"b:{n}") for n in range(3)
        ]
        h = {"X-Chronoq-Token": "smoke"}
        with httpx.Client(timeout=30, headers=h) as http:
            assert http.get(base + "api/config").json()["broker_kind"] == kind
            overview = http.get(base + "api/overview").json()
            topics = {t["topic"]: t for t in overview["topics"]}
            assert topics[close.topic]["pending"] == 3
            items = http.get(base + "api/messages", params={"key_prefix": "b:"}).json()["items"]
            assert [i["msg_id"] for i in items] == [s.msg_id for s in sent]
            assert [i["args"] for i in items] == [[0], [1], [2]]
            by_job = http.get(base + "api/messages", params={"job": "shop.close_order"}).json()
            assert len(by_job["items"]) == 3
            r = http.post(base + f"api/messages/{sent[1].msg_id}/abort", json={})
            assert r.json()["status"] == "ABORTED"
        view = broker.query(sent[1].msg_id)
        assert view is not None and view.state is MessageState.ABORTED
    finally:
        service.stop()
        app.close()


def test_dashboard_on_a_chronoq_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with open_broker(server.url) as broker:
            _smoke(server.url, broker, "chronoq", tmp_path / "dashboard.log")
    finally:
        server.stop()


def test_dashboard_on_redis(redis_url: str, tmp_path: Path) -> None:
    with open_broker(redis_url) as broker:
        _smoke(redis_url, broker, "redis", tmp_path / "dashboard.log")


NO_BROKER = cast(BrokerAdapter, None)  # a URL decides the kind; the broker is not read


def test_every_shipped_scheme_has_its_broker_kind() -> None:
    # derived from the URL table, so a new scheme (chronoq+unix://) is not "other"
    assert {scheme: broker_kind(NO_BROKER, f"{scheme}://x") for scheme in ADAPTERS} == {
        "rocksdb": "rocksdb",
        "memory": "memory",
        "chronoq": "chronoq",
        "chronoq+unix": "chronoq",
        "redis": "redis",
        "rediss": "redis",
        "redis+cluster": "redis",
        "redis+sentinel": "redis",
    }
    assert broker_kind(NO_BROKER, "kafka://x") == "other"
