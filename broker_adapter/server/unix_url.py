"""``chronoq+unix:///abs/path.sock``: a broker server's Unix socket on this machine.

``chronoq broker serve --unix PATH`` listens there instead of on TCP (the socket is
made 0600, see :mod:`~broker_adapter.server.unix`): a round trip over a Unix socket
costs a fraction of one over loopback TCP (``bench/remote_syscall_cost.py``), and
only the owning user can connect, so ``?token=`` is optional (still checked when
the server has one). Spelled like redis-py's ``unix:///path`` and the
``redis+unix:///path`` of other Redis clients, under this project's scheme: the
path is absolute (three slashes), percent-encoded where it must be (``%3F`` for a
``?``), and names no host. The query takes what ``chronoq://`` takes
(``token``, ``send_timeout_ms``, ``retries``, ``connect_timeout_s``).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, unquote

from broker_adapter.errors import InvalidArgument

#: The scheme of a broker server's Unix socket.
UNIX_SCHEME = "chronoq+unix"


def socket_path(rest: str) -> str:
    """The socket path of a ``chronoq+unix://`` URL whose part between ``://`` and ``?``
    is ``rest``.

    :raises InvalidArgument: for no path, a relative path, a directory (``.../``), or a
        host or ``host:port`` before the path; the message shows the form to use.
    """
    form = f"{UNIX_SCHEME}:///abs/path/broker.sock (three slashes, an absolute path)"
    if rest in ("", "/"):
        raise InvalidArgument(f"a {UNIX_SCHEME}:// URL names no socket path; use {form}")
    if not rest.startswith("/"):
        head, slash, _tail = rest.partition("/")
        if slash and head not in (".", "..", "~") and not head.startswith("~"):
            # ``//host[:port]/path``: a TCP address mixed with a socket path.
            raise InvalidArgument(
                f"a {UNIX_SCHEME}:// URL names a socket file, not a host: got {head!r} before "
                f"the path; use chronoq://{head} for a server on TCP, or {form}"
            )
        raise InvalidArgument(
            f"{rest!r} in a {UNIX_SCHEME}:// URL is a relative path: a broker URL is read "
            f"from other working directories too; use {form}"
        )
    path = unquote(rest)
    if path.endswith("/"):
        raise InvalidArgument(
            f"{path!r} in a {UNIX_SCHEME}:// URL is a directory; name the socket file: {form}"
        )
    return path


def unix_url(path: str | os.PathLike[str]) -> str:
    """The ``chronoq+unix://`` URL of the socket at ``path`` (made absolute), without a token.

    :raises InvalidArgument: for an empty path.
    """
    text = os.fspath(path)
    if not text:
        raise InvalidArgument("a Unix socket path is empty; give the socket file's path")
    return f"{UNIX_SCHEME}://{quote(str(Path(text).absolute()), safe='/')}"


__all__ = ["UNIX_SCHEME", "socket_path", "unix_url"]
