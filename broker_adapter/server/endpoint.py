"""Client plumbing: endpoints (a lazily reconnected link each) and the callback thread."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from broker_adapter.errors import ConnectionFailed, InvalidArgument
from broker_adapter.server.link import Link
from broker_adapter.server.unix_url import UNIX_SCHEME, socket_path
from broker_adapter.urls import split_url

log = logging.getLogger("chronoq.broker_adapter.RemoteBroker")
log.addHandler(logging.NullHandler())


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` as ``[(h1, p1), (h2, p2)]`` (``[::1]:p`` for IPv6).

    :raises InvalidArgument: for an entry without a valid port.
    """
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"endpoint {part!r} is not host:port")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    return out


def client_args(
    url: str, overrides: dict[str, Any]
) -> tuple[str | list[tuple[str, int | None]], dict[str, Any]]:
    """The endpoints and keyword arguments of a client of ``chronoq://h1:p1[,h2:p2]?...``
    or ``chronoq+unix:///path?...`` (:func:`url_options`), ``overrides`` winning (what
    both clients' ``from_url`` take).

    :raises InvalidArgument: for an unknown parameter, a bad number, or a Unix URL
        without an absolute socket path (:func:`~broker_adapter.server.unix_url.socket_path`).
    """
    scheme, rest, params = split_url(url)
    opts = url_options(params)
    opts.update(overrides)
    if scheme == UNIX_SCHEME:
        return [(socket_path(rest), None)], opts
    return rest.rstrip("/"), opts


def url_options(params: dict[str, str]) -> dict[str, Any]:
    """``RemoteBroker`` arguments from the query of a ``chronoq://`` URL.

    :raises InvalidArgument: for an unknown parameter or a bad number.
    """
    opts: dict[str, Any] = {}
    kinds: dict[str, Callable[[str], Any]] = {
        "token": lambda v: v or None,
        "send_timeout_ms": int,
        "retries": int,
        "connect_timeout_s": float,
    }
    for name, value in params.items():
        kind = kinds.get(name)
        if kind is None:
            raise InvalidArgument(f"unknown parameter {name!r} in a chronoq:// URL")
        try:
            opts[name] = kind(value)
        except ValueError as e:
            raise InvalidArgument(f"{name}={value!r} in a chronoq:// URL is not a number") from e
    return opts


class Endpoint:
    """One broker server: its address and a link made (again) on demand.

    :param index: its position in the broker's endpoint list.
    """

    def __init__(
        self, index: int, host: str, port: int | None, token: str | None, connect_timeout_s: float
    ) -> None:
        self.index = index
        self.host, self.port = host, port
        self.address = host if port is None else f"{host}:{port}"  # None: a Unix socket path
        self._token = token
        self._timeout = connect_timeout_s
        self._link: Link | None = None
        self._lock = threading.Lock()
        self.node = ""

    def link(self, check_open: Callable[[], None]) -> Link:
        """The live link, connecting first if there is none.

        :raises ConnectionFailed: when the server cannot be reached.
        :raises AuthenticationFailed: when it refuses the token.
        :raises BrokerClosed: via ``check_open``.
        """
        link = self._link
        if link is not None and link.alive:
            return link
        with self._lock:
            check_open()
            link = self._link
            if link is None or not link.alive:
                if link is not None:
                    link.close()
                link = self._link = Link(self.host, self.port, self._token, self._timeout)
                self.node = link.node
            return link

    def known_node(self, check_open: Callable[[], None]) -> str:
        """This endpoint's node id (connecting to learn it; ``""`` if unreachable)."""
        if not self.node:
            try:
                self.link(check_open)
            except ConnectionFailed:
                return ""
        return self.node

    def drop(self) -> None:
        """Close the link (the next call reconnects)."""
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()


class CallbackRunner:
    """Runs ``send_async`` callbacks on one thread of their own (never on a caller's,
    nor on a link's reader) and counts sends not yet completed, for ``flush``."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._cond = threading.Condition()
        self._outstanding = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        """One more send under way."""
        with self._cond:
            self._outstanding += 1

    def end(self) -> None:
        """A send without callback completed."""
        with self._cond:
            self._outstanding -= 1
            self._cond.notify_all()

    def run(self, callback: Callable[..., None], *args: Any) -> None:
        """Queue ``callback(*args)``; the send it reports counts as done once it ran."""
        with self._cond:
            self._queue.append((callback, args))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="chronoq-send-callbacks"
                )
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                callback, args = self._queue.popleft()
            try:
                callback(*args)
            except Exception:
                log.exception("send_async callback raised")
            self.end()

    def flush(self, timeout_s: float) -> None:
        """Wait until every send begun before has completed (or ``timeout_s`` passed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._outstanding <= 0, timeout_s)

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)


__all__ = ["CallbackRunner", "Endpoint", "parse_endpoints"]
