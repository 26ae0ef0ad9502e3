"""Scheduler: construction, settings, the broker's life, decorators, topics, run()."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock, SystemClock
from broker_adapter.errors import BrokerClosed
from scheduler import JobHandle, Scheduler, Settings
from scheduler.errors import DuplicateJob, InvalidJobSpec, InvalidSettings, JobNotFound
from scheduler.runners import app_runner, set_app_runner
from scheduler.spec import RetryPolicy


def test_settings_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CHRONOQ_BROKER_URL", f"rocksdb://{tmp_path}/env")
    monkeypatch.setenv("CHRONOQ_TOPIC", "shop.jobs")
    app = Scheduler()
    assert app.settings.broker_url == f"rocksdb://{tmp_path}/env"
    assert app.settings.topic == "shop.jobs"
    assert isinstance(app.clock, SystemClock)


def test_default_broker_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHRONOQ_BROKER_URL", raising=False)
    assert Scheduler().settings.broker_url == "rocksdb://./chronoq-data"


def test_broker_url_and_overrides_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CHRONOQ_BROKER_URL", "rocksdb://./elsewhere")
    app = Scheduler(f"rocksdb://{tmp_path}/d", topic="t1", max_workers=3)
    assert app.settings.broker_url == f"rocksdb://{tmp_path}/d"
    assert (app.settings.topic, app.settings.max_workers) == ("t1", 3)


def test_explicit_settings_with_overrides() -> None:
    base = Settings(broker_url="rocksdb://./x", topic="a")
    app = Scheduler(settings=base, topic="b")
    assert app.settings == Settings(broker_url="rocksdb://./x", topic="b")
    assert Scheduler("rocksdb://./y", settings=base).settings.broker_url == "rocksdb://./y"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"broker": "nope"},
        {"broker": "ftp://host/x"},
        {"max_workers": 0},
        {"topic": "bad topic"},
        {"no_such_setting": 1},
        {"settings": Settings(), "no_such_setting": 1},
        {"settings": Settings(), "prefetch": -1},
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidSettings):
        Scheduler(**kwargs)  # type: ignore[arg-type]


def test_bad_broker_or_settings_type() -> None:
    with pytest.raises(TypeError, match="broker="):
        Scheduler(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="settings="):
        Scheduler(settings={"topic": "x"})  # type: ignore[arg-type]


def test_broker_opens_lazily_with_the_clock_and_closes_with_the_scheduler(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    app = Scheduler(f"rocksdb://{data_dir}", clock=manual_clock)

    @app.job
    def noop() -> None: ...

    assert not data_dir.exists()  # decorating touched no broker
    broker = app.broker
    assert data_dir.exists() and app.broker is broker
    job = noop.schedule(delay=5)
    assert job.deliver_at_ms == manual_clock.now_ms() + 5000  # the broker runs on our clock
    app.close()
    app.close()  # twice is harmless
    with pytest.raises(BrokerClosed):
        broker.stats()
    with pytest.raises(BrokerClosed):
        _ = app.broker


def test_a_given_broker_is_used_as_given_and_left_open(
    data_dir: Path, manual_clock: ManualClock
) -> None:
    with open_broker(f"rocksdb://{data_dir}", clock=manual_clock) as broker:
        with Scheduler(broker, clock=manual_clock) as app:
            assert app.broker is broker
        assert broker.stats().pending == 0  # still open
        with pytest.raises(BrokerClosed):
            _ = app.broker


def test_job_registers_a_spec_and_stays_callable(app: Scheduler) -> None:
    @app.job
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    @app.job(
        name="shop.close",
        executor="celery",
        max_attempts=3,
        timeout=5,
        topic="shop",
        queue="q1",
        retry=RetryPolicy.fixed(2),
    )
    def close(order_id: int) -> str:
        return f"closed {order_id}"

    assert isinstance(add, JobHandle)
    assert add(2, b=3) == 5 and close(7) == "closed 7"
    assert add.__name__ == "add" and add.__doc__ == "Add two numbers."
    assert add.name == f"{__name__}.test_job_registers_a_spec_and_stays_callable.<locals>.add"
    spec = app.registry.get("shop.close")
    assert (spec.executor, spec.max_attempts, spec.timeout, spec.topic, spec.queue) == (
        "celery",
        3,
        5.0,
        "shop",
        "q1",
    )
    assert spec.retry.backoff_ms(1) == 2000
    assert close.spec is spec and close.topic == "shop" and close.cron is None
    assert app.handle("shop.close") is close
    with pytest.raises(JobNotFound, match="did you mean"):
        app.handle("shop.clos")


def test_job_decoration_errors(app: Scheduler) -> None:
    @app.job(name="taken")
    def first() -> None: ...

    with pytest.raises(DuplicateJob):

        @app.job(name="taken")
        def second() -> None: ...

    with pytest.raises(InvalidJobSpec):
        app.job(executor="gpu")(first)
    with pytest.raises(InvalidJobSpec):
        app.job(max_attempts=0)(first)
    with pytest.raises(TypeError, match="by keyword"):
        app.job("a.name")  # type: ignore[call-overload]


def test_topics_are_the_default_plus_what_jobs_name(app: Scheduler) -> None:
    assert app.topics() == {"chronoq.jobs"}

    @app.job(topic="billing")
    def charge() -> None: ...

    @app.cron("@daily", topic="nightly")
    def cleanup() -> None: ...

    assert app.topics() == {"chronoq.jobs", "billing", "nightly"}


def test_run_hands_the_app_to_the_registered_runner(app: Scheduler) -> None:
    calls: list[tuple[object, object]] = []

    def fake(a: Scheduler, /, *, stop_event: threading.Event | None = None) -> None:
        calls.append((a, stop_event))

    previous = set_app_runner(fake)
    try:
        stop = threading.Event()
        app.run(stop_event=stop)
    finally:
        set_app_runner(previous)
    assert calls == [(app, stop)]


def test_importing_workers_registers_its_runner() -> None:
    import workers

    assert app_runner() is workers.run_app


def _run_script(code: str, tmp_path: Path) -> list[str]:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code, f"rocksdb://{tmp_path / 'data'}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    return out.stdout.splitlines()


def test_run_without_importing_workers_finds_the_declared_runner(tmp_path: Path) -> None:
    code = (
        "import sys, threading, scheduler\n"
        "app = scheduler.Scheduler(sys.argv[1])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'workers'))\n"
        "stop = threading.Event()\n"
        "stop.set()\n"
        "app.run(stop_event=stop)\n"
        "print('workers.runner' in sys.modules)\n"
    )
    before, after = _run_script(code, tmp_path)
    assert before == "[]"  # the scheduler imported no workers module by itself
    assert after == "True"  # app.run() ran through the runner pyproject.toml declares


def test_run_without_any_runner_says_what_to_do(tmp_path: Path) -> None:
    code = (
        "import sys, scheduler, scheduler.runners as r\n"
        "r.entry_points = lambda group: []  # an install that declares no runner\n"
        "app = scheduler.Scheduler(sys.argv[1])\n"
        "try:\n"
        "    app.run()\n"
        "except scheduler.NoAppRunner as e:\n"
        "    print(type(e).__name__, e)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'workers'))\n"
    )
    first, second = _run_script(code, tmp_path)
    assert first.startswith("NoAppRunner ") and "import workers" in first
    assert "chronoq run module:app" in first
    assert second == "[]"


def test_importing_scheduler_imports_no_workers_celery_or_spark() -> None:
    import subprocess

    code = (
        "import sys, scheduler; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('workers', 'celery', 'pyspark', 'rocksdict')]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"
