"""Wire forms of the values the protocol carries (see :mod:`broker_adapter.server.protocol`
for the frames around them).

A message ``m`` is ``[topic, body, key, tags, props, delay_ms, delay_sec, delay_level,
deliver_at_ms]``; a send result ``r`` is ``[ok, id, due]`` (``ok`` is 1 for OK, 0 for
DUPLICATE), a batch's results ``[ids, dues, positions of DUPLICATEs]``; a received
message ``rm`` is ``[id, topic, body, due, born, attempts, receipt, key, tags, props]``;
a view is ``[id, topic, state, due, born, attempts, key, tags, body_size, groups, error]``.
"""

from __future__ import annotations

from typing import Any

from broker_adapter.message import Message
from broker_adapter.results import (
    NO_PROPERTIES,
    MessageState,
    MessageView,
    ReceivedMessage,
    SendResult,
    SendStatus,
)
from broker_adapter.server.protocol import ProtocolError


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
    "decode_message",
    "decode_messages",
    "decode_received",
    "decode_result",
    "decode_results",
    "decode_view",
    "encode_message",
    "encode_received",
    "encode_result",
    "encode_results",
    "encode_view",
]
