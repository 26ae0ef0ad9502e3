"""The ``chronoq`` command line.

::

    chronoq run examples.order_timeout:app [--exit-when-idle] [--trace | --trace-dir DIR]
                [--metrics-port N [--metrics-host H]]   (job metrics for Prometheus)
    chronoq worker --executor spark module:app [--trace]   (a dedicated dispatcher)
    chronoq report [--trace DIR] [--out DIR] [--bucket S]         (delivery report, Spark)
    chronoq send    [--url URL] --topic T [--key K] [--delay-ms N] (--body TEXT | --job NAME [--args JSON] [--kwargs JSON])
    chronoq abort   [--url URL] (--id ID | --key K --topic T)
    chronoq query   [--url URL] ID
    chronoq pending [--url URL] [--job NAME] [--key-prefix P] [--topic T] [--start ISO] [--end ISO] [--limit N]
    chronoq reschedule [--url URL] (--id ID | --key K --topic T) (--delay SECONDS | --at ISO8601)
    chronoq cancel  [--url URL] --key-prefix P [--topic T]
    chronoq stats   [--url URL]
    chronoq schedules list|pause|resume|run-now|remove [--url URL] [--app module:app] [NAME]
    chronoq dashboard [--url URL] [--host H] [--port P] [--token T]   (web UI + JSON API)
    chronoq dead-letters list|requeue|purge --group G [--url URL] [--id ID ... | --all]
    chronoq bench [NAME [ARGS...]]   (a script of bench/, run from a checkout; no NAME lists them)

``--url`` defaults to ``CHRONOQ_BROKER_URL`` (``rocksdb://./chronoq-data``); ``--json``
prints one JSON document instead of text. Exit status: 0 on success, 1 when the
thing asked for is not there (an unknown id, an abort ``NOT_FOUND``), 2 for bad usage.
``pending``, ``reschedule`` and ``cancel`` live in :mod:`workers.cli_runtime`,
``schedules`` in :mod:`workers.cli_schedules`, ``dead-letters`` in :mod:`workers.cli_dead`.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from broker_adapter import BrokerAdapter, Message, open_broker
from broker_adapter.errors import ChronoqError
from scheduler import apps
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.settings import DEFAULT_BROKER_URL
from workers import cli_dashboard, cli_dead, cli_schedules
from workers.cli_runtime import add_runtime_parsers, run_runtime

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def load_app(target: str) -> Scheduler:
    """The app that ``module:attr`` names (``module`` alone: its only Scheduler); see
    :func:`scheduler.apps.load_app`.

    :raises SystemExit: (status 2) with a message when it cannot be found.
    """
    try:
        return apps.load_app(target)
    except apps.AppNotFound as e:
        raise SystemExit(f"chronoq run: {e}") from e


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclasses, named tuples, enums, mappings)."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _show(args: argparse.Namespace, value: Any, text: str) -> None:
    print(json.dumps(_plain(value), sort_keys=True) if args.json else text)


def _cmd_run(args: argparse.Namespace) -> int:
    from workers.dispatcher import Dispatcher
    from workers.executors.factory import build_executors, open_trace
    from workers.job_metrics import JobMetrics
    from workers.routing import dedicated_group
    from workers.runner import run_app
    from workers.schedule_runs import RunLog

    app = load_app(args.target)
    logging.basicConfig(level=args.log_level or app.settings.log_level, format=LOG_FORMAT)
    names = getattr(args, "executor", None)
    executors = build_executors(app, names) if names else None
    trace = open_trace(app, args.trace_dir or ("" if args.trace else None))
    dispatcher = None
    metrics = JobMetrics(app)  # Prometheus (--metrics-port) and the job stats in the broker
    if executors is not None or trace is not None:
        group = dedicated_group(app.settings.group, names) if names else None
        dispatcher = Dispatcher(
            app,
            group=group,
            executors=executors,
            drain_timeout_s=args.drain_timeout,
            trace=trace,
            hooks=[RunLog(app), metrics],  # the last runs app.schedules.list() shows
        )
    try:
        run_app(
            app,
            exit_when_idle=args.exit_when_idle,
            drain_timeout_s=args.drain_timeout,
            dispatcher=dispatcher,
            job_metrics=metrics,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            freeze_gc=True,  # this process only runs the app: see workers.gc_tuning
        )
    finally:
        for executor in (executors or {}).values():
            executor.shutdown(wait=False)
        if trace is not None:
            trace.close()
        app.close()
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    # Imported only for this command: it needs Spark.
    from spark_tasks.pipelines.delivery_report import main as report_main

    return report_main(args)


def _cmd_send(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    if (args.body is None) == (args.job is None):
        raise SystemExit("chronoq send: give exactly one of --body or --job")
    if args.job is not None:
        body = JobCall(args.job, tuple(json.loads(args.args)), json.loads(args.kwargs)).encode()
    else:
        body = args.body.encode()
    tags = args.job  # a job run carries its job's name, as the scheduler's do
    res = broker.send(Message(args.topic, body, key=args.key, tags=tags, delay_ms=args.delay_ms))
    _show(args, res, f"{res.status.value} {res.msg_id} due {res.deliver_at_ms}")
    return 0


def _cmd_abort(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    res = broker.abort(args.id, key=args.key, topic=args.topic)
    _show(args, res, f"{res.status.value} {res.msg_id or ''}".rstrip())
    return 1 if res.status.value == "NOT_FOUND" else 0


def _cmd_query(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    view = broker.query(args.msg_id)
    if view is None:
        _show(args, None, f"{args.msg_id}: unknown")
        return 1
    text = (
        f"{view.msg_id} {view.state.value} topic={view.topic} key={view.key} "
        f"due={view.deliver_at_ms} attempts={view.attempts}"
        + (f" error={view.error!r}" if view.error else "")
    )
    _show(args, view, text)
    return 0


def _cmd_stats(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    st = broker.stats()
    lines = [f"pending {st.pending}, fired {st.fired_total}, dead {st.dead}"]
    lines += [
        f"topic {n}: pending {t.pending}, fired {t.fired_total}"
        for n, t in sorted(st.topics.items())
    ]
    lines += [
        f"group {n}: ready {g.ready}, in flight {g.inflight}, dead {g.dead}, acked {g.acked_total}"
        for n, g in sorted(st.groups.items())
    ]
    _show(args, st, "\n".join(lines))
    return 0


_OPS = {
    "send": _cmd_send,
    "abort": _cmd_abort,
    "query": _cmd_query,
    "stats": _cmd_stats,
}


def bench_scripts() -> dict[str, str]:
    """``chronoq bench`` names of the scripts in the checkout's ``bench/`` folder."""
    folder = os.path.join(os.getcwd(), "bench")
    names = (
        sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py"))
        if os.path.isdir(folder)
        else []
    )
    return {
        n.replace("_", "-"): n
        for n in names
        if not n.startswith("_") and n not in ("loadgen", "stats", "pending")
    }


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run ``bench/<name>.py`` with the remaining arguments, as ``python bench/...`` would."""
    import runpy

    scripts = bench_scripts()
    if args.name is None or not scripts:
        if not scripts:
            print(
                "chronoq bench: no bench/ folder here; run it from a chronoq checkout "
                "(the project root)",
                file=sys.stderr,
            )
            return 2
        print("benchmarks: " + ", ".join(scripts))
        return 0
    module = scripts.get(args.name)
    if module is None:
        print(
            f"chronoq bench: unknown benchmark {args.name!r}; one of: " + ", ".join(scripts),
            file=sys.stderr,
        )
        return 2
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    saved = sys.argv
    sys.argv = [f"bench/{module}.py", *args.args]
    try:
        runpy.run_module(f"bench.{module}", run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``chronoq`` command."""
    parser = argparse.ArgumentParser(prog="chronoq", description="chronoq job scheduler")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run an app: embedded broker + dispatcher + cron")
    run.add_argument("target", help="module:app, e.g. examples.order_timeout:app")
    run.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit once nothing is ready, running or pending (cron aside)",
    )
    run.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds running jobs get to finish on SIGTERM (default 30)",
    )
    run.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    worker = sub.add_parser(
        "worker",
        help="run a dispatcher with chosen executors, e.g. --executor spark",
        parents=[run],
        add_help=False,
        conflict_handler="resolve",
    )
    worker.add_argument(
        "--executor",
        action="append",
        required=True,
        help="an executor this dispatcher has: local, spark (repeatable); a spark-only "
        "worker joins group <group>.spark and runs only the Spark jobs",
    )
    for p in (run, worker):
        p.add_argument(
            "--trace", action="store_true", help="record the delivery trace in <data dir>/trace"
        )
        p.add_argument("--trace-dir", metavar="DIR", help="record the delivery trace in DIR")
        p.add_argument(
            "--metrics-port",
            type=int,
            metavar="N",
            help="serve job metrics (Prometheus) on this port, 0 for a free one "
            "(default: $CHRONOQ_METRICS_PORT; off when unset)",
        )
        p.add_argument(
            "--metrics-host",
            metavar="H",
            help="address for --metrics-port (default: $CHRONOQ_METRICS_HOST or 127.0.0.1; "
            "another one needs CHRONOQ_TOKEN)",
        )
    report = sub.add_parser("report", help="delivery report over a delivery trace (Spark)")
    report.add_argument("--trace", metavar="DIR", help="trace directory (default: from --url)")
    report.add_argument(
        "--url",
        default=os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL,
        help="broker URL whose data dir holds the trace (default: $CHRONOQ_BROKER_URL)",
    )
    report.add_argument("--out", default="chronoq-report", metavar="DIR", help="output dir")
    report.add_argument("--bucket", type=int, default=60, metavar="S", help="bucket seconds")
    report.add_argument("--master", help="Spark master (default: $CHRONOQ_SPARK_MASTER)")
    report.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    bench = sub.add_parser("bench", help="run a benchmark script of bench/ (no name: list)")
    bench.add_argument("name", nargs="?", help="e.g. timer-load, remote-send")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    from broker_adapter.server.cli import add_serve_parser  # msgpack etc. only for the CLI
    from broker_adapter.server.cli_admin import add_admin_parsers

    broker = sub.add_parser("broker", help="the built-in broker as a server for many processes")
    broker_commands = broker.add_subparsers(dest="broker_command", required=True)
    add_serve_parser(broker_commands)
    add_admin_parsers(broker_commands)  # backup, check
    ops: dict[str, argparse.ArgumentParser] = {}
    for name, what in (
        ("send", "send a message"),
        ("abort", "abort a pending message"),
        ("query", "show one message"),
        ("stats", "broker counters"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument(
            "--url",
            default=os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL,
            help="broker URL (default: $CHRONOQ_BROKER_URL or %(default)s)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        ops[name] = p
    ops["send"].add_argument("--topic", required=True)
    ops["send"].add_argument("--key")
    ops["send"].add_argument("--delay-ms", type=int)
    ops["send"].add_argument("--body", help="the body, as text")
    ops["send"].add_argument("--job", help="send a job call to this job name")
    ops["send"].add_argument("--args", default="[]", help="job args, a JSON array")
    ops["send"].add_argument("--kwargs", default="{}", help="job kwargs, a JSON object")
    ops["abort"].add_argument("--id")
    ops["abort"].add_argument("--key")
    ops["abort"].add_argument("--topic")
    ops["query"].add_argument("msg_id")
    add_runtime_parsers(sub, os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL)
    cli_schedules.add_parser(sub)
    cli_dashboard.add_parser(sub)
    cli_dead.add_parser(sub, os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``chronoq`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command in ("run", "worker"):
            return _cmd_run(args)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "bench":
            return _cmd_bench(args)
        if args.command == "broker":
            return int(args.func(args))
        if getattr(args, "runtime_command", None):
            return run_runtime(args)
        if args.command == "schedules":
            return cli_schedules.run(args)
        if args.command == "dashboard":
            return cli_dashboard.run(args)
        if args.command == "dead-letters":
            return cli_dead.run(args)
        with open_broker(args.url) as broker:
            return _OPS[args.command](args, broker)
    except ChronoqError as e:
        print(f"chronoq {args.command}: {e}", file=sys.stderr)
        return 1
    except json.JSONDecodeError as e:
        print(f"chronoq {args.command}: bad JSON: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
