"""What chronoq publishes to Celery, and how.

A due run becomes one Celery task message: the generic task :data:`RUN_TASK`
with the job's name and arguments, or, for a job scheduled with
``schedule_task``, the user's own task (:func:`task_message`), under the
message id as task id (:func:`task_id_for`). :func:`publish` sends it exactly as
``send_task`` would, and :class:`PublishSession` keeps the producer and publish
batch the executor's publisher thread sends with.
:class:`~workers.celery.executor.CeleryExecutor` decides when.
"""

from __future__ import annotations

import contextlib
from typing import Any

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec, parse_cron_key
from workers.celery.compat import task_exec_options
from workers.context import JobContext

#: The generic Celery task that runs a chronoq job by name (see :mod:`workers.celery.app`).
RUN_TASK = "chronoq.run"
#: Job-name prefix of the chronoq jobs that stand for a user's own Celery task.
TASK_JOB_PREFIX = "celery:"


def task_message(
    spec: JobSpec, call: JobCall, message: ReceivedMessage, due_ms: int
) -> tuple[str, list[Any], dict[str, Any]]:
    """The Celery task name, args and kwargs that run ``call``.

    A plain chronoq job goes through the generic task :data:`RUN_TASK`; a job
    named ``celery:<task>`` (from ``schedule_task``) is that Celery task itself.
    """
    if spec.name.startswith(TASK_JOB_PREFIX):
        task_name = getattr(spec.func, "name", None) or spec.name[len(TASK_JOB_PREFIX) :]
        return str(task_name), list(call.args), dict(call.kwargs)
    meta = {"due_ms": due_ms, "attempt": message.attempts, "topic": message.topic}
    if message.key is not None:
        meta["key"] = message.key
    return RUN_TASK, [spec.name, list(call.args), dict(call.kwargs)], meta


def task_id_for(message: ReceivedMessage, job: JobContext | None) -> str:
    """The Celery task id of a run: the message id; for the extra occurrences a
    cron catch-up (``coalesce="all"``) runs from one message, ``<msg_id>:<fire_ms>``."""
    if job is None or job.fire_ms is None or message.key is None:
        return message.msg_id
    parsed = parse_cron_key(message.key)
    if parsed is None or parsed[1] == job.fire_ms:
        return message.msg_id
    return f"{message.msg_id}:{job.fire_ms}"


def publish(
    app: Any,
    producer: Any,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    task_id: str,
    options: dict[str, Any],
    declared: set[str] | None = None,
) -> None:
    """Publish one task as ``app.send_task(name, args, kwargs, task_id=task_id,
    producer=producer, **options)`` does (the task's own options and routes, the
    same message), minus its result-backend hook: with the Redis result backend
    ``send_task`` subscribes the sending process to every task's result channel,
    and with the backend down blocks about 20 s in that subscription. Outcomes
    are read by :class:`~workers.celery.results.ResultWatcher` instead.
    No ``eta``/``countdown`` ever.

    Two per-message costs of ``send_task`` are paid once instead (together a
    fifth of the publisher's CPU here): the queue declaration, skipped for the
    queue names in ``declared`` (the caller's set of queues declared on this
    connection; this adds the ones it declares), and ``saferepr`` of the
    arguments, which are JSON values here, so plain ``repr`` cut to Celery's
    ``argsrepr`` size shows the same.
    """
    amqp = app.amqp
    task_type = app.tasks.get(name)
    opts = dict(options)
    if task_type is not None:
        for k, v in task_exec_options(task_type).items():
            if v is not None:
                opts.setdefault(k, v)
    time_limit = opts.pop("time_limit", None)
    soft_time_limit = opts.pop("soft_time_limit", None)
    expires = opts.pop("expires", None)
    opts.pop("ignore_result", None)
    opts = amqp.router.route(opts, name, args, kwargs, task_type)
    queue = opts.get("queue")
    qname = queue if isinstance(queue, str) else getattr(queue, "name", None)
    if declared is not None and qname in declared:
        opts.setdefault("declare", [])
    message = amqp.create_task_message(
        task_id,
        name,
        args,
        kwargs,
        expires=expires,
        time_limit=time_limit,
        soft_time_limit=soft_time_limit,
        create_sent_event=app.conf.task_send_sent_event,
        argsrepr=_bounded_repr(args, amqp.argsrepr_maxsize),
        kwargsrepr=_bounded_repr(kwargs, amqp.kwargsrepr_maxsize),
        **opts,
    )
    amqp.send_task_message(producer, name, message, **opts)
    if declared is not None and qname:
        declared.add(qname)


def _bounded_repr(value: Any, maxsize: int) -> str:
    text = repr(value)
    return text if len(text) <= maxsize else text[: max(0, maxsize - 3)] + "..."


class PublishSession:
    """A producer and an open kombu publish batch, kept by the publisher thread
    across its publish batches until one fails.

    Opening them per batch cost more than the publishing itself (kombu's Redis
    transport builds a new Redis client object for each batch: about 230 µs of
    the 460 µs a lone publish cost here). No socket is held between batches: the
    batch's pipeline takes a pooled, health-checked connection at each flush.
    Transports without batches publish at once and :meth:`flush` does nothing.
    """

    def __init__(self, app: Any, max_ops: int) -> None:
        self._stack = contextlib.ExitStack()
        try:
            self.producer: Any = self._stack.enter_context(app.producer_or_acquire())
            batching = getattr(self.producer, "batch", None)
            self._batch: Any = (
                self._stack.enter_context(batching(max_size=max_ops)) if batching else None
            )
        except BaseException:
            self._stack.close()
            raise

    def flush(self) -> None:
        """Send what the batch buffered, in one round trip; raises if the broker refused."""
        if self._batch is not None:
            self._batch.flush()

    def close(self, error: BaseException | None = None) -> None:
        """Give the producer back; after ``error`` the batch's unsent rest is discarded."""
        with contextlib.suppress(Exception):  # closing after a broken connection
            if error is None:
                self._stack.close()
            else:
                self._stack.__exit__(type(error), error, error.__traceback__)


__all__ = [
    "RUN_TASK",
    "TASK_JOB_PREFIX",
    "PublishSession",
    "publish",
    "task_id_for",
    "task_message",
]
