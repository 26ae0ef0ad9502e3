"""Lua scripts of the Redis broker: loading, calling, pipelining, error mapping.

Each ``*.lua`` file next to this module is one atomic step; its header documents
the keys it touches. Scripts are called with ``EVALSHA`` and one key (the shard's
due index, so Redis Cluster routes the call to the shard's slot); a Redis that
lost its script cache (restart, failover, new node) gets them loaded again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

import msgpack
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker_adapter.errors import BrokerError, ConnectionFailed

#: hiredis's C packer (the redis extra has it). redis-py's wrapper checks each argument
#: in Python first: twice the client CPU of packing a 1,000-message send.
_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover
    _pack = None

log = logging.getLogger("chronoq.broker_adapter.RedisScripts")
log.addHandler(logging.NullHandler())

NAMES = (
    "send",
    "fire",
    "peek",
    "claim",
    "release",
    "nack",
    "abort",
    "register",
    "pending",
    "extend",
    "ack_batch",
    "reschedule",
    "abort_prefix",
    "find",
    "rate",
    "slot",
    "dead",
    "settle_dead",
    "count",
)

#: Scripts whose shard loop must not run twice: a call that failed part way (a key of
#: a shard that moved away) is not made again per shard.
WRITES_ONCE = frozenset({"send"})
#: Error replies Redis gives before running a script at all.
NOT_RUN = (NoScriptError, MovedError, AskError, TryAgainError, ClusterDownError)

#: One script call: (script name, the shard's due key, arguments).
Call = tuple[str, str, Sequence[Any]]
#: One looping script of :meth:`Scripts.fan_steps`: (script name, the shards it covers,
#: the arguments before the shard groups, each shard's argument group).
Step = tuple[str, Sequence[int], Sequence[Any], Sequence[Sequence[Any]]]


def _source(name: str) -> str:
    return resources.files("broker_adapter.redis").joinpath(f"{name}.lua").read_text()


#: The parts of ``pull.lua``, in the order it runs them (:meth:`Scripts.fan_steps`).
PULL_PARTS = ("ack_batch", "fire", "claim")


#: The text put where a script says ``--@state`` (``fire``, ``claim``, ``ack_batch`` and
#: ``pull``): the parts' shared state; in ``pull.lua`` once, for all of its parts.
STATE = _source("part_state")
#: Scripts with the ``--@state`` marker, which ``pull.lua`` runs as its parts.
STATEFUL = ("ack_batch", "fire", "claim", "pull")


def _with_state(name: str, text: str, state: str) -> str:
    """``text`` with ``state`` where its one ``--@state`` line stands."""
    if text.count("--@state\n") != 1:
        raise RuntimeError(f"{name}.lua must have one --@state line")
    return text.replace("--@state\n", state)


def _pull_source() -> str:
    """``pull.lua`` with its parts' text put in at their markers: each part without its
    own state (``pull.lua`` has it once) and without its lines marked ``--@alone``."""
    text = _with_state("pull", _source("pull"), STATE)
    for name in PULL_PARTS:
        marker = f"--@{name}\n"
        if marker not in text:
            raise RuntimeError(f"pull.lua lacks the marker {marker!r}")
        part = _with_state(name, _source(name), "")
        part = "".join(ln for ln in part.splitlines(True) if not ln.rstrip().endswith("--@alone"))
        text = text.replace(marker, part + "\n")
    return text


SOURCES: dict[str, str] = {
    name: _with_state(name, _source(name), STATE) if name in STATEFUL else _source(name)
    for name in NAMES
}
SOURCES["pull"] = _pull_source()
SHAS: dict[str, str] = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in SOURCES.items()}


def group_by_node(keys: Sequence[str], node_of: Callable[[str], str]) -> list[list[int]]:
    """The indexes of ``keys`` grouped by ``node_of(key)`` (a master's name), in
    first-seen order (each broker's ``by_node`` on a cluster)."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(node_of(k), []).append(i)
    return list(groups.values())


class ReplyLost(RedisConnectionError):
    """A call was sent but its connection broke before the reply: it may have run, so
    it is not made again (a send would be stored twice)."""


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Turn redis-py errors into chronoq's: ``ConnectionFailed`` or ``BrokerError``."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as e:
        raise ConnectionFailed(f"Redis unreachable during {what}: {e}; check that it runs") from e
    except RedisError as e:
        raise BrokerError(f"Redis refused {what}: {e}") from e


class Scripts:
    """Calls the broker's Lua scripts on one client (``Redis`` or ``RedisCluster``)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        #: On a cluster each call may touch one slot only; on one instance a looping
        #: script serves every shard in one call.
        self.cluster = isinstance(client, RedisCluster)
        #: key -> the master that held it when last asked (a slot lookup per key per
        #: call cost ~20 % of a firing pass's client CPU); dropped on any failed call,
        #: so a moved slot is looked up again (the failed call goes through the
        #: cluster client, which follows the redirection).
        self._nodes: dict[str, Any] = {}

    def load(self) -> None:
        """Load every script (on every master of a cluster)."""
        for src in SOURCES.values():
            self._client.script_load(src)  # RedisCluster sends SCRIPT LOAD to every primary

    def call(self, name: str, key: str, args: Sequence[Any]) -> Any:
        """Run one script; loads the scripts once if Redis does not know it."""
        try:
            return self._client.evalsha(SHAS[name], 1, key, *args)
        except NoScriptError:
            self.load()
            return self._client.evalsha(SHAS[name], 1, key, *args)

    def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one round trip (on a cluster, the calls of every master
        go on its own connection at once), in order.

        Not a transaction: each call is atomic on its own shard.

        :raises RedisError: the first error any call raised.
        """
        if len(calls) == 1:
            name, key, args = calls[0]
            return [self.call(name, key, args)]
        results = self._run(calls)
        retry = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if retry:
            self.load()
            again = self._run([calls[i] for i in retry])
            for i, r in zip(retry, again, strict=True):
                results[i] = r
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    def by_node(self, keys: Sequence[str]) -> list[list[int]]:
        """The indexes of ``keys`` grouped by the master that holds each now (one group
        on one instance), in first-seen order."""
        if not self.cluster:
            return [list(range(len(keys)))]
        return group_by_node(keys, lambda k: str(self._node(k).name))

    def _node(self, key: str) -> Any:
        """The master holding ``key`` (cached until a call fails)."""
        node = self._nodes.get(key)
        if node is None:
            if len(self._nodes) > 4096:  # due keys only, in practice: a bound anyway
                self._nodes.clear()
            node = self._nodes[key] = self._client.get_node_from_key(key)
        return node

    def fan(
        self,
        name: str,
        keys: Sequence[str],
        common: Sequence[Any],
        per_shard: Sequence[Sequence[Any]],
    ) -> list[Any]:
        """Run a script that loops over shard argument groups (``send``, ``fire``,
        ``claim``, ``peek``, ``ack_batch``): one call on one instance, one call per master on a
        cluster.
        Returns each shard's result, decoded from the script's msgpack reply.

        :param keys: each shard's due key (routing).
        :param common: the arguments before the shard groups.
        :param per_shard: each shard's argument group (the script knows where each ends).
        """
        if self.cluster:
            return self._fan_by_node(name, keys, common, per_shard)
        flat = [x for p in per_shard for x in p]
        result: list[Any] = msgpack.unpackb(self.call(name, keys[0], (*common, *flat)), raw=True)
        return result

    def fan_steps(self, keys: Sequence[str], steps: Sequence[Step]) -> list[list[Any]]:
        """Several looping scripts (as :meth:`fan` runs one), in the order of
        :data:`PULL_PARTS` (any of them), in ONE script call per server: ``pull.lua``
        runs them one after the other (on a cluster, each master gets its shards of
        each step, every master's call sent before any reply is read). Returns, per
        step, each of its shards' results.

        :param keys: each shard's due key (routing), indexed by shard.
        :param steps: the scripts; a step without shards is skipped (its result: ``[]``).
        """
        live = [(j, step) for j, step in enumerate(steps) if step[1]]
        names = [step[0] for _j, step in live]
        if [n for n in PULL_PARTS if n in names] != names:
            raise ValueError(f"steps {names} are not in the order of {PULL_PARTS}")
        out: list[list[Any]] = [[None] * len(step[1]) for step in steps]
        # per server: for each step on it, the indexes of its shards there
        nodes: dict[str, list[tuple[int, list[int]]]] = {}
        for j, (_name, shards, _common, _per) in live:
            mine: dict[str, list[int]] = {}
            for i, s in enumerate(shards):
                node = self._node(keys[s]).name if self.cluster else ""
                mine.setdefault(node, []).append(i)
            for node, idx in mine.items():
                nodes.setdefault(node, []).append((j, idx))
        calls: list[Call] = []
        if not nodes:
            return out
        for parts in nodes.values():
            counts = dict.fromkeys(PULL_PARTS, 0)
            args: list[Any] = []
            for j, idx in parts:
                name, shards, common, per = steps[j]
                part = [*common, *(x for i in idx for x in per[i])]
                counts[name] = len(part)
                args += part
            j0, idx0 = parts[0]
            calls.append(("pull", keys[steps[j0][1][idx0[0]]], (*counts.values(), *args)))
        if self.cluster:
            replies = self._direct(calls)
        else:
            replies = [self.call(*calls[0])]
        again: list[tuple[int, int]] = []
        for parts, reply in zip(nodes.values(), replies, strict=True):
            if isinstance(reply, ReplyLost):
                raise reply  # it may have run in part: its parts are not made again
            if isinstance(reply, Exception):
                log.info("per-node pull failed (%s); one call per shard instead", reply)
                again.extend((j, i) for j, idx in parts for i in idx)
                continue
            for j, idx in parts:
                part_reply = reply[PULL_PARTS.index(steps[j][0])]
                for i, result in zip(idx, msgpack.unpackb(part_reply, raw=True), strict=True):
                    out[j][i] = result
        if again:
            if any(isinstance(r, NoScriptError) for r in replies):
                self.load()
            retry: list[Call] = []
            for j, i in again:
                name, shards, common, per = steps[j]
                retry.append((name, keys[shards[i]], (*common, *per[i])))
            for (j, i), reply in zip(again, self.pipeline(retry), strict=True):
                out[j][i] = msgpack.unpackb(reply, raw=True)[0]
        return out

    def _fan_by_node(
        self,
        name: str,
        keys: Sequence[str],
        common: Sequence[Any],
        per_shard: Sequence[Sequence[Any]],
    ) -> list[Any]:
        """On a cluster: one call per master for all of its shards (a script without a
        shebang may touch several slots of the node it runs on). A call that fails
        before it ran (slots moved, script cache lost, no connection) is made again one
        per shard through the cluster client, which follows redirections."""
        groups = self.by_node(keys)
        calls: list[Call] = [
            (name, keys[g[0]], (*common, *(x for i in g for x in per_shard[i]))) for g in groups
        ]
        replies = self._direct(calls)
        out: list[Any] = [None] * len(keys)
        again: list[int] = []
        for g, reply in zip(groups, replies, strict=True):
            if isinstance(reply, ReplyLost) or (
                isinstance(reply, ResponseError)
                and name in WRITES_ONCE
                and not isinstance(reply, NOT_RUN)
            ):
                raise reply  # it may have run in part: going again could store twice
            if isinstance(reply, Exception):
                log.info("per-node %s failed (%s); one call per shard instead", name, reply)
                again.extend(g)
                continue
            for i, result in zip(g, msgpack.unpackb(reply, raw=True), strict=True):
                out[i] = result
        if again:
            if any(isinstance(r, NoScriptError) for r in replies):
                self.load()
            retry = self.pipeline([(name, keys[i], (*common, *per_shard[i])) for i in again])
            for i, reply in zip(again, retry, strict=True):
                out[i] = msgpack.unpackb(reply, raw=True)[0]
        return out

    def _direct(self, calls: Sequence[Call]) -> list[Any]:
        """On a cluster: the calls on each master's own connection, every master's
        calls sent before any reply is read (the cluster pipeline costs several times
        more CPU). Returns each reply, or the exception that call met."""
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i, (_name, key, _args) in enumerate(calls):
            node = self._node(key)
            by_node.setdefault(node.name, (node, []))[1].append(i)
        missing = object()
        out: list[Any] = [missing] * len(calls)
        sent: list[tuple[Any, Any, list[int]]] = []
        for node, idx in by_node.values():
            pool = self._client.get_redis_connection(node).connection_pool
            try:
                conn = pool.get_connection()
            except Exception as e:  # noqa: BLE001 - nothing sent: the caller makes them again
                for i in idx:
                    out[i] = e
                continue
            try:
                cmds = [("EVALSHA", SHAS[calls[i][0]], 1, calls[i][1], *calls[i][2]) for i in idx]
                packed = conn.pack_commands(cmds) if _pack is None else [b"".join(map(_pack, cmds))]
                conn.send_packed_command(packed)
                sent.append((pool, conn, idx))
            except Exception as e:  # noqa: BLE001 - part may have been sent: never again
                conn.disconnect()
                pool.release(conn)
                for i in idx:
                    lost = ReplyLost(f"connection to {pool!r} broke while sending: {e}")
                    lost.__cause__ = e
                    out[i] = lost
        for pool, conn, idx in sent:
            try:
                for i in idx:
                    try:
                        out[i] = conn.read_response()
                    except ResponseError as e:  # an error reply: the connection is fine
                        out[i] = e
            except Exception as e:  # noqa: BLE001 - sent, reply lost: never made again
                conn.disconnect()
                for i in idx:
                    if out[i] is missing:
                        lost = ReplyLost(f"connection to {pool!r} lost before the reply: {e}")
                        lost.__cause__ = e
                        out[i] = lost
            finally:
                pool.release(conn)
        if any(isinstance(r, Exception) for r in out):
            self._nodes.clear()  # a slot may have moved: look every key up again
        return out

    def _run(self, calls: Sequence[Call]) -> list[Any]:
        if self.cluster:
            results = self._direct(calls)
            again = [
                i
                for i, r in enumerate(results)
                if isinstance(r, Exception) and not isinstance(r, NoScriptError | ReplyLost)
            ]
            if again:  # through the cluster client, which follows redirections
                pipe = self._client.pipeline(transaction=False)
                for i in again:
                    name, key, args = calls[i]
                    pipe.execute_command("EVALSHA", SHAS[name], 1, key, *args)
                for i, r in zip(again, pipe.execute(raise_on_error=False), strict=True):
                    results[i] = r
            return results
        pipe = self._client.pipeline(transaction=False)
        for name, key, args in calls:
            pipe.execute_command("EVALSHA", SHAS[name], 1, key, *args)
        return list(pipe.execute(raise_on_error=False))
