"""Short CPU slices for the thread that starts jobs on time (Linux EEVDF; issue 16).

A thread that sleeps until a job's due time must run the moment its timer
fires. When both cores of a small VM are busy, Linux's EEVDF scheduler lets the
running task finish its slice first (1.4 ms here: 0.7 ms times 1 + log2 of the
CPU count), so such a wake-up waited up to that long in the run queue:
``bench/start_tail_probe.py`` found ~0.8 ms of run-queue delay in the
dispatcher's late wake-ups while other benches ran. A thread with a shorter
slice gets an earlier deadline and preempts a task with a longer one when it
wakes (Linux >= 6.12: ``sched_setattr`` with ``sched_runtime`` for
``SCHED_OTHER``; no privilege needed, the thread's CPU share stays what its nice
value gives). Measured here it did not pay: on a quiet VM the P99's wake-ups had
no run-queue delay (the wheel's refill was the cause), and in paired runs at
N=20k a 100 us slice cost ~8 % more CPU per job and a slightly later P50 and
P99, so :class:`~workers.dispatcher.Dispatcher` asks for it only when told
(``wake_slice_us``).

:func:`shorten` sets it for the calling thread and returns an undo; anywhere it
cannot (another OS or CPU, an older kernel, a real-time or batch policy, a
seccomp filter) it does nothing.
"""

from __future__ import annotations

import ctypes
import platform
import struct
import sys
from collections.abc import Callable

#: A slice to ask for, us (the kernel's minimum is 100).
DEFAULT_SLICE_US = 100

# struct sched_attr (SCHED_ATTR_SIZE_VER1): size, policy, flags, nice, priority,
# runtime, deadline, period (ns), util_min, util_max.
_ATTR = struct.Struct("IIQiIQQQII")
_SCHED_OTHER = 0
_RESET_ON_FORK = 0x01
_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # (sched_setattr, sched_getattr)


def _syscall() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux") or platform.machine() not in _CALLS:
        return None
    try:
        func: Callable[..., int] = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    return func


_SYSCALL = _syscall()


def _get() -> tuple[int, ...] | None:
    """This thread's ``sched_attr`` fields, or ``None`` when it cannot be read."""
    if _SYSCALL is None:
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if _SYSCALL(_CALLS[platform.machine()][1], 0, buf, _ATTR.size, 0) != 0:
        return None
    return _ATTR.unpack(buf.raw)


def _set(fields: tuple[int, ...]) -> bool:
    assert _SYSCALL is not None
    buf = ctypes.create_string_buffer(_ATTR.pack(*fields), _ATTR.size)
    return _SYSCALL(_CALLS[platform.machine()][0], 0, buf, 0) == 0


def current_slice_us() -> int | None:
    """The calling thread's slice in us, or ``None`` where it is not known."""
    attr = _get()
    return None if attr is None or attr[1] != _SCHED_OTHER else attr[5] // 1000


def shorten(slice_us: int = DEFAULT_SLICE_US) -> Callable[[], None]:
    """Ask for ``slice_us`` of CPU per turn for the calling thread (see the module
    docstring); returns a function that puts the thread's former slice back (a
    no-op when nothing was changed).

    :param slice_us: the slice; the kernel keeps it within 100 us to 100 ms.
    """
    attr = _get()
    if attr is None or attr[1] != _SCHED_OTHER or attr[5] == slice_us * 1000:
        return _nothing
    size, policy, flags, nice, prio, runtime, *_rest = attr
    flags &= _RESET_ON_FORK  # the one flag a SCHED_OTHER thread keeps
    if not _set((size, policy, flags, nice, prio, slice_us * 1000, 0, 0, 0, 0)):
        return _nothing

    def undo() -> None:
        now = _get()  # keep a nice value changed meanwhile
        if now is not None:
            _set((now[0], now[1], flags, now[3], now[4], runtime, 0, 0, 0, 0))

    return undo


def _nothing() -> None:
    return None


__all__ = ["DEFAULT_SLICE_US", "current_slice_us", "shorten"]
