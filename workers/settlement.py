"""How a message is settled: the :class:`Settlement` kinds and a :class:`Decision`.

A dispatcher settles every message it pulls exactly once, in one of these ways.
Each kind names one broker operation and one meaning; the words a job's log line
shows for it are built by :class:`workers.outcomes.Settler`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker_adapter.errors import ChronoqError


class Settlement(enum.Enum):
    """The ways a pulled message is settled."""

    #: The job succeeded: ``ack``.
    ACK = "ack"
    #: The job failed and gets another attempt after the delay: ``nack``.
    RETRY = "retry"
    #: No more attempts: ``dead_letter`` with the reason.
    DEAD = "dead"
    #: Give the message back now without counting an attempt (the job never
    #: started here, or still runs elsewhere): ``release``.
    RELEASE = "release"
    #: The job could not start now (its executor could not take it, or it is over
    #: a per-job limit: :mod:`workers.limits`): give it back after the delay,
    #: without counting an attempt (``release`` with a delay).
    DEFER = "defer"
    #: Give back now, counting the attempt (the job started here and was stopped):
    #: ``nack`` without delay.
    ABANDON = "abandon"
    #: Another dispatcher runs it, or it may not run now (a cron fire while
    #: ``max_running`` runs go on): ``ack`` in this group, nothing ran.
    SKIP = "skip"


class UnknownSettlement(ChronoqError, ValueError):
    """A settlement that is not a :class:`Settlement` member (a typo, a plain string).

    :param value: what was given.
    """

    def __init__(self, value: object) -> None:
        self.value = value
        names = ", ".join(s.name for s in Settlement)
        super().__init__(f"unknown settlement {value!r}: give a Settlement ({names})")


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a message: how to settle it, why, and after how long.

    :param settlement: how it is settled.
    :param reason: why (the broker records it for ``retry`` and ``dead``; the log
        line shows it); ``""`` for a success.
    :param delay_ms: for :attr:`Settlement.RETRY` and :attr:`Settlement.DEFER`, how
        long until the message is due again.
    :raises UnknownSettlement: when ``settlement`` is not a :class:`Settlement`.
    :raises ValueError: for a negative ``delay_ms``.
    """

    settlement: Settlement
    reason: str
    delay_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.settlement, Settlement):
            raise UnknownSettlement(self.settlement)
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")


__all__ = ["Decision", "Settlement", "UnknownSettlement"]
