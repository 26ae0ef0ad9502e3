"""Which dispatcher runs which job: dedicated executors (Spark) get their own worker.

A Spark job needs a JVM; only the dispatcher started with ``chronoq worker
--executor spark module:app`` should start one. The rules:

* A *dedicated* executor (an executor kind declared ``dedicated`` in
  :data:`scheduler.executor_kinds.EXECUTOR_KINDS`, today ``spark``) runs in
  its own dispatcher, whose consumer group is ``<group>.<executor>`` (see
  :func:`dedicated_group`), so it gets every message of its topics whatever the
  main dispatchers do.
* A dispatcher subscribes only to topics that carry a job it may run: the main
  dispatchers (those with a non-dedicated executor, e.g. ``local``) to the
  default topic and every topic with a non-dedicated job; a dedicated one only
  to the topics of its own jobs. Give Spark jobs their own topic
  (``@app.job(executor="spark", topic="chronoq.spark")``) and the main
  dispatchers never see them.
* On a topic shared by both kinds, each dispatcher acks (in its own group) the
  jobs that belong to the other kind, with a log line: the message's state as
  ``query`` shows it is still that of the group that runs it.
* A non-dedicated job whose executor a main dispatcher lacks (a ``celery`` job
  where no CeleryExecutor is configured) fails per its retry policy, as before.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.executor_kinds import EXECUTOR_KINDS
from scheduler.registry import JobRegistry


def is_dedicated(executors: Collection[str]) -> bool:
    """Whether a dispatcher with ``executors`` is a dedicated one (only dedicated executors)."""
    return bool(executors) and all(EXECUTOR_KINDS.is_dedicated(e) for e in executors)


def dedicated_group(group: str, executors: Collection[str]) -> str:
    """The consumer group of a dispatcher with ``executors``: ``group`` for a main
    dispatcher, ``<group>.<executor>[-<executor>...]`` for a dedicated one."""
    if not is_dedicated(executors):
        return group
    return f"{group}.{'-'.join(sorted(executors))}"


def topics_for(registry: JobRegistry, default_topic: str, executors: Collection[str]) -> list[str]:
    """The topics a dispatcher with ``executors`` subscribes to (see the module docstring)."""
    if is_dedicated(executors):
        mine = {s.topic_or(default_topic) for s in registry if s.executor in executors}
        return sorted(mine)
    topics = {default_topic}
    for spec in registry:
        if spec.executor in executors or not EXECUTOR_KINDS.is_dedicated(spec.executor):
            topics.add(spec.topic_or(default_topic))
    return sorted(topics)


def skip_reason(executor: str, executors: Collection[str]) -> str | None:
    """Why a dispatcher with ``executors`` leaves a job of ``executor`` to another
    dispatcher, or ``None`` when it handles it (runs it, or fails it)."""
    if executor in executors:
        return None
    if EXECUTOR_KINDS.is_dedicated(executor):
        return (
            f"a {executor!r} job: runs in the dedicated group of "
            f"`chronoq worker --executor {executor}`"
        )
    if is_dedicated(executors):
        return f"a {executor!r} job: runs in the main dispatchers' group"
    return None


__all__ = [
    "dedicated_group",
    "is_dedicated",
    "skip_reason",
    "topics_for",
]
