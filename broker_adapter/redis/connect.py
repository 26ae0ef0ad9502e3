"""Redis clients from broker URLs: ``redis://``, ``rediss://``, ``redis+cluster://`` and
``redis+sentinel://``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode

import redis
from redis.sentinel import Sentinel

from broker_adapter.errors import InvalidArgument
from broker_adapter.redis.scripts import redis_errors
from broker_adapter.urls import split_url

#: Query parameters that are the broker's, not redis-py's.
INT_PARAMS = ("shards", "max_body_bytes", "max_delay_ms", "retention_ms", "fire_chunk")
#: Socket timeouts (s): fail fast when Redis is away instead of hanging.
TIMEOUTS = {"socket_connect_timeout": 5, "socket_timeout": 30}


@dataclass(frozen=True)
class ClientSpec:
    """The Redis a broker URL names, before any client is made (the blocking and the
    asyncio broker make their own from it).

    :ivar kind: ``"single"`` (one instance), ``"cluster"`` (an entry node) or ``"sentinel"``.
    :ivar url: the redis-py URL of the instance or entry node (``""`` for Sentinel).
    :ivar sentinels: the Sentinels' ``(host, port)``.
    :ivar service: the master's name at the Sentinels.
    :ivar master_kwargs: the Sentinel master's client arguments.
    :ivar sentinel_kwargs: the Sentinels' client arguments.
    """

    kind: str
    url: str = ""
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    master_kwargs: dict[str, Any] = field(default_factory=dict)
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)


def parse_url(url: str) -> tuple[ClientSpec, dict[str, Any]]:
    """The Redis ``url`` names (``redis://``, ``rediss://``, ``redis+cluster://host:port``
    or ``redis+sentinel://...``) and the broker options found in its query string.

    :raises InvalidArgument: for a malformed broker parameter or Sentinel URL.
    """
    scheme, rest, params = split_url(url)
    opts: dict[str, Any] = {}
    for name in list(params):
        value = params[name]
        if name in INT_PARAMS:
            try:
                opts[name] = int(value)
            except ValueError as e:
                raise InvalidArgument(f"{name} in {url!r} must be an int") from e
        elif name == "prefix":
            opts[name] = value
        elif name == "fire":
            opts[name] = value not in ("0", "false", "no")
        else:
            continue
        del params[name]
    query = f"?{urlencode(params)}" if params else ""
    if scheme == "redis+sentinel":
        return sentinel_spec(url, rest, params), opts
    if scheme == "redis+cluster":
        return ClientSpec("cluster", f"redis://{rest}{query}"), opts
    return ClientSpec("single", f"{scheme}://{rest}{query}"), opts


def open_client(url: str) -> tuple[Any, dict[str, Any]]:
    """A ``redis.Redis`` (or ``redis.RedisCluster`` for ``redis+cluster://host:port``, an
    entry node) for ``url``, and the broker options found in its query string.

    :raises InvalidArgument: for a malformed broker parameter.
    :raises ConnectionFailed: when a cluster's entry node cannot be reached.
    """
    spec, opts = parse_url(url)
    with redis_errors("connect"):
        if spec.kind == "sentinel":
            sentinel: Any = Sentinel(  # type: ignore[no-untyped-call]
                spec.sentinels, sentinel_kwargs=spec.sentinel_kwargs, **TIMEOUTS
            )
            client: Any = sentinel.master_for(spec.service, **spec.master_kwargs)
        elif spec.kind == "cluster":
            client = redis.RedisCluster.from_url(spec.url, **TIMEOUTS)
        else:
            client = redis.Redis.from_url(spec.url, **TIMEOUTS)
    return client, opts


def sentinel_spec(url: str, rest: str, params: dict[str, str]) -> ClientSpec:
    """The master of ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
    as Redis Sentinel names it (and names it again after a failover). The user and
    password are the master's; ``sentinel_password`` in the query is the sentinels'.
    Other query parameters (e.g. ``db``, ``socket_timeout``) go to the master's client.

    :raises InvalidArgument: without a sentinel address or a service name.
    """
    auth, _, hosts_path = rest.rpartition("@")
    hosts, _, path = hosts_path.partition("/")
    service, _, db = path.partition("/")
    sentinels: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, _, port = part.rpartition(":")
        try:
            sentinels.append((host or "127.0.0.1", int(port or 26379)))
        except ValueError as e:
            raise InvalidArgument(f"bad sentinel address {part!r} in {url!r}") from e
    if not hosts or not service:
        raise InvalidArgument(
            f"{url!r}: use redis+sentinel://host:port[,host:port...]/service_name[/db]"
        )
    kwargs: dict[str, Any] = dict(TIMEOUTS)
    sentinel_kwargs: dict[str, Any] = dict(TIMEOUTS)
    if "sentinel_password" in params:
        sentinel_kwargs["password"] = params.pop("sentinel_password")
    if auth:
        user, _, password = auth.rpartition(":")
        kwargs.update({"username": unquote(user) or None, "password": unquote(password)})
    try:
        kwargs["db"] = int(db or params.pop("db", "0") or 0)
    except ValueError as e:
        raise InvalidArgument(f"db in {url!r} must be an int") from e
    for name, value in params.items():
        kwargs[name] = float(value) if name.endswith("timeout") else value
    return ClientSpec("sentinel", "", tuple(sentinels), service, kwargs, sentinel_kwargs)
