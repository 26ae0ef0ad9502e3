"""The client's half of a session, without I/O: shared by the blocking
:class:`~broker_adapter.server.link.Link` and the asyncio
:class:`~broker_adapter.server.async_link.AsyncLink`.

What a client says first (``hello`` with its token), what it learns from the
answer (the server's node id and limits, or a typed refusal), and the bound a
request frame must keep. Frames and values themselves: :mod:`~broker_adapter.server.protocol`
and :mod:`~broker_adapter.server.values`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from broker_adapter.errors import (
    AuthenticationFailed,
    BrokerError,
    ConnectionFailed,
    InvalidArgument,
)
from broker_adapter.server import protocol as P

#: The server's body limit when its hello answer does not say (servers before the field).
DEFAULT_MAX_BODY = 4 * 1024 * 1024


class ServerTooOld(BrokerError):
    """The server predates an operation this client needs; nothing was sent.

    :param address: the server's address.
    :param op: the operation it does not know.
    """

    def __init__(self, address: str, op: str) -> None:
        self.url = address
        self.op = op
        super().__init__(
            f"the broker server at {address} does not know the operation {op!r} (it runs "
            "an older chronoq); upgrade chronoq where it runs (`chronoq broker serve`, or the "
            "process that owns a shared rocksdb:// directory) to this client's version, "
            "then restart it"
        )


class ServerHello(NamedTuple):
    """What a server said about itself when a client connected."""

    #: Its node id (8 hex digits): the prefix of message ids with several endpoints.
    node: str
    #: Largest body (plus properties) it accepts; larger sends are refused before sending.
    max_body: int
    #: Largest frame it reads; a larger request is refused before sending.
    max_frame: int
    #: The whole answer (``v``, ``manual_clock``, ...).
    info: dict[str, Any]
    #: The operations it knows (:data:`~broker_adapter.server.protocol.BASE_OPS` when
    #: its answer does not list them).
    ops: frozenset[str] = P.BASE_OPS

    def require(self, op: str, address: str) -> None:
        """Refuse, before sending, an operation this server does not know.

        :raises ServerTooOld: when it is not among :attr:`ops`.
        """
        if op not in self.ops:
            raise ServerTooOld(address, op)


def hello_request(token: str | None) -> bytes:
    """The first frame of a session (request id 0)."""
    return P.request(0, "hello", {"v": P.VERSION, "token": token})


def read_hello(payload: bytes, address: str) -> ServerHello:
    """The server's answer to :func:`hello_request`, from its frame's payload.

    :raises AuthenticationFailed: when the server refused the token.
    :raises ConnectionFailed: when it refused the session for another reason.
    :raises ProtocolError: when the payload is not a response.
    """
    resp = P.decode_response(payload)
    if not resp.ok:
        error = P.decode_error(resp.result)
        if isinstance(error, AuthenticationFailed):
            raise error
        raise ConnectionFailed(f"{address} refused the connection: {error}")
    info = resp.result if isinstance(resp.result, dict) else {}
    ops = info.get("ops")
    return ServerHello(
        node=str(info.get("node", "")),
        max_body=int(info.get("max_body", DEFAULT_MAX_BODY)),
        max_frame=int(info.get("max_frame", P.MAX_FRAME)),
        info=info,
        ops=frozenset(str(o) for o in ops) if isinstance(ops, list) else P.BASE_OPS,
    )


def check_request_size(data: bytes, max_frame: int) -> None:
    """Refuse a request frame the server would not read (it would close the connection).

    :raises InvalidArgument: when its payload is over ``max_frame``.
    """
    if len(data) - P.HEADER.size > max_frame:
        raise InvalidArgument(
            f"request of {len(data)} bytes is over the server's frame "
            f"limit of {max_frame}; send fewer messages at once"
        )


__all__ = [
    "DEFAULT_MAX_BODY",
    "ServerHello",
    "ServerTooOld",
    "check_request_size",
    "hello_request",
    "read_hello",
]
