"""Where a chronoq service listens: the ``--host``/``--port``/``--token`` options and
the rule that an address other than loopback needs a token.

The broker server (``chronoq broker serve``), its metrics endpoint, ``chronoq run
--metrics-port`` and ``chronoq dashboard`` all bind 127.0.0.1 by default and refuse
any other address without a token: whoever can reach such an address could use
the service.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket

from broker_adapter.errors import InvalidArgument

#: The address every service binds by default.
DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs
    )


def check_bind(host: str, token: str | None, refusal: str) -> None:
    """Refuse to bind a non-loopback ``host`` without a ``token``.

    :param refusal: the error's message: what was refused and what to do.
    :raises InvalidArgument: with ``refusal`` for a non-loopback ``host`` without a token.
    """
    # With a token any address will do: skip the resolver call.
    if not token and not is_loopback(host):
        raise InvalidArgument(refusal)


def add_listen_options(p: argparse.ArgumentParser, default_port: int, token_help: str) -> None:
    """Add ``--host`` (default 127.0.0.1), ``--port`` (0 for a free one) and ``--token``
    (default ``$CHRONOQ_TOKEN``) to ``p``.

    :param token_help: who must send the token, e.g. ``"token clients must present"``.
    """
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default %(default)s)")
    p.add_argument(
        "--port",
        type=int,
        default=default_port,
        help="TCP port, 0 for a free one (default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("CHRONOQ_TOKEN") or None,
        help=f"{token_help} (default: $CHRONOQ_TOKEN); required for a non-loopback --host",
    )


__all__ = ["DEFAULT_HOST", "add_listen_options", "check_bind", "is_loopback"]
