"""AsyncLink: one client connection to one broker server on an asyncio event loop.

The asyncio twin of :class:`~broker_adapter.server.link.Link`, same protocol
(:mod:`~broker_adapter.server.protocol`, the hello of :mod:`~broker_adapter.server.session`):
any number of coroutines send requests over one connection (pipelining), and
one reader task matches each answer to its request by id. Nothing blocks the
loop: reads and writes are the loop's own streams, and the requests made within
one turn of the loop go out in one write (the server then stores consecutive
sends as one batch). When the connection breaks, every waiting request fails
with :class:`~broker_adapter.errors.ConnectionFailed` and the link is dead;
:class:`~broker_adapter.server.async_endpoint.AsyncEndpoint` makes a new one on
the next call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from typing import Any

from broker_adapter.errors import (
    BrokerClosed,
    ChronoqError,
    ConnectionFailed,
)
from broker_adapter.server import protocol as P
from broker_adapter.server.link import RequestTimeout
from broker_adapter.server.session import (
    ServerHello,
    check_request_size,
    hello_request,
    read_hello,
)
from broker_adapter.server.unix import short_path

log = logging.getLogger("chronoq.broker_adapter.AsyncLink")
log.addHandler(logging.NullHandler())

#: Bytes the reader's stream buffers before it stops reading the socket.
READ_BUFFER = 1024 * 1024
#: Bytes queued on the transport past which a caller waits for it to drain.
WRITE_HIGH_WATER = 1024 * 1024
#: Answers delivered per turn of the loop: each wakes a coroutine, and the loop runs
#: every coroutine woken in one turn before anything else (a timer, another task), so
#: a thousand answers read at once would stall the loop ~10 ms (1,000 coroutines each
#: sending again and again: 8 gave a lag P99 of 0.9-1.3 ms, 4 gives 0.55 ms, same rate).
DELIVERIES_PER_TURN = 4
#: Bytes written per turn of the loop: a loopback write pays for the kernel's delivery
#: to the server (~30 us per KiB here), so 1,000 requests written at once stalled the
#: loop ~5 ms.
WRITE_PER_TURN = 32 * 1024
#: Granularity of request timeouts: one timer per link fails the overdue requests, at
#: most this late (a timer of its own per request cost as much as the rest of a send).
TIMEOUT_TICK_S = 0.05


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """The payload of the next frame.

    :raises asyncio.IncompleteReadError: when the stream ends (inside a frame or not).
    :raises FrameTooLarge: for a length of 0 or over ``limit``.
    """
    header = await reader.readexactly(P.HEADER.size)
    return await reader.readexactly(P.check_length(P.HEADER.unpack(header)[0], limit))


class AsyncLink:
    """A connected, authenticated link; made by :meth:`open`."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: ServerHello,
    ) -> None:
        self.address = address
        self.hello = hello
        self.loop = asyncio.get_running_loop()
        self._reader = reader
        self._writer = writer
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        # Requests by the timeout tick they expire at: rid -> (op, timeout), for the message.
        self._expiry: dict[int, dict[int, tuple[str, float]]] = {}
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []  # frames of this turn of the loop, written at its end
        self._alive = True
        self._error: ChronoqError | None = None
        self._task = self.loop.create_task(self._read_loop(), name=f"chronoq-link-{address}")

    @classmethod
    async def open(
        cls, host: str, port: int | None, token: str | None, connect_timeout_s: float = 3.0
    ) -> AsyncLink:
        """Connect to ``host:port`` (with ``port=None``: the Unix socket at the path
        ``host``) and say hello, within ``connect_timeout_s``.

        :raises ConnectionFailed: when the server cannot be reached or breaks the hello.
        :raises AuthenticationFailed: when it refuses the token.
        """
        address = host if port is None else f"{host}:{port}"
        try:
            async with asyncio.timeout(connect_timeout_s):
                if port is None:
                    with short_path(Path(host)) as path:  # a deep path too, as Link does
                        reader, writer = await asyncio.open_unix_connection(path, limit=READ_BUFFER)
                else:
                    reader, writer = await asyncio.open_connection(host, port, limit=READ_BUFFER)
        except (OSError, TimeoutError) as e:
            raise ConnectionFailed(
                f"cannot reach the broker server at {address}: {e or 'timed out'}; "
                "is `chronoq broker serve` running there?"
            ) from e
        try:
            async with asyncio.timeout(connect_timeout_s):
                writer.write(hello_request(token))
                hello = read_hello(await read_frame(reader, P.MAX_FRAME), address)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, P.ProtocolError) as e:
            writer.transport.abort()
            reason = "closed the connection" if isinstance(e, asyncio.IncompleteReadError) else e
            raise ConnectionFailed(f"hello to {address} failed: {reason or 'timed out'}") from e
        except BaseException:  # refused (AuthenticationFailed, ...) or cancelled
            writer.transport.abort()
            raise
        return cls(address, reader, writer, hello)

    @property
    def alive(self) -> bool:
        """Whether the link still works."""
        return self._alive

    @property
    def node(self) -> str:
        """The server's node id."""
        return self.hello.node

    @property
    def max_body(self) -> int:
        """The server's body limit (bytes of body plus properties)."""
        return self.hello.max_body

    # -- reading -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Deliver every answer until the stream ends or breaks."""
        delivered = 0
        try:
            while True:
                resp = P.decode_response(await read_frame(self._reader, P.MAX_FRAME))
                future = self._pending.pop(resp.rid, None)
                if future is None or future.done():
                    continue  # the caller timed out or was cancelled
                if resp.ok:
                    future.set_result(resp.result)
                else:
                    future.set_exception(self._server_error(resp.result))
                delivered += 1
                if delivered == DELIVERIES_PER_TURN:
                    delivered = 0
                    await asyncio.sleep(0)  # let the woken callers (and the rest) run
        except asyncio.IncompleteReadError:
            self._fail(
                ConnectionFailed(f"the broker server at {self.address} closed the connection")
            )
        except P.ProtocolError as e:
            self._fail(ConnectionFailed(f"bad answer from {self.address}: {e}"))
        except OSError as e:
            self._fail(ConnectionFailed(f"connection to {self.address} broke: {e}"))
        except asyncio.CancelledError:
            self._fail(ConnectionFailed(f"link to {self.address} is closed"))
            raise

    def _server_error(self, payload: Any) -> ChronoqError:
        """The error a server answered. Its own broker closed means the server is
        stopping: for this client that is a lost connection (retried, typed as such),
        not a closed client."""
        error = P.decode_error(payload)
        if isinstance(error, BrokerClosed):
            return ConnectionFailed(f"the broker server at {self.address} is stopping: {error}")
        return error

    def _fail(self, error: ChronoqError) -> None:
        """Mark the link dead and fail every waiting request with ``error``."""
        self._alive = False
        self._error = self._error or error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._error)
        self._out.clear()
        self._expiry.clear()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self._writer.transport.abort()

    # -- requests ----------------------------------------------------------------------------

    async def call(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """Send a request and wait for its result.

        :raises ConnectionFailed: when the link is or goes dead before the answer.
        :raises RequestTimeout: when no answer comes within ``timeout_s`` (the link stays).
        :raises InvalidArgument: for a request over the server's frame limit (not sent).
        :raises ChronoqError: the error the server answered.
        """
        if not self._alive:
            raise self._error or ConnectionFailed(f"link to {self.address} is closed")
        rid = next(self._rids)
        data = P.request(rid, op, args)
        check_request_size(data, self.hello.max_frame)
        future: asyncio.Future[Any] = self.loop.create_future()
        self._pending[rid] = future
        expiring = self._expiring_at(self.loop.time() + timeout_s)
        expiring[rid] = (op, timeout_s)
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)
        try:
            if self._writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await self._drain(op, timeout_s)
            return await future
        finally:
            self._pending.pop(rid, None)
            expiring.pop(rid, None)

    def _expiring_at(self, deadline: float) -> dict[int, tuple[str, float]]:
        """The requests that expire at the first timeout tick not before ``deadline``."""
        tick = int(deadline / TIMEOUT_TICK_S) + 1
        expiring = self._expiry.get(tick)
        if expiring is None:
            expiring = self._expiry[tick] = {}
            if self._expiry_timer is None:
                self._expiry_timer = self.loop.call_later(TIMEOUT_TICK_S, self._expire)
        return expiring

    def _expire(self) -> None:
        """Fail the requests whose time is up with :class:`RequestTimeout`."""
        self._expiry_timer = None
        now = self.loop.time() / TIMEOUT_TICK_S
        for tick in [t for t in self._expiry if t <= now]:
            for rid, (op, timeout_s) in self._expiry.pop(tick).items():
                future = self._pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_exception(
                        RequestTimeout(
                            f"no answer from {self.address} to {op} within {timeout_s:.3g} s"
                        )
                    )
        if self._expiry and self._alive:
            self._expiry_timer = self.loop.call_later(TIMEOUT_TICK_S, self._expire)

    def _flush(self) -> None:
        """Write the frames queued during this turn of the loop in one go, up to
        :data:`WRITE_PER_TURN` bytes; the rest in the next turn."""
        out = self._out
        if not self._alive:
            out.clear()
            return
        size = count = 0
        for data in out:
            size += len(data)
            count += 1
            if size >= WRITE_PER_TURN:
                break
        self._writer.write(b"".join(out[:count]))
        del out[:count]
        if out:
            self.loop.call_soon(self._flush)

    async def _drain(self, op: str, timeout_s: float) -> None:
        """Wait until the transport takes more (the server reads slower than we write)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._writer.drain()
        except TimeoutError:
            raise RequestTimeout(
                f"the broker server at {self.address} read nothing for {timeout_s:.3g} s "
                f"while {op} waited to be sent"
            ) from None
        except OSError as e:
            self._fail(ConnectionFailed(f"send to {self.address} failed: {e}"))

    async def close(self, error: ChronoqError | None = None) -> None:
        """Close the link; waiting requests fail with ``error`` (default
        :class:`ConnectionFailed`)."""
        if self._alive:
            self._fail(error or ConnectionFailed(f"link to {self.address} is closed"))
        if self._task is not asyncio.current_task():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


__all__ = ["AsyncLink", "read_frame"]
