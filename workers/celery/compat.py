"""Every private name of Celery, kombu and redis-py that chronoq relies on, in one place.

chronoq publishes, stores and reads exactly what Celery would, and some of that is
only reachable through names Celery and kombu keep private. Each such use is one
function (or, for a method Celery calls on a backend, one hook class) here, whose
docstring says what it relies on; the rest of :mod:`workers.celery` uses only
these. ``tests/celery/test_compat.py`` pins each assumption against the installed
Celery and kombu, and checks those lie in the range ``pyproject.toml`` allows: a
version bump that breaks one fails there, naming it, not somewhere downstream.
"""

from __future__ import annotations

from typing import Any

from celery.backends.redis import RedisBackend


def augment_message(channel: Any, message: dict[str, Any], exchange: str, routing_key: str) -> None:
    """Finish ``message`` in place as kombu's virtual channel does before ``_put``:
    encode its body, set ``body_encoding`` and a fresh ``delivery_tag``, and the
    ``delivery_info`` exchange and routing key.

    Relies on ``kombu.transport.virtual.Channel._inplace_augment_message(message,
    exchange, routing_key)``, which ``basic_publish`` calls.
    """
    channel._inplace_augment_message(message, exchange, routing_key)


def queue_list_key(channel: Any, queue: str, message: dict[str, Any]) -> str:
    """The Redis list kombu's Redis channel pushes ``message`` onto for ``queue``:
    ``queue`` itself, or ``queue`` plus the separator and the priority step of the
    message's priority.

    Relies on ``kombu.transport.virtual.Channel._get_message_priority(message)`` and
    ``kombu.transport.redis.Channel._q_for_pri(queue, priority)``, as ``_put`` uses them.
    """
    return str(channel._q_for_pri(queue, channel._get_message_priority(message)))


def queue_expires(channel: Any, queue: str) -> bool:
    """Whether ``queue`` was declared with an expiry (``x-expires``) on ``channel``:
    kombu's Redis channel then refreshes the expiry with every push.

    Relies on ``kombu.transport.redis.Channel._expires``, a dict of queue name to
    expiry that ``_put`` consults (missing on other transports: ``False``).
    """
    return queue in getattr(channel, "_expires", {})


def new_channel_client(channel: Any) -> Any:
    """A new synchronous ``redis.Redis`` client on the channel's connection pool, as
    kombu's Redis channel makes for its own commands.

    Relies on ``kombu.transport.redis.Channel._create_client()`` (no argument: the
    synchronous client on ``channel.pool``).
    """
    return channel._create_client()


def task_exec_options(task: Any) -> dict[str, Any]:
    """The execution options (queue, priority, routing...) Celery's ``apply_async``
    takes from ``task``'s class.

    Relies on ``celery.app.task.Task._get_exec_options()``, cached per task.
    """
    return dict(task._get_exec_options())


def thread_backend(app: Any) -> Any:
    """``app``'s result backend for this thread if one was made, else ``None``
    (``app.backend`` would make one).

    Relies on the ``celery.Celery._backend`` property: the shared backend when it
    is thread-safe, else this thread's (``app._local.backend``), never created.
    """
    return app._backend


def built_client(backend: Any) -> Any:
    """``backend``'s redis-py client if it was made, else ``None`` (``backend.client``
    would make one).

    Relies on ``RedisBackend.client`` being a ``cached_property``, which keeps the
    client in the instance ``__dict__`` under its own name once built.
    """
    return backend.__dict__.get("client")


def max_value_size(backend: Any) -> int:
    """The largest encoded result Celery's Redis backend stores (bytes).

    Relies on ``celery.backends.redis.RedisBackend._MAX_STR_VALUE_SIZE``.
    """
    return int(backend._MAX_STR_VALUE_SIZE)


def result_meta(
    backend: Any, result: Any, state: str, traceback: Any = None, request: Any = None
) -> dict[str, Any]:
    """The meta dict Celery stores for a task's new state (``status``, ``result``,
    ``traceback``, ``children``, ``date_done`` and, as configured, the extended fields).

    Relies on ``celery.backends.base.Backend._get_result_meta(result=, state=,
    traceback=, request=)``.
    """
    meta: dict[str, Any] = backend._get_result_meta(
        result=result, state=state, traceback=traceback, request=request
    )
    return meta


class StoreResultHook(RedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend with its private store hook named in public:
    every state Celery stores goes through :meth:`write_result`, which subclasses
    override; by default it is Celery's own store.

    Relies on ``celery.backends.base.BaseKeyValueStoreBackend._store_result(task_id,
    result, state, traceback=None, request=None, **kwargs)``, which
    ``Backend.store_result`` calls (with retries) for every state and whose return
    value it returns.
    """

    def _store_result(
        self,
        task_id: Any,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        return self.write_result(task_id, result, state, traceback, request, **kwargs)

    def write_result(
        self,
        task_id: Any,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Store ``state`` and ``result`` for ``task_id`` as Celery's Redis backend does.

        :returns: ``result``.
        """
        return super()._store_result(task_id, result, state, traceback, request, **kwargs)


__all__ = [
    "StoreResultHook",
    "augment_message",
    "built_client",
    "max_value_size",
    "new_channel_client",
    "queue_expires",
    "queue_list_key",
    "result_meta",
    "task_exec_options",
    "thread_backend",
]
