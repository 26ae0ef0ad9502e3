"""The chronoq pytest plugin: fixtures to test an app's timed jobs.

Installed with chronoq (entry point ``pytest11``), so these fixtures are there in
every test session:

``chronoq_clock``
    a :class:`~broker_adapter.clock.ManualClock`;
``chronoq_broker``
    a fresh private ``memory://`` broker on that clock;
``chronoq_app``
    the app under test: by default a new :class:`~scheduler.Scheduler` on that
    broker. To test *your* app (``app = Scheduler()`` built at import), override
    it in your ``conftest.py``::

        @pytest.fixture
        def chronoq_app():
            return shop.jobs.app

``chronoq``
    a :class:`~workers.testing.ChronoqKit` on ``chronoq_app``: ``advance(...)``,
    ``run_until_idle()``, ``ran``, ``failed``, ``pending(job)``,
    ``dead_letters(job)``. While the test runs the app sends through
    ``chronoq_broker`` and reads ``chronoq_clock``; afterwards it has its own back.

An ``async def`` test that uses ``chronoq`` runs on a new event loop (unless
pytest-asyncio or anyio runs it); await ``chronoq.advance_async(...)`` there.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported in the fixtures: every pytest session loads this plugin
    from broker_adapter.clock import ManualClock
    from broker_adapter.memory import MemoryBroker
    from scheduler import Scheduler
    from workers.testing import ChronoqKit

#: Where ``chronoq_clock`` starts: 2023-11-14T22:13:20Z.
START_MS = 1_700_000_000_000


@pytest.fixture
def chronoq_clock() -> ManualClock:
    """A clock that moves only when the test advances it."""
    from broker_adapter.clock import ManualClock

    return ManualClock(START_MS)


@pytest.fixture
def chronoq_broker(chronoq_clock: ManualClock) -> Iterator[MemoryBroker]:
    """A fresh private ``memory://`` broker on ``chronoq_clock``."""
    from broker_adapter.memory import MemoryBroker

    with MemoryBroker(clock=chronoq_clock) as broker:
        yield broker


@pytest.fixture
def chronoq_app(chronoq_broker: MemoryBroker, chronoq_clock: ManualClock) -> Iterator[Scheduler]:
    """The app under test: a new Scheduler on ``chronoq_broker`` (override it to return
    your own app)."""
    from scheduler import Scheduler

    with Scheduler(chronoq_broker, clock=chronoq_clock) as app:
        yield app


@pytest.fixture
def chronoq(
    chronoq_app: Scheduler, chronoq_broker: MemoryBroker, chronoq_clock: ManualClock
) -> Iterator[ChronoqKit]:
    """The kit: ``chronoq_app`` bound to ``chronoq_broker`` and ``chronoq_clock``."""
    from workers.testing import ChronoqKit

    with ChronoqKit(chronoq_app, broker=chronoq_broker, clock=chronoq_clock) as kit:
        yield kit


@pytest.hookimpl
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test that uses ``chronoq`` on a new event loop, unless an
    async plugin (pytest-asyncio, anyio) claims it."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj) or "chronoq" not in pyfuncitem.fixturenames:
        return None
    if any(pyfuncitem.get_closest_marker(m) for m in ("asyncio", "anyio", "trio")):
        return None
    from workers.testing import ChronoqKit

    if not isinstance(pyfuncitem.funcargs.get("chronoq"), ChronoqKit):
        return None  # a project's own fixture of that name: not ours to run
    params = inspect.signature(pyfuncitem.obj).parameters
    args = {name: pyfuncitem.funcargs[name] for name in params if name in pyfuncitem.funcargs}
    asyncio.run(pyfuncitem.obj(**args))
    return True
