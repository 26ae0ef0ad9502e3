"""The broker an app talks through, and its lifetime: :class:`AppBroker`.

:class:`~scheduler.scheduler.Scheduler` is an :class:`AppBroker`: the broker is
opened from ``settings.broker_url`` on first use (``app.broker``), so importing
an app module opens nothing; a broker passed in is used as given and never
closed here; :meth:`AppBroker.use_broker` lends the app another broker (and
clock) for a ``with`` block, as tests do; :meth:`AppBroker.close` closes what
the app opened, once. The awaitable client calls get one async adapter per
event loop from :mod:`scheduler.async_client`, opened here on the loop's first
call.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter
from broker_adapter.clock import Clock, SystemClock
from broker_adapter.errors import BrokerClosed
from broker_adapter.urls import open_broker
from scheduler.loop_rule import check_sync_call
from scheduler.settings import Settings

if TYPE_CHECKING:
    from scheduler.async_client import AsyncClient

# The Scheduler's logger, as before the split: log lines keep their owner's name.
_log = logging.getLogger("chronoq.scheduler.Scheduler")


class AppBroker(abc.ABC):
    """The app's broker: opened on first use, lent for a ``with`` block, closed
    once; see the module. The subclass calls :meth:`_hold_broker` before anything
    reads the broker or the clock."""

    @property
    @abc.abstractmethod
    def settings(self) -> Settings:
        """The app's settings (``settings.broker_url`` is opened on first use)."""

    def _hold_broker(self, broker: BrokerAdapter | None, clock: Clock | None) -> None:
        """Start with ``broker`` (used as given, never closed here), or with none
        (opened from ``settings.broker_url`` on first use), and ``clock`` (the
        system clock if ``None``; a given clock is also handed to the brokers this
        app opens)."""
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._given_clock = clock
        self._broker: BrokerAdapter | None = broker
        self._owns_broker = broker is None
        self._closed = False
        self._lock = threading.Lock()
        self._async_client: AsyncClient | None = None

    # -- the brokers of client calls --------------------------------------------------

    def client_broker(self, call: str) -> BrokerAdapter:
        """:attr:`broker`, for sync client call ``call`` (e.g. ``"app.cancel"``), after
        the loop rule (:mod:`scheduler.loop_rule`).

        :raises SyncCallInEventLoop: inside a running event loop on a network broker;
            the message names ``call``'s ``_async`` form.
        :raises BrokerClosed: after :meth:`close`.
        """
        broker = self._broker
        # The hot path of schedule(): an open broker on this machine is exempt from
        # the loop rule (loop_rule.is_local), so no more calls are needed.
        if broker is not None and not self._closed and getattr(broker, "local", False) is True:
            return broker
        broker = self.broker
        check_sync_call(broker, call)
        return broker

    async def async_broker(self) -> AsyncBrokerAdapter:
        """The async broker of the running event loop (:mod:`scheduler.async_client`),
        opened on the loop's first call without blocking it.

        :raises BrokerClosed: after :meth:`close` or :meth:`aclose`.
        """
        clients = self._async_client
        if clients is None:
            with self._lock:
                if self._closed:
                    raise BrokerClosed("this Scheduler is closed; create a new one")
                if self._async_client is None:
                    from scheduler.async_client import AsyncClient  # asyncio, on first use

                    url = self.settings.broker_url if self._owns_broker else None
                    self._async_client = AsyncClient(url, lambda: self.broker, self._clock_kwargs())
                clients = self._async_client
        return await clients.broker()

    def _clock_kwargs(self) -> dict[str, Any]:
        """What opening a broker passes on: the clock, when one was given."""
        return {} if self._given_clock is None else {"clock": self._given_clock}

    @property
    def clock(self) -> Clock:
        """The time source (the system clock unless one was given)."""
        return self._clock

    @property
    def broker(self) -> BrokerAdapter:
        """The broker, opened from ``settings.broker_url`` on first use.

        :raises BrokerClosed: after :meth:`close`.
        """
        broker = self._broker
        if broker is not None and not self._closed:
            return broker
        with self._lock:
            if self._closed:
                raise BrokerClosed("this Scheduler is closed; create a new one")
            if self._broker is None:
                url = self.settings.broker_url
                self._broker = open_broker(url, **self._clock_kwargs())
                _log.debug("opened broker %s", url)
            return self._broker

    def _broker_label(self) -> str:
        """The broker for ``repr``: its URL when this app opens it, else the adapter."""
        return repr(self.settings.broker_url if self._owns_broker else self._broker)

    @contextlib.contextmanager
    def use_broker(
        self, broker: BrokerAdapter, *, clock: Clock | None = None
    ) -> Iterator[BrokerAdapter]:
        """Send through ``broker`` (and read time from ``clock``, if given) inside the
        ``with`` block, then restore what was there: how a test points an app built at
        import at a ``memory://`` broker (the ``chronoq`` fixture of
        :mod:`workers.testing` does). ``broker`` is used as given, never closed here;
        a broker this app had opened stays open for after the block.

        :raises TypeError: for a ``broker`` that is not a BrokerAdapter.
        :raises BrokerClosed: after :meth:`close`.
        """
        if not isinstance(broker, BrokerAdapter):
            raise TypeError(f"use_broker takes a BrokerAdapter, got {type(broker).__name__}")
        with self._lock:
            if self._closed:
                raise BrokerClosed("this Scheduler is closed; create a new one")
            saved = (self._broker, self._owns_broker, self._clock, self._given_clock)
            saved_async = self._async_client
            self._broker, self._owns_broker, self._async_client = broker, False, None
            if clock is not None:
                self._clock = self._given_clock = clock
        try:
            yield broker
        finally:
            with self._lock:
                clients, self._async_client = self._async_client, saved_async
                self._broker, self._owns_broker, self._clock, self._given_clock = saved
            if clients is not None:  # it wrapped ``broker``: gone with the block
                clients.close()

    # -- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the async clients (see :meth:`aclose`), then the broker if this
        scheduler opened it (a broker passed in is left open). Closing twice is
        harmless; using the broker afterwards raises
        :class:`~broker_adapter.errors.BrokerClosed`.

        Inside a running event loop prefer ``await app.aclose()``: this loop's
        async client then closes before it returns, not as soon as the loop turns.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            broker, self._broker = self._broker, None
            clients, self._async_client = self._async_client, None
        if clients is not None:
            clients.close()
        if broker is not None and self._owns_broker:
            broker.close()

    async def aclose(self) -> None:
        """Close the running loop's async client (awaited), then everything
        :meth:`close` closes, on a thread: the loop never waits for RocksDB or a socket.
        Closing twice is harmless."""
        clients = self._async_client
        if clients is not None:
            await clients.aclose()
        import asyncio  # lazily: import scheduler stays light

        await asyncio.to_thread(self.close)


__all__ = ["AppBroker"]
