"""The loop rule: no sync network call on a running event loop.

A sync client call (``close_order.schedule``, ``cancel``, ``get``,
``app.pending``, ...) made on a thread whose event loop is running, while the
broker is reached over the network (``chronoq://``, ``redis://`` and its
variants), would stall every coroutine of that loop
for a network round trip. It raises :class:`SyncCallInEventLoop` before
anything is sent, naming the ``_async`` form to await instead.

Brokers on this machine are exempt: the embedded RocksDB broker and
``memory://`` answer in microseconds from this process, and a ``rocksdb://``
directory shared by several processes (:mod:`broker_adapter.shared`) is a
Unix-socket round trip of tens of microseconds to its owner. The rule follows
the URL, not which process happens to own the directory right now, so every
worker of one app (and its tests, on a ``ManualClock`` or ``memory://``) behaves
alike. Refusing them would only break code that works (a sync ``schedule``
inside an ``async def`` job); the ``_async`` forms work with them too, and are
the better habit in coroutines (a directory changing owners can make a shared
call wait).

This module imports no asyncio (``import scheduler`` stays light): the check
looks for a running loop only once asyncio was imported by someone.
"""

from __future__ import annotations

import sys

from broker_adapter.base import BrokerAdapter
from scheduler.errors import SchedulerError


class SyncCallInEventLoop(SchedulerError, RuntimeError):
    """A sync client call made inside a running event loop on a network broker;
    nothing was sent.

    :param call: the call, e.g. ``"shop.close_order.schedule"``.
    """

    def __init__(self, call: str) -> None:
        self.call = call
        super().__init__(
            f"{call}() would block the running event loop for a network round trip to "
            f"the broker; nothing was sent. In a coroutine, await {call}_async(...) "
            "instead (or run the sync call on a thread: await asyncio.to_thread(...))"
        )


def is_local(broker: BrokerAdapter) -> bool:
    """Whether ``broker`` is on this machine (embedded, memory, a shared
    ``rocksdb://`` directory): exempt from the loop rule."""
    return getattr(broker, "local", False) is True  # BrokerAdapter.local; duck types: False


def loop_running() -> bool:
    """Whether this thread is running an event loop (cheap when it is not)."""
    # A loop can only run once asyncio was imported: without it, no import and no call.
    aio = sys.modules.get("asyncio")
    # _get_running_loop is in asyncio.__all__; it answers None where
    # get_running_loop raises, which is much cheaper on the sync hot path.
    return aio is not None and aio._get_running_loop() is not None


def check_sync_call(broker: BrokerAdapter, call: str) -> None:
    """Apply the loop rule to sync call ``call`` about to use ``broker``.

    :raises SyncCallInEventLoop: when this thread runs an event loop and ``broker``
        is not local (:func:`is_local`).
    """
    if loop_running() and not is_local(broker):
        raise SyncCallInEventLoop(call)


__all__ = [
    "SyncCallInEventLoop",
    "check_sync_call",
    "is_local",
    "loop_running",
]
