"""EmbeddedSends: the embedded broker's send primitives, one write batch per call.

A send reserves sequence numbers, packs each message's wheel key and record
(:mod:`~broker_adapter.embedded.records`), checks a business key against the
``keys`` family, and writes the wheel entries, the key index and the pending
counters in one RocksDB write batch under the broker lock
(:meth:`~broker_adapter.embedded.core.BrokerCore.write_pending`), so a send is all
or nothing and, with the default ``wal`` durability, in RocksDB's WAL before it is
acknowledged. Everything that can refuse a send (a due time past the max delay, a
topic over the limit) is checked before anything is reserved or written.

This is the hot path of scheduling (issue 16): a write of one message costs
~4.5 us of RocksDB, so each Python step around it counts: the primitives are
methods of the broker itself (a mixin, no call in between), ``_send_one`` is a
single send without the lists a batch needs, and ``_send_checked`` one loop per
batch that builds no object a message does not need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import HEAD, VERSION, encode
from broker_adapter.embedded.timing_wheel import Entry
from broker_adapter.errors import InvalidDelay
from broker_adapter.message import Message
from broker_adapter.results import SendResult, SendStatus

_OK, _DUP = SendStatus.OK, SendStatus.DUPLICATE
_pack_wheel = K.pack_wheel_key
_pack_u64 = K.U64.pack
_MAX_TIME_MS = K.MAX_TIME_MS
_pack_head, _V = HEAD.pack, VERSION
# SendResult's own __new__ is a Python function: tuple.__new__ builds the same
# named tuple at a third of the cost (one per message).
_result = tuple.__new__


class EmbeddedSends:
    """The send primitives of :class:`~broker_adapter.embedded.broker.EmbeddedBroker`
    (a base of it), on the broker's core: ``_send_one``, ``_send_checked`` and the
    duplicate-key test ``_key_taken``."""

    _core: BrokerCore
    _closed: bool
    #: The furthest ahead a message may be due (ms); set by the broker.
    max_delay_ms: int
    #: The clock's ``now_ms`` (see :meth:`BrokerCore.clock_ms`); set by the broker.
    _clock_ms: Callable[[], int]
    # The tags of the last single send and their bytes (one tuple: read in one step).
    _last_tags: tuple[str | None, bytes] = (None, b"")

    if TYPE_CHECKING:

        def check_open(self) -> None: ...

    def _too_late(self, due: int, now: int) -> InvalidDelay:
        return InvalidDelay(
            "delay", due - now, f"due after the broker's max delay of {self.max_delay_ms} ms"
        )

    def _send_one(self, m: Message) -> SendResult:
        """Store one message (see :meth:`BrokerAdapter.send`).

        :raises InvalidDelay: when it is due after the max delay; nothing is stored.
        :raises StorageFull: when the disk is full; nothing is stored.
        """
        core = self._core
        with core.lock:
            if self._closed:  # closed while waiting for the lock
                self.check_open()
            store = core.store
            if not store.writable:  # after a full disk: retries at most every ~1 s
                core.resume_writes()
            now = core.now()
            # A delay counts from the clock, a due time never before broker time (after
            # the clock stepped back: see BrokerCore.after).
            delay = m.delay_ms
            wall = self._clock_ms()  # core.clock_ms() without its call
            due = wall + delay if delay is not None else m.deliver_at(wall)
            if due <= now:
                due = now
            elif due > now + self.max_delay_ms or due > _MAX_TIME_MS:
                raise self._too_late(due, now)
            topic = m.topic
            tid = core.topic_ids.get(topic) or core.topic_id(topic)
            prefix = core.prefixes[tid]
            wkey = _pack_wheel(due, core.take_seqs(1))
            raw = wkey[2:] + prefix
            batch = store.batch()
            key = m.key
            keyb = b""
            if key is not None:
                keyb = key.encode()
                index = prefix + keyb
                asked = m.deliver_at_ms if m.deliver_at_ms is not None else due
                old = store.cf[K.CF_KEYS].get(index)
                taken = None if old is None else self._key_taken(old, asked)
                if taken is not None:
                    return _result(
                        SendResult, (_DUP, (old[2:16] + prefix).hex(), K.wheel_time(taken))
                    )
                batch.put(index, wkey + _pack_u64(asked), store.handle[K.CF_KEYS])
            tags = m.tags
            last_tags = self._last_tags
            if tags is last_tags[0]:  # sends mostly repeat one tag (the scheduler's job name)
                tagsb = last_tags[1]
            else:
                tagsb = tags.encode() if tags else b""
                self._last_tags = (tags, tagsb)
            if key is None and m.properties is None:  # records.encode, inlined
                record = _pack_head(_V, 0, tid, 0, due, now, raw, 0, len(tagsb), 0)
                record += tagsb + m.body
            else:
                props = m.properties_bytes() if m.properties else b""
                record = encode(tid, 0, due, now, raw, keyb, tagsb, props, m.body)
            core.write_one(batch, wkey, tid, record)
        core.wake_if_before(due)
        return _result(SendResult, (_OK, raw.hex(), due))

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """Store a non-empty batch in one write (see :meth:`BrokerAdapter.send_batch`):
        a key already pending, or repeated within the batch, answers ``DUPLICATE``.

        :raises InvalidDelay: when one is due after the max delay; nothing is stored.
        :raises StorageFull: when the disk is full; nothing is stored.
        """
        core = self._core
        store = core.store
        known_tid, topic_id, prefixes = core.topic_ids.get, core.topic_id, core.prefixes
        results: list[SendResult] = []
        entries: list[Entry] = []
        add_result, add_entry = results.append, entries.append
        with core.lock:
            self.check_open()  # closed while waiting for the lock
            core.resume_writes()  # after a full disk: retries the store at most every ~1 s
            now = core.now()
            wall = core.clock_ms()
            dues = [
                (wall + m.delay_ms if m.delay_ms is not None else m.deliver_at(wall))
                for m in messages
            ]
            first, last = min(dues), max(dues)
            if last > now + self.max_delay_ms or last > K.MAX_TIME_MS:
                raise self._too_late(last, now)
            # (not kept across calls: a reopen after a full disk replaces them)
            h_keys, keys_cf = store.handle[K.CF_KEYS], store.cf[K.CF_KEYS]
            seq = core.take_seqs(len(dues))
            batch = store.batch()
            batch_keys: dict[bytes, SendResult] = {}
            last_topic, tid, prefix = "", 0, b""
            last_tags: str | None = None
            tagsb = b""
            for m, due in zip(messages, dues, strict=True):
                due = due if due > now else now  # noqa: FURB136 - a max() call costs more
                topic = m.topic
                if topic != last_topic:  # batches mostly go to one topic
                    tid = known_tid(topic) or topic_id(topic)
                    prefix, last_topic = prefixes[tid], topic
                wkey = _pack_wheel(due, seq)
                seq += 1
                raw = wkey[2:] + prefix
                tags = m.tags
                if tags is not last_tags:  # ...and carry one tag (the scheduler's job name)
                    tagsb = tags.encode() if tags else b""
                    last_tags = tags
                key = m.key
                if key is None and m.properties is None:  # records.encode, inlined
                    record = _pack_head(_V, 0, tid, 0, due, now, raw, 0, len(tagsb), 0)
                    record += tagsb + m.body
                else:
                    keyb = b""
                    if key is not None:
                        keyb = key.encode()
                        index = prefix + keyb
                        dup = batch_keys.get(index)
                        asked = m.deliver_at_ms if m.deliver_at_ms is not None else due
                        if dup is None:
                            old = keys_cf.get(index)
                            taken = None if old is None else self._key_taken(old, asked)
                            if taken is not None:
                                msg_id = (old[2:16] + prefix).hex()
                                dup = _result(SendResult, (_DUP, msg_id, K.wheel_time(taken)))
                        if dup is not None:
                            add_result(_result(SendResult, (_DUP, dup[1], dup[2])))
                            continue
                        batch.put(index, wkey + _pack_u64(asked), h_keys)
                    props = m.properties_bytes() if m.properties else b""
                    record = encode(tid, 0, due, now, raw, keyb, tagsb, props, m.body)
                add_entry((wkey, tid, record))
                result = _result(SendResult, (_OK, raw.hex(), due))
                if key is not None:
                    batch_keys[index] = result
                add_result(result)
            core.write_pending(batch, entries)
        if entries:
            core.wake_if_before(max(first, now))
        return results

    def _key_taken(self, entry: bytes, asked: int) -> bytes | None:
        """The current wheel key of the message of the key index ``entry`` (first wheel
        key + requested due ms) when it makes a new send with that key, asked for
        ``asked`` ms, a duplicate: its message is pending, or it fired (not aborted)
        and was asked for the same ms; else ``None`` (lock held). The requested time
        counts, not the clamped one (nor a reschedule's), so re-sending an occurrence
        whose time has passed is still recognised."""
        core = self._core
        old = core.locate(entry[:16])
        aborted = core.store.cf[K.CF_ABORTED]
        if old >= core.fired_upto:  # not fired yet: pending unless aborted (no wheel read)
            return old if aborted.get(old) is None else None
        same = int(K.U64.unpack_from(entry, 16)[0]) == asked
        return old if same and aborted.get(old) is None else None


__all__ = ["EmbeddedSends"]
