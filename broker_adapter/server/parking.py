"""Parked: a connection's requests that wait on a server pool, counted and bounded.

A long-poll ``pull`` or a slow request (``abort_prefix``) of a connection runs on
one of the server's pools and answers itself when it ends, so the connection's
reader goes on meanwhile. This counts them: the reader waits for room once
``limit`` are parked (TCP then pushes back on the client), and a drain waits
while slow ones run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor


class Parked:
    """The requests of one connection running on a pool.

    :param limit: how many may be parked at once before :meth:`wait_for_room` waits.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._cond = threading.Condition(threading.Lock())
        self.count = 0
        #: Slow requests among them (a drain waits for these).
        self.slow = 0

    @property
    def full(self) -> bool:
        """Whether ``limit`` requests are parked."""
        return self.count >= self._limit

    def wait_for_room(self, closed: Callable[[], bool]) -> None:
        """Wait until fewer than ``limit`` are parked, or ``closed()`` says to stop."""
        with self._cond:
            while self.count >= self._limit and not closed():
                self._cond.wait(1.0)

    def run(self, pool: Executor, fn: Callable[[], None], slow: bool = False) -> bool:
        """Run ``fn`` on ``pool``, counted as parked until it returns; ``False`` (nothing
        run) when the pool is shut down (the server is stopping)."""

        def parked() -> None:
            try:
                fn()
            finally:
                self._change(-1, slow)

        self._change(1, slow)
        try:
            pool.submit(parked)
        except RuntimeError:
            self._change(-1, slow)
            return False
        return True

    def _change(self, by: int, slow: bool) -> None:
        with self._cond:
            self.count += by
            if slow:
                self.slow += by
            if by < 0:
                self._cond.notify()


__all__ = ["Parked"]
