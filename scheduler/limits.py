"""Per-job limits: :class:`RateLimit` (``rate_limit="100/s"``) and the ``max_running``
check, as ``@app.job`` takes them.

Both hold across every dispatcher of an app, not per process: the dispatcher
asks the broker (:meth:`~broker_adapter.base.BrokerAdapter.acquire_rate` and
:meth:`~broker_adapter.base.BrokerAdapter.acquire_slot`). A run over a limit waits
(its message is released for a little later without counting an attempt); it never
fails for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker_adapter.checks import is_int
from scheduler.errors import InvalidJobSpec

#: Milliseconds per unit of a rate: ``s``, ``m`` (minute) and ``h``.
_PERIODS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour)\s*")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` runs started per ``period_ms``, bursts of up to ``limit``.

    :param limit: runs per period (>= 1).
    :param period_ms: the period in ms (>= 1).
    """

    limit: int
    period_ms: int

    def __post_init__(self) -> None:
        if not is_int(self.limit, 1) or not is_int(self.period_ms, 1):
            raise InvalidJobSpec(
                "rate_limit", (self.limit, self.period_ms), "limit and period_ms are ints >= 1"
            )

    @classmethod
    def parse(cls, text: object) -> RateLimit:
        """``"100/s"``, ``"30/m"``, ``"1000/h"`` or ``"5/10s"`` (5 per 10 seconds).

        :raises InvalidJobSpec: for anything else.
        """
        if isinstance(text, RateLimit):
            return text
        found = _RATE.fullmatch(text) if isinstance(text, str) else None
        if found is None or int(found.group(1)) < 1 or found.group(2) == "0":
            raise InvalidJobSpec(
                "rate_limit",
                text,
                "give runs per period as 'N/s', 'N/m' or 'N/h' (e.g. '100/s', '5/10s'), N >= 1",
            )
        count = int(found.group(2) or 1)
        return cls(int(found.group(1)), count * _PERIODS_MS[found.group(3)[0]])

    @property
    def interval_ms(self) -> float:
        """The steady spacing of permits once a burst is spent, ``period_ms / limit``."""
        return self.period_ms / self.limit

    def __str__(self) -> str:
        for unit, ms in (("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
            if self.period_ms % ms == 0:
                n = self.period_ms // ms
                return f"{self.limit}/{'' if n == 1 else n}{unit}"
        return f"{self.limit}/{self.period_ms}ms"


def check_max_running(value: object) -> int | None:
    """``value`` if it is ``None`` (no limit) or an int >= 1.

    :raises InvalidJobSpec: otherwise.
    """
    if value is not None and not is_int(value, 1):
        raise InvalidJobSpec("max_running", value, "must be None (no limit) or an int >= 1")
    return value


__all__ = ["RateLimit", "check_max_running"]
