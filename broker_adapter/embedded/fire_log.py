"""FireLog: when each message fired, for a benchmark's per-stage breakdown (opt-in).

Off unless ``CHRONOQ_FIRE_LOG=1`` is set when the process imports this module: the
wheel thread then reads :func:`fire_log` once, at construction, and keeps ``None``
(one attribute test per fired chunk, nothing per message). When on, it notes per
fired chunk the wall-clock time its write returned and the fire position after it
(:attr:`BrokerCore.fired_upto <broker_adapter.embedded.core.BrokerCore.fired_upto>`):
a message fired in the first chunk whose position is above its wheel key. Memory:
two objects per chunk, and a chunk holds up to ``fire_chunk`` messages.

``bench/job_start_breakdown.py`` uses it; nothing else does.
"""

from __future__ import annotations

import bisect
import os
import time

from broker_adapter.embedded.keys import id_wheel_key, parse_id

#: The environment variable that turns the log on (``1``), read once at import.
ENV_VAR = "CHRONOQ_FIRE_LOG"


class FireLog:
    """Fire times of the chunks fired by the wheel threads of this process."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._uptos: list[bytes] = []

    def fired(self, fired_upto: bytes) -> None:
        """A chunk's write returned; ``fired_upto``: the fire position after it."""
        self._times.append(time.time())
        self._uptos.append(fired_upto)

    def fire_time(self, msg_id: str) -> float | None:
        """When the message ``msg_id`` fired (epoch s), or ``None`` if no chunk has it."""
        raw = parse_id(msg_id)
        if raw is None:
            return None
        i = bisect.bisect_right(self._uptos, id_wheel_key(raw))
        return self._times[i] if i < len(self._times) else None

    def __len__(self) -> int:
        """Chunks noted so far."""
        return len(self._times)


_LOG: FireLog | None = FireLog() if os.environ.get(ENV_VAR) == "1" else None


def fire_log() -> FireLog | None:
    """This process's fire log, or ``None`` when ``CHRONOQ_FIRE_LOG=1`` was not set."""
    return _LOG


__all__ = ["ENV_VAR", "FireLog", "fire_log"]
