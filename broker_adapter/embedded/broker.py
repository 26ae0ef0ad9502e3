"""EmbeddedBroker: the default broker, in process, on a RocksDB timing wheel.

Threads: callers (send, abort, query, pull) and one *wheel thread* that fires
due messages, refills the near window, redelivers messages whose invisible time
passed and persists group cursors. A second thread serves ``send_async`` and
``send_oneway`` in batches. Locks: ``_lock`` guards the wheel, sequence numbers,
topics and counters; each group has its own lock, always taken before ``_lock``.
Key layout: :mod:`broker_adapter.embedded.keys`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_RETENTION_MS,
    Consumer,
    dead_letter_topic,
)
from broker_adapter.checks import check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.query import MessageQuery
from broker_adapter.embedded.records import (
    encode,
)
from broker_adapter.embedded.retention import Retention
from broker_adapter.embedded.store import RocksStore
from broker_adapter.embedded.timing_wheel import TimingWheel
from broker_adapter.errors import (
    InvalidArgument,
    InvalidDelay,
)
from broker_adapter.message import Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    MessageView,
    SendResult,
    SendStatus,
    TopicStats,
)
from broker_adapter.urls import split_url

log = logging.getLogger("chronoq.broker_adapter.EmbeddedBroker")
log.addHandler(logging.NullHandler())

_SEQ_BLOCK = 1 << 20
_RANGE_DELETE_MIN = 256
_TRIM_INTERVAL_MS = 60_000
_OK, _DUP = SendStatus.OK, SendStatus.DUPLICATE


class EmbeddedBroker(AdapterBase):
    """The embedded broker on a RocksDB directory (``rocksdb://PATH``).

    :param path: data directory; one process owns it at a time.
    :param clock: time source (a ``ManualClock`` in tests).
    :param durability: ``"wal"`` (default: survives ``kill -9``), ``"sync"``
        (fsync per send: survives power loss) or ``"fast"`` (no WAL).
    :param max_body_bytes: largest body (plus properties) accepted.
    :param max_delay_ms: the furthest ahead a message may be due.
    :param window_ms: the near window of the timing wheel held in memory.
    :param retention_ms: how long fired messages stay readable for groups, and their
        business keys (and those of aborted ones) known to keyed sends; see
        :mod:`~broker_adapter.embedded.retention`.
    :param fire_chunk: most messages fired in one write batch.
    :raises BrokerLocked: when another process owns ``path``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        durability: str = "wal",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        window_ms: int = 1000,
        retention_ms: int = DEFAULT_RETENTION_MS,
        fire_chunk: int = 1000,
    ) -> None:
        check_positive_settings(
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            window_ms=window_ms,
            retention_ms=retention_ms,
            fire_chunk=fire_chunk,
        )
        self._store = RocksStore(path, durability)
        self.path = self._store.path
        self._clock = clock or SystemClock()
        self.max_body_bytes = max_body_bytes
        self.max_delay_ms = max_delay_ms
        self.retention_ms = retention_ms
        self._fire_chunk = fire_chunk
        self._lock = threading.RLock()
        meta = self._store.cf[K.CF_META]
        self._topic_ids: dict[str, int] = {}
        self._topic_names: dict[int, str] = {}
        self._tid_prefix: dict[int, bytes] = {}
        self._pending_counts: dict[int, int] = {}
        self._fired: dict[int, int] = {}
        self._tails: dict[int, bytes] = {}
        for key, value in self._store.scan(K.CF_META, K.META_TOPIC, b"U", 1 << 30):
            self._remember_topic(key[1:].decode(), int(K.U16.unpack(value)[0]))
        for key, value in self._store.scan(K.CF_META, K.META_COUNTERS, b"O", 1 << 30):
            tid = int(K.U16.unpack_from(key, 1)[0])
            self._pending_counts[tid], self._fired[tid] = K.U64X2.unpack(value)
        seq = meta.get(K.META_SEQ)
        self._seq = self._seq_hi = int(K.U64.unpack(seq)[0]) if seq else 1
        fired_upto = meta.get(K.META_FIRED_UPTO) or K.wheel_key(0, 0)
        self._fired_upto = fired_upto
        self._last_now = K.wheel_time(fired_upto)
        for tid in self._topic_names:
            lo, hi = K.topic_range(tid)
            tail = self._store.last_key(K.CF_READY, lo, hi)
            if tail is not None:
                self._tails[tid] = tail
        self._wheel = TimingWheel(self._store, fired_upto, window_ms=window_ms)
        self._groups = GroupRegistry(self)
        self._retention = Retention(self)
        self._queries = MessageQuery(self)
        self._wake = threading.Condition(threading.Lock())
        self._kicked = False
        self._planned_wake = 0
        self._clock.subscribe(self._kick)
        self._thread = threading.Thread(
            target=self._run, name=f"chronoq-wheel:{self.path.name}", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> EmbeddedBroker:
        """Open ``rocksdb://PATH[?durability=...&window_ms=...]``."""
        _scheme, path, params = split_url(url)
        if not path:
            raise InvalidArgument(
                f"{url!r} names no directory: use rocksdb:///abs/dir or rocksdb://./dir"
            )
        opts: dict[str, Any] = {}
        for name, value in params.items():
            if name == "durability":
                opts[name] = value
            elif name in (
                "max_body_bytes",
                "max_delay_ms",
                "window_ms",
                "retention_ms",
                "fire_chunk",
            ):
                try:
                    opts[name] = int(value)
                except ValueError as e:
                    raise InvalidArgument(f"{name} in {url!r} must be an int") from e
            else:
                raise InvalidArgument(f"unknown parameter {name!r} in {url!r}")
        opts.update(kwargs)
        return cls(path, **opts)

    # -- topics, time, sequence ---------------------------------------------------------

    def _remember_topic(self, name: str, tid: int) -> None:
        self._topic_ids[name] = tid
        self._topic_names[tid] = name
        self._tid_prefix[tid] = K.tid_bytes(tid)

    def _topic_id(self, name: str) -> int:
        """The id of topic ``name``, registered durably on first use (``_lock`` held)."""
        tid = self._topic_ids.get(name)
        if tid is None:
            tid = len(self._topic_ids) + 1
            if tid > K.MAX_TOPICS:
                raise InvalidArgument(f"this broker already has {K.MAX_TOPICS} topics")
            self._store.cf[K.CF_META].put(
                K.META_TOPIC + name.encode(), K.U16.pack(tid), self._store.write_opt
            )
            self._remember_topic(name, tid)
        return tid

    def _now(self) -> int:
        """Broker time: the clock, never going backwards (keys stay after the fire position)."""
        now = self._clock.now_ms()
        if now < self._last_now:
            return self._last_now
        self._last_now = now
        return now

    def _reserve_seq(self, n: int) -> None:
        """Persist a new high-water mark so ``n`` more sequence numbers are safe to use."""
        self._seq_hi = self._seq + n + _SEQ_BLOCK
        self._store.cf[K.CF_META].put(K.META_SEQ, K.U64.pack(self._seq_hi), self._store.write_opt)

    def _next_seq(self) -> int:
        if self._seq >= self._seq_hi:
            self._reserve_seq(1)
        seq = self._seq
        self._seq = seq + 1
        return seq

    def _kick(self) -> None:
        with self._wake:
            self._kicked = True
            self._wake.notify()

    # -- sending ----------------------------------------------------------------------

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`: one write batch."""
        props_of = {i: m.properties_bytes() for i, m in enumerate(messages) if m.properties}
        store = self._store
        h_wheel, h_keys = store.handle[K.CF_WHEEL], store.handle[K.CF_KEYS]
        keys_cf = store.cf[K.CF_KEYS]
        pack_wheel = K.wheel_key
        results: list[SendResult] = []
        with self._lock:
            self.check_open()  # closed while waiting for the lock
            now = self._now()
            dues = [m.deliver_at(now) for m in messages]
            limit = min(now + self.max_delay_ms, K.MAX_TIME_MS)
            if dues and max(dues) > limit:
                raise InvalidDelay(
                    "delay",
                    max(dues) - now,
                    f"due after the broker's max delay of {self.max_delay_ms} ms",
                )
            tids = [self._topic_ids.get(m.topic) or self._topic_id(m.topic) for m in messages]
            if self._seq + len(dues) >= self._seq_hi:
                self._reserve_seq(len(dues))
            seq = self._seq
            prefix = self._tid_prefix
            batch = store.batch()
            entries = []
            batch_keys: dict[bytes, SendResult] = {}
            counts: dict[int, int] = {}
            for i, m in enumerate(messages):
                tid, due = tids[i], dues[i]
                wkey = pack_wheel(due, seq)
                seq += 1
                raw = wkey[2:] + prefix[tid]
                keyb = b""
                if m.key is not None:
                    keyb = m.key.encode()
                    index = prefix[tid] + keyb
                    dup = batch_keys.get(index)
                    asked = m.deliver_at_ms if m.deliver_at_ms is not None else due
                    if dup is None:
                        old = keys_cf.get(index)
                        if old is not None and self._key_taken(old, asked):
                            old_key = old[:16]
                            dup = SendResult(
                                _DUP, (old_key[2:] + prefix[tid]).hex(), K.wheel_time(old_key)
                            )
                    if dup is not None:
                        results.append(SendResult(_DUP, dup.msg_id, dup.deliver_at_ms))
                        continue
                    batch.put(index, wkey + K.U64.pack(asked), h_keys)
                record = encode(
                    tid,
                    0,
                    due,
                    now,
                    raw,
                    keyb,
                    m.tags.encode() if m.tags else b"",
                    props_of.get(i, b""),
                    m.body,
                )
                batch.put(wkey, record, h_wheel)
                entries.append((wkey, tid, record))
                counts[tid] = counts.get(tid, 0) + 1
                result = SendResult(_OK, raw.hex(), due)
                if keyb:
                    batch_keys[index] = result
                results.append(result)
            self._seq = seq
            self._count_pending(batch, counts)
            store.write(batch)
            schedule = self._wheel.schedule
            for entry in entries:
                schedule(*entry)
        if entries and min(dues) < self._planned_wake:
            self._kick()
        return results

    def _key_taken(self, entry: bytes, asked: int) -> bool:
        """Whether the key index ``entry`` (wheel key + requested due ms) makes a new
        send with that key, asked for ``asked`` ms, a duplicate: its message is
        pending, or it fired (not aborted) and was asked for the same ms. The
        requested time counts, not the clamped one, so re-sending an occurrence
        whose time has passed is still recognised."""
        old = entry[:16]
        aborted = self._store.cf[K.CF_ABORTED]
        if old >= self._fired_upto:  # not fired yet: pending unless aborted (no wheel read)
            return aborted.get(old) is None
        return int(K.U64.unpack_from(entry, 16)[0]) == asked and aborted.get(old) is None

    def _count_pending(self, batch: Any, counts: dict[int, int], fired: bool = False) -> None:
        """Add ``counts`` to pending (or move them to fired) in memory and in ``batch``."""
        h_meta = self._store.handle[K.CF_META]
        for tid, n in counts.items():
            if fired:
                self._pending_counts[tid] = self._pending_counts.get(tid, 0) - n
                self._fired[tid] = self._fired.get(tid, 0) + n
            else:
                self._pending_counts[tid] = self._pending_counts.get(tid, 0) + n
            value = K.U64X2.pack(max(self._pending_counts[tid], 0), self._fired.get(tid, 0))
            batch.put(K.META_COUNTERS + self._tid_prefix[tid], value, h_meta)

    # -- aborting and reading -----------------------------------------------------------

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        store = self._store
        with self._lock:
            if msg_id is not None:
                raw = K.parse_id(msg_id)
                if raw is None or K.id_tid(raw) not in self._topic_names:
                    return AbortResult(AbortStatus.NOT_FOUND, msg_id)
                wkey = K.id_wheel_key(raw)
            else:
                assert key is not None and topic is not None
                tid = self._topic_ids.get(topic)
                found = (
                    None
                    if tid is None
                    else store.cf[K.CF_KEYS].get(self._tid_prefix[tid] + key.encode())
                )
                if tid is None or found is None:
                    return AbortResult(AbortStatus.NOT_FOUND, None)
                wkey = found[:16]
                raw = K.make_id(wkey, tid)
                msg_id = raw.hex()
            record = store.cf[K.CF_WHEEL].get(wkey)
            if record is None:
                if store.cf[K.CF_ABORTED].get(wkey) is not None:
                    return AbortResult(AbortStatus.ABORTED, msg_id)
                tid = K.id_tid(raw)
                fired = store.cf[K.CF_READY].get(self._tid_prefix[tid] + wkey) is not None
                return AbortResult(
                    AbortStatus.ALREADY_DELIVERED if fired else AbortStatus.NOT_FOUND, msg_id
                )
            batch = store.batch()
            batch.delete(wkey, store.handle[K.CF_WHEEL])
            batch.put(wkey, K.U64.pack(self._now()) + record, store.handle[K.CF_ABORTED])
            self._count_pending(batch, {K.id_tid(raw): -1})
            store.write(batch)
            self._wheel.cancel(wkey)
        return AbortResult(AbortStatus.ABORTED, msg_id)

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        return self._queries.view(msg_id)

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        return self._queries.pending(topic, start_ms, end_ms, limit)

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        with self._lock:
            counts = {
                name: (tid, max(self._pending_counts.get(tid, 0), 0), self._fired.get(tid, 0))
                for name, tid in self._topic_ids.items()
            }
            dead_of = {}
            for name in list(self._groups.groups):
                dlq = self._topic_ids.get(dead_letter_topic(name))
                dead_of[name] = self._fired.get(dlq, 0) if dlq else 0
        groups, ready, inflight = self._groups.stats(dead_of)
        topics = {
            name: TopicStats(pending, fired, ready.get(tid, 0), inflight.get(tid, 0))
            for name, (tid, pending, fired) in counts.items()
        }
        return BrokerStats(topics=topics, groups=groups)

    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        return self._groups.consumer(group, topics, limits)

    # -- the wheel thread -------------------------------------------------------------------

    def _fire_due(self) -> int:
        """Fire one chunk of due messages; returns how many fired."""
        store = self._store
        with self._lock:
            now = self._now()
            entries = self._wheel.pop_due(now, self._fire_chunk)
            if not entries:
                return 0
            batch = store.batch()
            h_wheel, h_ready = store.handle[K.CF_WHEEL], store.handle[K.CF_READY]
            prefix = self._tid_prefix
            counts: dict[int, int] = {}
            tails = {}
            # Everything below the last fired key has now fired or was aborted, so a
            # big chunk is one range tombstone; small ones stay point deletes
            # (many range tombstones in a memtable slow reads down).
            ranged = len(entries) >= _RANGE_DELETE_MIN
            if ranged:
                batch.delete_range(self._fired_upto, K.next_key(entries[-1][0]), h_wheel)
            for wkey, tid, record in entries:
                if not ranged:
                    batch.delete(wkey, h_wheel)
                ready_key = prefix[tid] + wkey
                batch.put(ready_key, record, h_ready)
                counts[tid] = counts.get(tid, 0) + 1
                tails[tid] = ready_key
            self._count_pending(batch, counts, fired=True)
            self._fired_upto = K.next_key(entries[-1][0])
            batch.put(K.META_FIRED_UPTO, self._fired_upto, store.handle[K.CF_META])
            store.write(batch, lazy=True)
            self._tails.update(tails)
        self._groups.add_ready(counts)
        return len(entries)

    def _run(self) -> None:
        idle_s = 0.2
        next_trim = 0  # broker time: a ManualClock drives trimming in tests
        while not self._closed:
            try:
                if self._fire_due():
                    time.sleep(0)  # let senders and consumers in between chunks
                    continue
                now = self._now()
                deadline = self._groups.housekeep(now)
                if now >= next_trim:  # a round in chunks, firing in between
                    if not self._retention.trim(now):
                        time.sleep(0)
                        continue
                    next_trim = now + _TRIM_INTERVAL_MS
                with self._lock:
                    due = self._wheel.next_due_ms()
                wake = min(x for x in (due, deadline, now + 1000) if x is not None)
                self._planned_wake = wake
                with self._wake:
                    if not self._kicked:
                        delay = (wake - self._now()) / 1000
                        if delay > 0:
                            self._wake.wait(min(delay, idle_s))
                    self._kicked = False
                self._planned_wake = 0
            except Exception:  # the wheel must keep turning; log and go on
                if self._closed:
                    return
                log.exception("wheel thread error on %s", self.path)
                time.sleep(0.05)

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        self._clock.unsubscribe(self._kick)
        self._kick()
        self._groups.notify()
        self._thread.join(timeout=10)
        self._groups.close()
        with self._lock:
            self._store.close()
