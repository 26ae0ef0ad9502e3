"""Retention: what the embedded broker drops once nobody can need it any more.

Past ``retention_ms`` of broker time it drops fired messages that every group
subscribed to their topic has passed (the ``ready`` family), abort tombstones
whose due time passed (``aborted``), and with both the business-key entries
(``keys``) that still point at them, so a keyed workload (an order timeout
keyed by order id) does not grow the key index for ever, and the ``moves`` entry
of a message that was rescheduled. A key entry that a
later send with the same key took over points elsewhere and stays. A group's
retry or dead-letter note (``consume``) goes with the retry or dead-letter copy
it points at.

The work goes in chunks of :data:`TRIM_CHUNK` records, one per call of
:meth:`Retention.trim` on the wheel thread, which fires what is due between two
calls: a big backlog past retention never holds the timing wheel up.
"""

from __future__ import annotations

from typing import Any

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.records import HEAD_SIZE, record_id, record_tid

#: Records looked at per call (the wheel thread fires due messages between calls).
TRIM_CHUNK = 5_000
_KEY_LEN = slice(38, 40)  # key length in a record's head (see records.py)


class Retention:
    """Trims the data directory of one broker, a chunk at a time (only the wheel thread
    calls in).

    :param core: the broker's core (its store and topics).
    :param groups: its consumer groups (what they have passed is what may go).
    :param retention_ms: how long fired messages and tombstones stay.
    """

    def __init__(self, core: BrokerCore, groups: GroupRegistry, retention_ms: int) -> None:
        self._core = core
        self._groups = groups
        self.retention_ms = retention_ms
        # Per topic id: the ready key below which everything is trimmed already, so a
        # pass does not walk the deleted head again (range tombstones still cost).
        self._trimmed: dict[int, bytes] = {}
        self._aborted_from = b""

    def trim(self, now: int) -> bool:
        """Trim one chunk of what retention lets go at broker time ``now``; ``True``
        when nothing is left for this round."""
        floor = K.wheel_key(max(now - self.retention_ms, 0), 0)
        with self._core.lock:  # the store with every fire written, and how far that is
            store = self._core.store
            written = self._core.fired_upto
        batch = store.batch()
        left = TRIM_CHUNK
        h_aborted, h_ready = store.handle[K.CF_ABORTED], store.handle[K.CF_READY]
        lower = self._aborted_from
        if lower < floor:
            rows = store.scan(K.CF_ABORTED, lower, floor, left)
            for wkey, value in rows:
                self._forget_key(batch, value[8:], wkey)  # value: abort ms(8) + record
            upto = floor if len(rows) < left else K.next_key(rows[-1][0])
            batch.delete_range(lower, upto, h_aborted)
            self._aborted_from = upto
            left -= len(rows)
        for tid, prefix in list(self._core.prefixes.items()):
            if left <= 0:
                break
            end = prefix + floor
            if not self._core.topic_names.get(tid, "").startswith("%DLQ%"):
                # a fire held since the store was read is not in it: not trimmed below
                # a range tombstone it would outlive (dead letters are never held)
                end = min(end, prefix + written)
            for group in self._groups.subscribers_of(tid):
                with group.lock:
                    end = min(end, group.committed(tid))
            lower = max(self._trimmed.get(tid, prefix), prefix)
            if end <= lower:
                continue
            rows = store.scan(K.CF_READY, lower, end, left)
            gid = self._group_of(tid)
            for ready_key, record in rows:
                self._forget_key(batch, record, ready_key[2:])
                if gid is not None:
                    self._forget_note(batch, gid + record_id(record), ready_key[2:])
            upto = end if len(rows) < left else K.next_key(rows[-1][0])
            batch.delete_range(lower, upto, h_ready)
            self._core.forget_fresh(tid)  # pulls must not be handed what is deleted
            self._trimmed[tid] = upto
            left -= len(rows)
        store.write(batch, lazy=True)
        return left > 0

    def _group_of(self, tid: int) -> bytes | None:
        """The id bytes of the group whose retry or dead-letter topic ``tid`` is."""
        name = self._core.topic_names.get(tid, "")
        for system in ("%RETRY%", "%DLQ%"):
            if name.startswith(system):
                group = self._groups.group(name[len(system) :])
                return None if group is None else group.gid_bytes
        return None

    def _forget_note(self, batch: Any, note_key: bytes, wkey: bytes) -> None:
        """Delete a group's note on a message if it names the copy at ``wkey`` (a later
        retry's note names a later copy and stays)."""
        store = self._core.store
        note = store.cf[K.CF_CONSUME].get(note_key)
        if note is not None and note[3:19] == wkey:  # kind(1) attempts(2) wheel key(16)
            batch.delete(note_key, store.handle[K.CF_CONSUME])

    def _forget_key(self, batch: Any, record: bytes, wkey: bytes) -> None:
        """Delete the key entry of the message in ``record`` (stored at ``wkey``) if it
        still points at that message, and its ``moves`` entry if it was rescheduled. A
        retry's or dead letter's record (in another topic) leaves both to the first
        send's record."""
        raw = record_id(record)
        if record_tid(record) != K.id_tid(raw):
            return  # a retry's copy: the first send's record decides
        first_wkey = K.id_wheel_key(raw)
        if wkey != first_wkey:  # rescheduled: it fired or was aborted at wkey
            batch.delete(first_wkey, self._core.store.handle[K.CF_MOVES])
        klen = int.from_bytes(record[_KEY_LEN], "big")
        if not klen:
            return
        index = raw[14:16] + record[HEAD_SIZE : HEAD_SIZE + klen]
        store = self._core.store
        entry = store.cf[K.CF_KEYS].get(index)
        if entry is not None and entry[:16] == first_wkey:
            batch.delete(index, store.handle[K.CF_KEYS])
