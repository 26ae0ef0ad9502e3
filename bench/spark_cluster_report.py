"""The delivery report over a 1M-line trace: a Spark standalone cluster beside ``local[*]``.

Run from the project root::

    .venv/bin/python bench/spark_cluster_report.py                  # 1,000,000 lines
    .venv/bin/python bench/spark_cluster_report.py -n 200000 --repeat 1 --worker-cores 2

Steps, under a fresh temp directory (removed after):

1. generate the trace with Spark ``local[2]`` (``bench/spark_report.py``'s
   generator: 2 topics over one hour, long-tailed lateness, retries and dead letters);
2. start a standalone master and one worker from the pip pyspark
   (``tests/spark/standalone.py``: loopback, ``--worker-cores`` cores, 1 GiB;
   executors of 512 MiB);
3. for each master, ``local[*]`` then ``spark://127.0.0.1:PORT``, one child process
   with ``CHRONOQ_SPARK_MASTER`` set (as ``chronoq report`` would run) that starts
   the session and runs the report (``run_report``: read + aggregate + Parquet +
   table, and the chart's histogram unless ``--no-chart``) ``--repeat`` times.

Figures per master: session start (s), each report run (s) and its lines/s; the
first run includes the executors' Python workers and JIT warm-up. The machine's
load average (``/proc/loadavg``) is printed before and after: on a shared machine
the figures move with it.

Where the work runs differs: ``local[*]`` runs the tasks in the driver's JVM on
every core; the cluster runs them in one executor JVM with ``--worker-cores``
cores, the driver only plans and collects.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: ``spark.*`` settings of both runs (the cluster run adds the executors' own).
COMMON_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
}


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def child(trace: Path, out: Path, repeat: int, chart: bool) -> None:
    """Time the session start and ``repeat`` report runs; print them as one JSON line."""
    from spark_tasks.pipelines.delivery_report import run_report
    from spark_tasks.session import get_spark, stop_spark

    t = time.perf_counter()
    spark = get_spark()
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter() - t
    runs = []
    rows = 0
    try:
        for i in range(repeat):
            t = time.perf_counter()
            result = run_report(spark, trace, out / f"run-{i}", chart=chart)
            runs.append(time.perf_counter() - t)
            rows = len(result.rows)
        master = spark.sparkContext.master
    finally:
        stop_spark()
    print(json.dumps({"master": master, "start_s": started, "runs_s": runs, "rows": rows}))


def generate_trace(n: int, trace: Path, partitions: int) -> None:
    """Write ``n`` trace lines under ``trace`` with Spark ``local[2]`` (in a child, so
    this process never holds a JVM)."""
    from bench.spark_report import generate
    from spark_tasks.session import get_spark, stop_spark

    spark = get_spark(master="local[2]", conf=COMMON_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        generate(spark, n, trace, partitions)
    finally:
        stop_spark()


def run_child(env: dict[str, str], *args: str) -> str:
    """Run this script as a child with ``args``; its stdout."""
    argv = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {args[:1]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def time_report(env: dict[str, str], args: argparse.Namespace, trace: Path, out: Path) -> Any:
    """The figures of one :func:`child` run with ``env``'s master."""
    extra = ["--repeat", str(args.repeat)] + (["--no-chart"] if args.no_chart else [])
    stdout = run_child(env, "--child", str(trace), str(out), *extra)
    return json.loads(stdout.strip().splitlines()[-1])


def show(label: str, n: int, fig: Any) -> float:
    """Print one master's figures; its best lines/s."""
    runs = ", ".join(f"{s:.1f} s = {n / s:,.0f} lines/s" for s in fig["runs_s"])
    print(f"{label:<34} session {fig['start_s']:5.1f} s; report: {runs} ({fig['rows']} rows)")
    return float(n / min(fig["runs_s"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="trace lines")
    parser.add_argument("--partitions", type=int, default=8, help="trace files")
    parser.add_argument("--repeat", type=int, default=2, help="report runs per master")
    parser.add_argument("--worker-cores", type=int, default=1)
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("TRACE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--generate", metavar="TRACE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.repeat, not args.no_chart)
        return 0
    if args.generate:
        generate_trace(args.n, Path(args.generate), args.partitions)
        return 0

    from tests.spark.standalone import StandaloneCluster

    root = Path(tempfile.mkdtemp(prefix="chronoq-cluster-report-"))
    try:
        print(f"load average before: {loadavg()} ({os.cpu_count()} cores)")
        base_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t = time.perf_counter()
        run_child(
            base_env,
            "--generate",
            str(root / "trace"),
            "-n",
            str(args.n),
            "--partitions",
            str(args.partitions),
        )
        size = sum(p.stat().st_size for p in (root / "trace").iterdir())
        print(
            f"generated {args.n:,} trace lines ({size / 2**20:,.0f} MiB) in "
            f"{time.perf_counter() - t:.1f} s"
        )
        conf = ",".join(f"{k}={v}" for k, v in COMMON_CONF.items())
        local_env = {**base_env, "CHRONOQ_SPARK_MASTER": "local[*]", "SPARK_CONF": conf}
        local = time_report(local_env, args, root / "trace", root / "out-local")
        with StandaloneCluster(root / "cluster", worker_cores=args.worker_cores) as cluster:
            env = cluster.driver_env(
                "chronoq-bench-report", {"spark.cores.max": str(args.worker_cores)}
            )
            env["PYTHONPATH"] = str(ROOT)
            remote = time_report(env, args, root / "trace", root / "out-cluster")
            (app,) = cluster.applications_named("chronoq-bench-report")
        best_local = show(f"local[*] ({os.cpu_count()} threads in the driver)", args.n, local)
        label = f"{cluster.master_url} ({args.worker_cores} core(s))"
        best_remote = show(label, args.n, remote)
        print(f"cluster application {app['id']}: {app['state']}, {app['cores']} core(s)")
        print(f"cluster / local[*] (best runs): {best_remote / best_local:.2f}x")
        print(f"load average after: {loadavg()}")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
