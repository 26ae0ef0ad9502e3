"""Link: one client connection to one broker server, pipelined.

Any thread may send a request; a reader thread matches answers to requests by
id, so many requests (a long poll among them) share one socket. A sync call
waits on a bare lock (the cheapest wake-up CPython has); an async call gets a
completion function, run on the reader thread. When the socket breaks, every
waiting request fails with :class:`ConnectionFailed` and the link is dead.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from broker_adapter.errors import (
    AuthenticationFailed,
    ChronoqError,
    ConnectionFailed,
    InvalidArgument,
)
from broker_adapter.server import protocol as P

log = logging.getLogger("chronoq.broker_adapter.Link")
log.addHandler(logging.NullHandler())

#: ``done(result, error)``: exactly one of them is not ``None`` (a result may be ``None``).
Done = Callable[[Any, BaseException | None], None]


class RequestTimeout(ConnectionFailed):
    """No answer within the time allowed; the link itself may still be fine."""


class _Waiter:
    """A sync call waiting for its answer."""

    __slots__ = ("error", "lock", "result")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.lock.release()


class Link:
    """A connected, authenticated link to ``host:port``.

    :param token: the server's token, or ``None``.
    :param connect_timeout_s: bound on connecting and on the ``hello`` exchange.
    :raises ConnectionFailed: when the server cannot be reached.
    :raises AuthenticationFailed: when it refuses the token.
    """

    def __init__(self, host: str, port: int, token: str | None,
                 connect_timeout_s: float = 3.0) -> None:
        self.address = f"{host}:{port}"
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as e:
            raise ConnectionFailed(f"cannot reach the broker server at {self.address}: {e}; "
                                   "is `chronoq broker serve` running there?") from e
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rids = itertools.count(1)
        self._pending: dict[int, Done] = {}
        self._lock = threading.Lock()  # guards _pending, _alive and socket writes
        self._alive = True
        self._error: ChronoqError | None = None
        self._rfile = self._sock.makefile("rb", buffering=256 * 1024)
        try:
            self._sock.sendall(P.request(0, "hello", {"v": P.VERSION, "token": token}))
            answer = self._read_frame()
            if answer is None:
                raise ConnectionFailed(f"{self.address} closed the connection at hello")
            resp = P.decode_response(answer)
        except (OSError, P.ProtocolError) as e:
            self._abandon()
            raise ConnectionFailed(f"hello to {self.address} failed: {e}") from e
        except ConnectionFailed:
            self._abandon()
            raise
        if not resp.ok:
            self._abandon()
            error = P.decode_error(resp.result)
            if isinstance(error, AuthenticationFailed):
                raise error
            raise ConnectionFailed(f"{self.address} refused the connection: {error}")
        self.info: dict[str, Any] = resp.result
        self.node: str = str(self.info.get("node", ""))
        self.max_body: int = int(self.info.get("max_body", 4 * 1024 * 1024))
        self.max_frame: int = int(self.info.get("max_frame", P.MAX_FRAME))
        self._sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"chronoq-link-{self.address}")
        self._reader.start()

    def _abandon(self) -> None:
        self._alive = False
        self._rfile.close()
        self._sock.close()

    @property
    def alive(self) -> bool:
        """Whether the link still works."""
        return self._alive

    def _read_frame(self) -> bytes | None:
        header = self._rfile.read(4)
        if len(header) < 4:
            return None
        length = P.check_length(P.HEADER.unpack(header)[0], P.MAX_FRAME)
        payload: bytes = self._rfile.read(length)
        return payload if len(payload) == length else None

    def _read_loop(self) -> None:
        error: ChronoqError = ConnectionFailed(f"the broker server at {self.address} "
                                               "closed the connection")
        try:
            while True:
                payload = self._read_frame()
                if payload is None:
                    break
                resp = P.decode_response(payload)
                with self._lock:
                    done = self._pending.pop(resp.rid, None)
                if done is None:
                    continue  # answer to a call that timed out
                if resp.ok:
                    done(resp.result, None)
                else:
                    done(None, P.decode_error(resp.result))
        except P.ProtocolError as e:
            error = ConnectionFailed(f"bad answer from {self.address}: {e}")
        except OSError as e:
            error = ConnectionFailed(f"connection to {self.address} broke: {e}")
        except Exception:
            log.exception("reader of %s failed", self.address)
        self._fail(error)

    def _fail(self, error: ChronoqError) -> None:
        with self._lock:
            self._alive = False
            self._error = error
            pending, self._pending = self._pending, {}
        for done in pending.values():
            try:
                done(None, error)
            except Exception:
                log.exception("completion of a failed request raised")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def submit(self, op: str, args: dict[str, Any], done: Done) -> int:
        """Send a request; ``done`` hears its answer on the reader thread. Its id.

        :raises ConnectionFailed: when the link is dead (``done`` is not called).
        """
        data = None
        with self._lock:
            if not self._alive:
                raise self._error or ConnectionFailed(f"link to {self.address} is closed")
            rid = next(self._rids)
            data = P.request(rid, op, args)
            if len(data) - 4 > self.max_frame:
                raise InvalidArgument(f"request of {len(data)} bytes is over the server's "
                                      f"frame limit of {self.max_frame}; send fewer messages "
                                      "at once")
            self._pending[rid] = done
            try:
                self._sock.sendall(data)
            except OSError as e:
                self._pending.pop(rid, None)
                failed = ConnectionFailed(f"send to {self.address} failed: {e}")
                self._alive, self._error = False, failed
                raise failed from e
        return rid

    def call(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """Send a request and wait for its result.

        :raises ConnectionFailed: when the link breaks or no answer comes in ``timeout_s``.
        :raises ChronoqError: the error the server answered.
        """
        waiter = _Waiter()
        rid = self.submit(op, args, waiter)
        if not waiter.lock.acquire(timeout=timeout_s):
            with self._lock:
                self._pending.pop(rid, None)
            if waiter.lock.acquire(blocking=False):  # answered just now
                pass
            else:
                raise RequestTimeout(f"no answer from {self.address} to {op} within "
                                     f"{timeout_s:.3g} s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def close(self) -> None:
        """Close the link; waiting requests fail with ``ConnectionFailed``."""
        with self._lock:
            was_alive = self._alive
            self._alive = False
        if was_alive:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self._rfile.close()
        self._sock.close()
