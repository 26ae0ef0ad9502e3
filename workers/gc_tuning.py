"""Garbage-collector settings for a process that runs a dispatcher (issue 16).

The cyclic GC stops every thread while it runs. A full (generation 2) collection
walks every tracked object of the process, most of them modules, classes and
functions loaded at start-up that never become garbage: measured with
``bench/job_start_breakdown.py``, gen-2 pauses were the longest stalls of the
job-start path (a job due during one starts that much later).
:func:`tune_gc` moves what exists after start-up into the permanent generation
(:func:`gc.freeze`), so later collections walk only what was made since.

It is a whole-process choice, so only the code that owns the process makes it:
``chronoq run`` (``run_app(..., freeze_gc=True)``) calls it once the dispatcher
has joined its group. ``app.run()`` and a library embedding a dispatcher do not
(frozen objects are invisible to :func:`gc.get_referrers`, which some test
tools rely on).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_done = False


def tune_gc() -> bool:
    """Collect once, then freeze what is left (:func:`gc.freeze`); once per process.

    Objects frozen here are never collected (they are start-up state). Jobs'
    garbage is collected as before.

    :returns: ``True`` the first time (it tuned), ``False`` afterwards.
    """
    global _done
    with _lock:
        if _done:
            return False
        _done = True
    gc.collect()
    gc.freeze()
    return True


__all__ = ["tune_gc"]
