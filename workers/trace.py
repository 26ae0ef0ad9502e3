"""Delivery trace: one JSON line per settled delivery, for the delivery report.

Off by default (a dispatcher without a trace does one ``is None`` test per
message). On (``Dispatcher(app, trace=DeliveryTrace(dir))``, or ``chronoq run
--trace`` / ``chronoq worker --trace``), the dispatcher's threads only append a
tuple to a queue; a background thread formats and writes the lines, so the
pull loop and the job threads never wait for the disk.

The format (file names, the schema of a line, the default directory) is
:mod:`scheduler.trace_format`'s, shared with the delivery report that reads it.
A file is closed and a new one opened past ``max_bytes`` (64 MiB by default);
only the newest ``max_files`` (default 100) are kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import TextIO

from broker_adapter.results import ReceivedMessage
from scheduler.trace_format import (
    FIELDS,
    FILE_GLOB,
    TRACE_VERSION,
    default_trace_dir,
    trace_file_name,
)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_FILES = 100
#: ``Settler`` verbs to trace outcomes (:data:`scheduler.trace_format.TRACE_OUTCOMES`).
OUTCOMES = {
    "ack": "ok",
    "retry": "retry",
    "dead": "dead",
    "release": "released",
    "abandon": "released",
    "skip": "skipped",
}

_log = logging.getLogger("chronoq.workers.DeliveryTrace")
_dumps = json.dumps


#: Keys needing no JSON escaping (most business keys): written as they are.
_SAFE = re.compile(r"[A-Za-z0-9_:.\-/@#=+]*").fullmatch


def _tail(how: str) -> str:
    return f'"outcome":"{OUTCOMES.get(how, how)}","error":'


_TAILS = {how: _tail(how) for how in OUTCOMES}


def _text(value: str | None) -> str:
    return "null" if value is None else _dumps(value)


#: One settled delivery, queued for writing (a plain tuple: cheapest to build):
#: ``(message, job, group, how, error, fired_ms, dispatched_ms, started_ms, finished_ms)``.
Record = tuple[
    ReceivedMessage,
    str | None,
    str,
    str,
    str | None,
    float | None,
    float | None,
    float | None,
    float,
]


class DeliveryTrace:
    """Writes the delivery trace of one dispatcher; see the module docstring.

    :param directory: where the ``trace-*.jsonl`` files go (created if missing).
    :param max_bytes: size after which a file is rotated.
    :param max_files: how many files are kept (older ones are deleted).
    :param flush_interval_s: how often the writer thread writes what was queued.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        flush_interval_s: float = 1.0,
    ) -> None:
        if max_bytes < 1 or max_files < 1:
            raise ValueError("max_bytes and max_files must be >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._interval = flush_interval_s
        self._queue: deque[Record] = deque()
        self._heads: dict[tuple[str, str | None, str], str] = {}
        self._fired: dict[str, tuple[float, float | None]] = {}
        self._start = int(time.time() * 1000)
        self._n = 0
        self._file: TextIO | None = None
        self._size = 0
        self._wake = threading.Event()
        self._closed = False
        self._io_lock = threading.Lock()
        #: Lines written so far.
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="chronoq-trace", daemon=True)
        self._thread.start()

    # -- the dispatcher's hooks (hot path: no formatting, no I/O) ------------------------

    def received(self, messages: list[ReceivedMessage], now_ms: float) -> None:
        """A pull returned ``messages`` at ``now_ms``."""
        fired = self._fired
        for m in messages:
            fired[m.msg_id] = (now_ms, None)

    def dispatched(self, m: ReceivedMessage, now_ms: float) -> None:
        """``m`` was handed to its executor at ``now_ms``."""
        got = self._fired.get(m.msg_id)
        self._fired[m.msg_id] = (got[0] if got else now_ms, now_ms)

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
        """``m`` was settled by ``how`` (``ack``, ``retry``, ``dead``, ``release``, ``skip``)."""
        fired, dispatched = self._fired.pop(m.msg_id, (None, None))
        self._queue.append(
            (m, job, group, how, error or None, fired, dispatched, started_ms, now_ms)
        )

    # -- writing -----------------------------------------------------------------------

    def format(self, item: Record) -> str:
        """One queued record as its JSON line (with the newline)."""
        m, job, group, how, error, fired, dispatched, started, finished = item
        heads = self._heads
        head = heads.get((m.topic, job, group))
        if head is None:
            head = heads[(m.topic, job, group)] = (
                f'{{"v":{TRACE_VERSION},"topic":{_dumps(m.topic)},"job":{_text(job)},'
                f'"group":{_dumps(group)},"msg_id":"'
            )
        key = m.key
        if key is None:
            key_text = "null"
        elif _SAFE(key):
            key_text = f'"{key}"'
        else:
            key_text = _dumps(key)
        return (
            f'{head}{m.msg_id}","key":{key_text},"attempt":{m.attempts},'
            f'"sent_ms":{m.born_ms},"deliver_at_ms":{m.deliver_at_ms},'
            f'"fired_ms":{"null" if fired is None else int(fired)},'
            f'"dispatched_ms":{"null" if dispatched is None else int(dispatched)},'
            f'"started_ms":{"null" if started is None else int(started)},'
            f'"finished_ms":{int(finished)},{_TAILS.get(how) or _tail(how)}'
            f"{_text(error)}}}\n"
        )

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        self._n += 1
        path = self.directory / trace_file_name(self._start, self._n)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across writes
        self._size = 0
        files = sorted(self.directory.glob(FILE_GLOB))
        for old in files[: max(0, len(files) - self.max_files)]:
            old.unlink(missing_ok=True)

    def flush(self) -> int:
        """Write everything queued so far; returns the lines written."""
        with self._io_lock:
            queue, fmt = self._queue, self.format
            n = 0
            chunk: list[str] = []
            while queue:
                chunk.append(fmt(queue.popleft()))
                if len(chunk) >= 4096 or not queue:
                    text = "".join(chunk)
                    if self._file is None or self._size >= self.max_bytes:
                        self._open_next()
                    assert self._file is not None
                    self._file.write(text)
                    self._size += len(text)
                    n += len(chunk)
                    chunk = []
            if n and self._file is not None:
                self._file.flush()
            self.written += n
            return n

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            try:
                self.flush()
            except OSError:
                _log.exception("writing the delivery trace to %s failed", self.directory)

    def close(self) -> None:
        """Write what is queued and close the file. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.flush()
        with self._io_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __repr__(self) -> str:
        return f"<DeliveryTrace {self.directory} written={self.written}>"


__all__ = ["FIELDS", "OUTCOMES", "TRACE_VERSION", "DeliveryTrace", "Record", "default_trace_dir"]
