"""Settling a message (:class:`~workers.settlement.Settlement`) and the log line per job run.

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
from workers.settlement import Settlement, UnknownSettlement

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

    Broker errors (a broker closed under a late job) are not raised: the message
    is then redelivered after its invisible time, which is the safe side, and the
    returned words say so.

    :param consumer: the dispatcher's consumer.
    :param log: where a broker error is reported when :meth:`settle` is asked to warn.
    """

    def __init__(self, consumer: Consumer, log: logging.Logger) -> None:
        self._consumer = consumer
        self._log = log

    def settle(
        self,
        m: ReceivedMessage,
        settlement: Settlement,
        reason: str = "",
        delay_ms: int = 0,
        *,
        warn: bool = False,
    ) -> str:
        """Settle ``m`` as ``settlement`` says (see :class:`~workers.settlement.Settlement`).

        :param reason: why; recorded by the broker for a retry or a dead letter.
        :param delay_ms: for ``RETRY`` and ``DEFER``: how long until it is due again.
        :param warn: also log a broker error as a WARNING (for messages that get no
            job log line of their own).
        :returns: the outcome, as shown in the job's log line.
        :raises UnknownSettlement: for anything but a :class:`Settlement` member.
        """
        consumer = self._consumer
        try:
            match settlement:  # the common case first: one comparison per success
                case Settlement.ACK:
                    done = consumer.ack(m)
                    outcome = "ok"
                case Settlement.RETRY:
                    done = consumer.nack(m, delay_ms=delay_ms, reason=reason)
                    outcome = f"failed ({reason}); retry in {delay_ms} ms"
                case Settlement.DEAD:
                    done = consumer.dead_letter(m, reason)
                    outcome = f"dead-lettered: {reason}"
                case Settlement.RELEASE:
                    done = consumer.release(m, 0)
                    outcome = reason
                case Settlement.DEFER:
                    done = consumer.release(m, delay_ms)
                    outcome = f"not started ({reason}); released, retry in {delay_ms} ms"
                case Settlement.ABANDON:
                    done = consumer.nack(m, delay_ms=0, reason=reason)
                    outcome = reason
                case Settlement.SKIP:
                    done = consumer.ack(m)
                    outcome = reason
                case _:
                    raise UnknownSettlement(settlement)
        except UnknownSettlement:
            raise
        except ChronoqError as e:  # the broker failed: the message comes back on its own
            verb = _VERBS[settlement]
            if warn:
                self._log.warning(
                    "msg=%s: %s failed (%s); it will be redelivered", m.msg_id, verb, e
                )
            return f"{verb} failed ({e}); the message will be redelivered"
        if not done:
            outcome += " (the message was no longer in flight here: redelivered meanwhile)"
        return outcome


#: The word for each settlement's broker operation, in a failure's text.
_VERBS = {
    Settlement.ACK: "ack",
    Settlement.RETRY: "retry",
    Settlement.DEAD: "dead",
    Settlement.RELEASE: "release",
    Settlement.DEFER: "release",
    Settlement.ABANDON: "abandon",
    Settlement.SKIP: "ack",
}


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
