"""chronoq on a real Spark standalone cluster (issue 19 §2).

A master and one worker (1 core, 1 GiB; executors of 512 MiB) run from the pip
pyspark installation (:mod:`tests.spark.standalone`), a ``chronoq broker serve``
child is the broker, and every chronoq process is started the way a user would,
with ``CHRONOQ_SPARK_MASTER=spark://127.0.0.1:PORT``:

* ``chronoq worker --executor spark`` runs a cron job, a one-off job and a long
  job whose timeout cancels its Spark job group: each run is an application of
  the master's list, its tasks ran in the worker's executor directory, and the
  cancelled task was killed on the executor (its log says so; the next job gets
  the worker's only core);
* ``python -m spark_tasks.pipelines.bulk_schedule --broker-url chronoq://...``:
  the executors send their partitions to the server; every valid row is exactly
  one pending message (key, due time, body), a re-run adds none;
* ``chronoq report`` over a trace: the report's rows equal a plain-Python
  nearest-rank computation.

The cluster tests are ``slow`` (together ~2-3 min here, mostly JVM starts):
``.venv/bin/python -m pytest tests/spark/test_standalone_cluster.py -m slow``.
"""

from __future__ import annotations

import csv
import json
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker_adapter import MessageState, MessageView, open_broker
from broker_adapter.errors import InvalidArgument
from scheduler.jobcall import JobCall
from spark_tasks.pipelines.bulk_schedule import bulk_schedule
from spark_tasks.session import LOOPBACK_CONF, is_loopback_master, session_conf
from tests.server.serverproc import ROOT, ServerProcess

from . import cluster_app, standalone
from .standalone import StandaloneCluster, start_group, stop_group

T = TypeVar("T")
#: The module-scoped cluster fixture (pytest finds fixtures among a module's names).
spark_cluster = standalone.spark_cluster

CHRONOQ = str(Path(sys.executable).parent / "chronoq")
#: Real-time bound on anything a test waits for (JVM starts on a busy machine).
WAIT_S = 180.0
WORKER_APP = "chronoq-cluster-worker"
#: The executor's log line of a task killed by a job group's cancellation (the group
#: is the chronoq message id: :mod:`workers.executors.spark`).
KILLED_TASK = re.compile(r"Executor killed task .* cancelled job group (\S+)")


def wait_for(
    predicate: Callable[[], T | None],
    what: str,
    log: Path | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something (at most :data:`WAIT_S`); fail
    sooner if ``proc`` exited, with ``log``'s tail."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = predicate()
        if value is not None:
            return value
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
            raise AssertionError(f"gave up waiting for {what}\n{tail}")
        time.sleep(0.25)


class BrokerServe(ServerProcess):
    """``chronoq broker serve`` (the command a user runs), on a free port."""

    def argv(self) -> list[str]:
        """The command line."""
        return [CHRONOQ, "broker", "serve", "--data-dir", str(self.data_dir), "--port", "0"]


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``chronoq broker serve`` child's ``chronoq://`` URL for the module."""
    server = BrokerServe(tmp_path_factory.mktemp("server") / "data").start()
    try:
        yield server.url
    finally:
        server.stop()


def app_on_cluster(cluster: StandaloneCluster, app_id: str) -> dict[str, Any]:
    """The master's entry of ``app_id``; fails unless the master lists it."""
    apps = {a["id"]: a for a in cluster.applications()}
    assert app_id in apps, f"{app_id} is not in the master's list {sorted(apps)}"
    return apps[app_id]


def assert_ran_on_cluster(cluster: StandaloneCluster, record: dict[str, Any]) -> None:
    """The run's driver used the cluster, and its tasks ran in the worker's executor dirs."""
    assert record["master"] == cluster.master_url
    entry = app_on_cluster(cluster, record["app_id"])
    assert entry["name"] == record["app_name"] == WORKER_APP
    executors = {str(d) for d in cluster.executor_dirs(record["app_id"])}
    assert executors and set(record["executor_dirs"]) <= executors, (record, executors)


# -- the Spark worker: cron, one-off and timeout -----------------------------------------


@dataclass
class SparkWorker:
    """The ``chronoq worker --executor spark`` child and what it writes."""

    proc: subprocess.Popen[bytes]
    log: Path
    runs: Path
    app: Any
    jobs: dict[str, Any]

    def records(self, job: str) -> list[dict[str, Any]]:
        """The recorded runs of ``job`` (see :mod:`tests.spark.cluster_app`)."""
        return [json.loads(p.read_text()) for p in sorted(self.runs.glob(f"{job}-*.json"))]

    def record_of(self, job: str, msg_id: str) -> dict[str, Any] | None:
        """The recorded run of one message, once it finished."""
        path = self.runs / f"{job}-{msg_id}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def ticks(self, at_least: int) -> list[dict[str, Any]] | None:
        """The cron job's recorded runs, once there are ``at_least``."""
        ticks = self.records(cluster_app.TICK)
        return ticks if len(ticks) >= at_least else None

    def message_in(self, msg_id: str, state: MessageState) -> MessageView | None:
        """The message's view once it is in ``state``."""
        view = self.app.broker.query(msg_id)
        return view if view is not None and view.state is state else None

    def wait(self, predicate: Callable[[], T | None], what: str) -> T:
        """:func:`wait_for`, failing at once with the log if the worker exits."""
        return wait_for(predicate, what, self.log, self.proc)

    def alive(self) -> bool:
        """Whether the worker still runs."""
        return self.proc.poll() is None


@pytest.fixture(scope="class")
def spark_worker(
    spark_cluster: StandaloneCluster, broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkWorker]:
    """``chronoq worker --executor spark tests.spark.cluster_app:app`` on the cluster,
    with a client app on the same broker to schedule its jobs; SIGTERM at the end
    (the application then shows FINISHED), SIGKILL of its group if it hangs."""
    root = tmp_path_factory.mktemp("spark-worker")
    runs = root / "runs"
    runs.mkdir()
    env = spark_cluster.driver_env(WORKER_APP)
    env.update(
        {
            "CHRONOQ_BROKER_URL": broker_url,
            cluster_app.RUNS_ENV: str(runs),
            "PYTHONPATH": str(ROOT),
        }
    )
    argv = [CHRONOQ, "worker", "--executor", "spark", "tests.spark.cluster_app:app"]
    proc = start_group([*argv, "--drain-timeout", "5"], env, root / "worker.log", cwd=ROOT)
    client, jobs = cluster_app.client_app(broker_url)
    worker = SparkWorker(proc, root / "worker.log", runs, client, jobs)
    try:
        yield worker
    finally:
        client.close()
        stop_group(proc, timeout=60)


@pytest.mark.usefixtures("spark_worker")
@pytest.mark.slow
@pytest.mark.external_service
class TestSparkWorkerOnTheCluster:
    """One ``chronoq worker --executor spark`` process, its driver on the cluster."""

    def test_cron_job_fires_and_runs_on_the_cluster(
        self, spark_worker: SparkWorker, spark_cluster: StandaloneCluster
    ) -> None:
        ticks = spark_worker.wait(lambda: spark_worker.ticks(2), "two cron runs of the tick")
        fires = [t["fire_ms"] for t in ticks]
        assert len(set(fires)) == len(fires)  # each occurrence ran once
        assert all(f % 3000 == 0 for f in fires), fires  # on the */3 seconds
        for tick in ticks:
            assert tick["n"] == 1000
            assert_ran_on_cluster(spark_cluster, tick)
        entry = app_on_cluster(spark_cluster, ticks[0]["app_id"])
        assert entry["state"] == "RUNNING" and entry["cores"] == 1
        assert entry["memoryperexecutor"] == 512

    def test_one_off_job_runs_on_the_cluster(
        self, spark_worker: SparkWorker, spark_cluster: StandaloneCluster, tmp_path: Path
    ) -> None:
        out = tmp_path / "totals.parquet"
        n = 30_000
        receipt = spark_worker.jobs[cluster_app.TOTALS].schedule(n, str(out), delay=1.0)
        record = spark_worker.wait(
            lambda: spark_worker.record_of(cluster_app.TOTALS, receipt.msg_id),
            "the one-off job's run",
        )
        expected = {str(k): sum(range(k, n, 3)) for k in range(3)}
        assert record["sums"] == expected
        assert_ran_on_cluster(spark_cluster, record)
        assert list(out.glob("part-*.parquet"))  # the executor wrote the output
        view = spark_worker.wait(
            lambda: spark_worker.message_in(receipt.msg_id, MessageState.DONE),
            "the one-off job's message to be acked",
        )
        assert view.attempts == 1

    def test_timeout_cancels_the_long_job_on_the_executor(
        self, spark_worker: SparkWorker, spark_cluster: StandaloneCluster, tmp_path: Path
    ) -> None:
        receipt = spark_worker.jobs[cluster_app.STUCK].schedule()
        record = spark_worker.wait(
            lambda: spark_worker.record_of(cluster_app.STUCK, receipt.msg_id),
            "the long job to return",
        )
        assert record["outcome"] == "cancelled"
        assert record["ran_s"] < cluster_app.STUCK_SLEEP_S / 2  # cut short, not slept out
        view = spark_worker.wait(
            lambda: spark_worker.message_in(receipt.msg_id, MessageState.DEAD),
            "the timed-out message to be dead-lettered (max_attempts=1)",
        )
        assert view.error is not None and "timeout" in view.error
        # The task was killed on the executor, which logs it ...
        executor_log = spark_worker.wait(
            lambda: spark_cluster.executor_log_with(record["app_id"], KILLED_TASK),
            "the executor to log the killed task",
        )
        assert [m[1] for m in KILLED_TASK.finditer(executor_log)] == [receipt.msg_id]
        # ... so the worker's only core is free again: a job scheduled now runs.
        out = tmp_path / "after.parquet"
        after = spark_worker.jobs[cluster_app.TOTALS].schedule(300, str(out))
        done = spark_worker.wait(
            lambda: spark_worker.record_of(cluster_app.TOTALS, after.msg_id),
            "a job after the cancelled one",
        )
        assert done["sums"] == {str(k): sum(range(k, 300, 3)) for k in range(3)}
        assert spark_worker.alive()


# -- bulk scheduling: executors send to a chronoq:// server ------------------------------


def _write_rows(directory: Path, n: int, due0: int) -> list[tuple[str, str, str, str, str]]:
    """``n`` valid rows in 4 CSV files (due ``due0 + i`` seconds) plus 3 invalid ones."""
    rows = [
        (f"order:{i}", "cluster.close_order", str(due0 + i * 1000), "", f"[{i}]") for i in range(n)
    ]
    bad = [
        ("", "cluster.close_order", "", "60", "[0]"),
        ("order:bad-job", "no.such.job", "", "60", "[0]"),
        ("order:bad-args", "cluster.close_order", "", "60", "[0"),
    ]
    directory.mkdir()
    everything = rows + bad
    random.Random(3).shuffle(everything)
    for part in range(4):
        with (directory / f"rows-{part}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["key", "job", "deliver_at", "delay_s", "args"])
            writer.writerows(everything[part::4])
    return rows


def _all_pending(url: str, topic: str) -> list[Any]:
    views: list[Any] = []
    with open_broker(url) as broker:
        cursor: str | None = None
        while True:
            page = broker.find_pending(topic, limit=1000, cursor=cursor, with_body=True)
            views.extend(page.messages)
            cursor = page.cursor
            if cursor is None:
                return views


@pytest.mark.slow
@pytest.mark.external_service
def test_bulk_schedule_executors_send_their_partitions_to_the_server(
    spark_cluster: StandaloneCluster, broker_url: str, tmp_path: Path
) -> None:
    n = 20_000
    due0 = int(time.time() * 1000) + 3 * 3600_000  # nothing fires during the test
    rows = _write_rows(tmp_path / "rows", n, due0)
    env = spark_cluster.driver_env("chronoq-bulk")
    env.update({"CHRONOQ_BROKER_URL": broker_url, "PYTHONPATH": str(ROOT)})
    argv = [
        sys.executable,
        "-m",
        "spark_tasks.pipelines.bulk_schedule",
        "tests.spark.cluster_app:app",
        str(tmp_path / "rows"),
        "--broker-url",
        broker_url,
        "--rejects",
        str(tmp_path / "rejects.parquet"),
    ]
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, check=False
        )
        assert done.returncode == 0, done.stderr[-4000:]
        outputs.append(done.stdout)
    assert outputs[0].startswith(f"accepted {n}, duplicate 0 (already scheduled), rejected 3")
    assert outputs[1].startswith(f"accepted 0, duplicate {n} (already scheduled), rejected 3")

    # Every valid row is exactly one pending message, with its due time and job call.
    views = _all_pending(broker_url, cluster_app.ORDERS_TOPIC)
    by_key: dict[str, list[Any]] = defaultdict(list)
    for v in views:
        by_key[v.key].append(v)
    assert len(views) == n and set(by_key) == {r[0] for r in rows}
    for key, _job, due, _delay, args in rows:
        (view,) = by_key[key]
        assert view.deliver_at_ms == int(due)
        assert JobCall.decode(view.body) == JobCall("cluster.close_order", tuple(json.loads(args)))

    # Both runs were applications of the cluster, whose executors ran the tasks.
    apps = spark_cluster.applications_named("chronoq-bulk")
    assert len(apps) == 2 and all(a["state"] == "FINISHED" for a in apps), apps
    assert all(spark_cluster.executor_dirs(a["id"]) for a in apps)


# -- the delivery report ------------------------------------------------------------------

T0 = 1_700_000_000_000  # a bucket boundary for 60 s buckets


def _write_trace(directory: Path, n: int) -> list[dict[str, Any]]:
    rnd = random.Random(11)
    lines = []
    for i in range(n):
        topic = "orders" if i % 3 else "reports"
        due = T0 + rnd.randrange(180_000)
        late = int(rnd.paretovariate(1.3) * 2) - 1
        lines.append(
            {
                "v": 1,
                "msg_id": f"{i:032x}",
                "topic": topic,
                "job": "j",
                "key": None,
                "group": "g",
                "attempt": 1 + (i % 10 == 0),
                "sent_ms": due - 5,
                "deliver_at_ms": due,
                "fired_ms": due + 1,
                "dispatched_ms": due + 1,
                "started_ms": due + late,
                "finished_ms": due + late + 2,
                "outcome": "dead" if i % 50 == 0 else "retry" if i % 10 == 0 else "ok",
                "error": None,
            }
        )
    directory.mkdir()
    for part in range(3):
        with (directory / f"trace-{T0}-{part + 1:05d}.jsonl").open("w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines[part::3])
    return lines


def _nearest_rank(values: list[int], num: int, den: int) -> int:
    ordered = sorted(values)
    return ordered[max(-(-num * len(ordered) // den), 1) - 1]


@pytest.mark.slow
@pytest.mark.external_service
def test_delivery_report_runs_on_the_cluster(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    lines = _write_trace(tmp_path / "trace", 30_000)
    env = spark_cluster.driver_env("chronoq-report")
    env.update({"PYTHONPATH": str(ROOT), "TZ": "UTC"})
    argv = [CHRONOQ, "report", "--trace", str(tmp_path / "trace"), "--out", str(tmp_path / "out")]
    done = subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]

    header, *table = done.stdout.split("\n\n")[0].splitlines()
    cols = header.split()
    got = {}
    for line in table:
        cells = line.split()
        row = dict(zip(cols, [cells[0], f"{cells[1]} {cells[2]}", *cells[3:]], strict=True))
        got[(row["topic"], row["bucket_start"])] = row
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for x in lines:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(x["fired_ms"] // 60_000 * 60))
        groups[(x["topic"], start)].append(x)
    assert set(got) == set(groups)
    for key, xs in groups.items():
        late = [x["started_ms"] - x["deliver_at_ms"] for x in xs]
        row = got[key]
        assert int(row["deliveries"]) == len(xs)
        assert int(row["messages"]) == sum(x["attempt"] == 1 for x in xs)
        assert int(row["dead"]) == sum(x["outcome"] == "dead" for x in xs)
        for name, num, den in (("p50", 50, 100), ("p99", 99, 100), ("p999", 999, 1000)):
            assert int(row[f"late_{name}"]) == _nearest_rank(late, num, den), (key, name)
        assert int(row["late_max"]) == max(late)
    assert (tmp_path / "out" / "report.parquet" / "_SUCCESS").exists()
    assert (tmp_path / "out" / "lateness.png").read_bytes()[:4] == b"\x89PNG"
    (app,) = spark_cluster.applications_named("chronoq-report")
    assert app["state"] == "FINISHED" and spark_cluster.executor_dirs(app["id"])


# -- no cluster needed ----------------------------------------------------------------------


def test_a_loopback_cluster_master_keeps_the_driver_on_loopback() -> None:
    for master in ("spark://127.0.0.1:7077", "spark://localhost:7077", "local[2]"):
        assert is_loopback_master(master), master
        assert session_conf(master, environ={}).items() >= LOOPBACK_CONF.items()
    for master in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077,10.0.0.5:7077", "yarn"):
        assert not is_loopback_master(master), master
        assert "spark.driver.host" not in session_conf(master, environ={})
    # The user's SPARK_CONF still wins (e.g. a driver reachable from other hosts).
    conf = session_conf("spark://127.0.0.1:7077", environ={"SPARK_CONF": "spark.driver.host=h"})
    assert conf["spark.driver.host"] == "h"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"broker_url": "memory://shop"}, "a broker of one process"),
        ({}, "exactly one of broker="),
    ],
)
def test_bulk_schedule_refuses_a_url_executors_cannot_share(
    kwargs: dict[str, Any], match: str
) -> None:
    # Checked before Spark is touched: no session is needed (none is passed).
    with pytest.raises(InvalidArgument, match=match):
        bulk_schedule(None, "rows.csv", {"close": "orders"}, **kwargs)  # type: ignore[arg-type]
