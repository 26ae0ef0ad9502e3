"""URL schemes pick broker adapters (one table, like kombu's transport aliases).

``rocksdb://PATH`` is the embedded broker (``rocksdb:///abs/dir`` or
``rocksdb://./rel/dir``); query parameters become constructor arguments, e.g.
``rocksdb://./data?durability=sync``. A directory another process owns is
reached through it (:mod:`broker_adapter.shared`) unless ``?share=0``. Adapters
are imported only when used, so
``import broker_adapter`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import parse_qsl

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import InvalidArgument, UnknownScheme
from broker_adapter.threaded_async import ThreadedAsyncBroker

#: scheme -> "module:Class"; each class has ``from_url(url, **kwargs)``.
ADAPTERS: dict[str, str] = {
    "rocksdb": "broker_adapter.shared.broker:SharedBroker",  # an EmbeddedBroker with ?share=0
    "memory": "broker_adapter.memory.broker:MemoryBroker",
    "chronoq": "broker_adapter.server.client:RemoteBroker",
    "chronoq+unix": "broker_adapter.server.client:RemoteBroker",  # a local server's socket
    "redis": "broker_adapter.redis.broker:RedisBroker",
    "rediss": "broker_adapter.redis.broker:RedisBroker",
    "redis+cluster": "broker_adapter.redis.broker:RedisBroker",
    "redis+sentinel": "broker_adapter.redis.broker:RedisBroker",
}

#: scheme -> "module:Class" of the adapters that speak their protocol on the event loop
#: (each has ``from_url(url, **kwargs)``); any other scheme gets its sync adapter
#: behind a :class:`~broker_adapter.threaded_async.ThreadedAsyncBroker`.
ASYNC_ADAPTERS: dict[str, str] = {}
ASYNC_ADAPTERS["chronoq"] = "broker_adapter.server.async_client:AsyncRemoteBroker"
ASYNC_ADAPTERS["chronoq+unix"] = ASYNC_ADAPTERS["chronoq"]
ASYNC_ADAPTERS.update(
    dict.fromkeys(
        ("redis", "rediss", "redis+cluster", "redis+sentinel"),
        "broker_adapter.redis.async_broker:AsyncRedisBroker",
    )
)


def split_url(url: str) -> tuple[str, str, dict[str, str]]:
    """Split a broker URL into ``(scheme, rest, query params)``.

    ``rest`` is everything between ``scheme://`` and ``?``.

    :raises InvalidArgument: when the URL has no ``scheme://``.
    """
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(f"a broker URL looks like scheme://..., got {url!r}")
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    return scheme.lower(), rest, dict(parse_qsl(query, keep_blank_values=True))


def open_broker(url: str, **kwargs: Any) -> BrokerAdapter:
    """Open the broker that ``url`` names; ``kwargs`` go to the adapter's constructor.

    :raises UnknownScheme: for a scheme no adapter serves.
    :raises InvalidArgument: for a malformed URL.
    """
    scheme = split_url(url)[0]
    target = ADAPTERS.get(scheme)
    if target is None:
        raise UnknownScheme(url, list(ADAPTERS))
    broker: BrokerAdapter = _adapter_class(url, target).from_url(url, **kwargs)
    return broker


def open_async_broker(url: str, **kwargs: Any) -> AsyncBrokerAdapter:
    """Open the awaitable client of the broker that ``url`` names (see
    :mod:`broker_adapter.async_base`): a native one where the scheme has one
    (:data:`ASYNC_ADAPTERS`), else the sync adapter on a thread pool, owned (and
    closed) by the returned adapter. Opening connects nothing yet; the first call does.

    :raises UnknownScheme: for a scheme no adapter serves.
    :raises InvalidArgument: for a malformed URL.
    """
    target = ASYNC_ADAPTERS.get(split_url(url)[0])
    if target is None:
        return ThreadedAsyncBroker(open_broker(url, **kwargs), own=True)
    adapter: AsyncBrokerAdapter = _adapter_class(url, target).from_url(url, **kwargs)
    return adapter


def _adapter_class(url: str, target: str) -> Any:
    """The class ``"module:Class"`` names, imported now (adapters load lazily)."""
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("broker_adapter"):
            raise UnknownScheme(url, [s for s in ADAPTERS if s == "rocksdb"]) from e
        raise
    return getattr(module, class_name)


__all__ = ["ADAPTERS", "ASYNC_ADAPTERS", "open_async_broker", "open_broker", "split_url"]
