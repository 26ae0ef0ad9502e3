"""StageLog: when pull answers were written and read, for a benchmark's breakdown (opt-in).

Off unless ``CHRONOQ_STAGE_LOG=1`` is set when a process imports this module:
the server's connections and the client's links read :func:`stage_log` once, at
construction, and keep ``None`` (one attribute test per pull answer, nothing per
message). When on, the server notes per pull answer the wall-clock time its
write to the socket returned, and the client the time a link's reader got that
answer and whether the pulling thread read it itself (else another thread read
it and woke the puller: one thread hand-off more). Memory: two objects per
answer.

``bench/remote_start_breakdown.py`` uses it; nothing else does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import TypeVar

_T = TypeVar("_T")

#: The environment variable that turns the log on (``1``), read once at import.
ENV_VAR = "CHRONOQ_STAGE_LOG"


class StageLog:
    """Times of the pull answers of this process (server side: written; client: read).

    Flat lists of floats, ints and strings: nothing the garbage collector tracks, so
    the log does not lengthen the collections it is there to see past.
    """

    def __init__(self) -> None:
        self._written_at: list[float] = []
        self._written_n: list[int] = []
        self._written_ids: list[str] = []
        self._read_at: list[float] = []
        self._read_by_caller: list[bool] = []
        self._read_n: list[int] = []
        self._read_ids: list[str] = []
        self._lock = threading.Lock()

    def written(self, msg_ids: list[str]) -> None:
        """Server: a pull answer carrying ``msg_ids`` was just written to the socket."""
        if msg_ids:
            t = time.time()
            with self._lock:
                self._written_at.append(t)
                self._written_n.append(len(msg_ids))
                self._written_ids.extend(msg_ids)

    def read(self, at: float, by_caller: bool, msg_ids: Iterable[str]) -> None:
        """Client: the answer carrying ``msg_ids`` was read off the socket at ``at``
        (epoch s), by the pulling thread itself when ``by_caller``."""
        with self._lock:
            before = len(self._read_ids)
            self._read_ids.extend(msg_ids)
            n = len(self._read_ids) - before
            if n:
                self._read_at.append(at)
                self._read_by_caller.append(by_caller)
                self._read_n.append(n)

    @property
    def answers(self) -> tuple[int, int]:
        """Pull answers with messages noted so far: ``(written, read)``."""
        return len(self._written_at), len(self._read_at)

    def write_times(self) -> dict[str, float]:
        """When each message's pull answer was written (epoch s), by message id."""
        with self._lock:
            return dict(
                zip(self._written_ids, _repeat(self._written_at, self._written_n), strict=True)
            )

    def read_times(self) -> dict[str, tuple[float, bool]]:
        """When each message's pull answer was read, and whether by the puller, by id."""
        with self._lock:
            pairs = list(zip(self._read_at, self._read_by_caller, strict=True))
            return dict(zip(self._read_ids, _repeat(pairs, self._read_n), strict=True))


def _repeat(values: list[_T], counts: list[int]) -> list[_T]:
    return [v for v, n in zip(values, counts, strict=True) for _ in range(n)]


_LOG: StageLog | None = StageLog() if os.environ.get(ENV_VAR) == "1" else None


def stage_log() -> StageLog | None:
    """This process's stage log, or ``None`` when ``CHRONOQ_STAGE_LOG=1`` was not set."""
    return _LOG


__all__ = ["ENV_VAR", "StageLog", "stage_log"]
