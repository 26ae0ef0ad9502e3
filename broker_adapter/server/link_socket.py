"""LinkSocket: the byte stream under a :class:`~broker_adapter.server.link.Link`.

Opening it (connect over TCP or a Unix socket, then the ``hello`` exchange, whose
meaning is :mod:`~broker_adapter.server.session`'s), reading whole frames with a
short receive timeout, writing bytes, and shutting it down. Matching answers to
requests, and which thread reads, are the link's.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from broker_adapter.errors import AuthenticationFailed, ConnectionFailed
from broker_adapter.server import protocol as P
from broker_adapter.server.session import ServerHello, hello_request, read_hello
from broker_adapter.server.unix import connect_unix


class LinkSocket:
    """A socket connected to ``host:port`` (or, with ``port=None``, to the Unix socket
    at the path ``host``), past ``hello``.

    Not thread-safe: one thread reads at a time (the link's read role) and one writes
    at a time (under the link's write lock); any thread may shut it down.

    :param token: the server's token, or ``None``.
    :param connect_timeout_s: bound on connecting and on the ``hello`` exchange.
    :param read_slice_s: afterwards, longest a :meth:`read` waits for data.
    :raises ConnectionFailed: when the server cannot be reached.
    :raises AuthenticationFailed: when it refuses the token.
    """

    __slots__ = ("_frames", "_sock", "address", "hello")

    def __init__(
        self,
        host: str,
        port: int | None,
        token: str | None,
        connect_timeout_s: float,
        read_slice_s: float,
    ) -> None:
        #: ``host:port``, or the Unix socket's path.
        self.address = address = host if port is None else f"{host}:{port}"
        try:
            if port is None:
                sock = connect_unix(Path(host), connect_timeout_s)
            else:
                sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as e:
            raise ConnectionFailed(
                f"cannot reach the broker server at {address}: {e}; "
                "is `chronoq broker serve` running there?"
            ) from e
        if port is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._frames = P.FrameReader(sock)  # kept: it may hold bytes past the hello answer
        try:
            sock.sendall(hello_request(token))
            answer = self._frames.frames()
            if answer is None:
                raise ConnectionFailed(f"{address} closed the connection at hello")
            #: What the server said about itself.
            self.hello: ServerHello = read_hello(answer[0], address)
        except (OSError, P.ProtocolError) as e:
            sock.close()
            raise ConnectionFailed(f"hello to {address} failed: {e}") from e
        except (ConnectionFailed, AuthenticationFailed):
            sock.close()
            raise
        # A blocking socket whose receives (only) give up after a short while, so a
        # reader with a deadline needs no poll call per read. (A socket timeout would
        # also bound other threads' sendall, and could cut a frame in half.)
        sock.settimeout(None)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(read_slice_s * 1e6))
        )

    def read(self, deadline: float | None) -> list[bytes]:
        """The payloads of whole frames: those already buffered, else of what arrives
        within the read slice (nothing is awaited past ``deadline``, a monotonic time).
        Empty when none came.

        :raises ConnectionFailed: when the server closed the stream or it broke.
        :raises ProtocolError: for a bad frame length, or a stream ending inside a frame.
        """
        frames = self._frames.take()
        if frames:
            return frames
        if deadline is not None and deadline <= time.monotonic():
            return frames
        try:
            more = self._frames.fill()
        except BlockingIOError:
            return frames  # nothing within the slice: the caller checks its deadline
        except OSError as e:
            raise ConnectionFailed(f"connection to {self.address} broke: {e}") from e
        if not more:
            raise ConnectionFailed(f"the broker server at {self.address} closed the connection")
        return self._frames.take()

    def sendall(self, data: bytes) -> None:
        """Write all of ``data``.

        :raises OSError: from the socket.
        """
        self._sock.sendall(data)

    def shutdown(self) -> None:
        """Shut both directions down (a thread blocked reading returns); no error if
        that was done already."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Release the socket."""
        self._sock.close()


__all__ = ["LinkSocket"]
