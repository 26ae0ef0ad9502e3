"""Progress of long command-line work: a bar on a terminal, nothing otherwise.

The one place that decides: a bar shows when stderr is a terminal and the
command was not given ``--quiet``; piped, redirected or quiet, nothing is
written (scripts and logs stay clean). The bar is tqdm's (a small pure-Python
package with no dependencies, in chronoq's base install); if it is missing
anyway, the work runs the same without a bar.

Used by ``chronoq cancel --key-prefix`` (:mod:`workers.prefix_cancel`),
``chronoq report`` and the bulk scheduling pipeline (:mod:`spark_tasks.progress`);
it lives in this layer so that both ``workers`` and ``spark_tasks`` reach it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from types import TracebackType
from typing import Any, Self, TextIO

_log = logging.getLogger("chronoq.scheduler.Progress")


def show_progress(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether to show progress: ``stream`` (stderr by default) is a terminal and
    not ``quiet``."""
    if quiet:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Progress:
    """A progress bar, or nothing (every method then does nothing); thread-safe as
    tqdm is. Build one with :func:`progress`; use it as a context manager.

    :param bar: the tqdm bar, or ``None`` for no output.
    """

    def __init__(self, bar: Any | None) -> None:
        self._bar = bar

    @property
    def shown(self) -> bool:
        """Whether anything is written."""
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        if self._bar is not None:
            self._bar.update(n)

    def restart(self, desc: str, total: int | None) -> None:
        """Start a new phase: from zero, of ``total`` units (``None``: counts up),
        its rate timed afresh."""
        if self._bar is not None:
            self._bar.set_description_str(desc, refresh=False)
            self._bar.reset(total=total)

    def set_done(self, done: int) -> None:
        """Exactly ``done`` units are done (for a polled count)."""
        if self._bar is not None and done != self._bar.n:
            self._bar.update(done - self._bar.n)

    def set_count(self, done: int, total: int | None) -> None:
        """Exactly ``done`` of ``total`` units (a polled count whose total grows)."""
        bar = self._bar
        if bar is not None and (done != bar.n or total != bar.total):
            bar.total = total
            bar.update(done - bar.n)

    def describe(self, text: str) -> None:
        """The words before the bar (what is being done)."""
        if self._bar is not None:
            self._bar.set_description_str(text, refresh=False)

    def note(self, text: str) -> None:
        """The words after the bar (e.g. ``chunk 3/40``)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        """End the bar (its last state stays on the terminal)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def progress(
    desc: str,
    *,
    total: int | None = None,
    unit: str = " it",
    quiet: bool = False,
    stream: TextIO | None = None,
    force: bool = False,
    scale: bool = True,
) -> Progress:
    """A bar on ``stream`` (stderr) when :func:`show_progress` says so, else a silent one.

    :param desc: what is being done, shown before the bar.
    :param total: the units to do, if known.
    :param unit: what a unit is, spaced (``" keys"``, ``" rows"``, ``" tasks"``).
    :param quiet: the command's ``--quiet``.
    :param force: show it on ``stream`` even when it is no terminal (benches).
    :param scale: show counts as ``20.0k`` (for big ones).
    """
    stream = sys.stderr if stream is None else stream
    if not (force or show_progress(quiet, stream)):
        return Progress(None)
    try:
        tqdm = importlib.import_module("tqdm")
    except ModuleNotFoundError:  # the work goes on without a bar
        _log.debug("no progress bar: tqdm is not installed (pip install tqdm)")
        return Progress(None)
    sized = _columns(stream) > 0  # a terminal that reports no size (0x0) gets 80x24
    bar = tqdm.tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=scale,
        file=stream,
        dynamic_ncols=sized,
        ncols=None if sized else 80,
        nrows=None if sized else 24,  # tqdm hides a bar below the last of 0 rows
        mininterval=0.1,
        leave=True,
    )
    return Progress(bar)


def _columns(stream: TextIO) -> int:
    """The terminal's width, 0 when unknown."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


__all__ = ["Progress", "progress", "show_progress"]
