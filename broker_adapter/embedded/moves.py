"""Rescheduler: moves a pending message of the embedded broker to a new due time.

A move is one write batch under the broker lock (see
:mod:`~broker_adapter.embedded.core`): the wheel entry at the message's current
wheel key is deleted, the same record (new due time, maybe a new body) is put at
a new wheel key, and ``moves`` maps the message's first wheel key (its id) to the
new one (:mod:`~broker_adapter.embedded.keys`). The wheel thread fires under the
same lock, so a message is either still on the wheel (and moves) or has fired
(``ALREADY_DELIVERED``); the near window in memory drops the old key and takes the
new one in the same step, so it can fire only at the new time. The ``keys``
family is not touched: it keeps the first wheel key and the due time the first
send asked for.
"""

from __future__ import annotations

from broker_adapter.base import RESCHEDULE_PAST_TOLERANCE_MS
from broker_adapter.checks import NewDue
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import (
    props_size,
    record_id,
    record_tid,
    with_due_and_body,
)
from broker_adapter.errors import MessageTooLarge
from broker_adapter.results import RescheduleResult, RescheduleStatus

_NOT_FOUND = RescheduleStatus.NOT_FOUND


class Rescheduler:
    """Answers ``reschedule`` for an embedded broker.

    :param core: the broker's core.
    :param max_delay_ms: the furthest ahead a message may be due.
    :param max_body_bytes: the largest body plus properties.
    """

    def __init__(self, core: BrokerCore, max_delay_ms: int, max_body_bytes: int) -> None:
        self._core = core
        self._max_delay_ms = max_delay_ms
        self._max_body_bytes = max_body_bytes

    def reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule <broker_adapter.base.BrokerAdapter.reschedule>`.

        :raises InvalidDelay: for a due time out of range (nothing changes).
        :raises MessageTooLarge: for a body that, with the properties, is too big.
        """
        core = self._core
        with core.lock:  # the store read under the lock: no fire comes in between
            cf = core.store.cf
            now = core.now()
            max_delay = min(self._max_delay_ms, K.MAX_TIME_MS - now)
            new_due = due.resolve(now, max_delay, RESCHEDULE_PAST_TOLERANCE_MS)
            found = self._first_key(msg_id, key, topic)
            if found is None:
                return RescheduleResult(_NOT_FOUND, msg_id, None)
            first, tid = found
            the_id = msg_id if msg_id is not None else K.make_id(first, tid).hex()
            current = core.locate(first)
            record = cf[K.CF_WHEEL].get(current)
            if record is not None and record_id(record) != K.make_id(first, tid):
                record = None  # a made-up id that names a retry's wheel key
            if record is None:  # fired, aborted, or never (or no longer) known
                if (
                    cf[K.CF_ABORTED].get(current) is None
                    and cf[K.CF_READY].get(core.prefixes[tid] + current) is not None
                ):
                    return RescheduleResult(
                        RescheduleStatus.ALREADY_DELIVERED, the_id, K.wheel_time(current)
                    )
                return RescheduleResult(_NOT_FOUND, msg_id, None)
            if body is not None:
                size = len(body) + props_size(record)
                if size > self._max_body_bytes:
                    raise MessageTooLarge(size, self._max_body_bytes)
            moved = with_due_and_body(record, new_due, body)
            new_key = K.wheel_key(new_due, core.next_seq())
            batch = core.store.batch()
            batch.put(first, new_key, core.store.handle[K.CF_MOVES])
            core.move_pending(batch, current, (new_key, record_tid(record), moved))
        core.wake_if_before(new_due)
        return RescheduleResult(RescheduleStatus.RESCHEDULED, the_id, new_due)

    def _first_key(
        self, msg_id: str | None, key: str | None, topic: str | None
    ) -> tuple[bytes, int] | None:
        """The first wheel key and topic id of the message named by ``msg_id``, or by
        ``key`` on ``topic`` (the last one sent with it); ``None`` if there is none."""
        core = self._core
        if msg_id is not None:
            raw = K.parse_id(msg_id)
            if raw is None or K.id_tid(raw) not in core.topic_names:
                return None
            return K.id_wheel_key(raw), K.id_tid(raw)
        assert key is not None and topic is not None  # the adapter base checked
        tid = core.topic_ids.get(topic)
        if tid is None:
            return None
        entry = core.store.cf[K.CF_KEYS].get(core.prefixes[tid] + key.encode())
        return None if entry is None else (entry[:16], tid)


__all__ = ["Rescheduler"]
