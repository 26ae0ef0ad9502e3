"""Settling a message (ack, retry, dead letter, release) and the log line per job run.

Each job run gets one log line on the ``chronoq.workers.Dispatcher`` logger,
INFO when it succeeded, WARNING otherwise::

    job shop.close_order msg=0000018c...0001 attempt=1 late=1.8ms took=0.3ms: ok
    job shop.charge msg=... attempt=2 late=3.0ms took=12.1ms: failed (ValueError: declined); retry in 30000 ms
    job nightly msg=... attempt=1 late=0.9ms took=1.2ms cron=2024-03-10T05:00:00+08:00: ok
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from broker_adapter.base import Consumer
from broker_adapter.errors import ChronoqError
from broker_adapter.results import ReceivedMessage
from workers.context import JobContext

#: Longest error text recorded as a dead-letter or retry reason.
MAX_REASON_CHARS = 1000


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` for ``exc`` (just the type name when the message is empty)."""
    text = str(exc)
    name = type(exc).__name__
    out = f"{name}: {text}" if text else name
    return out if len(out) <= MAX_REASON_CHARS else out[: MAX_REASON_CHARS - 3] + "..."


class Settler:
    """Settles messages of one consumer and says what happened, in words.

    Broker errors (a broker closed under a late job) are logged, not raised: the
    message is then redelivered after its invisible time, which is the safe side.

    :param consumer: the dispatcher's consumer.
    :param log: where to report broker errors.
    """

    def __init__(self, consumer: Consumer, log: logging.Logger) -> None:
        self._consumer = consumer
        self._log = log

    def ack(self, m: ReceivedMessage) -> bool:
        """Ack ``m``; ``False`` when it was no longer in flight or the broker failed."""
        try:
            return self._consumer.ack(m)
        except ChronoqError as e:
            self._log.warning("msg=%s: ack failed (%s); it will be redelivered", m.msg_id, e)
            return False

    def nack(self, m: ReceivedMessage, delay_ms: int, reason: str) -> bool:
        """Nack ``m`` for a retry after ``delay_ms``; ``False`` when that did not happen."""
        try:
            return self._consumer.nack(m, delay_ms=delay_ms, reason=reason)
        except ChronoqError as e:
            self._log.warning("msg=%s: nack failed (%s); it will be redelivered", m.msg_id, e)
            return False

    def settle(self, m: ReceivedMessage, how: str, reason: str, delay_ms: int) -> str:
        """Settle ``m`` by ``how``: ``ack``, ``retry`` (nack after ``delay_ms``), ``dead``,
        ``release`` (give back now without counting an attempt: the job never started,
        or still runs elsewhere) or ``abandon`` (give back now, counting the attempt:
        the job started here and was stopped).

        :returns: the outcome, as shown in the job's log line.
        """
        try:
            if how == "ack":
                done = self._consumer.ack(m)
                outcome = "ok"
            elif how == "retry":
                done = self._consumer.nack(m, delay_ms=delay_ms, reason=reason)
                outcome = f"failed ({reason}); retry in {delay_ms} ms"
            elif how == "dead":
                done = self._consumer.dead_letter(m, reason)
                outcome = f"dead-lettered: {reason}"
            elif how == "release":
                done = self._consumer.release(m, 0)
                outcome = reason
            else:
                done = self._consumer.nack(m, delay_ms=0, reason=reason)
                outcome = reason
        except ChronoqError as e:
            return f"{how} failed ({e}); the message will be redelivered"
        if not done:
            outcome += " (the message was no longer in flight here: redelivered meanwhile)"
        return outcome


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}ms"


def log_run(
    log: logging.Logger,
    job: JobContext,
    outcome: str,
    end_mono: float,
    exc: BaseException | None = None,
) -> None:
    """Log the one line of a finished (or given up) job run; see the module docstring."""
    ok = outcome == "ok"
    level = logging.INFO if ok else logging.WARNING
    if not log.isEnabledFor(level):
        return
    started_ms, started_mono = job.started_ms, job.started_mono
    late = None if started_ms is None else started_ms - job.due_ms
    took = None if started_mono is None else (end_mono - started_mono) * 1000
    cron = ""
    if job.fire_ms is not None:
        cron = " cron=" + datetime.fromtimestamp(job.fire_ms / 1000, UTC).isoformat()
    log.log(
        level,
        "job %s msg=%s attempt=%d late=%s took=%s%s: %s",
        job.spec.name,
        job.message.msg_id,
        job.message.attempts,
        _ms(late),
        _ms(took),
        cron,
        outcome,
        exc_info=None if ok or exc is None or isinstance(exc, TimeoutError) else exc,
    )


__all__ = ["MAX_REASON_CHARS", "Settler", "describe_error", "log_run"]
