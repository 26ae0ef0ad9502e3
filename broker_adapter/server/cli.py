"""``chronoq broker serve``: run a :class:`BrokerServer` until SIGTERM or SIGINT.

``workers/cli.py`` adds this as a subcommand with :func:`add_serve_parser`;
``python -m broker_adapter.server`` runs it on its own. On start it writes one
line, ``chronoq broker listening on HOST:PORT node NODE``, to stdout (with
``--port 0`` that names the port picked). With ``--unix PATH`` it listens on a Unix
socket there instead of TCP (mode 0600; a token is then optional) and the line is
``chronoq broker listening on PATH node NODE url chronoq+unix:///PATH``, the URL
clients use (:mod:`~broker_adapter.server.unix_url`). SIGTERM drains in-flight requests,
flushes the broker and exits 0. SIGUSR1 takes a backup (a consistent copy of
the data directory, see :mod:`~broker_adapter.embedded.backup`) into a new
timestamped directory under ``--backup-dir`` and prints
``chronoq broker backup PATH`` to stdout (and logs it); ``chronoq broker backup
--url`` asks for one through the ``backup`` admin request.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_adapter.embedded.backup import timestamped
from broker_adapter.errors import ChronoqError, InvalidArgument
from broker_adapter.listen import add_listen_options
from broker_adapter.server.admission import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_PER_PEER,
    DEFAULT_MAX_UNAUTHENTICATED,
)
from broker_adapter.server.server import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_PORT,
    BrokerServer,
)
from broker_adapter.server.unix import check_free
from broker_adapter.server.unix_url import unix_url

log = logging.getLogger("chronoq.broker_adapter.BrokerServer")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` command to ``subparsers`` (of ``chronoq broker``); returns it.

    The parser's default ``func`` is :func:`serve_main`.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve", help="serve one embedded broker to many processes over TCP (or --unix)"
    )
    configure_parser(p)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to ``p``."""
    p.add_argument("--data-dir", required=True, help="the broker's RocksDB directory")
    add_listen_options(p, DEFAULT_PORT, "token clients must present")
    # Defaults that say they were not given, so --unix can refuse an explicit --host/--port.
    p.set_defaults(host=_Unset(p.get_default("host")), port=_UnsetPort(p.get_default("port")))
    p.add_argument(
        "--unix",
        metavar="PATH",
        help="listen on a Unix socket at PATH (made 0600) instead of TCP; clients use "
        "chronoq+unix:///abs/PATH (token optional); not with --host/--port",
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (same --host)"
    )
    p.add_argument(
        "--durability",
        choices=["wal", "sync", "fast"],
        default="wal",
        help="the embedded broker's durability (default %(default)s)",
    )
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS)
    p.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=_env("CHRONOQ_MAX_CONNECTIONS_PER_PEER", int, DEFAULT_MAX_PER_PEER),
        metavar="N",
        help="connections one client address may hold; every process on one host "
        "shares its address, ~2-3 per chronoq run "
        "(default %(default)s, $CHRONOQ_MAX_CONNECTIONS_PER_PEER)",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=DEFAULT_MAX_INFLIGHT,
        help="unanswered requests per connection (default %(default)s)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds in-flight requests get on SIGTERM (default %(default)s)",
    )
    p.add_argument(
        "--manual-clock",
        type=int,
        metavar="START_MS",
        help="TEST-ONLY: run on a manual clock from START_MS and accept the "
        "'advance' and 'reset' admin requests (reset empties the data dir)",
    )
    p.add_argument(
        "--backup-dir",
        default=os.environ.get("CHRONOQ_BACKUP_DIR") or None,
        help="SIGUSR1 writes a backup into a new timestamped directory here "
        "(default: $CHRONOQ_BACKUP_DIR)",
    )
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=serve_main)


def serve_main(args: argparse.Namespace) -> int:
    """Run the server ``args`` describe until SIGTERM/SIGINT; the exit status."""
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Hand the GIL over sooner, so a busy thread does not delay a due delivery by 5 ms.
    sys.setswitchinterval(0.0005)
    unix_path = None
    try:
        if args.unix is not None:
            unix_path = _unix_path(args)
        server = BrokerServer(
            args.data_dir,
            args.host,
            args.port,
            token=args.token,
            unix_path=unix_path,
            manual_clock_ms=args.manual_clock,
            max_connections=args.max_connections,
            max_inflight=args.max_inflight,
            broker_options={"durability": args.durability},
            max_connections_per_peer=args.max_connections_per_peer,
            max_unauthenticated=_env(
                "CHRONOQ_MAX_UNAUTHENTICATED", int, DEFAULT_MAX_UNAUTHENTICATED
            ),
            hello_timeout_s=_env("CHRONOQ_HELLO_TIMEOUT_S", float, DEFAULT_HELLO_TIMEOUT_S),
        )
    except ChronoqError as e:
        sys.stderr.write(f"chronoq broker serve: {e}\n")
        return 2
    except OSError as e:  # the broker is closed again by the server (see BrokerServer)
        where = unix_path or f"{args.host}:{args.port}"
        sys.stderr.write(f"chronoq broker serve: cannot listen on {where}: {e}\n")
        return 2
    try:
        if args.metrics_port is not None:
            server.metrics.serve(args.metrics_port, args.host)
    except OSError as e:
        sys.stderr.write(f"chronoq broker serve: metrics port: {e}\n")
        server.shutdown(0)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    backup_wanted = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: backup_wanted.set())
    threading.Thread(
        target=_backups_on_signal,
        args=(server, args.backup_dir, backup_wanted),
        name="chronoq-backup-signal",
        daemon=True,
    ).start()
    server.start()
    # A full collection stops every thread while it walks every tracked object, most
    # of them start-up state that never becomes garbage (a 8-9 ms pause at 3,300 jobs/s
    # here, a job due then starts that late): freeze it, as `chronoq run` does.
    gc.collect()
    gc.freeze()
    if unix_path is None:
        line = f"chronoq broker listening on {server.host}:{server.port} node {server.node}\n"
    else:
        url = unix_url(unix_path)
        line = f"chronoq broker listening on {unix_path} node {server.node} url {url}\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    while not stop.wait(1.0):
        pass
    log.info("signal received: draining")
    server.shutdown(args.drain_timeout)
    return 0


class _Unset(str):
    """``--host``'s default, telling apart an address not given (``--unix`` refuses one
    that is)."""


class _UnsetPort(int):
    """``--port``'s default, likewise."""


def _unix_path(args: argparse.Namespace) -> str:
    """The absolute socket path of ``--unix``, checked free (see
    :func:`~broker_adapter.server.unix.check_free`).

    :raises InvalidArgument: for ``--host``/``--port`` given too, an empty path, or a
        path taken.
    """
    given = [
        flag
        for flag, value, unset in (("--host", args.host, _Unset), ("--port", args.port, _UnsetPort))
        if not isinstance(value, unset)
    ]
    if given:
        raise InvalidArgument(
            f"--unix listens on a Unix socket only; drop {' and '.join(given)} "
            "(or drop --unix to serve TCP)"
        )
    if not args.unix:
        raise InvalidArgument("--unix needs a path, e.g. --unix /run/chronoq/broker.sock")
    path = Path(args.unix).absolute()
    check_free(path)
    return str(path)


def _env(name: str, kind: type[Any], default: Any) -> Any:
    """``$name`` as ``kind``, or ``default`` when unset.

    :raises SystemExit: for a value that is not a ``kind`` (argparse-style, exit 2).
    """
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        sys.stderr.write(f"chronoq broker serve: ${name}={raw!r} is not a {kind.__name__}\n")
        raise SystemExit(2) from None


def _backups_on_signal(
    server: BrokerServer, backup_dir: str | None, wanted: threading.Event
) -> None:
    """Take a backup each time ``wanted`` is set (by SIGUSR1), off the signal handler."""
    while True:
        wanted.wait()
        wanted.clear()
        if backup_dir is None:
            log.warning("SIGUSR1: no backup taken, start the server with --backup-dir DIR")
            continue
        try:
            info = server.broker.backup(timestamped(backup_dir))
        except ChronoqError as e:
            log.error("SIGUSR1: backup failed: %s", e)
            continue
        log.info("SIGUSR1: %s", info.describe())
        sys.stdout.write(f"chronoq broker backup {info.path}\n")
        sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m broker_adapter.server [serve options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m broker_adapter.server",
        description="serve one embedded chronoq broker over TCP",
    )
    configure_parser(parser)
    return serve_main(parser.parse_args(argv))
