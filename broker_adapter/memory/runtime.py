"""Reschedule and abort by key prefix on a memory broker's store.

Both follow :meth:`~broker_adapter.base.BrokerAdapter.reschedule` and
:meth:`~broker_adapter.base.BrokerAdapter.abort_prefix`. A reschedule is one step
under the store's lock: the store fires what is due first, so a message whose time
has come is ``ALREADY_DELIVERED`` and one that is moved never fires at its old time.
``abort_prefix`` reads the keys under the prefix from the store's sorted key index
(one slice), then aborts them :data:`CHUNK` at a time, taking the lock per chunk,
so sends, pulls and firing go on in between.
"""

from __future__ import annotations

import time

from broker_adapter.base import RESCHEDULE_PAST_TOLERANCE_MS
from broker_adapter.checks import NewDue
from broker_adapter.errors import MessageTooLarge, UnknownTopic
from broker_adapter.memory.store import MemoryStore
from broker_adapter.results import (
    MAX_REPORTED_KEYS,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)

#: Keys aborted per hold of the store's lock.
CHUNK = 1_000


def reschedule(
    store: MemoryStore,
    msg_id: str | None,
    key: str | None,
    topic: str | None,
    due: NewDue,
    body: bytes | None,
    max_body_bytes: int | None,
) -> RescheduleResult:
    """Move a pending message (by ``msg_id``, or ``key`` on ``topic``) to ``due``.

    :raises InvalidDelay: for a due time out of range (nothing changes).
    :raises MessageTooLarge: for a new body that, with the properties, is over
        ``max_body_bytes`` (nothing changes).
    """
    with store.lock:
        now = store.tick()
        new_due = due.resolve(now, store.max_delay_ms, RESCHEDULE_PAST_TOLERANCE_MS)
        if msg_id is not None:
            stored = store.messages.get(msg_id)
        else:
            assert key is not None and topic is not None  # the base checked
            stored = store.keyed(topic, key)
        if stored is None or stored.aborted:
            return RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
        if stored.copy is None:  # fired (and maybe retrying since)
            return RescheduleResult(
                RescheduleStatus.ALREADY_DELIVERED, stored.msg_id, stored.due_ms
            )
        if body is not None and max_body_bytes is not None:
            size = stored.size - len(stored.body) + len(body)  # the properties count too
            if size > max_body_bytes:
                raise MessageTooLarge(size, max_body_bytes)
        store.move(stored, new_due, body)
        return RescheduleResult(RescheduleStatus.RESCHEDULED, stored.msg_id, new_due)


def abort_prefix(store: MemoryStore, topic: str, key_prefix: str) -> PrefixAbortResult:
    """Abort the pending messages of ``topic`` whose key starts with ``key_prefix``.

    :raises UnknownTopic: for a topic the store never had a message on.
    """
    with store.lock:
        store.tick()
        if not store.knows(topic):
            raise UnknownTopic(topic)
        keys = store.keys_under(topic, key_prefix)
    keys = list(dict.fromkeys(keys))  # each once (the index may list one twice)
    aborted = 0
    delivered: list[str] = []
    delivered_count = 0
    for start in range(0, len(keys), CHUNK):
        with store.lock:
            store.tick()
            for k in keys[start : start + CHUNK]:
                stored = store.keyed(topic, k)  # looked up again: the lock was let go
                if stored is None or stored.aborted:
                    continue
                if stored.copy is None:
                    delivered_count += 1
                    if len(delivered) < MAX_REPORTED_KEYS:
                        delivered.append(k)
                    continue
                store.abort_pending(stored)
                aborted += 1
        time.sleep(0)  # let a waiting pull (which fires what is due) take the lock
    return PrefixAbortResult(aborted, tuple(delivered), delivered_count)


__all__ = ["CHUNK", "abort_prefix", "reschedule"]
