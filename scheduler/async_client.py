"""The awaitable side of an app: the broker its ``*_async`` calls go through.

Every client call of an app has an ``_async`` twin (``close_order.schedule_async``,
``schedule_many_async``, ``cancel_async``, ``get_async``; ``app.pending_async``,
``app.cancel_async``, ``app.get_async``). The twins build the very messages of
the sync forms and send them through an
:class:`~broker_adapter.async_base.AsyncBrokerAdapter` that :class:`AsyncClient`
keeps for the app:

* a local broker (``rocksdb://``, ``memory://``; or a broker object given to the
  app) is reached through the app's own sync broker on a few threads
  (:class:`~broker_adapter.threaded_async.ThreadedAsyncBroker`): one process owns a
  RocksDB directory, and a ``memory://`` broker lives in the app's handle;
* a URL whose scheme has a native async adapter
  (:data:`~broker_adapter.urls.ASYNC_ADAPTERS`) gets one of its own, speaking the
  protocol on the event loop;
* any other URL reuses the app's sync client on threads as well.

Asyncio objects (streams, futures) belong to one loop, so there is one adapter
per event loop, opened on that loop's first call. A small keeper task owns it:
the adapter closes when ``await app.aclose()`` or ``app.close()`` asks, or when
the loop's runner cancels its tasks at the end (``asyncio.run``, uvicorn), so a
test that runs several loops leaks no connection. Opening never blocks the loop:
a sync broker that must be opened first is opened on a thread.

The sync calls' side of it, the loop rule, is :mod:`scheduler.loop_rule`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import BrokerClosed
from broker_adapter.threaded_async import ThreadedAsyncBroker
from broker_adapter.urls import ASYNC_ADAPTERS, open_async_broker, split_url
from scheduler.loop_rule import loop_running

#: Schemes of local brokers: reached through the app's own broker, never a second one.
LOCAL_SCHEMES = frozenset({"rocksdb", "memory"})

#: How long ``close()`` waits for the adapter of a loop running in another thread.
CLOSE_WAIT_S = 10.0


@dataclass(eq=False)
class _LoopAdapter:
    """The adapter of one event loop and the keeper task that owns it."""

    loop: asyncio.AbstractEventLoop
    ready: asyncio.Future[AsyncBrokerAdapter]
    stop: asyncio.Future[None]
    keeper: asyncio.Task[None] | None = None
    adapter: AsyncBrokerAdapter | None = None
    done: threading.Event = field(default_factory=threading.Event)


class AsyncClient:
    """The :class:`AsyncBrokerAdapter` of one app on each event loop that uses it.

    :param url: the app's broker URL; ``None`` when the app was given a broker object.
    :param sync_broker: returns the app's sync broker, opening it if needed (may block:
        called on a thread).
    :param open_kwargs: keyword arguments for a native adapter (e.g. ``clock=``).
    """

    def __init__(
        self,
        url: str | None,
        sync_broker: Callable[[], BrokerAdapter],
        open_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._url = url
        self._sync_broker = sync_broker
        self._open_kwargs = open_kwargs or {}
        self._lock = threading.Lock()
        self._loops: dict[asyncio.AbstractEventLoop, _LoopAdapter] = {}
        self._closed = False

    @property
    def native(self) -> bool:
        """Whether the app's URL gets a native async adapter (else: threads)."""
        if self._url is None:
            return False
        scheme = split_url(self._url)[0]
        return scheme in ASYNC_ADAPTERS and scheme not in LOCAL_SCHEMES

    @property
    def loops(self) -> int:
        """How many event loops have an adapter open (or opening) now."""
        with self._lock:
            return len(self._loops)

    async def broker(self) -> AsyncBrokerAdapter:
        """The adapter of the running loop, opened on its first call.

        :raises BrokerClosed: after :meth:`close`.
        """
        loop = asyncio.get_running_loop()
        entry = self._loops.get(loop)
        if entry is not None and entry.adapter is not None:
            return entry.adapter
        with self._lock:
            if self._closed:
                raise BrokerClosed("this Scheduler is closed; create a new one")
            entry = self._loops.get(loop)
            if entry is None:
                entry = _LoopAdapter(loop, loop.create_future(), loop.create_future())
                self._loops[loop] = entry
                entry.keeper = loop.create_task(self._keep(entry), name="chronoq-async-client")
        # shield: a caller cancelled while the adapter opens must not cancel the opening.
        return await asyncio.shield(entry.ready)

    async def _open(self) -> AsyncBrokerAdapter:
        if self.native:
            assert self._url is not None
            return open_async_broker(self._url, **self._open_kwargs)
        sync = await asyncio.to_thread(self._sync_broker)
        return ThreadedAsyncBroker(sync, own=False)

    async def _keep(self, entry: _LoopAdapter) -> None:
        """Open the loop's adapter, hold it until asked to stop (or cancelled), close it."""
        try:
            try:
                adapter = await self._open()
            except asyncio.CancelledError:  # the loop ends while opening: waiters end too
                entry.ready.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - every waiter hears it; the next call retries
                entry.ready.set_exception(e)
                entry.ready.exception()  # retrieved: no "never retrieved" noise if none waits
                return
            entry.adapter = adapter
            entry.ready.set_result(adapter)
            try:
                await entry.stop
            finally:
                await adapter.close()
        finally:
            with self._lock:
                if self._loops.get(entry.loop) is entry:
                    del self._loops[entry.loop]
            entry.done.set()

    async def aclose(self) -> None:
        """Close the running loop's adapter (awaited) and refuse new calls; the
        adapters of other loops are closed as :meth:`close` does."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._closed = True
            entry = self._loops.get(loop)
        if entry is not None and entry.keeper is not None:
            if not entry.stop.done():
                entry.stop.set_result(None)
            await asyncio.shield(entry.keeper)
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Close every loop's adapter as far as a sync call can, and refuse new calls.

        A loop running in another thread is asked and waited for (up to
        :data:`CLOSE_WAIT_S`); a loop running in this thread closes its adapter as
        soon as it turns again; a stopped loop is run until its adapter closed.
        """
        with self._lock:
            self._closed = True
            entries = list(self._loops.values())
        for entry in entries:
            loop = entry.loop
            if loop.is_closed() or entry.keeper is None:
                continue  # the keeper ended with its loop's tasks
            if loop.is_running():
                loop.call_soon_threadsafe(_stop, entry)
                if not (loop_running() and asyncio.get_running_loop() is loop):
                    entry.done.wait(CLOSE_WAIT_S)
            else:
                _stop(entry)
                loop.run_until_complete(entry.keeper)


def _stop(entry: _LoopAdapter) -> None:
    if not entry.stop.done():
        entry.stop.set_result(None)


__all__ = ["LOCAL_SCHEMES", "AsyncClient"]
