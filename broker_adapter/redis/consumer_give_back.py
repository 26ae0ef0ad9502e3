"""Giving a delivery back: nack, dead letter, release, extend of a
:class:`~broker_adapter.redis.consumer.RedisConsumer`.

One idea apart from pulling and acking: each is one script call on the delivery's
shard (``nack.lua`` for the first three, ``extend.lua``), after the queued acks are
written. A mixin: the consumer supplies the keyspace, scripts, clock, acks, firer,
news, limits and its receipt bookkeeping (``_parse``, ``_settle``) it names.
"""

from __future__ import annotations

from typing import Any

from broker_adapter.base import retry_backoff_ms
from broker_adapter.checks import check_invisible_ms, check_nack_delay, check_release_delay
from broker_adapter.clock import Clock
from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Scripts, redis_errors
from broker_adapter.results import ReceivedMessage


class GiveBackMethods:
    """nack, dead_letter, release and extend of a Redis consumer (a mixin of
    :class:`~broker_adapter.redis.consumer.RedisConsumer`, which sets these)."""

    _keys: Keyspace
    _scripts: Scripts
    _clock: Clock
    _acks: AckBatcher
    _firer: Firer
    _news: ReadyNews
    _retention_ms: int
    group: str
    max_attempts: int
    _lock: Any
    _held: dict[bytes, tuple[int, int]]

    # the consumer's own (RedisConsumer overrides each)
    def _check(self) -> None:
        raise NotImplementedError

    def _parse(self, receipt: bytes) -> tuple[int, bytes, bytes] | None:
        raise NotImplementedError

    def _settle(self, receipt: bytes) -> tuple[int, bytes, bytes, bool] | None:
        raise NotImplementedError

    def nack(
        self, message: ReceivedMessage, delay_ms: int | None = None, reason: str | None = None
    ) -> bool:
        """See :meth:`broker_adapter.base.Consumer.nack`."""
        check_nack_delay(delay_ms)
        self._check()
        return self._give_back(message.receipt, delay_ms, reason, dead=False)

    def dead_letter(self, message: ReceivedMessage, reason: str) -> bool:
        """See :meth:`broker_adapter.base.Consumer.dead_letter`."""
        self._check()
        return self._give_back(message.receipt, None, reason, dead=True)

    def extend(self, message: ReceivedMessage, invisible_ms: int) -> bool:
        """See :meth:`broker_adapter.base.Consumer.extend`."""
        check_invisible_ms(invisible_ms)
        self._check()
        receipt = message.receipt
        parsed = self._parse(receipt)
        if parsed is None:
            return False
        s, n, att = parsed
        keys = self._keys
        deadline = self._clock.now_ms() + invisible_ms
        with redis_errors("extend"):
            self._acks.flush()
            extended = bool(
                self._scripts.call(
                    "extend",
                    keys.due_keys[s],
                    (keys.bases[s], self.group, n, att, deadline, self._retention_ms),
                )
            )
        if extended:
            with self._lock:
                entry = self._held.get(receipt)
                if entry is not None:
                    self._held[receipt] = (deadline, entry[1])
            self._firer.note_deadline(s, deadline)
        return extended

    def release(self, message: ReceivedMessage, delay_ms: int = 0) -> bool:
        """See :meth:`broker_adapter.base.Consumer.release`.

        The next delivery has the same delivery count but a new claim number, so a
        receipt from before the release never settles it.
        """
        check_release_delay(delay_ms)
        self._check()
        return self._give_back(message.receipt, delay_ms, None, dead=False, counts=False)

    def _give_back(
        self,
        receipt: bytes,
        delay_ms: int | None,
        reason: str | None,
        dead: bool,
        counts: bool = True,
    ) -> bool:
        parsed = self._settle(receipt)
        if parsed is None:
            return False
        s, n, att, _held = parsed
        keys = self._keys
        if delay_ms is None:
            delay_ms = retry_backoff_ms(int(att.split(b":", 1)[0]))
        now = self._clock.now_ms()
        args = (
            keys.bases[s],
            self.group,
            n,
            att,
            now,
            delay_ms,
            self.max_attempts,
            (reason or "")[:4096],
            1 if dead else 0,
            keys.wake_channel,
            s,
            self._retention_ms,
            0 if counts else 1,
        )
        with redis_errors("nack"):
            self._acks.flush()
            outcome = self._scripts.call("nack", keys.due_keys[s], args)
        if outcome == 1:
            self._firer.note_due(s, now + delay_ms)
        elif outcome == 2:
            self._news.announce([s])
        return bool(outcome)
