"""The broker's Lua scripts on a ``redis.asyncio`` client: the same sources, the same
calls as :class:`~broker_adapter.redis.scripts.Scripts`, awaited.

A client that does not know a script (first call, a restarted Redis, a failover, a
new cluster node) gets them all loaded, and the call is made again: an unknown
script is refused before it runs, so nothing is stored twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgpack
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from broker_adapter.redis.connect import TIMEOUTS, ClientSpec
from broker_adapter.redis.persistence import check_persistence_async
from broker_adapter.redis.scripts import SHAS, SOURCES, Call, group_by_node

#: Most connections one asyncio client opens to one Redis node. Concurrent sends share
#: script calls (see :mod:`~broker_adapter.redis.send_coalescer`), so a few carry any
#: load; a caller waits for a free one instead of an error past the pool's size.
MAX_CONNECTIONS = 32


def open_async_client(spec: ClientSpec) -> tuple[Any, list[Any]]:
    """A ``redis.asyncio`` client (``Redis``, ``RedisCluster``, or the master a Sentinel
    names) for ``spec``, and what else to ``aclose()`` with it (the Sentinel manager's
    own connections); it connects on its first command, on the loop that awaits it.

    It never makes a command again by itself: a script whose connection broke may have
    run, and a send made twice would be stored twice. The error reaches the caller
    (``ConnectionFailed``), who decides; the next call connects afresh.
    """
    once = {"retry": Retry(NoBackoff(), 0), **TIMEOUTS}
    if spec.kind == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(spec.sentinels), sentinel_kwargs=spec.sentinel_kwargs, **TIMEOUTS
        )
        return sentinel.master_for(spec.service, **{**spec.master_kwargs, **once}), [sentinel]
    if spec.kind == "cluster":
        return RedisCluster.from_url(spec.url, max_connections=MAX_CONNECTIONS, **once), []
    from redis.asyncio import BlockingConnectionPool, Redis

    pool: ConnectionPool = BlockingConnectionPool.from_url(
        spec.url, max_connections=MAX_CONNECTIONS, timeout=None, **once
    )
    return Redis.from_pool(pool), []  # owns the pool: closing the client closes it


class AsyncScripts:
    """Calls the broker's Lua scripts on one ``redis.asyncio`` client.

    :param client: ``Redis`` (one instance, or a Sentinel's master) or ``RedisCluster``.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        #: On a cluster each call touches one slot; on one instance a looping script
        #: serves every shard in one call.
        self.cluster = isinstance(client, RedisCluster)
        self._loaded = False
        self._loading = asyncio.Lock()

    async def ready(self) -> None:
        """Before the first command: load the scripts once (a cluster client learns its
        slot map then). Concurrent first calls would each start a cluster client's
        discovery, whose redirections and reconnects break each other's calls."""
        if self._loaded:
            return
        async with self._loading:
            if not self._loaded:
                await self.load()
                self._loaded = True
                await check_persistence_async(self._client)  # once per server and process

    async def load(self) -> None:
        """Load every script (on every master of a cluster)."""
        for src in SOURCES.values():
            if self.cluster:
                await self._client.execute_command(
                    "SCRIPT LOAD", src, target_nodes=RedisCluster.PRIMARIES
                )
            else:
                await self._client.script_load(src)

    async def call(self, name: str, key: str, args: Sequence[Any]) -> Any:
        """Run one script; loads the scripts once if Redis does not know it."""
        await self.ready()
        try:
            return await self._client.evalsha(SHAS[name], 1, key, *args)
        except NoScriptError:
            await self.load()
            return await self._client.evalsha(SHAS[name], 1, key, *args)

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts, in order: one round trip on one instance, every call at
        once on a cluster. Not a transaction: each call is atomic on its own shard.

        :raises RedisError: the first error any call raised.
        """
        if len(calls) == 1 or self.cluster:
            return await _gather([self.call(*c) for c in calls])
        await self.ready()
        results = await self._run(calls)
        retry = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if retry:
            await self.load()
            again = await self._run([calls[i] for i in retry])
            for i, r in zip(retry, again, strict=True):
                results[i] = r
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def by_node(self, keys: Sequence[str]) -> list[list[int]]:
        """The indexes of ``keys`` grouped by the master that holds each now (one group
        on one instance; on a cluster after :meth:`ready`, which learns the slot map)."""
        if not self.cluster:
            return [list(range(len(keys)))]
        return group_by_node(keys, lambda k: str(self._client.get_node_from_key(k).name))

    async def fan(
        self,
        name: str,
        keys: Sequence[str],
        common: Sequence[Any],
        per_shard: Sequence[Sequence[Any]],
    ) -> list[Any]:
        """Run a script that loops over shard argument groups (``send``): one call with
        every group on one instance; on a cluster one call per shard, all at once (the
        form the blocking client falls back to when a per-master call cannot run).
        Returns each shard's result, decoded from the script's msgpack reply.

        :param keys: each shard's due key (routing).
        :param common: the arguments before the shard groups.
        :param per_shard: each shard's argument group (the script knows where each ends).
        """
        await self.ready()
        if not self.cluster:
            flat = [x for p in per_shard for x in p]
            reply = await self.call(name, keys[0], (*common, *flat))
            result: list[Any] = msgpack.unpackb(reply, raw=True)
            return result
        replies = await _gather(
            [self.call(name, k, (*common, *p)) for k, p in zip(keys, per_shard, strict=True)]
        )
        return [msgpack.unpackb(r, raw=True)[0] for r in replies]

    async def _run(self, calls: Sequence[Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for name, key, args in calls:
            pipe.execute_command("EVALSHA", SHAS[name], 1, key, *args)
        return list(await pipe.execute(raise_on_error=False))


async def _gather(calls: Sequence[Any]) -> list[Any]:
    """Await every call; raise the first error once all have ended (none is left
    running behind the caller's back)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)
