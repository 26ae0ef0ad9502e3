"""Publish-if-unknown in one Redis round trip: the fast path of the Celery publisher.

When Celery's broker and result backend are the same Redis database (what
:func:`~workers.celery.app.celery_app_for` sets up), :class:`AtomicPublisher`
hands a whole publish batch to one Lua script. For each task, atomically, the
script reads the task's stored state and, unless Celery already has the task
(any stored state but ``PENDING``, ``FAILURE`` and ``REVOKED``), pushes the
message onto its queue and stores ``SENT`` (see
:mod:`workers.celery.results`). Against the general path (a lookup
round trip, kombu's publish batch, then the ``SENT`` writes) this saves CPU on
both sides of every batch, and it closes the gap the general path has: there a
dispatcher that dies between Celery's broker accepting a publish and the
``SENT`` write leaves a queued task that a redelivery publishes again.

The message is the one kombu would push: Celery's ``send_task_message`` builds
it (options, routes, headers, signals) through a producer whose channel,
:class:`_CapturingChannel`, takes the finished message at ``basic_publish``
instead of sending it; kombu's own channel then adds the delivery tag and body
encoding and names the list key (priority included), and the script does the
``LPUSH`` kombu's Redis transport would do. Only messages for the anonymous
exchange (Celery's way for its direct queues) are carried here: one for a named
exchange (a topic or fanout route, say) raises :class:`NotScriptable` before
anything is sent, and the executor goes back to the general path for good.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from celery.backends.redis import RedisBackend
from kombu.utils import json as kombu_json

from workers.celery.compat import augment_message, queue_expires, queue_list_key
from workers.celery.publish import publish
from workers.celery.redis_backend import RedisResultBackend
from workers.celery.results import decode_meta, sent_meta

#: KEYS: per task its meta key and queue list; ARGV: the result expiry (ms, 0: none),
#: then per task its message and its SENT meta. For each task: GET its meta; when
#: absent or PENDING/FAILURE/REVOKED, LPUSH the message and SET the SENT meta; reply
#: 1 (published), 2 (published over a FAILURE/REVOKED meta) or the stored meta (not
#: published). Celery's JSON meta starts with its status (read without decoding it);
#: an unreadable meta counts as known: never publish over what cannot be read.
_SCRIPT = """
local px = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 2 do
  local key, queue = KEYS[i], KEYS[i + 1]
  local meta = redis.call('GET', key)
  local state = nil
  if meta then
    state = string.match(meta, '^{"status": "(%u+)"')
    if not state then
      local ok, decoded = pcall(cjson.decode, meta)
      if ok and type(decoded) == 'table' then state = decoded['status'] end
    end
  end
  if meta and state ~= 'PENDING' and state ~= 'FAILURE' and state ~= 'REVOKED' then
    out[#out + 1] = meta
  else
    redis.call('LPUSH', queue, ARGV[i + 1])
    if px > 0 then
      redis.call('SET', key, ARGV[i + 2], 'PX', px)
    else
      redis.call('SET', key, ARGV[i + 2])
    end
    out[#out + 1] = meta and 2 or 1
  end
end
return out
"""

#: :meth:`AtomicPublisher.flush` reply for a task it published.
PUBLISHED = 1
#: ... for one it published over a ``FAILURE``/``REVOKED`` meta (a retry).
REPUBLISHED = 2


class NotScriptable(Exception):
    """A message this path cannot carry (a named exchange): use the general path."""


class _CapturingChannel:
    """A kombu channel that keeps what is published instead of sending it; every
    other call (declarations, message preparation) goes to the real channel."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.captured: list[tuple[dict[str, Any], str, str]] = []

    def basic_publish(
        self, message: dict[str, Any], exchange: str = "", routing_key: str = "", **_: Any
    ) -> None:
        self.captured.append((message, exchange, routing_key))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


@dataclass(slots=True)
class _Pending:
    task_id: str
    key: str
    queue: str
    body: str


class AtomicPublisher:
    """Publishes batches of task messages with :data:`_SCRIPT`; see the module docstring.

    Made by :meth:`open`, used by one thread (the executor's publisher).
    """

    def __init__(self, app: Any, connection: Any, channel: Any, backend: Any) -> None:
        self.app = app
        self._connection = connection
        self._channel = channel
        self._backend = backend
        self._capture = _CapturingChannel(channel)
        self._producer: Any = app.amqp.Producer(self._capture, auto_declare=False)
        self._script = backend.client.register_script(_SCRIPT)
        expires = getattr(backend, "expires", None)
        self._px = int(float(expires) * 1000) if expires else 0
        self._pending: list[_Pending] = []
        #: Queue names declared on this connection (see :func:`publish`).
        self.declared: set[str] = set()

    @classmethod
    def open(cls, app: Any) -> AtomicPublisher | None:
        """An AtomicPublisher for ``app``, or ``None`` when its broker and result
        backend are not one Redis database (with JSON, uncompressed results and no
        ``global_keyprefix``): the general path serves those."""
        backend = app.backend
        # Exactly these two: a subclass such as Celery's SentinelBackend finds its
        # server another way, and the same-database check below could not tell.
        if type(backend) not in (RedisBackend, RedisResultBackend) or backend.serializer != "json":
            return None
        if getattr(backend, "compression", None):
            return None
        connection = app.connection_for_write()
        try:
            if connection.transport.driver_type == "redis":
                channel = connection.default_channel
                if not getattr(channel, "global_keyprefix", "") and _same_database(
                    channel.client, backend.client
                ):
                    backend.client.script_load(_SCRIPT)  # reachable, and Lua allowed
                    return cls(app, connection, channel, backend)
        except BaseException:
            connection.release()
            raise
        connection.release()
        return None

    def declare(self, queue: Any) -> None:
        """Declare kombu ``queue`` on this connection now (its first publish would)."""
        self._producer.maybe_declare(queue)
        self.declared.add(queue.name)

    def add(
        self,
        name: str,
        args: list[Any],
        kwargs: dict[str, Any],
        task_id: str,
        options: dict[str, Any],
    ) -> None:
        """Build task ``task_id``'s message as ``send_task`` would (nothing is sent
        until :meth:`flush`; a queue not declared yet on this connection is).

        :raises NotScriptable: for a message to a named exchange, or to a queue
            with an expiry (kombu refreshes those with every push).
        """
        capture = self._capture
        capture.captured.clear()
        publish(self.app, self._producer, name, args, kwargs, task_id,
                {**options, "retry": False}, self.declared)  # fmt: skip
        if len(capture.captured) != 1:
            raise NotScriptable(f"task {name} made {len(capture.captured)} messages")
        message, exchange, routing_key = capture.captured[0]
        channel = self._channel
        if exchange:
            raise NotScriptable(f"task {name} is routed through exchange {exchange!r}")
        if queue_expires(channel, routing_key):
            raise NotScriptable(f"task {name} goes to queue {routing_key!r}, which expires")
        augment_message(channel, message, exchange, routing_key)
        queue = queue_list_key(channel, routing_key, message)
        key = self._backend.get_key_for_task(task_id)
        self._pending.append(_Pending(task_id, key, queue, _dumps(message)))

    def flush(self) -> dict[str, int | dict[str, Any] | None]:
        """Run the script over the messages added since the last flush, in one round
        trip. Per task id: :data:`PUBLISHED`, :data:`REPUBLISHED`, or the stored
        meta of a task Celery already has (not published; ``None`` if unreadable).

        :raises Exception: what Redis raised. A lost connection leaves the batch
            done whole or not at all (a script runs atomically); an error inside the
            script (Redis out of memory, say) may leave the tasks before it pushed,
            each with its ``SENT`` unless the error fell between the two.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return {}
        backend = self._backend
        keys: list[str] = []
        argv: list[Any] = [self._px]
        for p in pending:
            keys += [p.key, p.queue]
            argv += [p.body, backend.encode(sent_meta(p.task_id))]
        replies = self._script(keys=keys, args=argv)
        out: dict[str, int | dict[str, Any] | None] = {}
        for p, reply in zip(pending, replies, strict=True):
            out[p.task_id] = reply if isinstance(reply, int) else _decoded(backend, reply)
        return out

    def discard(self) -> None:
        """Drop the messages added and not flushed (their batch failed)."""
        self._pending.clear()

    def close(self) -> None:
        """Give the broker connection back."""
        self._pending.clear()
        with contextlib.suppress(Exception):  # closing after a broken connection
            self._connection.release()


def _dumps(message: dict[str, Any]) -> str:
    """The message as kombu's Redis transport writes it (kombu's JSON)."""
    return str(kombu_json.dumps(message))  # type: ignore[no-untyped-call]


def _decoded(backend: Any, raw: bytes) -> dict[str, Any] | None:
    try:
        return decode_meta(backend, raw)
    except Exception:  # noqa: BLE001 - unreadable: known all the same, not published
        return None


def _same_database(a: Any, b: Any) -> bool:
    """Whether two redis-py clients talk to the same server and database."""
    ka = a.connection_pool.connection_kwargs
    kb = b.connection_pool.connection_kwargs
    fields = ("host", "port", "path", "db")
    return all(ka.get(f) == kb.get(f) for f in fields)


__all__ = ["PUBLISHED", "REPUBLISHED", "AtomicPublisher", "NotScriptable"]
