"""Celery's Redis result backend, storing a task's result in one round trip.

Celery stores a task's result by first reading the stored meta (a result already
``SUCCESS`` is never overwritten), then writing and publishing the new one: two
round trips and a full decode of the old meta. :class:`RedisResultBackend` does
the same in one Lua script, which also closes the window between the read and
the write. What is stored and published does not change.

:func:`~workers.celery.app.celery_app_for` selects it for ``redis://`` and
``rediss://`` result backends; any Celery app can:
``result_backend=f"{BACKEND_PATH}+redis://..."``.
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from workers.celery.compat import StoreResultHook, max_value_size, result_meta

#: The backend name that selects :class:`RedisResultBackend`, as a prefix of a
#: ``redis://`` or ``rediss://`` result backend URL (``f"{BACKEND_PATH}+{url}"``).
BACKEND_PATH = "workers.celery.redis_backend:RedisResultBackend"

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


class RedisResultBackend(StoreResultHook):
    """Celery's Redis result backend, storing a result in one round trip (see the
    module docstring). Results written with another serializer than JSON take
    Celery's own two round trips (the script reads the stored meta as JSON)."""

    #: The registered script (chronoq's attribute, not Celery's).
    _store_script: Any = None

    def write_result(
        self,
        task_id: Any,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Store ``state`` and ``result`` for ``task_id`` unless it is ``SUCCESS`` already.

        :returns: ``result``.
        :raises BackendStoreError: for an encoded result larger than Redis takes.
        """
        if self.serializer != "json":
            return super().write_result(task_id, result, state, traceback, request, **kwargs)
        meta = result_meta(self, result, state, traceback, request)
        meta["task_id"] = bytes_to_str(task_id)  # type: ignore[no-untyped-call]
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > max_value_size(self):
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


__all__ = ["BACKEND_PATH", "RedisResultBackend"]
