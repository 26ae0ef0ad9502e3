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

    A message ``m`` is ``[topic, body, key, tags, props, delay_ms, delay_sec,
    delay_level, deliver_at_ms]``; a send result ``r`` is ``[ok, id, due]`` (``ok``
    is 1 for OK, 0 for DUPLICATE); a received message ``rm`` is ``[id, topic, body,
    due, born, attempts, receipt, key, tags, props]``; a view is ``[id, topic,
    state, due, born, attempts, key, tags, body_size, groups, error]``.
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
from broker_adapter.message import Message
from broker_adapter.results import (
    NO_PROPERTIES,
    MessageState,
    MessageView,
    ReceivedMessage,
    SendResult,
    SendStatus,
)

VERSION = 1
MAX_FRAME = 8 * 1024 * 1024
HEADER = struct.Struct(">I")
REQUEST, RESPONSE = 0, 1
OK, ERROR = 0, 1
_MAX_RID = 1 << 63

#: Operations the server knows; anything else is a malformed frame.
OPS = frozenset(
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


# -- values --------------------------------------------------------------------------------


def encode_message(m: Message) -> list[Any]:
    """The wire form of a message."""
    return [
        m.topic,
        m.body,
        m.key,
        m.tags,
        None if m.properties is None else dict(m.properties),
        m.delay_ms,
        m.delay_sec,
        m.delay_level,
        m.deliver_at_ms,
    ]


def _check_message_shape(v: Any) -> None:
    if type(v) is not list or len(v) != 9:
        raise ProtocolError("a message is a list of 9 fields")


def decode_message(v: Any) -> Message:
    """A :class:`Message` from its wire form (validated by ``Message`` itself).

    :raises ProtocolError: for a wrong shape.
    :raises InvalidMessage: for a well-formed but invalid message.
    """
    _check_message_shape(v)
    return Message(*v)


def decode_messages(v: list[Any]) -> list[Message]:
    """The messages of a ``send_batch`` from their wire forms; every shape is checked
    before any message is made.

    :raises ProtocolError: for a wrong shape.
    :raises InvalidMessage: for a well-formed but invalid message.
    """
    for m in v:
        _check_message_shape(m)
    return [Message(*m) for m in v]


def encode_result(r: SendResult) -> list[Any]:
    """The wire form of a send result."""
    return [1 if r.status is SendStatus.OK else 0, r.msg_id, r.deliver_at_ms]


def decode_result(v: Any) -> SendResult:
    """A :class:`SendResult` from its wire form."""
    return SendResult(SendStatus.OK if v[0] else SendStatus.DUPLICATE, v[1], v[2])


def encode_results(results: list[SendResult]) -> list[Any]:
    """The wire form of a batch's results, by column: ``[ids, dues, dups]`` where
    ``dups`` lists the positions of ``DUPLICATE`` results."""
    ok = SendStatus.OK
    return [
        [r.msg_id for r in results],
        [r.deliver_at_ms for r in results],
        [i for i, r in enumerate(results) if r.status is not ok],
    ]


def decode_results(v: Any, id_prefix: str = "") -> list[SendResult]:
    """A batch's :class:`SendResult` list from its wire form.

    :raises ProtocolError: for a wrong shape.
    """
    if type(v) is not list or len(v) != 3 or len(v[0]) != len(v[1]):
        raise ProtocolError("batch results are [ids, dues, dups]")
    ok = SendStatus.OK
    out = [SendResult(ok, id_prefix + i, d) for i, d in zip(v[0], v[1], strict=True)]
    for i in v[2]:
        out[i] = out[i]._replace(status=SendStatus.DUPLICATE)
    return out


def encode_received(m: ReceivedMessage) -> list[Any]:
    """The wire form of a received message."""
    return [
        m.msg_id,
        m.topic,
        m.body,
        m.deliver_at_ms,
        m.born_ms,
        m.attempts,
        m.receipt,
        m.key,
        m.tags,
        dict(m.properties) if m.properties else None,
    ]


def decode_received(
    v: list[Any], receipt_prefix: bytes = b"", id_prefix: str = ""
) -> ReceivedMessage:
    """A :class:`ReceivedMessage` from its wire form; prefixes tag id and receipt."""
    return ReceivedMessage(
        id_prefix + v[0],
        v[1],
        v[2],
        v[3],
        v[4],
        v[5],
        receipt_prefix + v[6],
        v[7],
        v[8],
        v[9] or NO_PROPERTIES,
    )


def encode_view(v: MessageView) -> list[Any]:
    """The wire form of a message view."""
    return [
        v.msg_id,
        v.topic,
        v.state.value,
        v.deliver_at_ms,
        v.born_ms,
        v.attempts,
        v.key,
        v.tags,
        v.body_size,
        {g: s.value for g, s in v.groups.items()},
        v.error,
    ]


def decode_view(v: list[Any], id_prefix: str = "") -> MessageView:
    """A :class:`MessageView` from its wire form."""
    groups = {g: MessageState(s) for g, s in v[9].items()}
    return MessageView(
        id_prefix + v[0],
        v[1],
        MessageState(v[2]),
        v[3],
        v[4],
        v[5],
        v[6],
        v[7],
        v[8],
        groups,
        v[10],
    )


__all__ = [
    "MAX_FRAME",
    "VERSION",
    "FrameTooLarge",
    "ProtocolError",
    "Request",
    "Response",
    "check_length",
    "decode_error",
    "decode_message",
    "decode_messages",
    "decode_received",
    "decode_request",
    "decode_response",
    "decode_result",
    "decode_results",
    "decode_view",
    "encode_message",
    "encode_received",
    "encode_result",
    "encode_results",
    "encode_view",
    "error_response",
    "frame",
    "request",
    "response",
]
