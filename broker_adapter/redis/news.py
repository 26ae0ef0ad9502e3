"""ReadyNews: word that shards of a :class:`RedisBroker` may have new ready messages.

Pulls in this process wait on an epoch that every piece of news bumps, and each
consumer marks the shards named so its next pull looks there first. Other
processes hear the same news on the broker's ``ready`` channel as
``"<origin>:<shard>,<shard>..."``; the origin names the broker instance that told
it, so an instance skips its own news (it was told in process already).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from redis.exceptions import RedisError

log = logging.getLogger("chronoq.broker_adapter.ReadyNews")
log.addHandler(logging.NullHandler())


class ShardWatcher(Protocol):
    """Something told which shards may have news (a consumer)."""

    def mark(self, shards: Iterable[int]) -> None:
        """``shards`` may have ready messages for it."""


class ReadyNews:
    """The ready news of one broker instance.

    :param client: the Redis client news to other processes is published on.
    :param channel: the ``ready`` channel (see :class:`~broker_adapter.redis.keys.Keyspace`).
    """

    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        #: This instance's name on the channel (``fire.lua`` tags its news with it too).
        self.origin = os.urandom(6).hex()
        self._origin_b = self.origin.encode()
        self._cond = threading.Condition(threading.Lock())
        self._epoch = 0
        self._watchers: weakref.WeakSet[ShardWatcher] = weakref.WeakSet()

    @property
    def epoch(self) -> int:
        """Bumped by every piece of news; read it before looking, then wait on it."""
        return self._epoch

    def watch(self, watcher: ShardWatcher) -> None:
        """Mark ``watcher``'s shards on news from now on (held weakly)."""
        self._watchers.add(watcher)

    def unwatch(self, watcher: ShardWatcher) -> None:
        """Stop telling ``watcher``."""
        self._watchers.discard(watcher)

    def watchers(self) -> list[ShardWatcher]:
        """The watchers told now."""
        return list(self._watchers)

    def tell(self, shards: Iterable[int], skip: ShardWatcher | None = None) -> None:
        """News in this process: ``shards`` may have ready messages (none named: only
        wake the waiting pulls, e.g. one waiting for room under its in-flight limit);
        ``skip``: a watcher that knows already (it fired and claimed there)."""
        shards = list(shards)
        if shards:
            for w in list(self._watchers):
                if w is not skip:
                    w.mark(shards)
        with self._cond:
            self._epoch += 1
            self._cond.notify_all()

    def announce(self, shards: list[int]) -> None:
        """News here and in every other process (published; a failure is logged)."""
        self.tell(shards)
        try:
            self._client.publish(self._channel, f"{self.origin}:{','.join(map(str, shards))}")
        except RedisError:
            log.warning("could not publish ready news", exc_info=True)

    def heard(self, payload: bytes) -> None:
        """A message of the ``ready`` channel; news of other instances is told here."""
        origin, _, shards = payload.rpartition(b":")
        if origin != self._origin_b:
            self.tell(int(s) for s in shards.split(b",") if s)

    def wait_changed(self, epoch: int, timeout_s: float) -> bool:
        """Wait until news after ``epoch`` (``True``) or ``timeout_s`` passed (``False``)."""
        with self._cond:
            if self._epoch == epoch:
                self._cond.wait(timeout_s)
            return self._epoch != epoch


def others_listen(client: Any, channel: str, cluster: bool) -> bool:
    """Whether a process other than this one listens on ``channel`` (on a cluster, the
    subscribers of every node summed); ``True`` when unsure (none yet, not even this
    one's listener, or Redis refused the count): publishing then is safe."""
    try:
        if cluster:
            listeners = 0
            for node in client.get_nodes():
                counts = client.pubsub_numsub(channel, target_nodes=node)
                listeners += int(counts[0][1]) if counts else 0
        else:
            counts = client.pubsub_numsub(channel)
            listeners = int(counts[0][1]) if counts else 0
    except RedisError:
        return True
    return listeners != 1


__all__ = ["ReadyNews", "ShardWatcher", "others_listen"]
