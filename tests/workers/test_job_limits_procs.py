"""Per-job limits across processes: three ``chronoq run`` dispatchers on one broker
that all reach (a ``chronoq broker serve`` server, a redis-server). A rate limit and
a ``max_running`` hold for the app as a whole, every run runs exactly once on its
first attempt, the waiting is bounded (counted from each dispatcher's delivery
trace), and the slot of a dispatcher killed with -9 frees itself when its lease
expires."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.scheduler import Scheduler
from tests.helpers import eventually, stop_process
from tests.server.serverproc import ServerProcess

pytestmark = pytest.mark.timeout(300)

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]
DISPATCHERS = 3
RATE, RUNS = 20, 200  # a limit of 20/s (bursts of 20) and 200 runs due at once
HEAVY = 30  # runs of a max_running=2 job

APP = textwrap.dedent(
    """
    import os
    import time

    from scheduler.scheduler import Scheduler
    from workers import current_job

    app = Scheduler()  # CHRONOQ_BROKER_URL from the environment
    OUT = os.environ["LIMITS_OUT"]


    def record(kind: str, n: int, start: float, end: float) -> None:
        attempt = current_job().message.attempts
        with open(OUT, "a") as f:  # one short append per line: whole lines
            f.write(f"{kind} {n} {attempt} {start:.6f} {end:.6f} {os.getpid()}\\n")


    @app.job(name="limits.rated", rate_limit="20/s", max_attempts=1)
    def rated(n: int) -> None:
        now = time.time()
        record("rated", n, now, now)


    @app.job(name="limits.heavy", max_running=2, max_attempts=1)
    def heavy(n: int) -> None:
        start = time.time()
        time.sleep(0.1)
        record("heavy", n, start, time.time())


    @app.job(name="limits.hold", max_running=1, timeout=2.0)
    def hold(n: int) -> None:
        start = time.time()
        record("hold-start", n, start, start)
        if n == 0 and current_job().message.attempts == 1:
            time.sleep(60)  # killed with -9 meanwhile
        record("hold", n, start, time.time())
    """
)


@pytest.fixture(params=["server", pytest.param("redis", marks=pytest.mark.external_service)])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A broker every dispatcher reaches: a ``chronoq broker serve`` child, or redis."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_url")
        return
    server = ServerProcess(tmp_path / "server-data").start()
    try:
        yield server.url
    finally:
        server.stop()


class Dispatchers:
    """``chronoq run limits_app:app`` children, each with its log and delivery trace."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.dir = tmp_path
        (tmp_path / "limits_app.py").write_text(APP)
        self.out = tmp_path / "runs.txt"
        self.env = dict(
            os.environ,
            CHRONOQ_BROKER_URL=url,
            CHRONOQ_MAX_WORKERS="4",
            CHRONOQ_PREFETCH="8",
            LIMITS_OUT=str(self.out),
            PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        )
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, n: int) -> None:
        for i in range(n):
            log = self.dir / f"d{i}.log"
            argv = [CHRONOQ, "run", "limits_app:app", "--trace-dir", str(self.dir / f"trace{i}")]
            with open(log, "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        env=self.env,
                        cwd=self.dir,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
        for i in range(n):
            log = self.dir / f"d{i}.log"
            eventually(
                lambda log=log: "dispatcher joined group" in log.read_text(),  # type: ignore[misc]
                timeout=60,
                what=f"{log.name} joined",
            )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            stop_process(p, 30)

    def rows(self, kind: str) -> list[tuple[int, int, float, float, int]]:
        """``(n, attempt, start, end, pid)`` of each recorded line of ``kind``."""
        if not self.out.exists():
            return []
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[0] == kind:
                n, attempt, pid = int(parts[1]), int(parts[2]), int(parts[5])
                rows.append((n, attempt, float(parts[3]), float(parts[4]), pid))
        return rows

    def outcomes(self) -> Counter[tuple[str, str]]:
        """``(job, outcome)`` counts over every dispatcher's delivery trace."""
        counts: Counter[tuple[str, str]] = Counter()
        for path in self.dir.glob("trace*/trace-*.jsonl"):
            for line in path.read_text().splitlines():
                row: dict[str, Any] = json.loads(line)
                counts[(row["job"], row["outcome"])] += 1
        return counts


@pytest.fixture
def dispatchers(tmp_path: Path, broker_url: str) -> Iterator[Dispatchers]:
    d = Dispatchers(tmp_path, broker_url)
    try:
        yield d
    finally:
        d.stop()


def client(url: str) -> Scheduler:
    """The sending side: the same job names (bodies never run here)."""
    app = Scheduler(url)
    for name in ("limits.rated", "limits.heavy", "limits.hold"):
        app.job(name=name)(_nothing)
    return app


def _nothing(n: int) -> None: ...


def max_overlap(rows: list[tuple[int, int, float, float, int]]) -> int:
    events = sorted([(r[2], 1) for r in rows] + [(r[3], -1) for r in rows])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def most_in_window(starts: list[float], window_s: float) -> int:
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# On the server with -m slow only (the suite's budget): the limits are the broker's
# acquire_rate/acquire_slot, each checked on every adapter by the conformance suite
@pytest.mark.parametrize(
    "broker_url",
    [
        pytest.param("server", marks=pytest.mark.slow),
        pytest.param("redis", marks=pytest.mark.external_service),
    ],
    indirect=True,
)
def test_rate_limit_and_max_running_hold_across_three_dispatchers(
    dispatchers: Dispatchers, broker_url: str
) -> None:
    dispatchers.start(DISPATCHERS)
    app = client(broker_url)
    try:
        app.handle("limits.rated").schedule_many([((n,), {}) for n in range(RUNS)])
        app.handle("limits.heavy").schedule_many([((n,), {}) for n in range(HEAVY)])
        eventually(lambda: len(dispatchers.rows("rated")) >= RUNS, 90, "every rated run")
        eventually(lambda: len(dispatchers.rows("heavy")) >= HEAVY, 30, "every heavy run")
        dead = app.broker.stats().groups[app.settings.group].dead
    finally:
        app.close()
    dispatchers.stop()
    rated, heavy = dispatchers.rows("rated"), dispatchers.rows("heavy")
    # Every run ran exactly once, on its first attempt, and nothing was dead-lettered
    assert sorted(r[0] for r in rated) == list(range(RUNS))
    assert sorted(r[0] for r in heavy) == list(range(HEAVY))
    assert {r[1] for r in rated + heavy} == {1}
    assert dead == 0
    outcomes = dispatchers.outcomes()
    for job in ("limits.rated", "limits.heavy"):
        assert outcomes[(job, "dead")] == outcomes[(job, "retry")] == 0
    assert outcomes[("limits.rated", "ok")] == RUNS
    assert outcomes[("limits.heavy", "ok")] == HEAVY
    # The runs were shared by the dispatchers, not run by one alone
    assert len({r[4] for r in rated}) > 1
    # The rate held for the app: in any window, at most the rate times its length plus
    # the burst of 20 (plus 3 for the spread between admission and the body's start)
    starts = sorted(r[2] for r in rated)
    for window in (1.0, 2.0, 4.0):
        seen = most_in_window(starts, window)
        assert seen <= RATE * window + RATE + 3, (window, seen)
    middle = [t for t in starts if starts[0] + 2 <= t <= starts[-1] - 1]
    span = starts[-1] - 1 - (starts[0] + 2)
    assert len(middle) / span <= RATE * 1.2 + 3, (len(middle), span)
    # max_running=2 held across the three dispatchers
    assert max_overlap(heavy) <= 2
    # The waiting did not spin: each dispatcher spaces its waiting runs by the
    # limit's interval, so a waiting run came back a few times, not every few ms
    released = outcomes[("limits.rated", "released")]
    assert released <= (RUNS - RATE) * 10, released
    assert outcomes[("limits.heavy", "released")] <= HEAVY * 20


def test_the_slot_of_a_dispatcher_killed_with_minus_9_frees_when_its_lease_expires(
    dispatchers: Dispatchers, broker_url: str
) -> None:
    dispatchers.start(DISPATCHERS)
    app = client(broker_url)
    slot = "job:limits.hold"
    try:
        hold = app.handle("limits.hold")
        hold.schedule(0)
        first = eventually(lambda: dispatchers.rows("hold-start"), 30, "run 0 started")[0]
        # Given run 0 holds the only slot (lease 2 s: its timeout) in one dispatcher
        assert not app.broker.acquire_slot(slot, 1, "probe", 1)
        # When that dispatcher is killed with -9 (run 0's message comes back only
        # after the 60 s invisible time)
        os.kill(first[4], signal.SIGKILL)
        killed_at = time.time()
        assert not app.broker.acquire_slot(slot, 1, "probe", 1)  # its lease still runs
        # Then run 1 runs on another dispatcher once that lease expired. It is sent
        # after the dead dispatcher's last pull (at most 200 ms long) ended: a chronoq://
        # server still hands a message to a pull the dead process left parked, and
        # that message would come back only after its 60 s invisible time.
        time.sleep(0.5)
        hold.schedule(1)
        eventually(lambda: dispatchers.rows("hold"), 30, "run 1 ran")
    finally:
        app.close()
    (ran,) = dispatchers.rows("hold")
    assert ran[0] == 1 and ran[1] == 1
    assert ran[4] != first[4]
    assert ran[2] > killed_at
