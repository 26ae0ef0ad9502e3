"""DeadLetters: list, requeue and purge a group's dead letters in the embedded broker.

A dead letter is a copy of the message in the ``ready`` family under the topic
``%DLQ%<group>`` (fired at its death, so ready-key order is death order) plus the
group's note in ``consume`` (see :mod:`~broker_adapter.embedded.keys`)::

    gid(2) msg id(16) -> b"D" attempts(2) DLQ wheel key(16) reason

The copy is a dead letter while the note is a ``D`` naming that copy's wheel key.
Requeue and purge rewrite the note and leave the copy where it is (a group
reading ``%DLQ%<group>`` keeps its cursor and counts; retention trims the copy,
and with it a note that still names it):

* **requeue**: ``b"R" 0(2) wheel key(16) reason`` and a fresh copy (attempts 0)
  on the wheel in ``%RETRY%<group>``, due now: the group's retry path, so
  ``query`` and the consumers treat it as any retry, and it may die again (a new
  copy, a new ``D`` note).
* **purge**: ``b"X" attempts(2) DLQ wheel key(16) reason``: the group's state is
  ``DONE``.

Each also adds to the group's settled count (``meta`` ``b"D" gid``), so ``stats()``
counts the dead letters there are now: the DLQ topic's fired total less it.

Both are one ``WriteBatch`` per chunk of :data:`CHUNK` under the broker lock
(which orders them against a concurrent requeue of the same id). A page scans at
most :data:`SCAN_BUDGET` copies from its cursor; a copy that is no longer a
dead letter is skipped. Requeue/purge of "the oldest" start at a per-group
position in memory below which no copy is a dead letter any more, so calling
again until 0 does not walk what was requeued before.
"""

from __future__ import annotations

from broker_adapter.base import dead_letter_topic, retry_topic
from broker_adapter.cursors import PositionCursor
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.query import MessageQuery
from broker_adapter.embedded.records import record_id, with_topic_and_attempts
from broker_adapter.results import DeadLetterPage, MessageView

#: Most dead-letter copies one page looks at.
SCAN_BUDGET = 5_000
#: Dead letters per write batch (and per hold of the broker lock).
CHUNK = 250

_DEAD, _REQUEUED, _PURGED = b"D", b"R", b"X"

# embedded dead-letter cursor, version 1: a DLQ wheel key (16) or one past it (17)
_CURSOR = PositionCursor("ed1", "dead_letters", (16, 17))
#: The opaque, url-safe cursor of a page whose next one starts at a position.
encode_cursor = _CURSOR.encode
#: The wheel-key position a cursor of :func:`encode_cursor` names (``InvalidArgument``
#: for anything else).
decode_cursor = _CURSOR.decode

#: (ready key of the DLQ copy, note key, note, record)
_Dead = tuple[bytes, bytes, bytes, bytes]


class DeadLetters:
    """Answers ``dead_letters``, ``requeue_dead`` and ``purge_dead`` for an embedded broker.

    :param core: the broker's core.
    :param groups: its consumer groups (names to ids).
    :param queries: builds the views.
    """

    def __init__(self, core: BrokerCore, groups: GroupRegistry, queries: MessageQuery) -> None:
        self._core = core
        self._groups = groups
        self._queries = queries
        # group id bytes -> DLQ ready key below which no copy is a dead letter any more
        self._settled: dict[bytes, bytes] = {}
        # group id bytes -> dead letters requeued or purged so far (meta b"D"), once read
        self._counts: dict[bytes, int] = {}

    def settled(self, group: str) -> int:
        """How many of ``group``'s dead letters were requeued or purged so far (durable)."""
        g = self._groups.group(group)
        return 0 if g is None else self._settled_count(g.gid_bytes)

    def _settled_count(self, gid: bytes) -> int:
        n = self._counts.get(gid)
        if n is None:
            raw = self._core.store.cf[K.CF_META].get(K.META_DEAD_SETTLED + gid)
            n = self._counts[gid] = int(K.U64.unpack(raw)[0]) if raw else 0
        return n

    def _where(self, group: str) -> tuple[bytes, int, bytes] | None:
        """``(gid bytes, DLQ topic id, DLQ key prefix)`` of ``group``, ``None`` when it
        has no dead-letter topic."""
        g = self._groups.group(group)
        dlq = self._core.topic_ids.get(dead_letter_topic(group))
        if g is None or dlq is None:
            return None
        return g.gid_bytes, dlq, self._core.prefixes[dlq]

    def _live(self, gid: bytes, ready_key: bytes, record: bytes) -> _Dead | None:
        """The dead letter whose DLQ copy is ``record`` at ``ready_key``, if it still is one."""
        note_key = gid + record_id(record)
        note = self._core.store.cf[K.CF_CONSUME].get(note_key)
        if note is None or note[:1] != _DEAD or note[3:19] != ready_key[2:]:
            return None
        return ready_key, note_key, note, record

    def page(self, group: str, cursor: str | None, limit: int, with_body: bool) -> DeadLetterPage:
        """One page; see :meth:`BrokerAdapter.dead_letters
        <broker_adapter.base.BrokerAdapter.dead_letters>`.

        :raises InvalidArgument: for a malformed cursor.
        """
        position = decode_cursor(cursor) if cursor is not None else b""
        where = self._where(group)
        if where is None:
            return DeadLetterPage([], None)
        gid, dlq, prefix = where
        lower = max(prefix + position, self._settled.get(gid, prefix))
        upper = K.topic_range(dlq)[1]
        rows = self._core.store.scan(K.CF_READY, lower, upper, SCAN_BUDGET)
        views: list[MessageView] = []
        for ready_key, record in rows:
            dead = self._live(gid, ready_key, record)
            if dead is not None:
                views.append(self._view(group, dead, with_body))
                if len(views) >= limit:
                    return DeadLetterPage(views, encode_cursor(K.next_key(ready_key[2:])))
        more = len(rows) >= SCAN_BUDGET
        return DeadLetterPage(views, encode_cursor(K.next_key(rows[-1][0][2:])) if more else None)

    def _view(self, group: str, dead: _Dead, with_body: bool) -> MessageView:
        note = dead[2]
        attempts = int(K.U16.unpack_from(note, 1)[0])
        error = note[19:].decode(errors="replace") or None
        return self._queries.dead_view(group, dead[3], attempts, error, with_body)

    def _named(self, gid: bytes, prefix: bytes, msg_ids: tuple[str, ...]) -> list[_Dead]:
        """The dead letters among ``msg_ids`` (broker lock held)."""
        cf = self._core.store.cf
        out = []
        for msg_id in msg_ids:
            raw = K.parse_id(msg_id)
            note = None if raw is None else cf[K.CF_CONSUME].get(gid + raw)
            if raw is None or note is None or note[:1] != _DEAD:
                continue
            ready_key = prefix + note[3:19]
            record = cf[K.CF_READY].get(ready_key)
            if record is not None:
                out.append((ready_key, gid + raw, note, record))
        return out

    def _oldest(self, gid: bytes, dlq: int, prefix: bytes, n: int) -> list[_Dead]:
        """Up to ``n`` of the oldest dead letters (broker lock held); moves the group's
        settled position past the copies before the first one."""
        lower = max(self._settled.get(gid, prefix), prefix)
        upper = K.topic_range(dlq)[1]
        out: list[_Dead] = []
        while len(out) < n and lower < upper:
            rows = self._core.store.scan(K.CF_READY, lower, upper, 4 * CHUNK)
            for ready_key, record in rows:
                dead = self._live(gid, ready_key, record)
                if dead is not None:
                    out.append(dead)
                    if len(out) >= n:
                        break
                elif not out:
                    self._settled[gid] = K.next_key(ready_key)
            if len(rows) < 4 * CHUNK:
                break
            lower = K.next_key(rows[-1][0])
        return out

    def requeue(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead <broker_adapter.base.BrokerAdapter.requeue_dead>`."""
        return self._settle(group, msg_ids, limit, requeue=True)

    def purge(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead <broker_adapter.base.BrokerAdapter.purge_dead>`."""
        return self._settle(group, msg_ids, limit, requeue=False)

    def _settle(
        self, group: str, msg_ids: tuple[str, ...] | None, limit: int, *, requeue: bool
    ) -> int:
        where = self._where(group)
        if where is None:
            return 0
        gid, dlq, prefix = where
        core = self._core
        done = 0
        todo = list(msg_ids) if msg_ids is not None else None
        while done < limit:
            with core.lock:  # found and rewritten in one hold: a second call finds R/X
                if todo is not None:
                    found = self._named(gid, prefix, tuple(todo[:CHUNK]))
                    todo = todo[CHUNK:]
                else:
                    found = self._oldest(gid, dlq, prefix, min(CHUNK, limit - done))
                if found:
                    self._write(group, found, requeue)
                    done += len(found)
            if (todo is None and len(found) < CHUNK) or todo == []:
                break
        return done

    def _write(self, group: str, found: list[_Dead], requeue: bool) -> None:
        """Rewrite the notes of ``found`` (and with ``requeue`` put a fresh copy of each
        on the wheel, due now) in one batch (broker lock held)."""
        core = self._core
        store = core.store
        batch = store.batch()
        h_consume = store.handle[K.CF_CONSUME]
        gid = found[0][1][:2]  # a note key is gid(2) + msg id(16)
        count = self._settled_count(gid) + len(found)
        batch.put(K.META_DEAD_SETTLED + gid, K.U64.pack(count), store.handle[K.CF_META])
        if not requeue:
            for _ready_key, note_key, note, _record in found:
                batch.put(note_key, _PURGED + note[1:], h_consume)
            core.write(batch)
            self._counts[gid] = count
            return
        retry_tid = core.topic_id(retry_topic(group))
        now = core.now()
        entries = []
        for _ready_key, note_key, note, record in found:
            wkey = K.wheel_key(now, core.next_seq())
            entries.append((wkey, retry_tid, with_topic_and_attempts(record, retry_tid, 0, now)))
            batch.put(note_key, _REQUEUED + K.U16.pack(0) + wkey + note[19:], h_consume)
        core.write_pending(batch, entries)
        self._counts[gid] = count
        core.kick()  # due now: the wheel thread fires them


__all__ = ["CHUNK", "SCAN_BUDGET", "DeadLetters", "decode_cursor", "encode_cursor"]
