"""TraceHook: a dispatch hook that records each delivery in a delivery trace.

The trace itself (:class:`workers.trace.DeliveryTrace`, its file format) only
queues what it is told; this hook tells it when a pull returned, when a job went
to its executor and how its message was settled, with the dispatcher's clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker_adapter.results import ReceivedMessage
from workers.context import JobContext
from workers.hooks import DispatchHook
from workers.runs import Run
from workers.settlement import Settlement


class TraceSink(Protocol):
    """What the hook needs of a delivery trace (a :class:`workers.trace.DeliveryTrace`)."""

    def received(self, messages: list[ReceivedMessage], now_ms: float) -> None:
        """A pull returned ``messages`` at ``now_ms``."""
        ...

    def dispatched(self, m: ReceivedMessage, now_ms: float) -> None:
        """``m`` was handed to its executor at ``now_ms``."""
        ...

    def finished(
        self,
        m: ReceivedMessage,
        job: str | None,
        group: str,
        how: str,
        error: str | None,
        started_ms: float | None,
        now_ms: float,
    ) -> None:
        """``m`` was settled by ``how`` (``ack``, ``retry``, ``dead``, ``release``,
        ``abandon`` or ``skip``)."""
        ...


#: The trace's word for each settlement (a deferred job is released, as the broker sees it).
TRACE_VERBS: dict[Settlement, str] = {
    Settlement.ACK: "ack",
    Settlement.RETRY: "retry",
    Settlement.DEAD: "dead",
    Settlement.RELEASE: "release",
    Settlement.DEFER: "release",
    Settlement.ABANDON: "abandon",
    Settlement.SKIP: "skip",
}


class TraceHook(DispatchHook):
    """Feeds ``trace`` the deliveries of one dispatcher.

    :param trace: where the deliveries go.
    :param group: the dispatcher's consumer group, recorded per delivery.
    :param clock_ms: the dispatcher's clock (epoch ms).
    """

    def __init__(self, trace: TraceSink, group: str, clock_ms: Callable[[], float]) -> None:
        self.trace = trace
        self._group = group
        self._clock_ms = clock_ms

    def on_pulled(self, messages: list[ReceivedMessage]) -> None:
        """Record when the pull returned."""
        self.trace.received(messages, self._clock_ms())

    def before_start(self, run: Run, job: JobContext) -> None:
        """Record when the job went to its executor."""
        self.trace.dispatched(run.message, self._clock_ms())

    def before_settle(
        self,
        message: ReceivedMessage,
        job: str | None,
        run: Run | None,
        settlement: Settlement,
        reason: str,
    ) -> None:
        """Record the settlement (and when the body started, if it did)."""
        started = None if run is None or settlement is Settlement.DEFER else run.job.started_ms
        self.trace.finished(
            message,
            job,
            self._group,
            TRACE_VERBS[settlement],
            reason,
            started,
            self._clock_ms(),
        )


__all__ = ["TRACE_VERBS", "TraceHook", "TraceSink"]
