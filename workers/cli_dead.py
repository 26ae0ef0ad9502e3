"""``chronoq dead-letters``: list, requeue and purge a consumer group's dead letters.

::

    chronoq dead-letters list    --group G [--url URL] [--limit N] [--body] [--json]
    chronoq dead-letters requeue --group G (--id ID [--id ID ...] | --all) [--url URL] [--json]
    chronoq dead-letters purge   --group G (--id ID [--id ID ...] | --all) [--url URL] [--json]

``list`` prints every dead letter of the group (oldest death first; at most
``--limit``, default 1,000): id, original topic, time of death (UTC), attempts,
key and the error. ``requeue`` gives each back to the group as a fresh delivery due
now; ``purge`` drops them. ``--all`` works through every dead letter of the group
in bounded calls (:meth:`~broker_adapter.base.BrokerAdapter.requeue_dead` until it
answers 0). Exit status: 0 done (``list`` always), 1 when nothing was requeued or
purged, 2 for bad input (nothing changed).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import InvalidArgument, InvalidTopic
from broker_adapter.results import MessageView
from broker_adapter.urls import open_broker

#: Dead letters per call of ``--all`` (the contract's default bound).
CHUNK = 1_000


def add_parser(sub: Any, default_url: str) -> None:
    """Add ``dead-letters`` and its actions to the ``chronoq`` subcommands ``sub``."""
    parser = sub.add_parser("dead-letters", help="list, requeue or purge a group's dead letters")
    actions = parser.add_subparsers(dest="dead_action", required=True)
    for action, what in (
        ("list", "list a group's dead letters, oldest death first"),
        ("requeue", "deliver dead letters to their group again, now"),
        ("purge", "drop dead letters for good"),
    ):
        p = actions.add_parser(action, help=what)
        p.add_argument("--group", required=True, help="the consumer group")
        p.add_argument("--url", default=default_url, help="broker URL (default: %(default)s)")
        p.add_argument("--json", action="store_true", help="print JSON")
        if action == "list":
            p.add_argument("--limit", type=int, default=CHUNK, help="most listed (%(default)s)")
            p.add_argument("--body", action="store_true", help="add each body (as text)")
        else:
            which = p.add_mutually_exclusive_group(required=True)
            which.add_argument("--id", action="append", dest="ids", help="a message id")
            which.add_argument("--all", action="store_true", help="every dead letter")


def _say(text: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def _row(v: MessageView) -> dict[str, Any]:
    died = datetime.fromtimestamp(v.deliver_at_ms / 1000, UTC).isoformat(timespec="milliseconds")
    row: dict[str, Any] = {
        "msg_id": v.msg_id,
        "topic": v.topic,
        "died": died.replace("+00:00", "Z"),
        "attempts": v.attempts,
        "key": v.key,
        "tags": v.tags,
        "error": v.error,
    }
    if v.body is not None:
        row["body"] = v.body.decode(errors="replace")
    return row


def _list(broker: BrokerAdapter, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidArgument(f"--limit must be >= 1, got {args.limit}")
    rows: list[dict[str, Any]] = []
    cursor = None
    while len(rows) < args.limit:
        page = broker.dead_letters(
            args.group, cursor=cursor, limit=min(100, args.limit - len(rows)), with_body=args.body
        )
        rows.extend(_row(v) for v in page.messages)
        cursor = page.cursor
        if cursor is None:
            break
    if args.json:
        _say(json.dumps({"group": args.group, "dead_letters": rows, "more": cursor is not None}))
        return 0
    for r in rows:
        _say(
            f"{r['msg_id']}  {r['topic']}  {r['died']}  attempts={r['attempts']}  "
            f"key={r['key'] or '-'}  error={r['error'] or '-'}"
        )
    _say(
        f"{len(rows)} dead letter(s) of {args.group}" + (" (more: raise --limit)" if cursor else "")
    )
    return 0


def _settle(broker: BrokerAdapter, args: argparse.Namespace) -> int:
    call = broker.requeue_dead if args.dead_action == "requeue" else broker.purge_dead
    if args.all:
        done = 0
        while (n := call(args.group, None, limit=CHUNK)) > 0:
            done += n
    else:
        ids = list(dict.fromkeys(args.ids))
        done = sum(call(args.group, ids[i : i + CHUNK]) for i in range(0, len(ids), CHUNK))
    word = "requeued" if args.dead_action == "requeue" else "purged"
    if args.json:
        _say(json.dumps({"group": args.group, word: done}))
    else:
        _say(f"{word} {done} dead letter(s) of {args.group}")
    return 0 if done else 1


def run(args: argparse.Namespace) -> int:
    """Run ``chronoq dead-letters ...``; its exit status (see the module docstring)."""
    try:
        with open_broker(args.url) as broker:
            if args.dead_action == "list":
                return _list(broker, args)
            return _settle(broker, args)
    except (InvalidArgument, InvalidTopic) as e:  # bad input: nothing changed
        _say(f"chronoq dead-letters {args.dead_action}: {e}", sys.stderr)
        return 2


__all__ = ["CHUNK", "add_parser", "run"]
