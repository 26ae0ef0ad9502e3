"""``chronoq schedules``: list and manage an app's schedules from the command line.

::

    chronoq schedules list    [--url URL] [--app module:app] [--json]
    chronoq schedules pause   [--url URL] [--app module:app] NAME [--json]
    chronoq schedules resume  [--url URL] [--app module:app] NAME [--json]
    chronoq schedules run-now [--url URL] [--app module:app] NAME [--json]
    chronoq schedules remove  [--url URL] [--app module:app] NAME [--json]

Every command works from the broker alone (``--url``, default
``CHRONOQ_BROKER_URL``): schedules are stored there (:mod:`scheduler.schedules`),
and so is a record of each ``@app.cron``/``@app.every`` job once ``chronoq run``
started the app. ``--app`` adds what only the code knows: the cron jobs of an app
that never ran (listed, and pausable), and the refusal to ``remove`` a cron job
the code defines. Without ``--app``, ``remove`` of a cron job's record only
forgets its paused state (the next ``chronoq run`` stores it again).

Exit status: 0 on success, 1 when the schedule does not exist, 2 for a request
that cannot work (e.g. removing a cron job of ``--app``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from broker_adapter.urls import open_broker
from scheduler import apps
from scheduler.errors import InvalidSchedule, ScheduleNotFound
from scheduler.scheduler import Scheduler
from scheduler.schedules import ScheduleInfo
from scheduler.settings import DEFAULT_BROKER_URL

_ACTIONS = ("list", "pause", "resume", "run-now", "remove")


def add_parser(sub: Any) -> None:
    """Add ``schedules`` and its actions to the ``chronoq`` subcommands ``sub``."""
    parser = sub.add_parser("schedules", help="list, pause, resume, run or remove schedules")
    actions = parser.add_subparsers(dest="schedules_action", required=True)
    for action, what in (
        ("list", "list every schedule with its next fire times"),
        ("pause", "pause a schedule (a cron job too): nothing fires until resumed"),
        ("resume", "resume a paused schedule from now"),
        ("run-now", "one extra run of a schedule's job now"),
        ("remove", "remove a stored schedule and its pending occurrence"),
    ):
        p = actions.add_parser(action, help=what)
        p.add_argument(
            "--url",
            default=None,
            help="broker URL (default: the app's, else $CHRONOQ_BROKER_URL or "
            f"{DEFAULT_BROKER_URL})",
        )
        p.add_argument("--app", metavar="MODULE:APP", help="the app, for its cron jobs")
        p.add_argument("--json", action="store_true", help="print JSON")
        if action != "list":
            p.add_argument("name", metavar="NAME", help="the schedule's name")


def _open_app(args: argparse.Namespace, stack: contextlib.ExitStack) -> Scheduler:
    """The app to work on (closed with ``stack``): ``--app`` on its broker or on
    ``--url``, else a bare app on ``--url``."""
    if args.app:
        try:
            app = stack.enter_context(apps.load_app(args.app))
        except apps.AppNotFound as e:
            raise SystemExit(f"chronoq schedules: {e}") from e
        if args.url:
            broker = stack.enter_context(open_broker(args.url))
            stack.enter_context(app.use_broker(broker))
        return app
    url = args.url or os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL
    return stack.enter_context(Scheduler(url))


def _say(text: str, stream: TextIO | None = None) -> None:
    """Write one line to stdout (or ``stream``): the command's output."""
    (stream or sys.stdout).write(text + "\n")


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _line(info: ScheduleInfo) -> str:
    d = info.definition
    state = "paused" if d.paused else "active"
    nxt = ", ".join(_when(t) for t in info.next_fire_ms) or "-"
    return f"{d.name}  {d.source}  {state}  v{d.version}  {d.describe()}  job={d.job}  next: {nxt}"


def run(args: argparse.Namespace) -> int:
    """Run ``chronoq schedules <action>``; returns the exit status."""
    action = args.schedules_action
    with contextlib.ExitStack() as stack:
        try:
            return _act(_open_app(args, stack), args, action)
        except ScheduleNotFound as e:
            _say(f"chronoq schedules {action}: {e}", sys.stderr)
            return 1
        except InvalidSchedule as e:
            _say(f"chronoq schedules {action}: {e}", sys.stderr)
            return 2


def _act(app: Scheduler, args: argparse.Namespace, action: str) -> int:
    """Do ``action`` on ``app``'s schedules and print the result."""
    if action == "list":
        infos = app.schedules.list()
        if args.json:
            _say(json.dumps([i.to_dict() for i in infos], sort_keys=True))
        else:
            _say("\n".join(_line(i) for i in infos) or "(no schedules)")
        return 0
    name = args.name
    if action == "run-now":
        sent = app.schedules.run_now(name)
        if args.json:
            _say(json.dumps({"name": name, "msg_id": sent.msg_id}))
        else:
            _say(f"{name}: run sent ({sent.msg_id})")
        return 0
    if action == "remove" and not args.app:
        info = app.schedules.get(name)
        if info.source == "decorator":
            _say(
                f"chronoq schedules: {name!r} is an @app.cron/@app.every job; its record "
                "(the paused state) is forgotten, and stored again by the next chronoq run",
                sys.stderr,
            )
    info = {
        "pause": app.schedules.pause,
        "resume": app.schedules.resume,
        "remove": app.schedules.remove,
    }[action](name)
    if args.json:
        _say(json.dumps(info.to_dict(), sort_keys=True))
    else:
        _say(_line(info) if action != "remove" else f"{name}: removed")
    return 0


__all__ = ["add_parser", "run"]
