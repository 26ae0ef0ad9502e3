"""The dashboard against a ``chronoq://`` server and a ``redis://`` broker: one
smoke test each (overview, search, abort checked through the broker)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx

from broker_adapter import BrokerAdapter, MessageState, open_broker
from tests.dashboard.conftest import make_app, start_dashboard
from tests.server.serverproc import ServerProcess


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
