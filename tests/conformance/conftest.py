"""The conformance suite runs once per adapter listed in :data:`ADAPTERS`.

Each test gets a :class:`Harness`: the broker under test, the ``ManualClock`` it
reads time from, and ``reopen()`` for durability tests. Test bodies use only
the ``BrokerAdapter``/``Consumer`` contract plus the harness, never an adapter's
own API.

Adding an adapter (remote server, Redis) means writing one factory, a function
``(request, workdir) -> AdapterFactory``, and appending an :class:`AdapterSpec`
with ``marks=(pytest.mark.external_service,)`` when it needs a running service.
A factory whose ``open`` cannot share the test's clock or whose data cannot
survive a close sets ``can_reopen=False``; tests that need it then skip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter, Consumer
from broker_adapter.clock import ManualClock
from broker_adapter.errors import BrokerClosed


class AdapterFactory(Protocol):
    """Opens brokers of one adapter on one test's data (same data on every call)."""

    can_reopen: bool

    def open(self, clock: ManualClock) -> BrokerAdapter:
        """A new broker reading time from ``clock``."""
        ...

    def cleanup(self) -> None:
        """Drop the test's data (e.g. flush a Redis db); called after the broker closed."""
        ...


@dataclass
class EmbeddedFactory:
    """The embedded RocksDB broker on a directory under the test's tmp_path."""

    path: Path
    can_reopen: bool = True

    def open(self, clock: ManualClock) -> BrokerAdapter:
        from broker_adapter.embedded import EmbeddedBroker

        return EmbeddedBroker(str(self.path), clock=clock)

    def cleanup(self) -> None:
        """tmp_path is removed by pytest."""


def _embedded(request: pytest.FixtureRequest, workdir: Path) -> AdapterFactory:
    return EmbeddedFactory(workdir / "embedded")


@dataclass
class MemoryFactory:
    """A ``memory://NAME`` broker of the test's own name. The factory holds one more
    handle of it for the test's duration (``keeper``), as an app and a test sharing
    one named broker do, so a reopen sees the same data; nothing survives the
    process, so the durability tests are skipped (:data:`MEMORY_SKIPS`)."""

    name: str
    can_reopen: bool = True
    keeper: BrokerAdapter | None = None

    def open(self, clock: ManualClock) -> BrokerAdapter:
        from broker_adapter.memory import MemoryBroker

        if self.keeper is None:
            self.keeper = MemoryBroker(self.name, clock=clock)
        return MemoryBroker(self.name, clock=clock)

    def cleanup(self) -> None:
        """Close the keeper: the last handle, so the named broker's data goes."""
        if self.keeper is not None:
            self.keeper.close()


def _memory(request: pytest.FixtureRequest, workdir: Path) -> AdapterFactory:
    return MemoryFactory(f"conformance-{request.node.nodeid}")


#: Conformance tests about surviving a restart: ``memory://`` keeps data in this
#: process only, so each is skipped for it with this reason.
MEMORY_SKIPS: dict[str, str] = dict.fromkeys(
    (
        "test_sent_messages_are_durable_across_reopen",
        "test_inflight_message_is_delivered_again_after_reopen",
        "test_abort_is_durable_across_reopen",
    ),
    "memory:// is not durable: its messages live in this process only, so a restart "
    "(which this test's reopen stands for) loses them by design",
)


def _remote(request: pytest.FixtureRequest, workdir: Path) -> AdapterFactory:
    """RemoteBroker against one shared ``--manual-clock`` server subprocess."""
    from tests.server.remote_harness import make_remote

    return make_remote(request, workdir)


def _redis(request: pytest.FixtureRequest, workdir: Path) -> AdapterFactory:
    """RedisBroker on the session's real redis-server (flushed per test)."""
    from tests.redis.harness import make_redis

    return make_redis(request)


@dataclass(frozen=True)
class AdapterSpec:
    """One row of the adapter table: an id, a factory maker and pytest marks."""

    id: str
    make: Callable[[pytest.FixtureRequest, Path], AdapterFactory]
    marks: tuple[Any, ...] = ()
    #: test function name -> why the test does not apply to this adapter
    skips: dict[str, str] = field(default_factory=dict)


#: Every adapter the contract suite runs against. Later:
#: ``AdapterSpec("remote", _remote, marks=(pytest.mark.external_service,))``,
#: ``AdapterSpec("redis", _redis, marks=(pytest.mark.external_service,))``.
ADAPTERS: list[AdapterSpec] = [
    AdapterSpec("embedded", _embedded),
    AdapterSpec("memory", _memory, skips=MEMORY_SKIPS),
    AdapterSpec("remote", _remote, marks=(pytest.mark.external_service,)),
    AdapterSpec("redis", _redis, marks=(pytest.mark.external_service,)),
]


@dataclass
class Harness:
    """The broker under test plus the clock it runs on.

    :ivar broker: the open broker (replaced by :meth:`reopen`).
    :ivar clock: the ``ManualClock`` the broker reads.
    """

    adapter: str
    factory: AdapterFactory
    clock: ManualClock
    broker: BrokerAdapter = field(init=False)
    _consumers: list[Consumer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.broker = self.factory.open(self.clock)

    @property
    def now(self) -> int:
        """The broker's current time, epoch ms."""
        return self.clock.now_ms()

    def advance(self, ms: int) -> int:
        """Move the broker's time forward by ``ms``; returns the new time."""
        return self.clock.advance(ms)

    def consumer(self, group: str, topics: Iterable[str], **kwargs: Any) -> Consumer:
        """``broker.consumer(...)``, closed for you at the end of the test."""
        c = self.broker.consumer(group, list(topics), **kwargs)
        self._consumers.append(c)
        return c

    def reopen(self) -> BrokerAdapter:
        """Close the broker and open a new one on the same data and clock."""
        if not self.factory.can_reopen:
            pytest.skip(f"the {self.adapter} adapter cannot reopen its data")
        self._close_consumers()
        self.broker.close()
        self.broker = self.factory.open(self.clock)
        return self.broker

    def _close_consumers(self) -> None:
        for c in self._consumers:
            try:
                c.close()
            except BrokerClosed:
                pass
        self._consumers.clear()

    def close(self) -> None:
        """Close consumers and broker (both harmless when already closed)."""
        self._close_consumers()
        self.broker.close()


@pytest.fixture(params=[pytest.param(a, id=a.id, marks=a.marks) for a in ADAPTERS])
def harness(
    request: pytest.FixtureRequest, tmp_path: Path, manual_clock: ManualClock
) -> Iterator[Harness]:
    """A fresh broker of each adapter in :data:`ADAPTERS`, on a ManualClock."""
    spec: AdapterSpec = request.param
    reason = spec.skips.get(request.node.originalname)
    if reason is not None:
        pytest.skip(reason)
    factory = spec.make(request, tmp_path)
    h = Harness(spec.id, factory, manual_clock)
    try:
        yield h
    finally:
        h.close()
        factory.cleanup()


@pytest.fixture
def broker(harness: Harness) -> BrokerAdapter:
    """The broker under test (parametrized by adapter through ``harness``)."""
    return harness.broker


# -- the client half, awaitable (test_async_contract.py) -------------------------------


def open_async_of(h: Harness) -> AsyncBrokerAdapter:
    """The awaitable client of ``h``'s broker, opened as an app opens it: for a network
    adapter ``open_async_broker`` on the same server (a native adapter where
    ``ASYNC_ADAPTERS`` has one, else the threaded fallback); for a local one
    (embedded, memory) the harness's own broker on threads, since one process owns
    a RocksDB directory (see ``scheduler.async_client``)."""
    from broker_adapter.threaded_async import ThreadedAsyncBroker
    from broker_adapter.urls import open_async_broker

    if h.adapter == "remote":
        return open_async_broker(h.factory.server.url)  # type: ignore[attr-defined]
    if h.adapter == "redis":  # the client computes due times: it needs the test's clock
        return open_async_broker(h.factory.url, clock=h.clock)  # type: ignore[attr-defined]
    return ThreadedAsyncBroker(h.broker)


@dataclass
class AsyncHarness:
    """An awaitable client (``broker``) on the data of a sync :class:`Harness`
    (``sync``: the clock, consumers, the sync view to check what a call did)."""

    sync: Harness
    broker: AsyncBrokerAdapter

    def run(self, body: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``body()`` on a fresh event loop, closing the client on that loop at
        the end (an async adapter belongs to the loop it was used on)."""

        async def main() -> Any:
            try:
                return await body()
            finally:
                await self.broker.close()

        return asyncio.run(main())


@pytest.fixture
def async_harness(harness: Harness) -> Iterator[AsyncHarness]:
    """An async client of each adapter in :data:`ADAPTERS` (ids as ``harness``)."""
    ah = AsyncHarness(harness, open_async_of(harness))
    try:
        yield ah
    finally:
        if not getattr(ah.broker, "closed", True):  # never ran: nothing bound to a loop
            asyncio.run(ah.broker.close())


@pytest.fixture
def async_broker(async_harness: AsyncHarness) -> AsyncBrokerAdapter:
    """The async client under test (parametrized by adapter through ``harness``)."""
    return async_harness.broker
