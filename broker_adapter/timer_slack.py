"""Tight timed waits for the threads that fire due messages (Linux; issue 16).

Linux lets a timed wait end up to the thread's *timer slack* late (50 us by
default), so that wake-ups can be merged. A thread that waits for a due
millisecond does not want that: with the slack at 1 ns a 0.5 ms
``Condition.wait`` overshot by 53 us at the median instead of 104 us on this
kind of VM. :func:`tighten` sets it for the calling thread (``prctl
PR_SET_TIMERSLACK``): the embedded wheel thread and the Redis firer's threads
call it when they start, and an embedded pull that fires due messages itself
calls it once per thread. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

_PR_SET_TIMERSLACK = 29
_local = threading.local()


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        func: Callable[..., int] = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    return func


_PRCTL = _prctl()


def tighten() -> bool:
    """Set this thread's timer slack to 1 ns, once per thread; whether it is set.

    Harmless to call again (the first call's answer), and a no-op (``False``) off
    Linux or if the call fails.
    """
    done: bool | None = getattr(_local, "done", None)
    if done is None:
        done = _local.done = _PRCTL is not None and _PRCTL(_PR_SET_TIMERSLACK, 1, 0, 0, 0) == 0
    return done


__all__ = ["tighten"]
