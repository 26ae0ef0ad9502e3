"""The wire protocol between ``RemoteBroker`` and ``BrokerServer`` (version 1).

Framing
    Every frame is a 4-byte big-endian unsigned length ``N`` followed by ``N``
    bytes of msgpack (``1 <= N <= max_frame``, default 8 MiB). A length of 0 or
    above the limit, bytes that are not msgpack, or msgpack of the wrong shape
    is a *malformed frame*: the server closes that connection (only that one).

Frames (msgpack arrays)
    request   ``[0, rid, op, args]``: ``rid`` an int in ``[0, 2**63)`` chosen by
              the client, ``op`` a str, ``args`` a map with str keys.
    response  ``[1, rid, 0, result]`` on success, ``[1, rid, 1, [name, text, attrs]]``
              on error: ``name`` is a class of :mod:`broker_adapter.errors`,
              ``attrs`` a map of its fields (e.g. ``size``/``limit``).

Session
    The first request must be ``hello`` ``{"v": 1, "token": str | None}``; it
    answers ``{"v", "node", "max_body", "max_frame", "manual_clock"}``. A wrong or
    missing token is answered with an ``AuthenticationFailed`` error and the
    connection is closed; nothing else from that connection is executed.
    Requests may be *pipelined*: a client sends more before the answers come,
    and answers can come out of order (a long-poll ``pull`` is answered when it
    ends), matched by ``rid``. ``batch`` ``{"reqs": [[op, args], ...]}`` runs
    several requests in one frame and answers a list of ``[0, result]`` or
    ``[1, error]``.

Operations (``args`` -> ``result``)
    ``send`` {m} -> r; ``send_batch`` {ms} -> [ids, dues, positions of DUPLICATEs]; ``abort`` {id | key, topic} ->
    [status, id]; ``query`` {id} -> view | None; ``pending`` {topic, start, end,
    limit} -> [view]; ``stats`` {} -> {"topics": {name: [pending, fired, ready,
    inflight]}, "groups": {name: [ready, inflight, dead, acked]}};
    ``consumer_open`` {group, topics, invisible_ms, max_attempts, max_inflight,
    max_inflight_bytes} -> cid; ``pull`` {cid, max, wait} -> [rm]; ``ack``
    {cid, receipt} -> bool; ``ack_batch`` {cid, receipts} -> [bool]; ``nack`` {cid, receipt, delay, reason} -> bool;
    ``dead_letter`` {cid, receipt, reason} -> bool; ``extend`` {cid, receipt,
    invisible_ms} -> bool; ``release`` {cid, receipt, delay} -> bool;
    ``consumer_close`` {cid} -> None.
    Test-only, refused unless the server runs with ``--manual-clock``:
    ``advance`` {ms | to_ms} -> now_ms, ``reset`` {start_ms} -> None (empties the
    data directory).

    Runtime calls (added later in version 1; see *Compatibility*): ``reschedule``
    {id | key, topic, delay | at, body} -> [status, id, due]; ``abort_prefix``
    {topic, prefix} -> [aborted, [key], already_delivered_count]; ``find_pending``
    {topic, prefix, tag, start, end, limit, cursor, body} -> [[view], cursor];
    ``acquire_rate`` {bucket, limit, period} -> ms to wait (0: taken);
    ``acquire_slot`` {name, limit, holder, lease} -> bool; ``release_slot`` {name,
    holder} -> bool. ``abort_prefix`` may run long: the server runs it off the
    connection's reader, so later requests of the same connection are answered
    meanwhile (out of order, by ``rid``).

    Dead letters and counts (added later in version 1): ``dead_letters`` {group,
    cursor, limit, body} -> [[view], cursor]; ``requeue_dead`` and ``purge_dead``
    {group, ids (null: the oldest), limit} -> how many; ``count_pending`` {edges,
    topic} -> [[count], exact].

    Admin (added later in version 1): ``backup`` {dest} -> [path, bytes, files,
    seconds]: a consistent copy of the data directory into ``dest``, a new (or
    empty) directory on the server's machine (see ``chronoq broker backup``).

    A message ``m`` is ``[topic, body, key, tags, props, delay_ms, delay_sec,
    delay_level, deliver_at_ms]``; a send result ``r`` is ``[ok, id, due]`` (``ok``
    is 1 for OK, 0 for DUPLICATE); a received message ``rm`` is ``[id, topic, body,
    due, born, attempts, receipt, key, tags, props]``; a view is ``[id, topic,
    state, due, born, attempts, key, tags, body_size, groups, error]``, plus
    ``body`` as a 12th field in the answers of ``find_pending`` with ``body`` true.

Compatibility
    Operations are only ever added within a version. ``hello`` answers the server's
    operations as ``ops`` (a server that does not list them knows :data:`BASE_OPS`),
    and a client checks an operation against that list before sending it: an older
    server would close the connection on an operation it does not know, so the
    client raises :class:`~broker_adapter.server.session.ServerTooOld` (naming what
    to upgrade) instead of sending. A newer server answers an older client as before.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgpack

from broker_adapter import errors
from broker_adapter.checks import is_int
from broker_adapter.errors import ChronoqError, DecodeError, InvalidArgument

VERSION = 1
MAX_FRAME = 8 * 1024 * 1024
HEADER = struct.Struct(">I")
REQUEST, RESPONSE = 0, 1
OK, ERROR = 0, 1
_MAX_RID = 1 << 63

#: The operations of the first version-1 servers (those whose hello lists no ``ops``).
BASE_OPS = frozenset(
    {
        "hello",
        "send",
        "send_batch",
        "abort",
        "query",
        "pending",
        "stats",
        "consumer_open",
        "pull",
        "ack",
        "ack_batch",
        "nack",
        "dead_letter",
        "extend",
        "release",
        "consumer_close",
        "batch",
        "advance",
        "reset",
    }
)
#: The runtime calls (reschedule, prefix abort, find, rate limits and slots).
RUNTIME_OPS = frozenset(
    {
        "reschedule",
        "abort_prefix",
        "find_pending",
        "acquire_rate",
        "acquire_slot",
        "release_slot",
    }
)
#: The dead-letter calls and pending counts (for dashboards).
DEAD_LETTER_OPS = frozenset({"dead_letters", "requeue_dead", "purge_dead", "count_pending"})
#: Operations the server knows; anything else is a malformed frame.
#: Administration of the server's data directory.
ADMIN_OPS = frozenset({"backup"})
OPS = BASE_OPS | RUNTIME_OPS | DEAD_LETTER_OPS | ADMIN_OPS


class ProtocolError(DecodeError):
    """A frame that breaks the protocol; the connection that sent it is closed."""


class FrameTooLarge(ProtocolError):
    """A frame length of 0 or over the limit."""

    def __init__(self, length: int, limit: int) -> None:
        self.length = length
        self.limit = limit
        super().__init__(f"frame length {length} is outside 1..{limit} bytes")


class Request(NamedTuple):
    """A decoded request frame."""

    rid: int
    op: str
    args: dict[str, Any]


class Response(NamedTuple):
    """A decoded response frame: ``error`` is set when ``ok`` is false."""

    rid: int
    ok: bool
    result: Any


def frame(obj: Any) -> bytes:
    """``obj`` as one frame: length header plus msgpack.

    :raises InvalidArgument: for a value msgpack cannot carry (e.g. an int over 64 bits).
    """
    try:
        payload: bytes = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as e:
        raise InvalidArgument(f"a value cannot be sent to the broker server: {e}") from e
    return HEADER.pack(len(payload)) + payload


def check_length(length: int, limit: int = MAX_FRAME) -> int:
    """Return ``length`` if it is a valid frame length.

    :raises FrameTooLarge: for 0 or more than ``limit``.
    """
    if length < 1 or length > limit:
        raise FrameTooLarge(length, limit)
    return length


def unpack(payload: bytes, limit: int = MAX_FRAME) -> Any:
    """Strictly decode one msgpack object that fills ``payload`` exactly.

    :raises ProtocolError: for anything but exactly one msgpack object.
    """
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_bin_len=limit,
            max_str_len=limit,
            max_array_len=limit,
            max_map_len=limit,
            max_ext_len=0,
        )
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        UnicodeDecodeError,
    ) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e


class FrameReader:
    """Cuts whole frames out of a socket's byte stream.

    Not thread-safe: one thread at a time may read (the client's link hands the
    reading role between threads; the server has one reader per connection).
    """

    def __init__(self, sock: socket.socket, limit: int = MAX_FRAME) -> None:
        self._sock = sock
        self._limit = limit
        self._buf = bytearray()

    def take(self) -> list[bytes]:
        """Every whole frame buffered now (no I/O).

        :raises ProtocolError: for a bad length.
        """
        buf, limit, unpack_header = self._buf, self._limit, HEADER.unpack_from
        out = []
        pos, n = 0, len(buf)
        while n - pos >= 4:
            length = check_length(unpack_header(buf, pos)[0], limit)
            if n - pos - 4 < length:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out

    def fill(self) -> bool:
        """Read what the socket has (blocking for at least one byte); ``False`` at a
        clean end of stream.

        :raises ProtocolError: when the stream ends inside a frame.
        :raises OSError: from the socket.
        """
        data = self._sock.recv(256 * 1024)
        if not data:
            if self._buf:
                raise ProtocolError("connection closed inside a frame")
            return False
        self._buf += data
        return True

    def frames(self) -> list[bytes] | None:
        """Wait for at least one whole frame; every whole frame buffered now, or
        ``None`` at a clean end of stream.

        :raises ProtocolError: for a bad length, or a stream cut inside a frame.
        """
        while True:
            out = self.take()
            if out:
                return out
            if not self.fill():
                return None


def decode_request(payload: bytes) -> Request:
    """Decode a request frame's payload.

    :raises ProtocolError: when it is not ``[0, rid, op, args]`` with a known op.
    """
    obj = unpack(payload)
    if type(obj) is not list or len(obj) != 4 or obj[0] != REQUEST or not is_int(obj[0]):
        raise ProtocolError("a request is [0, rid, op, args]")
    _, rid, op, args = obj
    if not is_int(rid, 0, _MAX_RID - 1):
        raise ProtocolError(f"bad request id {rid!r}")
    if type(op) is not str or op not in OPS:
        raise ProtocolError(f"unknown operation {op!r}")
    if type(args) is not dict:
        raise ProtocolError("request args must be a map")
    return Request(rid, op, args)


def decode_response(payload: bytes) -> Response:
    """Decode a response frame's payload.

    :raises ProtocolError: when it is not ``[1, rid, ok, result]``.
    """
    obj = unpack(payload)
    if (
        type(obj) is not list
        or len(obj) != 4
        or obj[0] != RESPONSE
        or not is_int(obj[1])
        or obj[2] not in (OK, ERROR)
    ):
        raise ProtocolError("a response is [1, rid, 0|1, result]")
    return Response(obj[1], obj[2] == OK, obj[3])


def request(rid: int, op: str, args: Mapping[str, Any]) -> bytes:
    """A request frame."""
    return frame([REQUEST, rid, op, args])


def response(rid: int, result: Any) -> bytes:
    """A success response frame."""
    return frame([RESPONSE, rid, OK, result])


# -- errors ------------------------------------------------------------------------------

_ERROR_ATTRS = ("size", "limit", "field", "value", "topic", "path", "holder", "url", "length")


def error_payload(exc: BaseException) -> list[Any]:
    """``[name, text, attrs]`` of an exception (``BrokerError`` for non-chronoq ones)."""
    if not isinstance(exc, ChronoqError):
        return ["BrokerError", f"{type(exc).__name__}: {exc}", {}]
    attrs = {}
    for name in _ERROR_ATTRS:
        v = getattr(exc, name, None)
        if isinstance(v, int | str | float) and not isinstance(v, bool):
            attrs[name] = v
    return [type(exc).__name__, str(exc), attrs]


def error_response(rid: int, exc: BaseException) -> bytes:
    """An error response frame."""
    return frame([RESPONSE, rid, ERROR, error_payload(exc)])


def decode_error(payload: Any) -> ChronoqError:
    """The exception an error payload names (``BrokerError`` if unknown)."""
    if type(payload) is not list or len(payload) != 3:
        return ProtocolError(f"malformed error payload {payload!r}")
    name, text, attrs = payload
    cls = getattr(errors, str(name), None)
    if name in ("ProtocolError", "FrameTooLarge"):
        cls = ProtocolError
    if not (isinstance(cls, type) and issubclass(cls, ChronoqError)):
        cls = errors.BrokerError
    exc = cls.__new__(cls)
    Exception.__init__(exc, str(text))
    if isinstance(attrs, dict):
        for k, v in attrs.items():
            if k in _ERROR_ATTRS:
                setattr(exc, k, v)
    return exc


__all__ = [
    "ADMIN_OPS",
    "BASE_OPS",
    "DEAD_LETTER_OPS",
    "MAX_FRAME",
    "OPS",
    "RUNTIME_OPS",
    "VERSION",
    "FrameTooLarge",
    "ProtocolError",
    "Request",
    "Response",
    "check_length",
    "decode_error",
    "decode_request",
    "decode_response",
    "error_response",
    "frame",
    "request",
    "response",
]
