"""The loop rule: no sync network call on a running event loop.

A sync client call (``close_order.schedule``, ``cancel``, ``get``,
``app.pending``, ...) made on a thread whose event loop is running, while the
broker is reached over a socket (``chronoq://``, ``redis://``, a RocksDB
directory served by another process), would stall every coroutine of that loop
for a network round trip. It raises :class:`SyncCallInEventLoop` before
anything is sent, naming the ``_async`` form to await instead.

In-process brokers (the embedded RocksDB broker, ``memory://``) are exempt:
their calls return in microseconds without waiting on a socket, so refusing
them would only break code that works (a sync ``schedule`` inside an ``async
def`` job, a test). The ``_async`` forms work with them too.

This module imports no asyncio (``import scheduler`` stays light): the check
looks for a running loop only once asyncio was imported by someone.
"""

from __future__ import annotations

import sys

from broker_adapter.base import BrokerAdapter
from scheduler.errors import SchedulerError

#: Modules whose adapters keep the broker in this process (their calls are exempt
#: from the loop rule); a subclass defined elsewhere counts through its bases.
IN_PROCESS_MODULES = ("broker_adapter.embedded", "broker_adapter.memory")


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


def is_in_process(broker: BrokerAdapter) -> bool:
    """Whether ``broker`` keeps its data in this process (embedded, memory), so a
    call returns in microseconds and never waits on a socket."""
    return any(c.__module__.startswith(IN_PROCESS_MODULES) for c in type(broker).__mro__)


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
        is not in-process.
    """
    if loop_running() and not is_in_process(broker):
        raise SyncCallInEventLoop(call)


__all__ = [
    "IN_PROCESS_MODULES",
    "SyncCallInEventLoop",
    "check_sync_call",
    "is_in_process",
    "loop_running",
]
