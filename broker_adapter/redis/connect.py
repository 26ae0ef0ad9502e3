"""Redis clients from broker URLs: ``redis://``, ``rediss://``, ``redis+cluster://``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import redis

from broker_adapter.errors import InvalidArgument
from broker_adapter.redis.scripts import redis_errors
from broker_adapter.urls import split_url

#: Query parameters that are the broker's, not redis-py's.
INT_PARAMS = ("shards", "max_body_bytes", "max_delay_ms", "retention_ms", "fire_chunk")
#: Socket timeouts (s): fail fast when Redis is away instead of hanging.
TIMEOUTS = {"socket_connect_timeout": 5, "socket_timeout": 30}


def open_client(url: str) -> tuple[Any, dict[str, Any]]:
    """A ``redis.Redis`` (or ``redis.RedisCluster`` for ``redis+cluster://host:port``, an
    entry node) for ``url``, and the broker options found in its query string.

    :raises InvalidArgument: for a malformed broker parameter.
    :raises ConnectionFailed: when a cluster's entry node cannot be reached.
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
    with redis_errors("connect"):
        if scheme == "redis+cluster":
            client: Any = redis.RedisCluster.from_url(f"redis://{rest}{query}", **TIMEOUTS)
        else:
            client = redis.Redis.from_url(f"{scheme}://{rest}{query}", **TIMEOUTS)
    return client, opts
