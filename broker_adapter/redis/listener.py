"""The pub/sub listener of a Redis broker: news from other processes.

Split from :mod:`broker_adapter.redis.firer`: the firer learns earlier due times
from this process's own sends at once, and from other processes through the
``wake`` channel heard here; pulls hear of ready messages on the ``ready`` channel.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from redis.exceptions import RedisError

from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews


class Listener:
    """Listens on the broker's ``wake`` and ``ready`` channels (other processes' news).

    :param client: the Redis client to subscribe with.
    :param keys: the broker's keyspace (its channels and shards).
    :param firer: told of earlier due times heard on ``wake``.
    :param news: told what is heard on ``ready``.
    """

    def __init__(self, client: Any, keys: Keyspace, firer: Firer, news: ReadyNews) -> None:
        self._client = client
        self._keys = keys
        self._wake_channel = keys.wake_channel.encode()
        # this listener's own channel: close publishes on it so that the thread's
        # blocking read returns at once instead of at its timeout (0.2 s per close)
        self._stop_channel = f"{keys.wake_channel}:stop:{uuid.uuid4().hex}".encode()
        self._firer = firer
        self._news = news
        self._closed = False
        self._pubsub: Any = None
        self.log = logging.getLogger("chronoq.broker_adapter.Listener")
        self.log.addHandler(logging.NullHandler())
        self._thread = threading.Thread(target=self._run, name="chronoq-redis-listen", daemon=True)

    def start(self) -> None:
        """Subscribe (before returning, so no news after this is missed) and start."""
        self._subscribe()
        self._thread.start()

    def _subscribe(self) -> None:
        ps = self._client.pubsub(ignore_subscribe_messages=True)
        ps.subscribe(self._keys.wake_channel, self._keys.ready_channel, self._stop_channel)
        self._pubsub = ps

    def close(self) -> None:
        """Stop listening."""
        self._closed = True
        if self._thread.is_alive():
            try:
                self._client.publish(self._stop_channel, b"")
            except (RedisError, OSError):
                pass  # the read then ends at its timeout
            self._thread.join(timeout=5)
        try:
            if self._pubsub is not None:
                self._pubsub.close()
        except (RedisError, OSError):
            pass

    def _handle(self, channel: bytes, data: bytes) -> None:
        if channel == self._wake_channel:
            shard, _, due = data.partition(b":")
            s = int(shard)
            if 0 <= s < self._keys.shards:
                self._firer.note_due(s, int(due))
        else:
            self._news.heard(data)

    def _run(self) -> None:
        while not self._closed:
            try:
                if self._pubsub is None:
                    self._subscribe()
                    self._news.tell(range(self._keys.shards))  # news may be lost
                    self._firer.kick()
                msg = self._pubsub.get_message(timeout=0.2)
                if msg is not None and msg.get("type") == "message":
                    ch = msg["channel"]
                    ch = ch if isinstance(ch, bytes) else ch.encode()
                    if ch != self._stop_channel:
                        self._handle(ch, msg["data"])
            except Exception:
                if self._closed:
                    return
                self.log.warning(
                    "pub/sub listener lost its connection; resubscribing", exc_info=True
                )
                try:
                    if self._pubsub is not None:
                        self._pubsub.close()
                except (RedisError, OSError):
                    pass
                self._pubsub = None
                time.sleep(0.2)
