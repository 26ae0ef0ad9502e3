"""``chronoq dashboard`` as users run it: its one stdout line, ``--port``, the refusal
of a non-loopback address without a token, the missing extra; and
``workers.dashboard.create_app`` mounted under a prefix in a FastAPI app served by
uvicorn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from broker_adapter import MessageState, open_broker
from broker_adapter.errors import InvalidArgument
from tests.dashboard.conftest import CHRONOQ, make_app, start_dashboard
from tests.examples.webapps import ROOT, Service, free_port, python_env
from tests.helpers import eventually, python_without, stop_process

LINE = re.compile(r"chronoq dashboard listening on http://127\.0\.0\.1:(\d+)\n")


def _env() -> dict[str, str]:
    env = python_env()
    env.pop("CHRONOQ_TOKEN", None)
    return env


def test_prints_exactly_one_line_and_port_zero_picks_a_free_port(tmp_path: Path) -> None:
    with (tmp_path / "err.log").open("wb") as err:
        proc = subprocess.Popen(
            [CHRONOQ, "dashboard", "--url", "memory://", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            env=_env(),
            cwd=tmp_path,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = LINE.fullmatch(line)
        assert m is not None, line
        port = int(m.group(1))
        assert port not in (0, 7440)
        r = httpx.get(f"http://127.0.0.1:{port}/api/config", timeout=30)
        assert r.json()["broker_kind"] == "memory" and r.json()["token_required"] is False
    finally:
        code = stop_process(proc)
    assert code == 0
    assert proc.stdout.read() == ""  # nothing but the one line
    proc.stdout.close()


def test_port_option_is_the_port_it_listens_on(tmp_path: Path) -> None:
    port = free_port()
    service, base = start_dashboard("memory://", tmp_path / "d.log", "--port", str(port))
    try:
        assert base == f"http://127.0.0.1:{port}/"
        assert httpx.get(base + "api/overview", timeout=30).status_code == 200
    finally:
        service.stop()


def test_a_non_loopback_host_without_a_token_is_refused(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::"):
        out = subprocess.run(
            [CHRONOQ, "dashboard", "--url", "memory://", "--host", host, "--port", "0"],
            check=False,
            capture_output=True,
            text=True,
            env=_env(),
            cwd=tmp_path,
            timeout=60,
        )
        assert out.returncode == 2, out
        assert out.stdout == ""
        assert "not a loopback address" in out.stderr and "--token" in out.stderr


def test_a_wildcard_host_with_a_token_serves_only_with_the_token(tmp_path: Path) -> None:
    service, base = start_dashboard(
        "memory://", tmp_path / "d.log", "--host", "0.0.0.0", token="wild-token"
    )
    try:
        assert base.startswith("http://0.0.0.0:")
        local = base.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(local + "api/overview", timeout=30).status_code == 401
        r = httpx.get(local + "api/overview", headers={"X-Chronoq-Token": "wild-token"})
        assert r.status_code == 200
    finally:
        service.stop()
    assert "wild-token" not in service.output()


def test_without_the_dashboard_extra_it_names_the_pip_line() -> None:
    code = (
        "import contextlib, io, sys\n"
        "import workers, workers.cli, workers.dashboard\n"
        "print('fastapi' in sys.modules)\n"
        "from workers.cli import main\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    rc = main(['dashboard', '--url', 'memory://', '--port', '0'])\n"
        "print(rc)\n"
        "print(err.getvalue().strip())\n"
        "from broker_adapter.errors import MissingExtra\n"
        "from workers.dashboard import create_app\n"
        "try:\n"
        "    create_app('memory://')\n"
        "except MissingExtra as e:\n"
        "    print('MissingExtra', e)\n"
    )
    lines = python_without("fastapi", code).splitlines()
    assert lines[0] == "False"  # importing workers (and its CLI) needs no FastAPI
    assert lines[1] == "2"
    assert "pip install 'chronoq[dashboard]'" in lines[2], lines
    assert lines[3].startswith("MissingExtra") and "chronoq[dashboard]" in lines[3]


MOUNTED = """
import os

from fastapi import FastAPI

from workers.dashboard import create_app

app = FastAPI()
app.mount("/chronoq", create_app(url=os.environ["DASH_URL"], token=os.environ["DASH_TOKEN"]))


@app.get("/hello")
def hello() -> dict[str, str]:
    return {"hello": "world"}
"""


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[str, object]]:
    """A FastAPI app mounting the dashboard at ``/chronoq``, under uvicorn, on a
    ``rocksdb://`` directory this process owns; ``(base URL, broker)``."""
    (tmp_path / "mounted_app.py").write_text(MOUNTED)
    data = tmp_path / "data"
    broker = open_broker(f"rocksdb://{data}")
    port = free_port()
    env = dict(
        python_env(DASH_URL=f"rocksdb://{data}", DASH_TOKEN="mount-token"),
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )
    argv = [sys.executable, "-m", "uvicorn", "mounted_app:app", "--port", str(port)]
    service = Service("uvicorn", argv, env, tmp_path, tmp_path / "uvicorn.log")
    try:
        service.wait_for_output("Application startup complete")
        yield f"http://127.0.0.1:{port}", broker
    finally:
        service.stop()
        broker.close()


def test_create_app_mounted_under_a_prefix(mounted: tuple[str, object]) -> None:
    base, broker = mounted
    app = make_app(broker)  # type: ignore[arg-type]
    try:
        sent = app.handle("shop.close_order").schedule(3, delay=timedelta(hours=1), key="m:3")
        token = {"X-Chronoq-Token": "mount-token"}
        with httpx.Client(timeout=30) as http:
            assert http.get(f"{base}/hello").json() == {"hello": "world"}
            assert http.get(f"{base}/chronoq/api/overview").status_code == 401
            r = http.get(f"{base}/chronoq/api/messages", params={"key_prefix": "m:"}, headers=token)
            assert r.status_code == 200
            assert [i["msg_id"] for i in r.json()["items"]] == [sent.msg_id]
            assert "default-src 'self'" in r.headers["content-security-policy"]
            page = http.get(f"{base}/chronoq/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert http.get(f"{base}/chronoq/static/favicon.svg").status_code == 200
            r = http.post(
                f"{base}/chronoq/api/messages/{sent.msg_id}/abort",
                json={},
                headers={**token, "Origin": base},
            )
            assert r.json()["status"] == "ABORTED"
            r = http.post(
                f"{base}/chronoq/api/messages/{sent.msg_id}/abort",
                json={},
                headers={**token, "Origin": "http://evil.example"},
            )
            assert r.status_code == 403
            assert http.get(f"{base}/chronoq/openapi.json").status_code == 200
        view = broker.query(sent.msg_id)  # type: ignore[attr-defined]
        assert view is not None and view.state is MessageState.ABORTED
    finally:
        app.close()


def test_create_app_on_a_broker_object_served_in_this_process() -> None:
    import uvicorn

    from workers.dashboard import create_app

    broker = open_broker("memory://")
    port = free_port()
    app = create_app(broker=broker)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}/"
        eventually(lambda: server.started, timeout=30, what="uvicorn started")
        sent = make_app(broker).handle("shop.remind").schedule("hi", delay=3600, key="o:1")
        with httpx.Client(timeout=30) as http:
            assert http.get(base + "api/config").json()["broker_kind"] == "memory"
            doc = http.get(base + f"api/messages/{sent.msg_id}").json()
            assert doc["args"] == ["hi"] and doc["key"] == "o:1"
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()
    assert broker.query(sent.msg_id) is not None  # a broker passed in is left open
    broker.close()
    with pytest.raises(InvalidArgument):
        create_app()
    with pytest.raises(InvalidArgument):
        create_app("memory://", broker=broker)


def test_the_dashboard_takes_a_directory_over_when_its_owner_leaves(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner = open_broker(f"rocksdb://{data}")
    app = make_app(owner)
    sent = app.handle("shop.close_order").schedule(5, delay=timedelta(hours=1), key="own:5")
    service, base = start_dashboard(f"rocksdb://{data}", tmp_path / "d.log")
    try:
        with httpx.Client(timeout=30) as http:
            assert http.get(base + f"api/messages/{sent.msg_id}").json()["args"] == [5]
            app.close()
            owner.close()  # e.g. chronoq run restarting: the dashboard owns it now

            def answers() -> bool:
                r = http.get(base + "api/messages", params={"key": "own:5"})
                return r.status_code == 200 and [i["msg_id"] for i in r.json()["items"]] == [
                    sent.msg_id
                ]

            eventually(answers, timeout=30, what="the dashboard answers after the takeover")
            r = http.post(base + f"api/messages/{sent.msg_id}/abort", json={})
            assert r.json()["status"] == "ABORTED"
    finally:
        service.stop()
        app.close()
        owner.close()
    with open_broker(f"rocksdb://{data}") as again:
        view = again.query(sent.msg_id)
        assert view is not None and view.state is MessageState.ABORTED
