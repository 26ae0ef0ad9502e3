"""Unix sockets for the broker server: listen with 0600 permissions, connect, clean up.

A Unix socket is reachable only by whoever may open its file, so the shared
directory's socket (see :mod:`broker_adapter.shared`) needs no token: it is
made ``0600`` (the owning user only) *before* anyone can connect, by binding a
temporary name, changing its mode and then renaming it over the final path
(which also replaces a stale socket of a dead owner in one step).

``sun_path`` holds at most 107 bytes; a longer path is reached through
``/proc/self/fd/N/NAME``, ``N`` being an open descriptor of its directory
(Linux), so a deep data directory still works.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from broker_adapter.errors import InvalidArgument

#: Longest path ``bind``/``connect`` take directly (``sun_path`` less its NUL).
SUN_PATH_MAX = 107


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A path to ``path`` short enough for ``sun_path`` (valid inside the block).

    :raises OSError: when a long path's directory cannot be opened.
    """
    text = str(path)
    if len(text.encode()) <= SUN_PATH_MAX:
        yield text
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def listen_unix(path: Path, backlog: int = 512) -> socket.socket:
    """A listening socket at ``path``, mode 0600, replacing whatever file was there.

    Only the process that owns the data directory may call it (the directory's
    lock decides who that is), so the replaced file is a dead owner's.

    :raises OSError: when the socket cannot be made.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_path(tmp) as address:
            sock.bind(address)
        os.chmod(tmp, 0o600)  # before the rename: nobody can connect to the temporary name
        sock.listen(backlog)
        os.replace(tmp, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return sock


def connect_unix(path: Path, timeout_s: float) -> socket.socket:
    """A socket connected to the listener at ``path``.

    :raises OSError: when nobody listens there (``ConnectionRefusedError`` for a
        stale socket file, ``FileNotFoundError`` for none).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        with short_path(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def check_free(path: Path) -> None:
    """Refuse a socket path a ``chronoq broker serve --unix`` must not take over: a file
    that is not a socket, a socket a live server listens on, or a missing directory.
    A stale socket (nobody listening: a dead server's) is left to :func:`listen_unix`,
    which replaces it. Two servers starting at once may both pass; the later one wins.

    :raises InvalidArgument: saying what is at ``path`` and what to do.
    """
    if not path.parent.is_dir():
        raise InvalidArgument(
            f"{str(path.parent)!r} is not a directory: create it (e.g. mkdir -p) "
            "or choose another --unix path"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise InvalidArgument(
            f"{str(path)!r} exists and is not a socket: choose another --unix path "
            "(it is never replaced)"
        )
    try:
        connect_unix(path, 1.0).close()
    except (ConnectionRefusedError, FileNotFoundError):
        return  # stale, or gone meanwhile
    except OSError as e:
        raise InvalidArgument(
            f"cannot tell whether a server listens on {str(path)!r} ({e}): "
            "choose another --unix path"
        ) from e
    raise InvalidArgument(
        f"a server already listens on {str(path)!r}: stop it first, or choose another --unix path"
    )


def inode(path: Path) -> int | None:
    """The inode number of ``path``, or ``None`` when there is no such file."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def remove_if_same(path: Path, ino: int | None) -> None:
    """Remove ``path`` if it still is the file ``ino`` (a listener's own socket file)."""
    if ino is not None and inode(path) == ino:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


__all__ = [
    "SUN_PATH_MAX",
    "check_free",
    "connect_unix",
    "inode",
    "listen_unix",
    "remove_if_same",
    "short_path",
]
