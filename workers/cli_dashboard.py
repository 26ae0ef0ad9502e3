"""``chronoq dashboard``: serve the dashboard (:mod:`workers.dashboard`) with uvicorn.

::

    chronoq dashboard --url URL [--host 127.0.0.1] [--port 7440] [--token T]
                      [--trace-dir DIR] [--allowed-host NAME ...]

Binds 127.0.0.1 by default; any address that is not loopback is refused without
a token (``--token`` or ``CHRONOQ_TOKEN``), as ``chronoq broker serve`` does.
Requests must name the bound address or a loopback name in their ``Host`` header
(DNS rebinding), or a name given with ``--allowed-host``; bound to a wildcard
(``0.0.0.0``, ``::``) without ``--allowed-host``, any name is accepted, the token
being the defence. ``--port 0`` takes a free port. Once listening it prints exactly one line to
stdout, ``chronoq dashboard listening on http://HOST:PORT``. Exit status 2 for
options that cannot work (nothing is started then).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from broker_adapter.errors import ChronoqError, InvalidArgument
from broker_adapter.extras import require
from broker_adapter.listen import add_listen_options, check_bind
from scheduler.settings import DEFAULT_BROKER_URL

#: The default TCP port.
DEFAULT_PORT = 7440


def add_parser(sub: Any) -> None:
    """Add ``dashboard`` to the ``chronoq`` subcommands ``sub``."""
    p = sub.add_parser("dashboard", help="web dashboard and JSON API over a broker")
    p.add_argument(
        "--url",
        default=os.environ.get("CHRONOQ_BROKER_URL") or DEFAULT_BROKER_URL,
        help="broker URL (default: $CHRONOQ_BROKER_URL or %(default)s)",
    )
    add_listen_options(p, DEFAULT_PORT, "token API calls must send")
    p.add_argument("--trace-dir", metavar="DIR", help="delivery trace for the lateness page")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the dashboard is reached under besides loopback (repeatable)",
    )
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def _fail(message: str) -> int:
    sys.stderr.write(f"chronoq dashboard: {message}\n")
    return 2


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say
    # TCP, and without it a keep-alive answer waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def run(args: argparse.Namespace) -> int:
    """Run ``chronoq dashboard`` until SIGTERM/SIGINT; the exit status."""
    try:
        check_bind(
            args.host,
            args.token,
            f"--host {args.host} is not a loopback address: give a --token (or set "
            "CHRONOQ_TOKEN), or bind 127.0.0.1",
        )
    except InvalidArgument as e:
        return _fail(str(e))
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: give 0..65535")
    try:
        require("uvicorn", "dashboard", "chronoq dashboard")
        from workers.dashboard import create_app
        from workers.dashboard.serve import serve
    except ChronoqError as e:
        return _fail(str(e))
    try:
        sock = _listen(args.host, args.port)
    except OSError as e:
        return _fail(f"cannot listen on {args.host}:{args.port}: {e}")
    port = sock.getsockname()[1]
    allowed = list(args.allowed_host)
    if args.host in ("0.0.0.0", "::"):
        # A wildcard has no name of its own and needs a token: the token is the defence.
        allowed = allowed or ["*"]
    else:
        allowed.append(f"{args.host}:{port}" if ":" not in args.host else f"[{args.host}]:{port}")
    try:
        app = create_app(
            args.url, token=args.token, trace_dir=args.trace_dir, allowed_hosts=allowed, port=port
        )
    except ChronoqError as e:
        sock.close()
        return _fail(str(e))
    shown = args.host if ":" not in args.host else f"[{args.host}]"
    sys.stdout.write(f"chronoq dashboard listening on http://{shown}:{port}\n")
    sys.stdout.flush()
    try:
        serve(app, sock, args.log_level)
    finally:
        app.state.chronoq_dashboard.close()
        sock.close()
    return 0


__all__ = ["DEFAULT_PORT", "add_parser", "run"]
