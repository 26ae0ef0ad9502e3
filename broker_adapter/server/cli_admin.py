"""``chronoq broker backup`` and ``chronoq broker check``: the embedded broker's admin tools.

``workers/cli.py`` adds them next to ``serve`` with :func:`add_admin_parsers`.

``backup DEST`` takes an online, consistent copy (a RocksDB checkpoint, see
:mod:`~broker_adapter.embedded.backup`) into the new directory ``DEST``:

* ``--data-dir DIR``: when no process holds ``DIR``, it is opened here (without
  firing anything) and copied; when a shared ``rocksdb://`` owner holds it, the
  owner is asked through ``DIR/chronoq.sock``;
* ``--url chronoq://HOST:PORT[?token=T]`` or ``chronoq+unix:///PATH`` (or
  ``--token``/``$CHRONOQ_TOKEN``): the
  server takes it (the ``backup`` admin request); ``DEST`` is a path on the
  server's machine. ``--url rocksdb://DIR`` is ``--data-dir DIR``.

``check --data-dir DIR [--json] [--repair]`` verifies a directory no process holds
(:mod:`~broker_adapter.embedded.check`) and with ``--repair`` fixes it in place
(:mod:`~broker_adapter.embedded.repair`). Exit status: 0 clean (after repair:
sound now), 1 problems found (or left), 2 unusable or refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from broker_adapter.embedded.backup import BackupInfo, backup_directory, check_destination
from broker_adapter.embedded.check import check_directory, holder_of
from broker_adapter.embedded.repair import repair_directory
from broker_adapter.errors import ChronoqError, InvalidArgument
from broker_adapter.server.link import Link
from broker_adapter.server.server import DEFAULT_PORT
from broker_adapter.server.unix_url import UNIX_SCHEME, socket_path
from broker_adapter.shared.broker import SOCKET_NAME
from broker_adapter.urls import split_url

#: How long a backup request may take (a checkpoint flushes and links every file).
BACKUP_TIMEOUT_S = 600.0


def add_admin_parsers(subparsers: Any) -> None:
    """Add ``backup`` and ``check`` to ``subparsers`` (of ``chronoq broker``)."""
    b: argparse.ArgumentParser = subparsers.add_parser(
        "backup", help="take an online, consistent copy of a broker's data directory"
    )
    b.add_argument("dest", help="the new directory to write (must not exist, or be empty)")
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", help="the broker's RocksDB directory")
    where.add_argument(
        "--url",
        help="chronoq://HOST:PORT or chronoq+unix:///PATH of a running server, or rocksdb://DIR",
    )
    b.add_argument(
        "--token",
        default=os.environ.get("CHRONOQ_TOKEN") or None,
        help="the server's token (default: $CHRONOQ_TOKEN, or ?token= in --url)",
    )
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=backup_main)
    c: argparse.ArgumentParser = subparsers.add_parser(
        "check", help="verify a broker data directory offline (checksums and invariants)"
    )
    c.add_argument("--data-dir", required=True, help="the broker's RocksDB directory")
    c.add_argument("--repair", action="store_true", help="fix what can be fixed, in place")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=check_main)


def backup_via_link(link: Link, dest: str) -> BackupInfo:
    """Ask the broker behind ``link`` for a backup into ``dest`` (on its machine)."""
    try:
        return BackupInfo.from_list(link.call("backup", {"dest": dest}, BACKUP_TIMEOUT_S))
    finally:
        link.close()


def backup_data_dir(data_dir: str, dest: str) -> BackupInfo:
    """Back up ``data_dir``: here if no process holds it, else through its shared owner.

    :raises ChronoqError: when it fails (the owner is no shared one: use its --url).
    """
    root = Path(data_dir).resolve()
    if holder_of(root) is None:
        return backup_directory(root, dest)
    sock = root / SOCKET_NAME
    if not sock.exists():
        raise InvalidArgument(
            f"{str(root)!r} is held by {holder_of(root)}, which serves no {SOCKET_NAME}: "
            "if it is `chronoq broker serve`, use --url chronoq://HOST:PORT"
        )
    # The owner resolves DEST itself: give it an absolute path of this machine.
    return backup_via_link(Link(str(sock), None, None), str(check_destination(dest)))


def backup_url(url: str, dest: str, token: str | None) -> BackupInfo:
    """Back up the broker at ``url`` (``chronoq://``, ``chronoq+unix://`` or ``rocksdb://``).

    :raises InvalidArgument: for another scheme or a malformed Unix URL.
    """
    parts = urlsplit(url)
    if parts.scheme == "rocksdb":
        return backup_data_dir(parts.netloc + parts.path, dest)
    if parts.scheme not in ("chronoq", UNIX_SCHEME):
        raise InvalidArgument(
            f"backup takes a chronoq://, {UNIX_SCHEME}:// or rocksdb:// URL, got {url!r}"
        )
    query = parse_qs(parts.query)
    token = query.get("token", [token or ""])[0] or None
    if parts.scheme == UNIX_SCHEME:
        link = Link(socket_path(split_url(url)[1]), None, token)
    else:
        link = Link(parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT, token)
    return backup_via_link(link, dest)


def backup_main(args: argparse.Namespace) -> int:
    """``chronoq broker backup``; the exit status."""
    try:
        if args.url:
            info = backup_url(args.url, args.dest, args.token)
        else:
            info = backup_data_dir(args.data_dir, args.dest)
    except ChronoqError as e:
        sys.stderr.write(f"chronoq broker backup: {e}\n")
        return 2
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "path": info.path,
                    "bytes": info.size_bytes,
                    "files": info.files,
                    "seconds": info.seconds,
                }
            )
            + "\n"
        )
    else:
        sys.stdout.write(info.describe() + "\n")
    return 0


def check_main(args: argparse.Namespace) -> int:
    """``chronoq broker check``; the exit status (0 clean, 1 problems, 2 unusable)."""
    try:
        if args.repair:
            repaired = repair_directory(args.data_dir)
            text = json.dumps(repaired.to_json(), indent=2) if args.json else repaired.describe()
            code = repaired.exit_code
        else:
            report = check_directory(args.data_dir)
            text = json.dumps(report.to_json(), indent=2) if args.json else report.describe()
            code = report.exit_code
    except ChronoqError as e:
        sys.stderr.write(f"chronoq broker check: {e}\n")
        return 2
    sys.stdout.write(text + "\n")
    return code


__all__ = [
    "BACKUP_TIMEOUT_S",
    "add_admin_parsers",
    "backup_data_dir",
    "backup_main",
    "backup_url",
    "backup_via_link",
    "check_main",
]
