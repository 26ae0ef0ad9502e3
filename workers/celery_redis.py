"""Celery's Redis broker transport and result backend, with fewer costs per task.

A Celery worker on Redis pays, for every task, several Redis round trips and some
pure-Python overhead that has nothing to do with the task. Two of those costs
are avoidable without changing what is stored or sent:

- :class:`RedisTransport` (the broker side): kombu's Redis channel builds a fresh
  ``redis.Redis`` object each time it needs its synchronous client, for the
  unacked-message bookkeeping of every delivery and every ack among others.
  With redis-py 8 one such object costs about 85 µs of CPU, so a worker pays
  roughly 170 µs per task for two throwaway objects. This transport's channels
  keep that client (it is thread-safe; its connection pool does the pooling
  either way) and make a new one only when kombu replaced the pool after a
  disconnect.
- :class:`RedisResultBackend` (the result side): Celery stores a task's result
  by first reading the stored meta (a result already ``SUCCESS`` is never
  overwritten), then writing and publishing the new one: two round trips and a
  full decode of the old meta. This backend does the same in one Lua script,
  which also closes the window between the read and the write.

:func:`~workers.celery_app.celery_app_for` selects both for ``redis://`` and
``rediss://`` URLs. Any Celery app can do the same: ``broker_transport=``
:data:`TRANSPORT_PATH` and ``result_backend=f"{BACKEND_PATH}+redis://..."``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

#: Celery's ``broker_transport`` value that selects :class:`RedisTransport`.
TRANSPORT_PATH = "workers.celery_redis:RedisTransport"
#: The backend name that selects :class:`RedisResultBackend`, as a prefix of a
#: ``redis://`` or ``rediss://`` result backend URL (``f"{BACKEND_PATH}+{url}"``).
BACKEND_PATH = "workers.celery_redis:RedisResultBackend"


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, reusing its synchronous client (see the module docstring)."""

    _sync_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """``client``, or this channel's synchronous client (made once per pool)."""
        if client:
            yield client
            return
        cached = self._sync_client
        if cached is None or cached.connection_pool is not self.pool:
            cached = self._sync_client = self._create_client()  # type: ignore[no-untyped-call]
        yield cached


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`RedisChannel` channels."""

    Channel = RedisChannel


#: KEYS[1]: the task's meta key; ARGV: the new meta, its expiry in seconds (0:
#: none). Stores and publishes the meta unless the stored one is SUCCESS (Celery's
#: rule); a stored value that is not JSON is overwritten, as Celery would.
_STORE_UNLESS_SUCCESS = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
    return 0
  end
end
local ex = tonumber(ARGV[2])
if ex > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ex)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""


class RedisResultBackend(RedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend, storing a result in one round trip (see the
    module docstring). Results written with another serializer than JSON take
    Celery's own two round trips (the script reads the stored meta as JSON)."""

    _store_script: Any = None

    def _store_result(
        self,
        task_id: Any,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        if self.serializer != "json":
            return super()._store_result(task_id, result, state, traceback, request, **kwargs)
        meta = self._get_result_meta(
            result=result, state=state, traceback=traceback, request=request
        )
        meta["task_id"] = bytes_to_str(task_id)  # type: ignore[no-untyped-call]
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError(
                "value too large for Redis backend", state=state, task_id=task_id
            )
        expires = self.failure_expires if state == states.FAILURE else self.expires
        key = self.get_key_for_task(task_id)
        self.ensure(self._store_unless_success, (key, value, expires))
        return result

    def _store_unless_success(self, key: Any, value: Any, expires: Any) -> None:
        if self._store_script is None:
            self._store_script = self.client.register_script(_STORE_UNLESS_SUCCESS)
        self._store_script(keys=[key], args=[value, int(expires or 0)])


__all__ = [
    "BACKEND_PATH",
    "TRANSPORT_PATH",
    "RedisChannel",
    "RedisResultBackend",
    "RedisTransport",
]
