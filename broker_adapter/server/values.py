"""Wire forms of the values the protocol carries (see :mod:`broker_adapter.server.protocol`
for the frames around them).

A message ``m`` is ``[topic, body, key, tags, props, delay_ms, delay_sec, delay_level,
deliver_at_ms]``; a send result ``r`` is ``[ok, id, due]`` (``ok`` is 1 for OK, 0 for
DUPLICATE), a batch's results ``[ids, dues, positions of DUPLICATEs]``; a received
message ``rm`` is ``[id, topic, body, due, born, attempts, receipt, key, tags, props]``;
a view is ``[id, topic, state, due, born, attempts, key, tags, body_size, groups, error]``
(plus ``body`` when the view carries one: ``find_pending`` with bodies). Runtime calls:
a reschedule result is ``[status, id, due]``, a prefix abort's ``[aborted, keys,
already_delivered_count]``, a ``find_pending`` page ``[[view], cursor]``. Dead
letters: a ``dead_letters`` page is ``[[view], cursor]`` too, pending counts
``[[count], exact]``.
"""

from __future__ import annotations

from typing import Any

from broker_adapter.message import Message
from broker_adapter.results import (
    NO_PROPERTIES,
    DeadLetterPage,
    MessageState,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    ReceivedMessage,
    RescheduleResult,
    RescheduleStatus,
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
    """The wire form of a message view (its body as a 12th field when it has one)."""
    out: list[Any] = [
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
    if v.body is not None:
        out.append(v.body)
    return out


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
        v[11] if len(v) > 11 else None,
    )


def encode_reschedule(r: RescheduleResult) -> list[Any]:
    """The wire form of a reschedule result."""
    return [r.status.value, r.msg_id, r.deliver_at_ms]


def decode_reschedule(v: Any, id_prefix: str = "") -> RescheduleResult:
    """A :class:`RescheduleResult` from its wire form (``id_prefix`` tags a found id).

    :raises ProtocolError: for a wrong shape.
    """
    if type(v) is not list or len(v) != 3:
        raise ProtocolError("a reschedule result is [status, id, due]")
    msg_id = None if v[1] is None else id_prefix + v[1]
    return RescheduleResult(RescheduleStatus(v[0]), msg_id, v[2])


def encode_prefix_abort(r: PrefixAbortResult) -> list[Any]:
    """The wire form of an ``abort_prefix`` result."""
    return [r.aborted, list(r.already_delivered), r.already_delivered_count]


def decode_prefix_abort(v: Any) -> PrefixAbortResult:
    """A :class:`PrefixAbortResult` from its wire form.

    :raises ProtocolError: for a wrong shape.
    """
    if type(v) is not list or len(v) != 3 or type(v[1]) is not list:
        raise ProtocolError("a prefix abort result is [aborted, keys, count]")
    return PrefixAbortResult(v[0], tuple(v[1]), v[2])


def encode_page(p: PendingPage) -> list[Any]:
    """The wire form of a ``find_pending`` page."""
    return [[encode_view(v) for v in p.messages], p.cursor]


def decode_page(v: Any, id_prefix: str = "") -> PendingPage:
    """A :class:`PendingPage` from its wire form (``id_prefix`` tags every id).

    :raises ProtocolError: for a wrong shape.
    """
    if type(v) is not list or len(v) != 2 or type(v[0]) is not list:
        raise ProtocolError("a find_pending page is [[view], cursor]")
    return PendingPage([decode_view(m, id_prefix) for m in v[0]], v[1])


def encode_dead_page(p: DeadLetterPage) -> list[Any]:
    """The wire form of a ``dead_letters`` page."""
    return [[encode_view(v) for v in p.messages], p.cursor]


def decode_dead_page(v: Any, id_prefix: str = "") -> DeadLetterPage:
    """A :class:`DeadLetterPage` from its wire form (``id_prefix`` tags every id).

    :raises ProtocolError: for a wrong shape.
    """
    page = decode_page(v, id_prefix)
    return DeadLetterPage(page.messages, page.cursor)


def encode_counts(c: PendingCounts) -> list[Any]:
    """The wire form of ``count_pending``'s answer."""
    return [list(c.counts), c.exact]


def decode_counts(v: Any) -> PendingCounts:
    """A :class:`PendingCounts` from its wire form.

    :raises ProtocolError: for a wrong shape.
    """
    if type(v) is not list or len(v) != 2 or type(v[0]) is not list or type(v[1]) is not bool:
        raise ProtocolError("pending counts are [[count], exact]")
    return PendingCounts(list(v[0]), v[1])


__all__ = [
    "decode_counts",
    "decode_dead_page",
    "decode_message",
    "decode_messages",
    "decode_page",
    "decode_prefix_abort",
    "decode_received",
    "decode_reschedule",
    "decode_result",
    "decode_results",
    "decode_view",
    "encode_counts",
    "encode_dead_page",
    "encode_message",
    "encode_page",
    "encode_prefix_abort",
    "encode_received",
    "encode_reschedule",
    "encode_result",
    "encode_results",
    "encode_view",
]
