"""Riding out a broker that cannot be reached: back off, say so once, go on.

A dispatcher's pull raises :class:`~broker_adapter.errors.ConnectionFailed` while
its broker is down or cut off (a Redis restart, a partition that ends in a reset).
Such an outage ends by itself, so :meth:`Dispatcher.run_forever
<workers.dispatcher.Dispatcher.run_forever>` keeps its pull loop and its running
jobs, waits with :class:`BrokerOutage`'s back-off (0.5 s doubling to 5 s) and pulls
again; messages it held meanwhile stay invisible until its invisible time, so at
worst they run again elsewhere (at-least-once). One WARNING starts an outage, one
INFO line ends it (with its length and failed pulls): a long outage does not
flood the log. Other errors (a wrong token, a closed broker) still stop the loop.
"""

from __future__ import annotations

import logging
import time

from broker_adapter.errors import ConnectionFailed

#: First and longest wait between pulls while the broker is unreachable (seconds).
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 5.0


class BrokerOutage:
    """The state of one dispatcher's pulls: reachable, or since when not.

    :param log: where the start and end of an outage are logged.
    :param what: names the pulling party in those lines (e.g. the group).
    """

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._since: float | None = None
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        """Whether the last pull failed."""
        return self._since is not None

    def failed(self, error: ConnectionFailed) -> float:
        """Record a failed pull; the seconds to wait before the next one."""
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning(
                "%s: broker unreachable (%s); pulling again with back-off up to %g s, "
                "running jobs go on",
                self._what,
                error,
                MAX_WAIT_S,
            )
        return float(min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** min(self._failures - 1, 8)))

    def succeeded(self) -> None:
        """Record a pull that reached the broker (ends an outage, if one was going on)."""
        if self._since is None:
            return
        self._log.info(
            "%s: broker reachable again after %.1f s (%d failed pulls)",
            self._what,
            time.monotonic() - self._since,
            self._failures,
        )
        self._since = None
        self._failures = 0
