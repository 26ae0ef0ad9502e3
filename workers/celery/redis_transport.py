"""kombu's Redis broker transport, minus a throwaway client object per delivery and per ack.

kombu's Redis channel builds a fresh ``redis.Redis`` object each time it needs its
synchronous client, for the unacked-message bookkeeping of every delivery and
every ack among others. With redis-py 8 one such object costs about 85 µs of CPU,
so a Celery worker pays roughly 170 µs per task for two throwaway objects.
:class:`RedisTransport`'s channels keep that client (it is thread-safe; its
connection pool does the pooling either way) and make a new one only when kombu
replaced the pool after a disconnect. What is stored and sent does not change.

:func:`~workers.celery.app.celery_app_for` selects it for ``redis://`` and
``rediss://`` brokers; any Celery app can: ``broker_transport=`` :data:`TRANSPORT_PATH`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

from workers.celery.compat import new_channel_client

#: Celery's ``broker_transport`` value that selects :class:`RedisTransport`.
TRANSPORT_PATH = "workers.celery.redis_transport:RedisTransport"


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, reusing its synchronous client (see the module docstring)."""

    #: This channel's synchronous client (chronoq's attribute, not kombu's).
    _sync_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client``, or this channel's synchronous client (made once per pool)."""
        if client:
            yield client
            return
        cached = self._sync_client
        if cached is None or cached.connection_pool is not self.pool:
            cached = self._sync_client = new_channel_client(self)
        yield cached


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`RedisChannel` channels."""

    Channel = RedisChannel


__all__ = ["TRANSPORT_PATH", "RedisChannel", "RedisTransport"]
