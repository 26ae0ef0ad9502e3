"""Whether the Redis a broker connects to keeps what it acknowledges across a crash.

chronoq's promise is "accepted = delivered or aborted, never lost". On Redis that
holds only as far as Redis persists: with ``appendonly no`` and no snapshots a
restart loses every pending message; ``appendfsync everysec`` loses up to about
one second of acknowledged sends when the machine crashes (power cut, kernel
panic: a ``kill -9`` of redis-server alone loses nothing the OS already has,
``bench/redis_fsync_loss.py`` measured 0); ``appendfsync always`` loses none. At connect, both adapters call
:func:`check_persistence` (or :func:`check_persistence_async`): it reads
``INFO persistence`` and, where ``CONFIG`` is allowed, ``CONFIG GET appendfsync``
and ``CONFIG GET save`` of every server that holds data (the instance, each
cluster master, the Sentinel's master) and logs at most one line per server per
process: a WARNING naming the risk and the setting to change, an INFO note for
``everysec``, nothing for ``always``. The check never fails a connect: an error
reading the settings is logged at DEBUG and ignored.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("chronoq.broker_adapter.RedisBroker")
log.addHandler(logging.NullHandler())

_checked: set[str] = set()
_checked_lock = threading.Lock()


@dataclass(frozen=True)
class Persistence:
    """What one Redis server says about its persistence.

    :ivar aof: ``appendonly yes`` (``aof_enabled`` in ``INFO persistence``).
    :ivar appendfsync: ``always``, ``everysec`` or ``no``; ``None`` when ``CONFIG``
        is not allowed.
    :ivar snapshots: whether ``save`` has snapshot rules; ``None`` when unknown.
    """

    aof: bool
    appendfsync: str | None
    snapshots: bool | None


def assess(server: str, p: Persistence) -> tuple[int, str] | None:
    """The log level and line for ``server``'s persistence ``p``; ``None`` when it
    keeps every acknowledged write (AOF with ``appendfsync always``).

    :param server: how the line names the server (e.g. ``127.0.0.1:6379``).
    :param p: its settings.
    """
    fix = "Set `appendonly yes` and `appendfsync always` in redis.conf (or CONFIG SET)."
    if not p.aof:
        if p.snapshots:
            risk = "only RDB snapshots: a crash loses every send since the last snapshot"
        else:
            risk = "no persistence (appendonly no, no snapshots): a restart loses everything"
        return logging.WARNING, (
            f"Redis {server} runs with {risk}; chronoq cannot keep acknowledged sends there. {fix}"
        )
    if p.appendfsync == "always":
        return None
    if p.appendfsync == "everysec":
        return logging.INFO, (
            f"Redis {server} runs with appendfsync everysec: a machine crash (power cut, "
            "kernel panic) loses up to about 1 s of acknowledged sends; `appendfsync always` "
            "loses none (slower sends)"
        )
    if p.appendfsync is None:
        return logging.INFO, (
            f"Redis {server} has appendonly yes; CONFIG GET is not allowed, so chronoq "
            "cannot tell its appendfsync: only `always` keeps every acknowledged send"
        )
    return logging.WARNING, (
        f"Redis {server} runs with appendfsync {p.appendfsync}: a machine crash loses the "
        f"acknowledged sends the OS had not written yet (up to ~30 s of them). {fix}"
    )


def parse(info: dict[str, Any], config: dict[str, Any] | None) -> Persistence:
    """:class:`Persistence` from an ``INFO persistence`` reply and a ``CONFIG GET``
    reply of ``appendfsync`` and ``save`` (``None`` when not allowed)."""
    fsync = None if config is None else _text(config.get("appendfsync"))
    save = None if config is None else _text(config.get("save"))
    return Persistence(
        aof=str(info.get("aof_enabled", "0")) == "1",
        appendfsync=fsync or None,
        snapshots=None if save is None else bool(save.strip()),
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _first_time(server: str) -> bool:
    """Whether ``server`` is checked for the first time in this process."""
    with _checked_lock:
        if server in _checked:
            return False
        _checked.add(server)
        return True


def _report(server: str, p: Persistence) -> None:
    verdict = assess(server, p)
    if verdict is None:
        log.debug("Redis %s keeps every acknowledged write (appendfsync always)", server)
    else:
        log.log(verdict[0], "%s", verdict[1])


def _config(pairs: Any) -> dict[str, Any]:
    """``CONFIG GET`` replies (one dict per call) merged."""
    out: dict[str, Any] = {}
    for reply in pairs:
        if isinstance(reply, dict):
            out.update({_text(k) or "": v for k, v in reply.items()})
    return out


def _targets(client: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(name, extra command kwargs)`` of each server holding ``client``'s data."""
    primaries = getattr(client, "get_primaries", None)
    if primaries is not None:  # a cluster: every master
        return [(str(node.name), {"target_nodes": node}) for node in primaries()]
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None:
        return [(f"the master of Sentinel service {service!r}", {})]
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
    return [(str(where), {})]


def check_persistence(client: Any) -> None:
    """Log, once per server per process, whether ``client``'s Redis keeps acknowledged
    sends across a crash (see the module docstring). Never raises.

    :param client: a blocking ``redis.Redis`` (an instance or a Sentinel's master) or
        ``redis.RedisCluster``.
    """
    try:
        for server, kw in _targets(client):
            if not _first_time(server):
                continue
            info = client.execute_command("INFO", "persistence", **kw)
            try:
                config: dict[str, Any] | None = _config(
                    client.execute_command("CONFIG GET", name, **kw)
                    for name in ("appendfsync", "save")
                )
            except RedisError:  # CONFIG renamed or not allowed (managed Redis, ACLs)
                config = None
            _report(server, parse(info, config))
    except Exception:
        log.debug("could not read the persistence settings of Redis", exc_info=True)


async def check_persistence_async(client: Any) -> None:
    """:func:`check_persistence` for a ``redis.asyncio`` client. Never raises.

    :param client: ``redis.asyncio.Redis`` (an instance or a Sentinel's master) or
        ``redis.asyncio.RedisCluster``.
    """
    try:
        for server, kw in _targets(client):
            if not _first_time(server):
                continue
            info = await client.execute_command("INFO", "persistence", **kw)
            try:
                replies = [
                    await client.execute_command("CONFIG GET", name, **kw)
                    for name in ("appendfsync", "save")
                ]
                config: dict[str, Any] | None = _config(replies)
            except RedisError:  # CONFIG renamed or not allowed (managed Redis, ACLs)
                config = None
            _report(server, parse(info, config))
    except Exception:
        log.debug("could not read the persistence settings of Redis", exc_info=True)


def forget_checked() -> None:
    """Check every server again on the next connect (tests)."""
    with _checked_lock:
        _checked.clear()


__all__ = [
    "Persistence",
    "assess",
    "check_persistence",
    "check_persistence_async",
    "forget_checked",
    "parse",
]
