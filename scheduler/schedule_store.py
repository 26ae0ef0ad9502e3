"""Where schedule definitions live: keyed pending messages on a reserved topic.

Each :class:`~scheduler.schedule_def.ScheduleDef` is one message of topic
:data:`SCHEDULES_TOPIC` with key ``schedule:<name>:`` (``%`` and ``:`` in the name
escaped as ``%25`` and ``%3A``, so no record's key is a prefix of another's),
body the definition's JSON, due about :data:`HORIZON_MS` ahead. Nobody consumes
that topic: a record is read with ``find_pending(..., with_body=True)``, changed
in one atomic step with ``reschedule(key=..., body=...)`` and removed with
``abort``. Each write also moves its due time to a fresh point about a year
ahead (with random low bits), which serves two purposes: the record never falls
due (:meth:`ScheduleStore.keep_alive` pushes forward the ones that get within
half the horizon), and a reader holding a cached copy can tell whether it is
still current with one ``query(msg_id)``, a point lookup that returns no body:
same id, still pending, same due time means unchanged.

So every process of the app sees the same schedules, they survive restarts
(with a durable broker), and no new broker primitive is needed. A record is a
message: ``chronoq pending --topic chronoq.schedules`` shows them.

Concurrency: a write replaces the whole record (last writer wins; two
concurrent ``update`` calls of one schedule do not merge). A create is atomic
(a keyed send: ``DUPLICATE`` means the name is taken).
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import DecodeError, UnknownTopic
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortStatus,
    MessageState,
    MessageView,
    RescheduleStatus,
    SendStatus,
)
from scheduler.schedule_def import ScheduleDef

_log = logging.getLogger("chronoq.scheduler.ScheduleStore")

#: The reserved topic of schedule records (no dispatcher subscribes to it).
SCHEDULES_TOPIC = "chronoq.schedules"
#: Key prefix of every schedule record.
RECORD_PREFIX = "schedule:"
#: How far ahead a record is due after a write (a year: well within the default
#: 10-year max delay of every adapter).
HORIZON_MS = 365 * 24 * 3600 * 1000
#: Random spread of a record's due time, so two writes (even concurrent ones)
#: leave different due times: a cached copy's check compares them.
_SPREAD_MS = 1 << 20
_ESCAPED = re.compile("%(25|3A)")
#: Records read per page.
_PAGE = 500
#: Changed records ``read_all`` reads one by one; past this, it reads them all again.
_REREAD_ONE_BY_ONE = 50


def record_key(name: str) -> str:
    """The key of schedule ``name``'s record: ``schedule:<escaped name>:``."""
    return f"{RECORD_PREFIX}{name.replace('%', '%25').replace(':', '%3A')}:"


def name_of_key(key: str) -> str | None:
    """The schedule name a record key stands for, or ``None`` for another key."""
    if (
        not key.startswith(RECORD_PREFIX)
        or not key.endswith(":")
        or len(key) <= len(RECORD_PREFIX) + 1
    ):
        return None
    escaped = key[len(RECORD_PREFIX) : -1]
    if ":" in escaped:
        return None
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else ":", escaped)


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """A definition as read from the broker, with what identifies this copy.

    :param definition: the definition.
    :param msg_id: the record's message id (stable across writes).
    :param due_ms: the record's due time (changes with each write).
    """

    definition: ScheduleDef
    msg_id: str
    due_ms: int


class ScheduleStore:
    """Reads and writes schedule records on a broker; safe across threads.

    :param broker: returns the broker to use (read on each call: an app's broker
        may be swapped, e.g. by ``use_broker`` in tests).
    :param now_ms: the current time, epoch ms.
    """

    def __init__(self, broker: Callable[[], BrokerAdapter], now_ms: Callable[[], int]) -> None:
        self._broker = broker
        self._now_ms = now_ms
        # name -> the copy last read (None: no record then); see current().
        self._cache: dict[str, StoredSchedule | None] = {}

    # -- reading ------------------------------------------------------------------------

    def _views(self, key_prefix: str, with_body: bool) -> Iterator[MessageView]:
        """Every pending record under ``key_prefix``, page by page."""
        broker = self._broker()
        cursor: str | None = None
        while True:
            try:
                page = broker.find_pending(
                    SCHEDULES_TOPIC,
                    key_prefix=key_prefix,
                    limit=_PAGE,
                    cursor=cursor,
                    with_body=with_body,
                )
            except UnknownTopic:
                return  # no schedule was ever stored on this broker
            yield from page.messages
            cursor = page.cursor
            if cursor is None:
                return

    def _pages(self, key_prefix: str) -> list[StoredSchedule]:
        out: list[StoredSchedule] = []
        for view in self._views(key_prefix, with_body=True):
            if view.body is None or view.key is None:
                continue
            try:
                d = ScheduleDef.from_json(view.body)
            except DecodeError as e:
                _log.warning("schedule record %s (msg %s) ignored: %s", view.key, view.msg_id, e)
                continue
            if record_key(d.name) == view.key:
                out.append(StoredSchedule(d, view.msg_id, view.deliver_at_ms))
        return out

    def read_all(self) -> list[StoredSchedule]:
        """Every stored schedule, in no particular order.

        Lists the records without their bodies first: a record whose id and due
        time match the copy read last is unchanged, so only the others are read
        (each by key, or all again with bodies when many changed).
        """
        found: list[StoredSchedule] = []
        changed: list[str] = []
        for view in self._views(RECORD_PREFIX, with_body=False):
            name = name_of_key(view.key or "")
            if name is None:
                continue
            cached = self._cache.get(name)
            if (
                cached is not None
                and cached.msg_id == view.msg_id
                and cached.due_ms == view.deliver_at_ms
            ):
                found.append(cached)
            else:
                changed.append(name)
        if len(changed) > _REREAD_ONE_BY_ONE:
            found = self._pages(RECORD_PREFIX)
            for s in found:
                self._cache[s.definition.name] = s
            return found
        for name in changed:
            stored = self.read(name)
            if stored is not None:
                found.append(stored)
        return found

    def read(self, name: str) -> StoredSchedule | None:
        """Schedule ``name`` as stored now, or ``None``."""
        key = record_key(name)
        found = next((s for s in self._pages(key) if record_key(s.definition.name) == key), None)
        self._cache[name] = found
        return found

    def current(self, name: str) -> ScheduleDef | None:
        """Schedule ``name``'s definition as stored now, or ``None``, in one point
        lookup (``query``) when the copy read last is still current; the record is
        read again only when it changed (or was never read here)."""
        cached = self._cache.get(name)
        if cached is not None:
            view = self._broker().query(cached.msg_id)
            if (
                view is not None
                and view.state is MessageState.PENDING
                and view.deliver_at_ms == cached.due_ms
            ):
                return cached.definition
        found = self.read(name)
        return None if found is None else found.definition

    # -- writing ------------------------------------------------------------------------

    def _due(self, avoid: int | None = None) -> int:
        due = self._now_ms() + HORIZON_MS - random.randrange(_SPREAD_MS)
        return due + 1 if due == avoid else due

    def create(self, d: ScheduleDef) -> bool:
        """Store ``d`` as a new record; ``False`` (nothing changed) when a record of
        that name exists."""
        msg = Message(SCHEDULES_TOPIC, d.to_json(), record_key(d.name), deliver_at_ms=self._due())
        result = self._broker().send(msg)
        if result.status is SendStatus.OK:
            self._cache[d.name] = StoredSchedule(d, result.msg_id, result.deliver_at_ms)
        return result.status is SendStatus.OK

    def write(self, d: ScheduleDef, previous: StoredSchedule | None = None) -> bool:
        """Replace the record of ``d.name`` with ``d`` in one atomic step; ``False``
        (nothing changed) when there is no such record.

        :param previous: the copy ``d`` was derived from (its due time is avoided).
        """
        due = self._due(None if previous is None else previous.due_ms)
        res = self._broker().reschedule(
            key=record_key(d.name), topic=SCHEDULES_TOPIC, deliver_at_ms=due, body=d.to_json()
        )
        if res.status is RescheduleStatus.RESCHEDULED:
            assert res.msg_id is not None and res.deliver_at_ms is not None
            self._cache[d.name] = StoredSchedule(d, res.msg_id, res.deliver_at_ms)
            return True
        if res.status is RescheduleStatus.ALREADY_DELIVERED:
            # The record fell due (a broker with a short max delay, or a clock jump):
            # it is gone from the pending set; store it afresh.
            _log.warning("schedule record %s had fallen due; stored again", d.name)
            return self.create(d)
        self._cache.pop(d.name, None)
        return False

    def delete(self, name: str) -> bool:
        """Remove schedule ``name``'s record; ``False`` when there was none."""
        res = self._broker().abort(key=record_key(name), topic=SCHEDULES_TOPIC)
        self._cache.pop(name, None)
        return res.status is AbortStatus.ABORTED

    def keep_alive(self, stored: list[StoredSchedule]) -> int:
        """Push forward the records of ``stored`` due within half the horizon (so none
        ever falls due); returns how many moved."""
        limit = self._now_ms() + HORIZON_MS // 2
        moved = 0
        for s in stored:
            if s.due_ms < limit:
                res = self._broker().reschedule(
                    key=record_key(s.definition.name),
                    topic=SCHEDULES_TOPIC,
                    deliver_at_ms=self._due(s.due_ms),
                )
                moved += res.status is RescheduleStatus.RESCHEDULED
        return moved


__all__ = [
    "HORIZON_MS",
    "RECORD_PREFIX",
    "SCHEDULES_TOPIC",
    "ScheduleStore",
    "StoredSchedule",
    "name_of_key",
    "record_key",
]
