"""WheelThread: the embedded broker's background thread that turns the timing wheel.

Each turn fires one chunk of due messages (:meth:`GroupRegistry.fire_due`) and
tells the groups; when nothing is due it redelivers messages whose invisible
time passed and persists cursors (:meth:`GroupRegistry.housekeep`), trims what
retention lets go (:meth:`Retention.trim`, a chunk per turn), and sleeps until
the next due time, the next invisible-time deadline, or a kick. A due time that a
waiting pull fires itself (:meth:`BrokerCore.take_fire_duty`) it sleeps past by
:data:`~.core.FIRE_DUTY_GRACE_MS`, and fires then only what no pull did; fires
that pulls held (:mod:`~.fire_writes`) and did not write in their time it writes.
"""

from __future__ import annotations

import logging
import threading
import time

from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.retention import Retention
from broker_adapter.timer_slack import tighten as tighten_timer_slack

log = logging.getLogger("chronoq.broker_adapter.EmbeddedBroker")
log.addHandler(logging.NullHandler())

#: Broker time between two retention rounds.
TRIM_INTERVAL_MS = 60_000
# Longest sleep of an idle wheel thread: a bound on a missed wake-up.
_IDLE_S = 0.2


class WheelThread:
    """Fires due messages and does the broker's housekeeping on one daemon thread.

    :param core: the broker's core.
    :param groups: told what fired; housekept when idle.
    :param retention: trimmed when idle, every :data:`TRIM_INTERVAL_MS` of broker time.
    :param name: the thread's name.
    """

    def __init__(
        self,
        core: BrokerCore,
        groups: GroupRegistry,
        retention: Retention,
        name: str,
    ) -> None:
        self._core = core
        self._groups = groups
        self._retention = retention
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start turning the wheel."""
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current turn and wait up to ``timeout_s`` for the thread."""
        self._stopping = True
        self._core.kick()
        self._thread.join(timeout=timeout_s)

    def fire_due(self) -> int:
        """Fire one chunk of due messages and tell the groups; returns how many fired."""
        return self._groups.fire_due()

    def _run(self) -> None:
        tighten_timer_slack()  # wake at a due millisecond, not 50 us after it (Linux)
        core = self._core
        next_trim = 0  # broker time: a ManualClock drives trimming in tests
        while not self._stopping:
            try:
                if not core.resume_writes():  # a full disk: wait for room, quietly
                    core.wait_for_work(core.now() + 1000, _IDLE_S)
                    continue
                if self.fire_due():
                    time.sleep(0)  # let senders and consumers in between chunks
                    continue
                core.write_held_old()  # what no pull wrote in its time
                now = core.now()
                deadline = self._groups.housekeep(now)
                if now >= next_trim:  # a round in chunks, firing in between
                    if not self._retention.trim(now):
                        time.sleep(0)
                        continue
                    next_trim = now + TRIM_INTERVAL_MS
                due = core.next_due_ms()
                if due is not None:
                    due = core.wheel_wake_ms(due)
                held = core.held_write_ms()
                wake = min(x for x in (due, deadline, held, now + 1000) if x is not None)
                core.wait_for_work(wake, _IDLE_S)
            except Exception:  # the wheel must keep turning; log and go on
                if self._stopping:
                    return
                log.exception("wheel thread error on %s", core.store.path)
                time.sleep(0.05)


__all__ = ["TRIM_INTERVAL_MS", "WheelThread"]
