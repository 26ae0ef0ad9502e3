"""Per-job limits (workers.limits) on a real Dispatcher and broker: a run over its
job's ``rate_limit`` or ``max_running`` waits (released, no attempt counted), every
run still runs exactly once, the limit holds, other jobs pass it, the waiting does
not spin, and a slot is held until the body returns (renewed while it runs)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker_adapter.results import ReceivedMessage
from scheduler.errors import InvalidJobSpec
from scheduler.limits import RateLimit
from scheduler.scheduler import Scheduler
from workers import Dispatcher, current_job
from workers.hooks import DispatchHook
from workers.limits import LIMIT_PREFIX, JobLimits, job_limits
from workers.runs import Run
from workers.settlement import Settlement
from workers.testing import ChronoqKit

pytestmark = pytest.mark.timeout(120)


class Settled(DispatchHook):
    """Counts settlements per job and kind (any thread)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str | None, Settlement]] = Counter()
        self._lock = threading.Lock()

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        with self._lock:
            self.counts[(job, settlement)] += 1

    def of(self, job: str, settlement: Settlement) -> int:
        return self.counts[(job, settlement)]


class Log:
    """What the jobs record: (name, arg, attempt, start, end) per run (any thread)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, Any, int, float, float]] = []
        self._lock = threading.Lock()

    def run(self, name: str, arg: Any, seconds: float = 0.0) -> None:
        start = time.monotonic()
        if seconds:
            time.sleep(seconds)
        with self._lock:
            self.rows.append((name, arg, current_job().message.attempts, start, time.monotonic()))

    def of(self, name: str) -> list[tuple[str, Any, int, float, float]]:
        with self._lock:
            return [r for r in self.rows if r[0] == name]


@pytest.fixture(params=["memory", "rocksdb"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scheduler]:
    """A Scheduler on memory:// or a rocksdb:// directory, with the system clock
    (waits are real time)."""
    url = f"memory://{tmp_path.name}" if request.param == "memory" else f"rocksdb://{tmp_path}/d"
    scheduler = Scheduler(url, max_workers=4, prefetch=8)
    yield scheduler
    scheduler.close()


@contextmanager
def dispatching(app: Scheduler, *hooks: DispatchHook, **options: Any) -> Iterator[Dispatcher]:
    """A real Dispatcher running in a thread for the block."""
    dispatcher = Dispatcher(app, hooks=hooks, **options)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run_forever, kwargs={"stop_event": stop})
    thread.start()
    try:
        yield dispatcher
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: still false after {timeout} s"
        time.sleep(0.01)


def max_overlap(rows: list[tuple[str, Any, int, float, float]]) -> int:
    """The most runs going at one time, from their (start, end) times."""
    events = sorted([(r[3], 1) for r in rows] + [(r[4], -1) for r in rows])
    best = now = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        best = max(best, now)
    return best


def most_in_window(starts: list[float], window_s: float) -> int:
    """The most starts within any ``window_s`` long interval."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_a_rate_limited_backlog_runs_once_each_within_the_rate_and_does_not_spin(
    app: Scheduler,
) -> None:
    log, settled = Log(), Settled()

    @app.job(name="limits.rated", rate_limit="10/s", max_attempts=1)
    def rated(n: int) -> None:
        log.run("rated", n)

    # Given 40 runs due at once and a limit of 10/s (bursts of up to 10)
    rated.schedule_many([((n,), {}) for n in range(40)])
    with dispatching(app, settled):
        wait_for(lambda: len(log.of("rated")) == 40, 30, "all 40 ran")
    rows = log.of("rated")
    # Then each ran exactly once, on its first attempt, none failed or dead-lettered
    assert sorted(r[1] for r in rows) == list(range(40))
    assert {r[2] for r in rows} == {1}
    assert settled.of("limits.rated", Settlement.ACK) == 40
    assert settled.of("limits.rated", Settlement.DEAD) == 0
    assert settled.of("limits.rated", Settlement.RETRY) == 0
    # And no 1 s window saw more than the rate plus its burst (10 + 10), with margin
    starts = [r[3] for r in rows]
    assert most_in_window(starts, 1.0) <= 22
    # And the 30 that waited were not re-delivered in a loop: one dispatcher spaces
    # them by the limit's interval, so a handful of returns each at most
    waits = settled.of("limits.rated", Settlement.DEFER)
    assert 30 <= waits <= 90, waits


def test_max_running_holds_and_the_waiting_do_not_spin(app: Scheduler) -> None:
    log, settled = Log(), Settled()

    @app.job(name="limits.heavy", max_running=2, max_attempts=1)
    def heavy(n: int) -> None:
        log.run("heavy", n, 0.1)

    heavy.schedule_many([((n,), {}) for n in range(16)])
    with dispatching(app, settled) as dispatcher:
        wait_for(lambda: len(log.of("heavy")) == 16, 30, "all 16 ran")
        wait_for(
            lambda: dispatcher.processed >= 16 + settled.of("limits.heavy", Settlement.DEFER),
            5,
            "settled",
        )
    rows = log.of("heavy")
    assert sorted(r[1] for r in rows) == list(range(16))
    assert {r[2] for r in rows} == {1}
    # The limit held, and was used (4 workers would have run 4 at once)
    assert max_overlap(rows) == 2
    # Every slot was given back
    assert [
        app.broker.acquire_slot(LIMIT_PREFIX + "limits.heavy", 2, f"probe{i}", 1000)
        for i in range(3)
    ] == [True, True, False]
    # ~0.8 s of waiting for 14 runs, spaced by held time / max_running (~50 ms)
    waits = settled.of("limits.heavy", Settlement.DEFER)
    assert 14 <= waits <= 14 * 8, waits


def test_a_job_at_its_limit_does_not_hold_up_other_jobs(app: Scheduler) -> None:
    log, settled = Log(), Settled()
    gate = threading.Event()

    @app.job(name="limits.one_at_a_time", max_running=1)
    def blocked(n: int) -> None:
        gate.wait(20)
        log.run("blocked", n)

    @app.job(name="limits.free")
    def free(n: int) -> None:
        log.run("free", n)

    # The limited job's messages come first in the topic, the free ones after
    blocked.schedule_many([((n,), {}) for n in range(20)])
    free.schedule_many([((n,), {}) for n in range(20)])
    with dispatching(app, settled):
        wait_for(lambda: len(log.of("free")) == 20, 20, "every free run ran")
        assert log.of("blocked") == []  # one holds the slot; 19 wait, nothing ran yet
        gate.set()
        wait_for(lambda: len(log.of("blocked")) == 20, 30, "every blocked run ran")
    assert settled.of("limits.free", Settlement.DEFER) == 0
    assert {r[2] for r in log.rows} == {1}


def test_a_timed_out_body_keeps_its_slot_until_it_returns(app: Scheduler) -> None:
    log, settled = Log(), Settled()
    began = threading.Event()

    @app.job(name="limits.stuck", max_running=1, timeout=0.2, max_attempts=1)
    def stuck(n: int) -> None:
        if n == 0:
            began.set()
        log.run("stuck", n, 0.8 if n == 0 else 0.0)  # ignores its cancel event

    stuck.schedule(0)
    with dispatching(app, settled):
        assert began.wait(10)
        # Run 0 timed out (its message dead-lettered) while its body still runs
        wait_for(lambda: settled.of("limits.stuck", Settlement.DEAD) == 1, 5, "timed out")
        stuck.schedule(1)
        wait_for(lambda: len(log.of("stuck")) == 2, 10, "both ran")
    first, second = sorted(log.of("stuck"), key=lambda r: r[1])
    assert second[3] >= first[4]  # run 1 started only after run 0's body returned


def test_a_slot_is_renewed_while_its_run_goes_on(app: Scheduler) -> None:
    log = Log()

    @app.job(name="limits.long", max_running=1)
    def long(n: int) -> None:
        log.run("long", n, 2.0 if n == 0 else 0.0)

    long.schedule(0)
    # Invisible time (and so the slot's lease) of 1 s: the run outlives two leases
    with dispatching(app, invisible_ms=1000):
        wait_for(lambda: current_holders(app, "limits.long") == 0, 5, "slot taken")
        long.schedule(1)
        wait_for(lambda: len(log.of("long")) == 2, 15, "both ran")
    first, second = sorted(log.of("long"), key=lambda r: r[1])
    assert second[3] >= first[4]


def current_holders(app: Scheduler, job: str) -> int:
    """0 when the job's only slot is held by someone (a probe could not take it)."""
    name = LIMIT_PREFIX + job
    if app.broker.acquire_slot(name, 1, "probe", 1):
        app.broker.release_slot(name, "probe")
        return 1
    return 0


def test_the_slot_of_a_dead_holder_frees_when_its_lease_expires(app: Scheduler) -> None:
    log = Log()

    @app.job(name="limits.after_crash", max_running=1)
    def after_crash() -> None:
        log.run("after_crash", None)

    # A dispatcher killed while its run held the only slot, with 0.6 s left on its lease
    # (timed from before the acquire: a pause of this thread after it would count
    # against the wait the run must show)
    began = time.monotonic()
    assert app.broker.acquire_slot(LIMIT_PREFIX + "limits.after_crash", 1, "dead/1@x", 600)
    after_crash.schedule()
    with dispatching(app):
        wait_for(lambda: len(log.of("after_crash")) == 1, 10, "it ran")
    assert log.of("after_crash")[0][3] - began >= 0.55  # waited for the lease, then ran


def test_jobs_without_limits_get_no_hook_and_no_broker_call(
    app: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()

    @app.job(name="limits.plain")
    def plain(n: int) -> None:
        log.run("plain", n)

    assert job_limits(app.broker, list(app.registry)) is None
    dispatcher = Dispatcher(app)
    assert not any(isinstance(h, JobLimits) for h in dispatcher.open().calls.hooks)
    dispatcher.close()

    @app.job(name="limits.limited", rate_limit="1000/s")
    def limited(n: int) -> None:
        log.run("limited", n)

    calls: list[str] = []
    real = app.broker.acquire_rate

    def counting(bucket: str, limit: int, period_ms: int) -> int:
        calls.append(bucket)
        return real(bucket, limit, period_ms)

    monkeypatch.setattr(app.broker, "acquire_rate", counting)
    plain.schedule_many([((n,), {}) for n in range(5)])
    limited.schedule_many([((n,), {}) for n in range(3)])
    with dispatching(app) as d:
        assert any(isinstance(h, JobLimits) for h in d.open().calls.hooks)
        wait_for(lambda: len(log.rows) == 8, 10, "all ran")
    assert calls == [LIMIT_PREFIX + "limits.limited"] * 3


def test_a_cron_run_over_its_rate_limit_waits(app: Scheduler) -> None:
    log = Log()

    @app.cron("* * * * * *", name="limits.every_second", rate_limit="1/m")
    def every_second() -> None:
        log.run("every_second", None)

    # The bucket is empty: the cron's occurrence waits instead of running or failing
    name = LIMIT_PREFIX + "limits.every_second"
    assert app.broker.acquire_rate(name, 1, 60_000) == 0
    settled = Settled()
    with dispatching(app, settled):
        app.planner.arm_all()
        wait_for(
            lambda: settled.of("limits.every_second", Settlement.DEFER) >= 1, 10, "a cron wait"
        )
    assert log.of("every_second") == []
    assert settled.of("limits.every_second", Settlement.DEAD) == 0


def test_under_the_testing_kit_a_rate_limited_job_waits_in_manual_time(tmp_path: Path) -> None:
    app = Scheduler(f"memory://{tmp_path.name}-kit")

    @app.job(name="limits.kit", rate_limit="2/s")
    def paced(n: int) -> None: ...

    with ChronoqKit(app) as kit:
        paced.schedule_many([((n,), {}) for n in range(6)])
        kit.run_until_idle()
        assert len(kit.ran) == 2  # the burst; the other 4 wait for the clock
        assert len(kit.pending(paced)) == 4
        kit.advance(seconds=5)  # permits come back every 0.5 s of the kit's clock
        assert sorted(r.args[0] for r in kit.ran) == list(range(6))
        assert {r.attempt for r in kit.ran} == {1}
        assert kit.pending(paced) == []
    app.close()


@pytest.mark.parametrize(
    ("text", "limit", "period_ms", "shown"),
    [
        ("100/s", 100, 1_000, "100/s"),
        (" 30 / m ", 30, 60_000, "30/m"),
        ("1000/hour", 1_000, 3_600_000, "1000/h"),
        ("5/10s", 5, 10_000, "5/10s"),
        ("7/90sec", 7, 90_000, "7/90s"),
    ],
)
def test_rate_limit_texts(text: str, limit: int, period_ms: int, shown: str) -> None:
    rate = RateLimit.parse(text)
    assert (rate.limit, rate.period_ms, str(rate)) == (limit, period_ms, shown)
    assert rate.interval_ms == period_ms / limit
    assert RateLimit.parse(rate) is rate


@pytest.mark.parametrize("bad", ["", "0/s", "10/0s", "10", "10/d", "-1/s", "ten/s", 10, 2.5])
def test_a_bad_rate_limit_or_max_running_registers_nothing(tmp_path: Path, bad: object) -> None:
    app = Scheduler(f"memory://{tmp_path.name}-bad")
    with pytest.raises(InvalidJobSpec, match="rate_limit"):
        app.job(name="limits.bad", rate_limit=bad)(lambda: None)  # type: ignore[call-overload]
    wrong: tuple[Any, ...] = (0, -1, 1.5, "2", True)
    for n in wrong:
        with pytest.raises(InvalidJobSpec, match="max_running"):
            app.job(name="limits.bad", max_running=n)(lambda: None)
    assert app.registry.find("limits.bad") is None
    app.close()
