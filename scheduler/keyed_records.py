"""Keyed records: small state a process publishes through the broker itself.

A record is a pending message nobody consumes, on a reserved topic, with a key
that names its writer (``runs:<owner>:<n>`` for the schedules' last runs,
``stats:<owner>:`` for the job stats). :func:`put_record` replaces the writer's
previous version in one atomic ``reschedule(key=..., body=...)`` (or sends the
first one), due ``due_ms``: far enough ahead that it never fires while its
writer lives, so the records of a writer gone for that long fall due and are
forgotten. :func:`iter_records` reads every writer's records, a page at a time.
No broker primitive of its own: it works on every adapter.
"""

from __future__ import annotations

from collections.abc import Iterator

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import MessageView, RescheduleStatus


def put_record(broker: BrokerAdapter, topic: str, key: str, body: bytes, due_ms: int) -> None:
    """Store ``body`` as the record ``key`` of ``topic``, in place of its last version.

    :param due_ms: when the record falls due (epoch ms) unless written again before.
    :raises ChronoqError: when the broker fails (nothing changed, or the old version stays).
    """
    res = broker.reschedule(key=key, topic=topic, deliver_at_ms=due_ms, body=body)
    if res.status is not RescheduleStatus.RESCHEDULED:  # the first write, or it fell due
        broker.send(Message(topic, body, key, deliver_at_ms=due_ms))


def iter_records(
    broker: BrokerAdapter, topic: str, key_prefix: str | None = None, page: int = 100
) -> Iterator[MessageView]:
    """Every record of ``topic`` (under ``key_prefix``), with its body, in due order.

    A topic never written to holds none.
    """
    cursor: str | None = None
    while True:
        try:
            found = broker.find_pending(
                topic, key_prefix=key_prefix, limit=page, cursor=cursor, with_body=True
            )
        except UnknownTopic:
            return
        yield from found.messages
        cursor = found.cursor
        if cursor is None:
            return


__all__ = ["iter_records", "put_record"]
