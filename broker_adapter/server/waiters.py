"""Waiter: how a thread in :meth:`Link.call <broker_adapter.server.link.Link.call>`
waits for its answer (a bare lock the reader releases), and TimedWaiter, which also
notes when and by which thread the answer was read (for
:mod:`~broker_adapter.server.stage_log`)."""

from __future__ import annotations

import threading
import time
from typing import Any


class Waiter:
    """A sync call waiting for its answer."""

    __slots__ = ("error", "lock", "result")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.lock.release()


class TimedWaiter(Waiter):
    """A waiter that also notes when its answer was read and by which thread."""

    __slots__ = ("read_at", "reader")

    def __init__(self) -> None:
        super().__init__()
        self.read_at = 0.0
        self.reader = 0

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.read_at = time.time()
        self.reader = threading.get_ident()
        super().__call__(result, error)


__all__ = ["TimedWaiter", "Waiter"]
