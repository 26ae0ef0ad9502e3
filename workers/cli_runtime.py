"""``chronoq reschedule``, ``chronoq cancel`` and ``chronoq pending``: manage pending
runs of a broker from the command line, without the app's code.

::

    chronoq reschedule --url URL (--id ID | --key KEY --topic T) (--delay SECONDS | --at ISO8601)
    chronoq cancel     --url URL --key-prefix P [--topic T] [--quiet]
    chronoq pending    --url URL [--job NAME] [--key-prefix P] [--topic T]
                       [--start ISO8601] [--end ISO8601] [--limit N]

``--url`` defaults to ``CHRONOQ_BROKER_URL`` (``rocksdb://./chronoq-data``); a
``rocksdb://`` directory a running app owns is reached through its socket. Every
command takes ``--json`` (one JSON document on stdout). Times are ISO 8601 with a
zone (``2030-01-01T09:00:00+01:00``, ``...Z``); text output shows them in UTC.

* ``reschedule`` moves one pending run (``--delay 0`` runs it now). Without
  ``--topic`` a key is ambiguous, so ``--key`` needs it.
* ``cancel`` aborts every pending run whose key starts with the prefix, on
  ``--topic`` or on every topic the broker has (retry and dead-letter topics
  aside), and says which keys had already fired. On a terminal it shows a
  progress bar of keys done on stderr (in countable chunks:
  :mod:`workers.prefix_cancel`); piped or with ``--quiet``, nothing.
* ``pending`` lists runs not yet due in due-time order, by job (its runs' tags),
  key prefix, topic and due-time window, reading every page up to ``--limit``
  (default 100). Without ``--topic``, ``--key-prefix`` searches every topic.

Exit status: **0** done (``RESCHEDULED``; ``cancel`` aborted at least one run;
``pending`` listed, even nothing); **1** nothing to act on (``NOT_FOUND`` or
``ALREADY_DELIVERED``; ``cancel`` aborted nothing; a ``--topic`` the broker never
had a message on) or the broker failed; **2** bad input (the message says what
to give), and then nothing changed.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from broker_adapter import BrokerAdapter, open_broker
from broker_adapter.errors import ChronoqError, UnknownTopic
from broker_adapter.message import check_topic
from broker_adapter.results import PrefixAbortResult, RescheduleStatus
from scheduler.app_pending import check_app_prefix
from scheduler.pending_runs import PendingRun, RunQuery, iter_runs
from scheduler.progress import progress
from scheduler.receipts import CancelAllResult
from workers.prefix_cancel import cancel_prefix

#: Exit statuses (see the module docstring).
DONE, NOTHING, BAD_INPUT = 0, 1, 2


class BadInput(ChronoqError, ValueError):
    """A command-line value that cannot be used (exit status 2)."""


def _iso_ms(option: str, text: str | None) -> int | None:
    """``text`` (ISO 8601 with a zone) as epoch ms."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"{option} {text!r} is not an ISO 8601 time such as 2030-01-01T09:00:00Z"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadInput(f"{option} {text!r} has no zone; add one, e.g. {text}Z or {text}+01:00")
    return int(at.timestamp() * 1000)


def _utc(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """JSON-ready ``value`` (enums by value, mappings and sequences walked)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    """The command's answer on stdout: ``doc`` as JSON with ``--json``, else ``text``."""
    sys.stdout.write((json.dumps(_plain(doc), sort_keys=True) if args.json else text) + "\n")


def _fail(name: str, error: Exception, status: int) -> int:
    sys.stderr.write(f"chronoq {name}: {error}\n")
    return status


def _topics(broker: BrokerAdapter) -> list[str]:
    """Every topic the broker has, retry and dead-letter topics (``%...%``) aside."""
    return sorted(t for t in broker.stats().topics if not t.startswith("%"))


# -- the commands -----------------------------------------------------------------------------


def cmd_reschedule(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    """``chronoq reschedule``: move one pending run."""
    if (args.id is None) == (args.key is None):
        raise BadInput("give exactly one of --id or --key (with --topic)")
    if args.key is not None and args.topic is None:
        raise BadInput("--key needs --topic: keys are per topic")
    if args.id is not None and args.topic is not None:
        raise BadInput("--topic goes with --key only; an id names one message")
    if (args.delay is None) == (args.at is None):
        raise BadInput(
            "give exactly one of --delay SECONDS or --at ISO8601 (--delay 0 runs it now)"
        )
    delay_ms = None
    if args.delay is not None:
        if not math.isfinite(args.delay) or args.delay < 0:
            raise BadInput(f"--delay {args.delay}: give seconds >= 0")
        delay_ms = round(args.delay * 1000)
    res = broker.reschedule(
        args.id,
        key=args.key,
        topic=args.topic,
        delay_ms=delay_ms,
        deliver_at_ms=_iso_ms("--at", args.at),
    )
    doc = {
        "status": res.status,
        "msg_id": res.msg_id,
        "deliver_at_ms": res.deliver_at_ms,
        "deliver_at": _utc(res.deliver_at_ms),
    }
    due = f" due {doc['deliver_at']}" if res.deliver_at_ms is not None else ""
    _out(args, doc, f"{res.status.value} {res.msg_id or ''}{due}".replace("  ", " ").rstrip())
    return DONE if res.status is RescheduleStatus.RESCHEDULED else NOTHING


def cmd_cancel(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    """``chronoq cancel --key-prefix``: abort every pending run under a prefix."""
    prefix = check_app_prefix(args.key_prefix)
    topics = [check_topic(args.topic)] if args.topic is not None else _topics(broker)
    results: list[PrefixAbortResult] = []
    with progress("cancelling", unit=" keys", quiet=args.quiet) as bar:
        if bar.shown:  # on a terminal: in chunks it can count (same answer, more work)
            results = cancel_prefix(broker, topics, prefix, bar, strict=args.topic is not None)
        else:
            for topic in topics:
                try:
                    results.append(broker.abort_prefix(topic, prefix))
                except UnknownTopic:
                    if args.topic is not None:
                        raise
    res = CancelAllResult.of(results, topics)
    doc = {
        "aborted": res.aborted,
        "already_delivered": list(res.already_delivered),
        "already_delivered_count": res.already_delivered_count,
        "topics": list(res.topics),
    }
    lines = [f"aborted {res.aborted}; already fired {res.already_delivered_count}"]
    lines += [f"  fired: {k}" for k in res.already_delivered]
    _out(args, doc, "\n".join(lines))
    return DONE if res.aborted else NOTHING


def _pending_runs(args: argparse.Namespace, broker: BrokerAdapter) -> Iterator[PendingRun]:
    if args.limit < 1:
        raise BadInput(f"--limit {args.limit}: give at least 1")
    if args.key_prefix is not None:
        check_app_prefix(args.key_prefix)
    topics: tuple[str | None, ...]
    if args.topic is not None:
        topics = (check_topic(args.topic),)
    elif args.key_prefix is not None:
        topics = tuple(_topics(broker))
    else:
        topics = (None,)
    query = RunQuery(
        topics,
        strict=args.topic is not None,
        key_prefix=args.key_prefix,
        tag=args.job,
        start_ms=_iso_ms("--start", args.start),
        end_ms=_iso_ms("--end", args.end),
        limit=args.limit,
    )
    return iter_runs(broker, query)


def _run_doc(run: PendingRun) -> dict[str, Any]:
    view = run.view
    return {
        "msg_id": run.msg_id,
        "topic": run.topic,
        "state": view.state,
        "key": run.key,
        "tags": view.tags,
        "job": run.job,
        "args": list(run.args),
        "kwargs": dict(run.kwargs),
        "deliver_at_ms": run.deliver_at_ms,
        "deliver_at": _utc(run.deliver_at_ms),
        "born_ms": view.born_ms,
        "attempts": view.attempts,
        "body_size": view.body_size,
    }


def _run_line(run: PendingRun) -> str:
    """``<due> <id> <topic> key=<key> <job>(<args>)``: one line of ``chronoq pending``."""
    what = f" job={run.job}" if run.job else ""
    if run.call is not None:
        parts = [json.dumps(a) for a in run.args] + [
            f"{k}={json.dumps(v)}" for k, v in run.kwargs.items()
        ]
        what = f" {run.call.name}({', '.join(parts)})"
    return f"{_utc(run.deliver_at_ms)} {run.msg_id} {run.topic} key={run.key}{what}"


def cmd_pending(args: argparse.Namespace, broker: BrokerAdapter) -> int:
    """``chronoq pending``: list pending runs in due-time order."""
    runs = list(_pending_runs(args, broker))
    docs = [_run_doc(r) for r in runs]
    _out(args, docs, "\n".join(_run_line(r) for r in runs) or "(nothing pending)")
    return DONE


_COMMANDS: dict[str, Callable[[argparse.Namespace, BrokerAdapter], int]] = {
    "reschedule": cmd_reschedule,
    "cancel": cmd_cancel,
    "pending": cmd_pending,
}


def add_runtime_parsers(sub: Any, url_default: str) -> None:
    """Add ``reschedule``, ``cancel`` and ``pending`` to the ``chronoq`` subcommands
    ``sub``; :func:`run_runtime` runs the one parsed."""
    helps = {
        "reschedule": "move a pending run to a new time (--delay 0: run it now)",
        "cancel": "cancel every pending run under a key prefix",
        "pending": "list pending runs (by job, key prefix, topic, due time)",
    }
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, what in helps.items():
        p = sub.add_parser(name, help=what)
        p.add_argument(
            "--url",
            default=url_default,
            help="broker URL (default: $CHRONOQ_BROKER_URL or %(default)s)",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(runtime_command=name)
        parsers[name] = p
    p = parsers["reschedule"]
    p.add_argument("--id", help="the run's message id")
    p.add_argument("--key", help="the run's key (with --topic)")
    p.add_argument("--topic", help="the topic of --key")
    p.add_argument("--delay", type=float, metavar="SECONDS", help="due this many seconds from now")
    p.add_argument("--at", metavar="ISO8601", help="due at this time (with a zone)")
    p = parsers["cancel"]
    p.add_argument("--key-prefix", required=True, help="e.g. order:42:")
    p.add_argument("--topic", help="only this topic (default: every topic)")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p = parsers["pending"]
    p.add_argument("--job", help="only runs of this job (its name)")
    p.add_argument("--key-prefix", help="only runs whose key starts with this")
    p.add_argument("--topic", help="only this topic")
    p.add_argument("--start", metavar="ISO8601", help="only runs due at or after this")
    p.add_argument("--end", metavar="ISO8601", help="only runs due before this")
    p.add_argument("--limit", type=int, default=100, help="most runs listed (default 100)")


def run_runtime(args: argparse.Namespace) -> int:
    """Run the parsed runtime command (see the module for its exit status)."""
    name = args.runtime_command
    try:
        with open_broker(args.url) as broker:
            return _COMMANDS[name](args, broker)
    except UnknownTopic as e:
        return _fail(name, e, NOTHING)
    except (ValueError, TypeError) as e:  # bad input: the ChronoqError ones say what to give
        if not isinstance(e, ChronoqError):
            raise
        return _fail(name, e, BAD_INPUT)
    except ChronoqError as e:
        return _fail(name, e, NOTHING)


__all__ = [
    "BadInput",
    "add_runtime_parsers",
    "cmd_cancel",
    "cmd_pending",
    "cmd_reschedule",
    "run_runtime",
]
