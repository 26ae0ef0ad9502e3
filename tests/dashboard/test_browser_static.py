"""The dashboard's pages as shipped: the static files hold no external URL, no way
to turn data into markup and no inline script, pyproject ships all of them, and the
pages work mounted under a prefix in another ASGI app (relative URLs only), in a
real headless Chromium.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from broker_adapter import open_broker
from scheduler.scheduler import Scheduler
from tests.dashboard.browser import (
    Browser,
    browser_fixture,  # noqa: F401  (the module's ``browser`` fixture)
)
from tests.helpers import eventually
from tests.redis_server import free_port

STATIC = Path(__file__).resolve().parents[2] / "workers" / "dashboard" / "static"


def test_the_shipped_files_reference_nothing_outside_the_dashboard() -> None:
    # Given every file the package ships for the pages
    files = [p for p in STATIC.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"index.html", "main.js", "charts.js", "app.css"}
    for path in files:
        text = path.read_text(encoding="utf-8")
        # Then no absolute URL (the SVG namespace is a name, not a request) ...
        urls = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s\"'`)]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)
        # ... and no way to turn data into markup or code
        for banned in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ):
            assert banned not in text, (path.name, banned)
    # ... and the wheel takes every one of them (pyproject's package-data globs)
    data = tomllib.loads((STATIC.parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    globs = data["tool"]["setuptools"]["package-data"]["workers.dashboard"]
    for path in files:
        rel = path.relative_to(STATIC.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), (rel, globs)
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) is None  # no inline script
    assert re.search(r"\son[a-z]+\s*=", html) is None  # no inline handler
    assert " style=" not in html


@pytest.fixture
def mounted() -> Iterator[tuple[str, Scheduler]]:
    """``create_app`` mounted at ``/chronoq`` in a FastAPI app under uvicorn (a thread
    of this process, on a ``memory://`` broker, no token); its root URL and an app."""
    import uvicorn
    from fastapi import FastAPI

    from workers.dashboard import create_app

    broker = open_broker("memory://")
    app = Scheduler(broker)

    @app.job(name="shop.close_order")
    def close_order(order_id: int) -> None:
        """Close an unpaid order."""

    port = free_port()
    outer = FastAPI()
    dashboard_app = create_app(broker=broker, port=port)
    outer.mount("/chronoq", dashboard_app)
    server = uvicorn.Server(uvicorn.Config(outer, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="mounted-dashboard", daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started, 30, "uvicorn to start")
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        dashboard_app.state.chronoq_dashboard.close()
        app.close()
        broker.close()


def test_the_pages_work_mounted_under_a_prefix(
    browser: Browser, mounted: tuple[str, Scheduler]
) -> None:
    # Given the dashboard mounted at /chronoq/ in another app, and a pending job
    root, app = mounted
    receipt = app.handle("shop.close_order").schedule(9, delay=timedelta(hours=1), key="order:9")

    # When its pages are used there (no token configured: no sign-in form)
    browser.open(root + "/chronoq/#/overview")
    browser.wait_text("#card-pending .card-value", "1")
    browser.go("#/search?mode=key&key=order%3A9")
    browser.click(f"#results a[href='#/message/{receipt.msg_id}']")
    browser.wait_text("#detail-state", "PENDING")

    # Then every request stayed under the prefix (relative URLs only)
    urls = browser.requested_urls()
    outside = [u for u in urls if not u.startswith((root + "/chronoq/", "data:"))]
    assert urls and outside == [], outside
    assert browser.console_errors() == []
