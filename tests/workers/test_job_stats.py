"""Job stats through the broker: each dispatcher writes one keyed record of 5 s
samples, and ``read_job_stats`` merges every dispatcher's, interval by interval,
with P50/P99 from the merged lateness buckets. Two real ``chronoq run`` processes
on one shared ``rocksdb://`` directory: the merged counts equal the jobs run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter import open_broker
from broker_adapter.base import BrokerAdapter
from scheduler.keyed_records import put_record
from scheduler.scheduler import Scheduler
from tests.helpers import eventually, stop_process
from workers.job_stats import (
    LATENESS_BOUNDS_S,
    STATS_KEY_PREFIX,
    STATS_TOPIC,
    JobStatsLog,
    JobStatsSample,
    Totals,
    lateness_bucket,
    quantile_ms,
    read_job_stats,
)

pytestmark = pytest.mark.timeout(180)

CHRONOQ = str(Path(sys.executable).with_name("chronoq"))
ROOT = Path(__file__).resolve().parents[2]
NB = len(LATENESS_BOUNDS_S) + 1
T0 = 1_800_000_000_000  # a multiple of 5 s


class FakeTotals:
    """Totals a test moves by hand, and the wall clock it reads."""

    def __init__(self) -> None:
        self.counts = [0] * 5
        self.late = [0] * NB
        self.now = T0

    def __call__(self) -> Totals:
        return Totals(tuple(self.counts), tuple(self.late))

    def run(self, n: int, late_s: float, *, failed: int = 0) -> None:
        self.counts[0] += n
        self.counts[1] += n - failed
        self.counts[2] += failed
        self.late[lateness_bucket(late_s)] += n


@pytest.fixture
def memory_broker() -> Iterator[BrokerAdapter]:
    broker = open_broker("memory://stats")
    yield broker
    broker.close()


def _log(broker: BrokerAdapter, fake: FakeTotals) -> JobStatsLog:
    return JobStatsLog(lambda: broker, fake, lambda: fake.now)


def test_quantiles_interpolate_within_the_merged_buckets() -> None:
    buckets = [0] * NB
    assert quantile_ms(buckets, 0.5) is None
    buckets[lateness_bucket(0.0007)] = 100  # all in (0.5 ms, 1 ms]
    assert quantile_ms(buckets, 0.5) == pytest.approx(0.75)
    buckets[lateness_bucket(120.0)] = 1  # above the last bound: the last bound
    assert quantile_ms(buckets, 0.999) == 60_000
    assert lateness_bucket(0.0005) == 0 and lateness_bucket(0.00051) == 1


def test_two_dispatchers_samples_merge_per_interval(memory_broker: BrokerAdapter) -> None:
    # Given: two dispatchers' stats logs on one broker, on the same wall clock
    a, b = FakeTotals(), FakeTotals()
    log_a, log_b = _log(memory_broker, a), _log(memory_broker, b)
    # When: in the interval [T0, T0+5s) A runs 98 jobs ~2 ms late and B runs 2 that
    # fail, 20 s late; each writes just after the boundary
    a.run(98, 0.002)
    b.run(2, 20.0, failed=2)
    a.now = b.now = T0 + 5_020
    log_a.flush()
    log_b.flush()
    # And: in the next interval only A runs 10, then closes mid-interval
    a.run(10, 0.0004)
    a.now = T0 + 7_000
    log_a.flush(closing=True)
    log_a.flush()  # nothing new: no write
    # Then: one record per dispatcher, and one merged sample per interval, oldest first
    page = memory_broker.find_pending(STATS_TOPIC, key_prefix=STATS_KEY_PREFIX, with_body=True)
    assert sorted(v.key or "" for v in page.messages) == sorted([log_a.key, log_b.key])
    first, second = read_job_stats(memory_broker, since_ms=0)
    assert (first.t_ms, first.interval_ms) == (T0, 5000)
    assert (first.started, first.succeeded, first.failed) == (100, 98, 2)
    assert first.lateness_p50_ms is not None and 1.0 < first.lateness_p50_ms <= 2.5
    assert first.lateness_p99_ms is not None and 10_000 < first.lateness_p99_ms <= 30_000
    assert second == JobStatsSample(
        T0 + 5000, 5000, 10, 10, 0, 0, 0, pytest.approx(0.25), pytest.approx(0.495)
    )
    # And: since_ms leaves out the intervals that ended before it
    assert read_job_stats(memory_broker, since_ms=T0 + 5000) == [second]


def test_a_record_of_another_format_or_garbage_is_skipped(memory_broker: BrokerAdapter) -> None:
    due = int(time.time() * 1000) + 60_000
    put_record(memory_broker, STATS_TOPIC, "stats:x:", b'{"f": 99, "iv": 5000, "s": []}', due)
    put_record(memory_broker, STATS_TOPIC, "stats:y:", b"not json", due)
    fake = FakeTotals()
    log = _log(memory_broker, fake)
    fake.run(3, 0.01)
    fake.now = T0 + 5_020
    log.flush()
    assert [(s.t_ms, s.started) for s in read_job_stats(memory_broker, since_ms=0)] == [(T0, 3)]


def test_nothing_written_yet_reads_as_no_samples(memory_broker: BrokerAdapter) -> None:
    assert read_job_stats(memory_broker, since_ms=0) == []


APP = textwrap.dedent(
    """
    import os
    import time

    from scheduler.scheduler import Scheduler

    app = Scheduler()


    @app.job(name="s.work")
    def work(n: int) -> None:
        time.sleep(0.03)
        with open(os.environ["STATS_OUT"], "a") as f:
            f.write(f"{n} {os.getpid()}\\n")
    """
)
RUNS = 40


def test_two_chronoq_run_processes_merged_counts_equal_the_jobs_run(tmp_path: Path) -> None:
    (tmp_path / "stats_app.py").write_text(APP)
    url = f"rocksdb://{tmp_path / 'data'}"
    out = tmp_path / "runs.txt"
    env = dict(
        os.environ,
        CHRONOQ_BROKER_URL=url,
        CHRONOQ_MAX_WORKERS="1",
        CHRONOQ_PREFETCH="1",
        STATS_OUT=str(out),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    procs: list[subprocess.Popen[str]] = []
    logs = [tmp_path / f"d{i}.log" for i in range(2)]
    try:
        # Given: two dispatchers of one app on one directory (the second a client)
        for log in logs:
            with open(log, "w") as f:
                procs.append(
                    subprocess.Popen(
                        [CHRONOQ, "run", "stats_app:app"],
                        env=env,
                        cwd=tmp_path,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
            eventually(lambda log=log: "dispatcher joined" in log.read_text(), 30, "joined")
        # When: 40 runs fall due together
        app = Scheduler(url)
        try:
            job = app.job(name="s.work")(lambda n: None)
            for n in range(RUNS):
                job.schedule(n, delay=0.3)
        finally:
            app.close()
        eventually(
            lambda: out.exists() and len(out.read_text().splitlines()) == RUNS, 30, "all ran"
        )
        pids = {line.split()[1] for line in out.read_text().splitlines()}
        assert len(pids) == 2, "both dispatchers ran some"

        # Then: within a write period (5 s) the stats show every run, while they run
        def merged() -> int:
            with open_broker(url) as broker:
                return sum(s.started for s in read_job_stats(broker, since_ms=0))

        eventually(lambda: merged() == RUNS, 15, "the stats show every run")
    finally:
        for proc in procs:
            stop_process(proc)
    # And: after both left (each writes once more on leaving) the counts are exact
    with open_broker(url) as broker:
        samples = read_job_stats(broker, since_ms=0)
        records = broker.find_pending(STATS_TOPIC, key_prefix=STATS_KEY_PREFIX, with_body=True)
    assert sum(s.started for s in samples) == RUNS
    assert sum(s.succeeded for s in samples) == RUNS
    assert sum(s.failed + s.retried + s.dead for s in samples) == 0
    assert all(s.lateness_p50_ms is not None and s.lateness_p99_ms is not None for s in samples)
    assert [s.t_ms for s in samples] == sorted({s.t_ms for s in samples})
    # One record per dispatcher, each with its share
    shares = [sum(row[1] for row in json.loads(v.body or b"")["s"]) for v in records.messages]
    assert len(shares) == 2 and sum(shares) == RUNS and min(shares) > 0
