"""DispatchHook: what runs around a dispatcher's pull loop (dramatiq's middleware).

The pull loop only pulls, decodes, routes, submits and settles; everything else
that happens per message is a hook: the delivery trace
(:class:`~workers.trace_hook.TraceHook`), keeping held messages invisible
(:class:`~workers.invisibility.InvisibilityKeeper`), timeouts
(:class:`~workers.timeout_watch.TimeoutWatch`) and the cron gate
(:class:`~workers.cron_gate.CronGate`). Pass more with ``Dispatcher(app, hooks=[...])``.

The life of one message, and the calls a hook gets (every method is optional)::

    on_pulled(messages)                   pull thread, once per pull
    admit(run) -> reason | Decision       pull thread; "" lets the run start
    before_start(run, job)                before each job goes to its executor
    after_handoff(run)                    the executor handed the job to another system
    after_job(run, job, error)            each job returned (error: None on success)
    after_run(run)                        the run will start no more jobs
    before_settle(message, job, run, settlement, reason)   every message, once
    after_settle(message, outcome)        the broker call that settled it returned

A cron message may run several occurrences one after the other: one ``before_start``
and ``after_job`` per occurrence. A message settled without a run (undecodable,
unknown job, left to another dispatcher) gets only ``before_settle``, with
``run=None``. Besides: ``on_open(session)`` when the dispatcher joins its group,
``tick()`` before each pull (return how soon to be called again) and
``on_close()`` when it has left.

``before_start`` runs in the pull thread (or, for a cron run's next occurrence, in
the thread that finished the previous one); the ``after_*`` and
``before_settle`` calls run in the thread that finished the job, which may be
any executor's. Hooks must be quick and thread-safe, and must not raise. The
loop calls only the methods a hook overrides (see :class:`HookCalls`), so a
hook costs nothing on the events it ignores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from broker_adapter.base import Consumer
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext
from workers.runs import Run
from workers.settlement import Decision, Settlement


class Session(Protocol):
    """What a hook may know of the dispatcher that joined its group."""

    @property
    def group(self) -> str:
        """The consumer group."""
        ...

    @property
    def topics(self) -> list[str]:
        """The topics it pulls."""
        ...

    @property
    def consumer(self) -> Consumer:
        """Its consumer (for a hook's own broker calls, e.g. ``extend``)."""
        ...

    @property
    def invisible_ms(self) -> int:
        """How long a pulled message stays invisible to the group."""
        ...


class DispatchHook:
    """Base class of the hooks: every method does nothing; override what you need.

    See the module docstring for when each is called and from which thread.
    """

    def on_open(self, session: Session) -> None:
        """The dispatcher joined its group."""

    def on_pulled(self, messages: list[ReceivedMessage]) -> None:
        """A pull returned ``messages`` (never empty)."""

    def admit(self, run: Run) -> str | Decision:
        """Whether ``run`` may start now: ``""``, or why not (it is then skipped:
        acked in this group with that reason), or a :class:`Decision` to settle it
        otherwise (e.g. ``DEFER``: released for later, as a run over a per-job
        limit is). The first refusal wins; every admitted or refused run gets
        :meth:`after_run`."""
        return ""

    def before_start(self, run: Run, job: JobContext) -> None:
        """``job`` (``run``'s current job) is about to go to its executor."""

    def after_handoff(self, run: Run) -> None:
        """``run``'s job now runs in another system; its slot is free, its message
        stays in flight until the outcome comes."""

    def after_job(self, run: Run, job: JobContext, error: BaseException | None) -> None:
        """``job`` returned (``error`` ``None``), raised ``error``, or was cancelled
        before it started (a :class:`~concurrent.futures.CancelledError`)."""

    def after_run(self, run: Run) -> None:
        """``run`` starts no more jobs (its message may be settled already)."""

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        """``message`` is about to be settled as ``settlement`` for ``reason``.

        :param job: the job's name (``None`` when the body could not be decoded).
        :param run: its run, or ``None`` when it never got one.
        """

    def after_settle(self, message: ReceivedMessage, outcome: str) -> None:
        """The broker call that settled ``message`` returned; ``outcome``: what
        happened, in the words of the job's log line (``"ok"`` for an ack)."""

    def tick(self) -> int | None:
        """Periodic work in the pull thread; ms until it wants to be called again
        (bounds the next pull's wait), or ``None`` for no wish."""
        return None

    def on_close(self) -> None:
        """The dispatcher left its group (after its drain)."""


def _overriding(hooks: Iterable[DispatchHook], name: str) -> tuple[Callable[..., Any], ...]:
    default = getattr(DispatchHook, name)
    return tuple(getattr(h, name) for h in hooks if getattr(type(h), name, default) is not default)


class HookCalls:
    """The bound methods of ``hooks`` that override each :class:`DispatchHook`
    method, in hook order: the loop iterates these, never a hook that does nothing.

    :param hooks: the hooks, in the order they are called.
    """

    def __init__(self, hooks: Iterable[DispatchHook]) -> None:
        self.hooks: tuple[DispatchHook, ...] = tuple(hooks)
        hs = self.hooks
        self.on_open: tuple[Callable[[Session], None], ...] = _overriding(hs, "on_open")
        self.on_pulled: tuple[Callable[[list[ReceivedMessage]], None], ...] = _overriding(
            hs, "on_pulled"
        )
        self.admit: tuple[Callable[[Run], str | Decision], ...] = _overriding(hs, "admit")
        self.before_start: tuple[Callable[[Run, JobContext], None], ...] = _overriding(
            hs, "before_start"
        )
        self.after_handoff: tuple[Callable[[Run], None], ...] = _overriding(hs, "after_handoff")
        self.after_job: tuple[Callable[[Run, JobContext, BaseException | None], None], ...] = (
            _overriding(hs, "after_job")
        )
        self.after_run: tuple[Callable[[Run], None], ...] = _overriding(hs, "after_run")
        self.before_settle: tuple[
            Callable[[ReceivedMessage, str | None, Run | None, Settlement, str], None], ...
        ] = _overriding(hs, "before_settle")
        self.after_settle: tuple[Callable[[ReceivedMessage, str], None], ...] = _overriding(
            hs, "after_settle"
        )
        self.tick: tuple[Callable[[], int | None], ...] = _overriding(hs, "tick")
        self.on_close: tuple[Callable[[], None], ...] = _overriding(hs, "on_close")


__all__ = ["DispatchHook", "HookCalls", "Session"]
