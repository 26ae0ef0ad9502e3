"""InlineRuns: the pulling thread runs the local jobs of a pull itself (issue 16).

Handing a job to a pool thread costs that thread two wake-ups (its queue, then the
GIL once the pulling thread blocks) and puts the hand-off on the job's start: on
a 2-core VM ~40 us of CPU and ~0.1 ms per job, more than a short job's body.
So :meth:`InlineRuns.step` pulls as :meth:`PullLoop.step
<workers.pull_loop.PullLoop.step>` does and runs the local jobs
(``executor="local"``) of the pull itself, one after the other, as long as at
most the executor's ``max_workers`` jobs hold a slot (the kept ones included: no
more jobs run at once than without it); the others go to their executors as usual.

Leader/follower, with the follower woken only when it is needed: the pulling
thread holds the *pull role* (a lock) while it pulls and gives it up while it
runs a job. A watch thread looks every ``period_s`` (only while inline runs
happen; it parks otherwise). When the same inline run is still going at two
looks in a row, the watch has one pool thread wait until that run ends (so the
job counts against ``max_workers`` like a pool job), queues the kept jobs not
started yet on the pool, takes the role and pulls,
handing every job to the pool, until the run ends; the pulling thread then waits
for the role back. A job whose inline runs took longer than ``long_s`` twice is
not run inline again by this dispatcher (:attr:`PullLoop.long_jobs
<workers.pull_loop.PullLoop.long_jobs>`): a long job delays the jobs due behind
it by at most ~2 x ``period_s``, twice.

The guarantees are the pool's: the run is held and settled exactly as a pool
thread settles it (its done callback, in the running thread); timeouts, the
invisibility keeper and other hooks run in whichever thread pulls; a stop
while the pulling thread runs a job has the watch drain (a job that does not
finish is released and cancelled after the drain timeout, as on the pool). A job
run inline runs in the dispatcher's thread (thread-local state,
:func:`threading.current_thread`); ``Dispatcher(inline_jobs=False)`` turns it off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from broker_adapter.errors import ChronoqError
from workers.executors.local import LocalExecutor, QueuedCall
from workers.pull_loop import PullLoop

#: How often the watch looks at a running inline job, s.
DEFAULT_PERIOD_S = 0.02
#: A job whose inline runs took longer than this twice is not run inline again, s.
DEFAULT_LONG_S = 0.005
#: Inline runs longer than ``long_s`` after which a job is not run inline again.
_STRIKES = 2
#: Looks without a new inline run before the watch parks.
_QUIET_LOOKS = 50


class InlineRuns:
    """Drives a :class:`~workers.pull_loop.PullLoop` for one pulling thread, running
    the local jobs of each pull in that thread; see the module docstring.

    :param loop: the joined loop.
    :param stopping: whether the dispatcher is stopping.
    :param drain: the dispatcher's drain, for the watch to call when it stops while
        the pulling thread is in a job.
    :param log: the dispatcher's logger.
    :param period_s: how often the watch looks at a running inline job.
    :param long_s: a job whose inline runs took longer than this twice runs on the pool.
    """

    def __init__(
        self,
        loop: PullLoop,
        stopping: Callable[[], bool],
        drain: Callable[[], object],
        log: logging.Logger,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        long_s: float = DEFAULT_LONG_S,
    ) -> None:
        self._loop = loop
        self._stopping = stopping
        self._drain = drain
        self._log = log
        self._period = period_s
        self._long = long_s
        self._role = threading.Lock()  # the pull role
        # The inline run going on (its number, 0 when none), the executor whose
        # thread it stands for, and the event that frees a thread held for it; the
        # watch reads and changes them under _turn, and so does a run's end.
        self._turn = threading.Lock()
        self._running = 0
        self._executor: LocalExecutor | None = None
        self._kept: list[tuple[QueuedCall, str, LocalExecutor]] = []  # left to run here
        self._held: threading.Event | None = None
        self._runs = 0  # inline runs so far
        self._active = threading.Event()  # the watch looks while set, parks otherwise
        self._closing = threading.Event()
        self._watch: threading.Thread | None = None
        self._strikes: dict[str, int] = {}  # inline runs longer than long_s, per job
        #: Times the watch pulled because an inline run outlasted ``period_s``.
        self.reliefs = 0

    def step(self, wait_ms: int) -> int:
        """:meth:`PullLoop.step <workers.pull_loop.PullLoop.step>` with the pull role,
        then the kept job, if any, run here; returns messages pulled (or -1)."""
        with self._role:
            got = self._loop.step(wait_ms, inline=True)
            kept = self._loop.take_inline()
        if kept:
            self._kept = kept
            turn = self._turn
            while True:
                with turn:  # the watch may have queued the rest on the pool meanwhile
                    if not kept:
                        break
                    call, name, executor = kept.pop(0)
                    self._runs += 1
                    self._executor = executor
                    self._running = self._runs
                self._run(call, name)
        return got

    def _run(self, call: QueuedCall, name: str) -> None:
        if not self._active.is_set():
            self._start_watch()
        t0 = time.monotonic()
        try:
            call.run(here=True)
        finally:
            with self._turn:
                self._running = 0
                held, self._held = self._held, None
            if held is not None:
                held.set()  # the pool thread held for this run is free again
            if time.monotonic() - t0 > self._long:
                self._ran_long(name)

    def _ran_long(self, name: str) -> None:
        # Twice, not once: a short job preempted on a busy machine can take as long.
        strikes = self._strikes[name] = self._strikes.get(name, 0) + 1
        if strikes >= _STRIKES:
            self._loop.long_jobs.add(name)
            self._log.info("job %s ran longer than %g s: not run inline again", name, self._long)

    def _start_watch(self) -> None:
        if self._watch is None:
            self._watch = threading.Thread(
                target=self._look, name="chronoq-inline-watch", daemon=True
            )
            self._watch.start()
        self._active.set()

    def _look(self) -> None:
        seen = 0  # the inline run seen going on at the last look
        runs_seen = self._runs
        quiet = 0
        while not self._closing.is_set():
            self._active.wait()
            if self._closing.wait(self._period):
                return
            with self._turn:
                running = self._running
                drain = running != 0 and self._stopping()
                if running and running == seen and not drain:
                    self._hold_thread()
                    self._queue_kept()
            if drain:
                # The pulling thread is in a job and cannot drain: drain for it. It
                # sees the stop when the job returns, so it pulls no more.
                self._drain()
                return
            if running and running == seen:
                self._relieve(running)
                running = 0
            seen = running
            runs = self._runs
            quiet = 0 if runs != runs_seen or self._running else quiet + 1
            runs_seen = runs
            if quiet >= _QUIET_LOOKS:
                quiet = 0
                self._active.clear()
                if self._runs != runs_seen:  # one started meanwhile: keep looking
                    self._active.set()

    def _hold_thread(self) -> None:
        """Have a pool thread wait until the inline run ends (``_turn`` held), so the
        pool runs one job fewer at once meanwhile."""
        executor = self._executor
        if executor is None or self._held is not None:
            return
        held = threading.Event()
        try:
            executor.occupy(held)
        except RuntimeError:  # shut down: no thread to hold, no job to start either
            return
        self._held = held

    def _queue_kept(self) -> None:
        """Queue the jobs the pulling thread kept and has not started on the pool
        (``_turn`` held): they would wait for the job it is stuck in."""
        kept = self._kept
        while kept:
            call, _name, executor = kept.pop(0)
            try:
                executor.queue(call)
            except RuntimeError:  # shut down: the drain releases its run
                call.cancel()

    def _relieve(self, running: int) -> None:
        """Pull while inline run ``running`` goes on (its thread is still in the job)."""
        if not self._role.acquire(blocking=False):
            return  # the pulling thread is back at pulling
        self.reliefs += 1
        wait_ms = max(1, int(self._period * 1000))
        try:
            while self._running == running and not self._closing.is_set() and not self._stopping():
                try:
                    self._loop.step(wait_ms)
                except ChronoqError as e:  # e.g. the broker is unreachable: look again soon
                    self._log.warning("pull while a job runs inline failed: %s", e)
                    self._closing.wait(self._period)
        finally:
            self._role.release()

    def close(self) -> None:
        """End the watch (waiting for a pull or drain of its own to end)."""
        self._closing.set()
        self._active.set()
        if self._watch is not None:
            self._watch.join()


__all__ = ["DEFAULT_LONG_S", "DEFAULT_PERIOD_S", "InlineRuns"]
