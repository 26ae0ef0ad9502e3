"""The runtime calls of :class:`~broker_adapter.redis.broker.RedisBroker`: reschedule,
abort by key prefix, find, dead letters, pending counts, rates and slots.

One idea apart from sending, firing and pulling: calls an operator or a job makes now
and then, each one script call per shard (or one on one shard), their arguments and
replies built by :mod:`~broker_adapter.redis.runtime_calls` and
:mod:`~broker_adapter.redis.dead_letters` (shared with the asyncio client). A mixin:
the broker supplies the keyspace, scripts, clock, firer and limits it names.
"""

from __future__ import annotations

from broker_adapter.base import RESCHEDULE_PAST_TOLERANCE_MS
from broker_adapter.checks import NewDue
from broker_adapter.clock import Clock
from broker_adapter.redis.dead_letters import (
    count_calls,
    counts_of,
    dead_calls,
    dead_page,
    settle_call,
    settle_calls,
)
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.runtime_calls import (
    PrefixAbort,
    find_calls,
    find_page,
    rate_call,
    reschedule_call,
    reschedule_result,
    slot_call,
)
from broker_adapter.redis.scripts import Scripts, redis_errors
from broker_adapter.results import (
    DeadLetterPage,
    PendingCounts,
    PendingPage,
    PrefixAbortResult,
    RescheduleResult,
    RescheduleStatus,
)


class RedisRuntimeMethods:
    """The runtime calls of a Redis broker (a mixin of
    :class:`~broker_adapter.redis.broker.RedisBroker`, which sets these attributes)."""

    _keys: Keyspace
    _scripts: Scripts
    _clock: Clock
    _firer: Firer
    _max_delay_ms: int
    _retention_ms: int
    _body_limit: int

    def _reschedule(
        self,
        msg_id: str | None,
        key: str | None,
        topic: str | None,
        due: NewDue,
        body: bytes | None,
    ) -> RescheduleResult:
        """See :meth:`BrokerAdapter.reschedule`: one ``reschedule.lua`` call on the
        message's shard, atomic against the firers there. The new due is resolved on
        the broker's clock, as a send's is."""
        now = self._clock.now_ms()
        at = due.resolve(now, self._max_delay_ms, RESCHEDULE_PAST_TOLERANCE_MS)
        limit = self._body_limit
        call = reschedule_call(self._keys, msg_id, key, topic, at, body, limit, now)
        if call is None:
            return RescheduleResult(RescheduleStatus.NOT_FOUND, msg_id, None)
        shard, (name, due_key, args) = call
        with redis_errors("reschedule"):
            reply = self._scripts.call(name, due_key, args)
        result, wake = reschedule_result(shard, msg_id, reply, limit)
        if wake >= 0:
            self._firer.note_due(shard, wake)
        return result

    def _abort_prefix(self, topic: str, key_prefix: str) -> PrefixAbortResult:
        """See :meth:`BrokerAdapter.abort_prefix`: rounds of ``abort_prefix.lua`` calls,
        one per shard still going, each at most
        :data:`~broker_adapter.redis.runtime_calls.ABORT_CHUNK` keys."""
        job = PrefixAbort(self._keys, topic, key_prefix, self._retention_ms)
        with redis_errors("abort_prefix"):
            while calls := job.calls():
                job.feed(self._scripts.pipeline(calls))
        return job.result()

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
        """See :meth:`BrokerAdapter.find_pending`: one ``find.lua`` call per shard."""
        calls = find_calls(
            self._keys, topic, key_prefix, tag, start_ms, end_ms, limit, cursor, with_body
        )
        with redis_errors("find_pending"):
            replies = self._scripts.pipeline(calls)
        return find_page(replies, topic, limit, with_body)

    def _dead_letters(
        self, group: str, cursor: str | None, limit: int, with_body: bool
    ) -> DeadLetterPage:
        """See :meth:`BrokerAdapter.dead_letters`: one ``dead.lua`` call per shard."""
        calls = dead_calls(self._keys, group, cursor, limit, with_body)
        with redis_errors("dead_letters"):
            replies = self._scripts.pipeline(calls)
        return dead_page(replies, group, limit, with_body)

    def _requeue_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.requeue_dead` and :mod:`~broker_adapter.redis.dead_letters`."""
        return self._settle_dead(group, "R", msg_ids, limit)

    def _purge_dead(self, group: str, msg_ids: tuple[str, ...] | None, limit: int) -> int:
        """See :meth:`BrokerAdapter.purge_dead`."""
        return self._settle_dead(group, "X", msg_ids, limit)

    def _settle_dead(
        self, group: str, how: str, msg_ids: tuple[str, ...] | None, limit: int
    ) -> int:
        keys, now = self._keys, self._clock.now_ms()
        with redis_errors("requeue_dead" if how == "R" else "purge_dead"):
            if msg_ids is not None:
                calls = settle_calls(keys, group, how, msg_ids, now, self._retention_ms)
                return sum(int(r) for r in self._scripts.pipeline(calls))
            done = 0
            for shard in range(keys.shards):
                if done >= limit:
                    break
                call = settle_call(
                    keys, shard, group, how, limit - done, (), now, self._retention_ms
                )
                done += int(self._scripts.call(*call))
            return done

    def _count_pending(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending`: ``ZCOUNT`` per bucket and shard
        (with a topic, an estimate from its share: :mod:`~broker_adapter.redis.dead_letters`)."""
        with redis_errors("count_pending"):
            replies = self._scripts.pipeline(count_calls(self._keys, edges, topic))
        return counts_of(replies, len(edges) - 1, topic)

    def _acquire_rate(self, bucket: str, limit: int, period_ms: int) -> int:
        """See :meth:`BrokerAdapter.acquire_rate`: ``rate.lua`` (GCRA) on one key."""
        name, key, args = rate_call(self._keys, bucket, limit, period_ms, self._clock)
        with redis_errors("acquire_rate"):
            return int(self._scripts.call(name, key, args))

    def _acquire_slot(self, name: str, limit: int, holder: str, lease_ms: int) -> bool:
        """See :meth:`BrokerAdapter.acquire_slot`: ``slot.lua`` on one key."""
        script, key, args = slot_call(
            self._keys, "acquire", name, holder, limit, lease_ms, self._clock
        )
        with redis_errors("acquire_slot"):
            return bool(self._scripts.call(script, key, args))

    def _release_slot(self, name: str, holder: str) -> bool:
        """See :meth:`BrokerAdapter.release_slot`: ``slot.lua`` on one key."""
        script, key, args = slot_call(self._keys, "release", name, holder, 1, 1, self._clock)
        with redis_errors("release_slot"):
            return bool(self._scripts.call(script, key, args))
