"""EmbeddedConsumer: a member of a consumer group, and the long poll of ``pull``.

A consumer reads its group's ready messages straight from the store (under its
group's lock, see the lock order in :mod:`~broker_adapter.embedded.core`) and
waits for more on the registry's :class:`ReadySignal`. With the system clock, a
pull that would wait past the wheel's next due time waits until then and fires
that chunk itself (:meth:`BrokerCore.take_fire_duty`): the job starts one thread
hand-off sooner than if the wheel thread fired it and woke the pull. Acks, nacks, dead
letters, extensions and releases change the group's shared state, so they go to
the :class:`~broker_adapter.embedded.group_registry.GroupRegistry`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from broker_adapter.base import Consumer
from broker_adapter.checks import (
    check_invisible_ms,
    check_nack_delay,
    check_pull_args,
    check_release_delay,
)
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.groups import ConsumerGroup, Pull
from broker_adapter.embedded.keys import CF_READY, topic_range
from broker_adapter.embedded.records import HEAD, HEAD_SIZE, delivery_fields
from broker_adapter.errors import BrokerClosed
from broker_adapter.results import NO_PROPERTIES, ReceivedMessage
from broker_adapter.timer_slack import tighten as tighten_timer_slack

if TYPE_CHECKING:
    from broker_adapter.embedded.group_registry import GroupRegistry

_unpack_head = HEAD.unpack_from
_HEAD_SIZE = HEAD_SIZE
# ReceivedMessage's own __new__ is a Python function: tuple.__new__ builds the same
# named tuple for less (one per message pulled).
_new = tuple.__new__
# A pull with this long (s) before its next due time tops the wheel's window up.
_QUIET_S = 0.0005


class ReadySignal:
    """Wakes pulls waiting for messages; an epoch tells a waiter whether it missed one.

    Its lock is a leaf of the lock order: held only inside :meth:`notify` and :meth:`wait`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._epoch = 0
        self._waiting = 0  # threads inside wait(): a notify with none skips the condition's

    @property
    def epoch(self) -> int:
        """How many wake-ups there were; read it before looking for messages."""
        return self._epoch

    def notify(self) -> None:
        """Wake every waiting pull (messages are ready, room freed, or the broker closes)."""
        with self._cond:
            self._epoch += 1
            if self._waiting:
                self._cond.notify_all()

    def wait(self, epoch: int, timeout_s: float) -> None:
        """Sleep up to ``timeout_s`` unless a wake-up came since ``epoch`` was read.

        :param epoch: :attr:`epoch` as read before the last look for messages.
        :param timeout_s: the longest wait in seconds.
        """
        with self._cond:
            if self._epoch == epoch:
                self._waiting += 1
                try:
                    self._cond.wait(timeout_s)
                finally:
                    self._waiting -= 1


class EmbeddedConsumer(Consumer):
    """A member of a consumer group of an embedded broker.

    :param core: the broker's core (store, topic names and tails, time, wake-ups).
    :param registry: the groups, which settle this consumer's messages.
    :param group: its group's shared state.
    :param topics: ids of the topics it pulls from (its group's retry topic included).
    :param topic_names: the names it subscribed with.
    :param max_inflight: most messages held unsettled at once.
    :param max_inflight_bytes: most bytes held unsettled at once.
    """

    _ids = itertools.count(1)

    def __init__(
        self,
        core: BrokerCore,
        registry: GroupRegistry,
        group: ConsumerGroup,
        topics: Iterable[int],
        topic_names: tuple[str, ...],
        max_inflight: int,
        max_inflight_bytes: int,
    ) -> None:
        self._core = core
        self._registry = registry
        self._group = group
        self._tids = list(topics)
        self.group = group.name
        self.topics = topic_names
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes
        self.held = 0
        self.held_bytes = 0
        self.closed = False
        self._paused = False
        self._turn = 0
        self._fires = core.wall_clock  # a manual clock: the wheel thread fires (tests)
        self.id = next(self._ids)

    def _check(self) -> None:
        if self.closed:
            raise BrokerClosed(f"consumer of group {self.group!r} is closed")
        self._registry.check_open()

    def pull(self, max_messages: int = 32, wait_ms: int = 1000) -> list[ReceivedMessage]:
        """See :meth:`broker_adapter.base.Consumer.pull`."""
        check_pull_args(max_messages, wait_ms)
        self._check()
        core, group = self._core, self._group
        signal = self._registry.ready_signal
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            epoch = signal.epoch
            if self.has_new():
                with group.lock:
                    got = [] if self._paused else self._take(max_messages, core.now())
            else:  # the usual look before a wait finds nothing: skip the lock and take
                got = []
            if got:
                soonest = group.next_deadline()
                if soonest is not None:  # the wheel thread redelivers at that deadline
                    core.wake_if_before(soonest)
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                return got
            if self._fires and not self._paused and self._fire_when_due(epoch, remaining):
                continue
            signal.wait(epoch, remaining)
            self._registry.check_open()

    def has_new(self) -> bool:
        """Whether a topic of this consumer has ready keys past its group's cursor (its
        tail is at or after the cursor), read without the group's lock. A take finds
        nothing otherwise. A fire moves a tail before it bumps the ready signal's
        epoch, so a pull that read the epoch first either sees the new tail here or
        is woken at once by its wait."""
        tails, cursors = self._core.tails, self._group.cursors
        for tid in self._tids:
            tail = tails.get(tid)
            if tail is not None and cursors[tid] <= tail:
                return True
        return False

    def _fire_when_due(self, epoch: int, remaining: float) -> bool:
        """When the wheel's next due time comes within ``remaining`` s, wait for it
        (or a wake-up) and fire that chunk here; ``False`` when there is nothing to
        do (the caller then waits as usual)."""
        core, registry = self._core, self._registry
        due = core.next_due_ms()
        if due is None:
            return False
        until = core.seconds_until(due)
        if until >= _QUIET_S:  # a quiet moment: write held fires and refill now, not at a fire
            core.write_held_old()
            if core.top_up():
                due = core.next_due_ms()
                if due is None:
                    return False
                until = core.seconds_until(due)
        if until >= remaining:
            return False  # beyond this pull: the wheel thread (or a later pull) fires it
        if until > 0:
            tighten_timer_slack()  # once per thread: wake at the due time, not 50 us later
            core.take_fire_duty(due)
            signal = registry.ready_signal
            signal.wait(epoch, until)
            registry.check_open()
            if signal.epoch != epoch:
                return True  # woken: look for messages first
        else:
            registry.check_open()
        try:
            fired = registry.fire_due(hold=True)
        except Exception:  # noqa: BLE001 - e.g. a full disk: the wheel thread retries and logs
            registry.check_open()  # closed meanwhile: BrokerClosed, as a waiting pull gets
            return False
        if not fired and until <= 0:
            # Due but nothing fired: the near window loads a moment after its load
            # time (a refill at due - window_ms). Look again in 1 ms, as the wheel does.
            registry.ready_signal.wait(epoch, min(remaining, 0.001))
        return True

    def _take(self, max_messages: int, now_ms: int) -> list[ReceivedMessage]:
        """Read up to ``max_messages`` ready messages and put them in flight (group lock held)."""
        group = self._group
        room = min(max_messages, self.max_inflight - self.held)
        out: list[ReceivedMessage] = []
        if room <= 0 or self.held_bytes >= self.max_inflight_bytes:
            return out
        core = self._core
        tails = core.tails
        cursors = group.cursors
        tids = self._tids
        n = len(tids)
        turn = self._turn = (self._turn + 1) % n
        names = core.topic_names
        inflight = group.inflight
        receipts: list[bytes] = []
        pull: Pull | None = None
        add = out.append
        props: Mapping[str, str]
        for i in range(n):
            tid = tids[(turn + i) % n]
            cursor = cursors[tid]
            tail = tails.get(tid)
            if tail is None or cursor > tail:
                continue  # nothing new: most pulls of most topics stop here
            want = room - len(out)
            rows = core.fresh_rows(tid, cursor, want)
            if rows is None:  # older than what was just fired: read the store
                rows = core.store.scan(CF_READY, cursor, topic_range(tid)[1], want)
            if not rows:
                continue
            if pull is None:
                pull = Pull(now_ms + group.invisible_ms, self)
            pulled = group.topic_keys(tid)
            held_bytes, max_bytes = self.held_bytes, self.max_inflight_bytes
            taken = 0
            for receipt, data in rows:  # hot loop: locals only, one object per message
                size = len(data)
                if out and held_bytes + size > max_bytes:
                    break
                _v, _f, _t, attempts, due, born, raw, klen, tlen, plen = _unpack_head(data)
                if klen or plen:
                    attempts, due, born, raw, key, tags, given, body = delivery_fields(data)
                    props = given or NO_PROPERTIES
                else:  # the scheduler's messages: tags (the job name) and a body
                    key, props = None, NO_PROPERTIES
                    if tlen:
                        tags = data[_HEAD_SIZE : _HEAD_SIZE + tlen].decode()
                        body = data[_HEAD_SIZE + tlen :]
                    else:
                        tags, body = None, data[_HEAD_SIZE:]
                receipts.append(receipt)
                inflight[receipt] = (data, pull)
                pulled.append(receipt)
                held_bytes += size
                add(
                    _new(
                        ReceivedMessage,
                        (
                            raw.hex(),
                            names[(raw[14] << 8) | raw[15]],
                            body,
                            due,
                            born,
                            attempts + 1,
                            receipt,
                            key,
                            tags,
                            props,
                        ),
                    )
                )
                taken += 1
            if taken:
                cursors[tid] = receipts[-1] + b"\x00"
                group.ready[tid] = group.ready.get(tid, 0) - taken
                self.held += taken
                self.held_bytes = held_bytes
            if len(out) >= room or self.held_bytes >= self.max_inflight_bytes:
                break
        if pull is not None:
            group.watch(pull, receipts)
        return out

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` was called."""
        return self._paused

    def pause(self) -> None:
        """Hand out nothing more: from now on a pull waits out its ``wait_ms`` and returns
        no message. What this consumer holds can still be settled (ack, nack, extend,
        release...). A pull taking messages at this moment finishes first (the group's
        lock), so once this returns :attr:`held` only goes down. A server's handover
        drain uses it (:meth:`~broker_adapter.server.server.BrokerServer.drain`)."""
        with self._group.lock:
            self._paused = True

    def ack(self, message: ReceivedMessage) -> bool:
        """See :meth:`broker_adapter.base.Consumer.ack`."""
        if self.closed or self._registry.closed:
            self._check()
        return self._registry.ack(self._group, message.receipt)

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> list[bool]:
        """See :meth:`broker_adapter.base.Consumer.ack_batch`: one take of the group's lock."""
        if self.closed or self._registry.closed:
            self._check()
        return self._registry.ack_many(self._group, [m.receipt for m in messages])

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        self._check()
        return self._registry.nack(self._group, message.receipt, delay_ms, reason, dead=False)

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        self._check()
        return self._registry.nack(self._group, message.receipt, None, reason, dead=True)

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        self._check()
        return self._registry.extend(self._group, message.receipt, invisible_ms)

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`."""
        check_release_delay(delay_ms)
        self._check()
        return self._registry.nack(
            self._group, message.receipt, delay_ms, None, dead=False, attempt=False
        )

    def close(self) -> None:
        """See :meth:`broker_adapter.base.Consumer.close`."""
        if self.closed:
            return
        self.closed = True
        self._registry.release_held(self, self._group)

    @property
    def topic_ids(self) -> list[int]:
        """Topic ids this consumer pulls from (its group's retry topic included)."""
        return self._tids

    def __repr__(self) -> str:
        return f"<EmbeddedConsumer {self.id} group={self.group!r} topics={self.topics!r}>"


__all__ = ["EmbeddedConsumer", "ReadySignal"]
