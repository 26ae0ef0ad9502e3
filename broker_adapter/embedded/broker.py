"""EmbeddedBroker: the default broker, in process, on a RocksDB timing wheel.

The broker wires its parts and implements the adapter primitives (see
:mod:`broker_adapter.adapter`): aborts and stats here, sends in the base
:class:`~broker_adapter.embedded.sends.EmbeddedSends`, on the shared state of a
:class:`~broker_adapter.embedded.core.BrokerCore` (which also documents the
lock order); ``query``/``pending`` in
:class:`~broker_adapter.embedded.query.MessageQuery`; consumers in
:class:`~broker_adapter.embedded.group_registry.GroupRegistry`; the runtime calls
in :mod:`~broker_adapter.embedded.moves` (reschedule),
:mod:`~broker_adapter.embedded.prefix_abort` and
:mod:`~broker_adapter.embedded.finder` (find_pending); rate limits and semaphores
in memory (:mod:`broker_adapter.coordination`: a restart starts them afresh). Threads: callers
(send, abort, query, pull), the :class:`~broker_adapter.embedded.firing.WheelThread`
that fires due messages and keeps house, and the base's thread serving
``send_async`` and ``send_oneway`` in batches. Key layout:
:mod:`broker_adapter.embedded.keys`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_RETENTION_MS,
    Consumer,
    dead_letter_topic,
)
from broker_adapter.checks import NewDue, check_positive_settings
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.coordination import LeaseSemaphores, RateBuckets
from broker_adapter.embedded import keys as K
from broker_adapter.embedded.backup import BackupInfo, checkpoint
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.dead_letters import DeadLetters
from broker_adapter.embedded.finder import PendingFinder
from broker_adapter.embedded.fire_writes import DEFAULT_HOLD_MS
from broker_adapter.embedded.firing import WheelThread
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.moves import Rescheduler
from broker_adapter.embedded.pending_counts import PendingCounter
from broker_adapter.embedded.prefix_abort import abort_prefix
from broker_adapter.embedded.query import MessageQuery
from broker_adapter.embedded.retention import Retention
from broker_adapter.embedded.sends import EmbeddedSends
from broker_adapter.errors import InvalidArgument, StorageFull
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    DeadLetterPage,
    MessageView,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    TopicStats,
)
from broker_adapter.urls import split_url

log = logging.getLogger("chronoq.broker_adapter.EmbeddedBroker")
log.addHandler(logging.NullHandler())


class EmbeddedBroker(EmbeddedSends, AdapterBase):
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
    :param fire_hold_ms: how long a pull's fire may wait for its write while fires go
        on (one write per ~``fire_hold_ms`` instead of one per due millisecond; 0:
        write every fire at once); see :mod:`~broker_adapter.embedded.fire_writes`.
    :raises BrokerLocked: when another process owns ``path``.
    """

    local = True  # answered on this machine (see BrokerAdapter.local)

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
        fire_hold_ms: int = DEFAULT_HOLD_MS,
    ) -> None:
        check_positive_settings(
            max_body_bytes=max_body_bytes,
            max_delay_ms=max_delay_ms,
            window_ms=window_ms,
            retention_ms=retention_ms,
            fire_chunk=fire_chunk,
        )
        if fire_hold_ms < 0:
            raise InvalidArgument(f"fire_hold_ms must be 0 or more, got {fire_hold_ms}")
        clock = clock or SystemClock()
        core = self._core = BrokerCore(
            path, clock, durability=durability, window_ms=window_ms, fire_hold_ms=fire_hold_ms
        )
        self.path = core.store.path
        self.max_body_bytes = max_body_bytes
        self.max_delay_ms = max_delay_ms
        self._clock_ms = clock.now_ms  # the single send's clock read (EmbeddedSends)
        self.retention_ms = retention_ms
        self._groups = GroupRegistry(core, self.check_open, fire_chunk=fire_chunk)
        self._queries = MessageQuery(core, self._groups)
        self._rescheduler = Rescheduler(core, max_delay_ms, max_body_bytes)
        self._finder = PendingFinder(core, self._queries)
        self._dead = DeadLetters(core, self._groups, self._queries)
        self._counter = PendingCounter(core)
        self._rates = RateBuckets(clock)
        self._slots = LeaseSemaphores(clock)
        retention = Retention(core, self._groups, retention_ms)
        self._wheel_thread = WheelThread(
            core, self._groups, retention, f"chronoq-wheel:{self.path.name}"
        )
        self._wheel_thread.start()

    @property
    def core(self) -> BrokerCore:
        """The shared state under this broker (for tools and tests; see
        :mod:`~broker_adapter.embedded.core`)."""
        return self._core

    def backup(self, dest: str | os.PathLike[str]) -> BackupInfo:
        """Write a consistent copy of the data directory into the new directory ``dest``
        while the broker runs (see :mod:`~broker_adapter.embedded.backup`: restore by
        opening a broker on the copy).

        :raises InvalidArgument: when ``dest`` exists and is not an empty directory.
        :raises StorageFull: when the destination's disk is full.
        :raises BrokerClosed: when the broker is closed.
        """
        self.check_open()
        return checkpoint(self._core.store, dest)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> EmbeddedBroker:
        """Open ``rocksdb://PATH[?durability=...&window_ms=...]``."""
        _scheme, path, params = split_url(url)
        opts = cls.url_options(url, path, params)
        opts.update(kwargs)
        return cls(path, **opts)

    @staticmethod
    def url_options(url: str, path: str, params: dict[str, str]) -> dict[str, Any]:
        """The constructor arguments the query ``params`` of ``url`` (whose directory is
        ``path``) give.

        :raises InvalidArgument: for no directory, an unknown parameter or a bad number.
        """
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
                "fire_hold_ms",
            ):
                try:
                    opts[name] = int(value)
                except ValueError as e:
                    raise InvalidArgument(f"{name} in {url!r} must be an int") from e
            else:
                raise InvalidArgument(f"unknown parameter {name!r} in {url!r}")
        return opts

    # -- sending ----------------------------------------------------------------------

    # -- aborting and reading -----------------------------------------------------------

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort`."""
        core = self._core
        with core.lock:  # the store read under the lock: no fire comes in between
            store = core.store
            if msg_id is not None:
                raw = K.parse_id(msg_id)
                if raw is None or K.id_tid(raw) not in core.topic_names:
                    return AbortResult(AbortStatus.NOT_FOUND, msg_id)
                wkey = core.locate(K.id_wheel_key(raw))
            else:
                assert key is not None and topic is not None
                tid = core.topic_ids.get(topic)
                found = (
                    None
                    if tid is None
                    else store.cf[K.CF_KEYS].get(core.prefixes[tid] + key.encode())
                )
                if tid is None or found is None:
                    return AbortResult(AbortStatus.NOT_FOUND, None)
                raw = K.make_id(found[:16], tid)
                wkey = core.locate(found[:16])
                msg_id = raw.hex()
            record = store.cf[K.CF_WHEEL].get(wkey)
            if record is None:
                if store.cf[K.CF_ABORTED].get(wkey) is not None:
                    return AbortResult(AbortStatus.ABORTED, msg_id)
                tid = K.id_tid(raw)
                fired = store.cf[K.CF_READY].get(core.prefixes[tid] + wkey) is not None
                return AbortResult(
                    AbortStatus.ALREADY_DELIVERED if fired else AbortStatus.NOT_FOUND, msg_id
                )
            core.abort_pending(wkey, K.id_tid(raw), record)
        return AbortResult(AbortStatus.ABORTED, msg_id)

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        return self._queries.view(msg_id)

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        return self._queries.pending(topic, start_ms, end_ms, limit)

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule` and :mod:`~broker_adapter.embedded.moves`."""
        return self._rescheduler.reschedule(msg_id, key, topic, due, body)

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix` and
        :mod:`~broker_adapter.embedded.prefix_abort`."""
        return abort_prefix(self._core, topic, key_prefix)

    def _find_pending(
        self,
        topic: str | None,
        key_prefix: str | None,
        tag: str | None,
        start_ms: int | None,
        end_ms: int | None,
        limit: int,
        cursor: str | None,
        with_body: bool,
    ) -> PendingPage:
        """See :meth:`BrokerAdapter.find_pending` and :mod:`~broker_adapter.embedded.finder`."""
        return self._finder.find(topic, key_prefix, tag, start_ms, end_ms, limit, cursor, with_body)

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters` and :mod:`~broker_adapter.embedded.dead_letters`."""
        return self._dead.page(group, cursor, limit, with_body)

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead`."""
        return self._dead.requeue(group, msg_ids, limit)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return self._dead.purge(group, msg_ids, limit)

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending` and
        :mod:`~broker_adapter.embedded.pending_counts` (estimates past a scan budget)."""
        return self._counter.count(edges, topic)

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate` (in memory: a restart refills buckets)."""
        return self._rates.acquire(bucket, limit, period_ms)

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot` (in memory: a restart frees slots)."""
        return self._slots.acquire(name, limit, holder, lease_ms)

    def _release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot`."""
        return self._slots.release(name, holder)

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        core = self._core
        with core.lock:
            counts = {
                name: (tid, core.pending_count(tid), core.fired_count(tid))
                for name, tid in core.topic_ids.items()
            }
            dead_of = {}
            for name in self._groups.group_names():
                dlq = core.topic_ids.get(dead_letter_topic(name))
                # ever dead-lettered, less those requeued or purged since
                dead_of[name] = core.fired_count(dlq) - self._dead.settled(name) if dlq else 0
        groups, ready, inflight = self._groups.stats(dead_of)
        topics = {
            name: TopicStats(pending, fired, ready.get(tid, 0), inflight.get(tid, 0))
            for name, (tid, pending, fired) in counts.items()
        }
        return BrokerStats(topics=topics, groups=groups)

    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`."""
        return self._groups.consumer(group, topics, limits)

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`."""
        self._groups.notify()  # waiting pulls answer BrokerClosed
        self._wheel_thread.stop()
        try:
            self._groups.close()
        except StorageFull as e:
            # Cursors not saved mean some acked messages are delivered again after a
            # reopen (at least once), never a loss; the directory must be released.
            log.warning("closing %s without saving consumer cursors: %s", self.path, e)
        finally:
            self._core.close()
