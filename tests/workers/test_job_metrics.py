"""Job metrics from a dispatcher: a real ``chronoq run --metrics-port`` process runs
succeeding and failing jobs (retried once, then dead-lettered with
``max_attempts=2``), and ``/metrics``, scraped over HTTP, counts each of them
exactly. Off loopback the endpoint needs a token; without the ``metrics`` extra
it is a MissingExtra naming the pip line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.errors import InvalidArgument
from broker_adapter.metrics_http import serve_metrics
from scheduler.scheduler import Scheduler
from tests.helpers import eventually, python_without, stop_process
from workers.dispatcher import Dispatcher
from workers.job_metrics import JobMetrics
from workers.job_stats import STATS_HORIZON_MS, STATS_TOPIC, read_job_stats

pytestmark = pytest.mark.timeout(120)

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]
OK, BAD = 5, 3  # runs of the succeeding job, of the failing one

APP = textwrap.dedent(
    """
    import time

    from scheduler.scheduler import Scheduler
    from scheduler.spec import RetryPolicy
    from workers.runner import on_start

    app = Scheduler()


    @app.job(name="m.ok")
    def ok(n: int) -> None:
        time.sleep(0.02)


    @app.job(name="m.bad", max_attempts=2, retry=RetryPolicy(delays_ms=(100,)))
    def bad(n: int) -> None:
        raise ValueError(f"bad {n}")


    @app.job(name="m.idle")
    def idle() -> None: ...


    @on_start(app)
    def go() -> None:
        for n in range(5):
            ok.schedule(n)
        for n in range(3):
            bad.schedule(n, delay=0.2)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """``/metrics`` as ``{'name{labels}': value}`` (comments dropped)."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


@pytest.fixture
def run_proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """``chronoq run metrics_app:app --metrics-port P`` on a rocksdb:// dir of its own."""
    (tmp_path / "metrics_app.py").write_text(APP)
    port = _free_port()
    log = tmp_path / "run.log"
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'data'}",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [CHRONOQ, "run", "metrics_app:app", "--metrics-port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield proc, f"http://127.0.0.1:{port}/metrics", log
    finally:
        stop_process(proc)


def test_a_running_dispatcher_counts_each_job_exactly(
    run_proc: tuple[subprocess.Popen[str], str, Path],
) -> None:
    proc, url, log = run_proc
    # Given: the app scheduled 5 runs that succeed and 3 that fail twice
    eventually(lambda: "job metrics on http://127.0.0.1:" in log.read_text(), 30, "endpoint up")

    # When: every run settled (the failing ones: retried once, then dead-lettered)
    def settled() -> dict[str, float] | None:
        m = _scrape(url)
        done = m.get('chronoq_job_dead_total{job="m.bad"}') == BAD
        return m if done and m.get('chronoq_job_succeeded_total{job="m.ok"}') == OK else None

    eventually(settled, 30, "every run settled")
    time.sleep(0.5)  # nothing more comes: the counts stay exact
    m = _scrape(url)

    # Then: the counters are exact, per job
    ok, bad = '{job="m.ok"}', '{job="m.bad"}'
    assert m[f"chronoq_job_started_total{ok}"] == OK
    assert m[f"chronoq_job_succeeded_total{ok}"] == OK
    assert m[f"chronoq_job_failed_total{ok}"] == 0
    assert m[f"chronoq_job_retried_total{ok}"] == 0
    assert m[f"chronoq_job_dead_total{ok}"] == 0
    assert m[f"chronoq_job_started_total{bad}"] == 2 * BAD
    assert m[f"chronoq_job_succeeded_total{bad}"] == 0
    assert m[f"chronoq_job_failed_total{bad}"] == 2 * BAD
    assert m[f"chronoq_job_retried_total{bad}"] == BAD
    assert m[f"chronoq_job_dead_total{bad}"] == BAD
    # And: one lateness and one run-time observation per attempt that started
    assert m[f"chronoq_job_lateness_seconds_count{ok}"] == OK
    assert m[f"chronoq_job_lateness_seconds_count{bad}"] == 2 * BAD
    assert m[f"chronoq_job_run_seconds_count{ok}"] == OK
    assert m[f"chronoq_job_run_seconds_count{bad}"] == 2 * BAD
    # m.ok sleeps 20 ms: none of its runs fits the 5 ms bucket, all fit +Inf
    assert m['chronoq_job_run_seconds_bucket{job="m.ok",le="0.005"}'] == 0
    assert m['chronoq_job_run_seconds_bucket{job="m.ok",le="+Inf"}'] == OK
    assert m[f"chronoq_job_run_seconds_sum{ok}"] >= OK * 0.02
    lateness_bounds = [
        k for k in m if k.startswith('chronoq_job_lateness_seconds_bucket{job="m.ok"')
    ]
    assert 'le="0.0005"' in lateness_bounds[0] and 'le="60.0"' in lateness_bounds[-2]
    # And: a job that never ran shows no series; nothing is in flight now
    assert not any('job="m.idle"' in k for k in m)
    assert m["chronoq_job_in_flight"] == 0 and m["chronoq_job_awaiting"] == 0
    assert proc.poll() is None


def test_off_loopback_the_endpoint_needs_the_token_and_nothing_binds_without_one() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("chronoq_probe", "probe", registry=registry).inc()
    # Given: no token for a non-loopback address: refused before binding
    port = _free_port()
    with pytest.raises(InvalidArgument, match="CHRONOQ_TOKEN"):
        serve_metrics(registry, port, "0.0.0.0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free
    # When: served on every address with a token
    endpoint = serve_metrics(registry, 0, "0.0.0.0", token="s3cret")
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        # Then: a scrape without it, or with another, gets 401; with it, the metrics
        for headers in ({}, {"Authorization": "Bearer nope"}):
            with pytest.raises(urllib.error.HTTPError) as e:
                _scrape(url, headers)
            assert e.value.code == 401
            e.value.close()
        got = _scrape(url, {"Authorization": "Bearer s3cret"})
        assert got["chronoq_probe_total"] == 1
    finally:
        endpoint.stop()


def test_chronoq_run_refuses_a_public_metrics_host_without_a_token(tmp_path: Path) -> None:
    # Given: the metrics port and a non-loopback host from the environment, no token
    (tmp_path / "metrics_app.py").write_text(APP)
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=f"rocksdb://{tmp_path / 'data'}",
        CHRONOQ_METRICS_PORT="0",
        CHRONOQ_METRICS_HOST="0.0.0.0",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("CHRONOQ_TOKEN", None)
    argv = [CHRONOQ, "run", "metrics_app:app"]
    out = subprocess.run(
        argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1, out.stderr
    assert "without a token" in out.stderr and "CHRONOQ_TOKEN" in out.stderr


#: Serves job metrics with ``prometheus_client`` unimportable; prints what it saw.
CHILD = r"""
import json
import sys

from broker_adapter.errors import MissingExtra
from scheduler.scheduler import Scheduler
from workers.job_metrics import JobMetrics

app = Scheduler(broker="memory://metrics")
seen = {}
try:
    JobMetrics(app, stats=False).serve(0)
except MissingExtra as e:
    seen["serve"] = [e.extra, str(e)]
seen["imported"] = "prometheus_client" in sys.modules
print(json.dumps(seen))
"""


def test_metrics_without_the_extra_are_a_missing_extra_naming_the_pip_line() -> None:
    seen = json.loads(python_without("prometheus_client", CHILD).splitlines()[-1])
    extra, text = seen["serve"]
    assert extra == "metrics" and "pip install 'chronoq[metrics]'" in text
    assert "job metrics endpoint" in text
    assert seen["imported"] is False


def test_in_process_counts_and_the_stats_record_on_the_apps_clock(
    app: Scheduler, manual_clock: ManualClock
) -> None:
    # Given: an app on a manual clock (years before the wall clock) and its dispatcher
    @app.job(name="p.ok")
    def ok() -> None: ...

    @app.job(name="p.bad", max_attempts=1)
    def bad() -> None:
        raise RuntimeError("no")

    metrics = JobMetrics(app)
    dispatcher = Dispatcher(app, hooks=[metrics])
    metrics.watch(dispatcher)
    ok.schedule()
    ok.schedule()
    bad.schedule()
    # When: they ran, and the dispatcher left (its stats are written on leaving)
    dispatcher.run_until_idle(timeout_s=10)
    dispatcher.close()
    # Then: the counts, per job
    snap = metrics.snapshot()
    assert snap["p.ok"][0] == [2, 2, 0, 0, 0]
    assert snap["p.bad"][0] == [1, 0, 1, 0, 1]
    assert sum(snap["p.ok"][1]) == 2 and sum(snap["p.bad"][3]) == 1
    assert metrics.gauges() == (0, 0)
    # And: one stats record, due an hour ahead on the broker's (the app's) clock
    (record,) = app.broker.find_pending(STATS_TOPIC).messages
    assert record.deliver_at_ms == manual_clock.now_ms() + STATS_HORIZON_MS
    (sample,) = read_job_stats(app.broker, since_ms=0)
    assert (sample.started, sample.succeeded, sample.failed, sample.dead) == (3, 2, 1, 1)
