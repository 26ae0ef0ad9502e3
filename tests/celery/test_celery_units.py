"""The Celery pieces that need no running service: naming, wiring (the layering:
``test_optional_extra.py``)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path

import pytest

from broker_adapter import MessageState
from broker_adapter.clock import ManualClock
from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.spec import RetryPolicy
from workers import Dispatcher
from workers.celery import (
    RUN_TASK,
    CeleryExecutor,
    celery_app_for,
    install,
    schedule_task,
    scheduler_of,
    task_job,
)
from workers.celery.publish import publish, task_id_for, task_message
from workers.context import JobContext
from workers.executors.base import JobNotStarted

URL = "redis://127.0.0.1:1/0"  # never connected to in these tests


def _message(key: str | None = None, attempts: int = 1) -> ReceivedMessage:
    return ReceivedMessage("m1", "chronoq.jobs", b"", 1_000, 900, attempts, b"r", key)


def test_a_job_is_published_as_the_generic_task_with_its_name(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path}")

    @app.job(name="shop.close", executor="celery", queue="orders")
    def close(order_id: int) -> None: ...

    name, args, kwargs = task_message(
        close.spec, JobCall("shop.close", (7,), {"why": "t"}), _message("order:7", 2), 1_000
    )
    assert (name, args) == (RUN_TASK, ["shop.close", [7], {"why": "t"}])
    assert kwargs == {"due_ms": 1_000, "attempt": 2, "topic": "chronoq.jobs", "key": "order:7"}


def test_task_id_is_the_message_id_except_for_extra_cron_occurrences(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path}")

    @app.cron("* * * * *", name="tick", executor="celery")
    def tick() -> None: ...

    m = _message("cron:tick:60000")
    assert task_id_for(m, None) == "m1"
    first = JobContext(tick.spec, JobCall("tick"), m, 60_000, lambda: 0.0)
    extra = JobContext(tick.spec, JobCall("tick"), m, 120_000, lambda: 0.0)
    assert task_id_for(m, first) == "m1"
    assert task_id_for(m, extra) == "m1:120000"


def test_install_registers_the_celery_executor_for_default_dispatchers(tmp_path: Path) -> None:
    app = Scheduler(f"rocksdb://{tmp_path / 'd'}")
    celery = celery_app_for(app, URL)
    try:
        assert scheduler_of(celery) is app
        assert RUN_TASK in celery.tasks
        dispatcher = Dispatcher(app)
        assert isinstance(dispatcher.executors["celery"], CeleryExecutor)
        assert "celery" not in Dispatcher(Scheduler(f"rocksdb://{tmp_path / 'e'}")).executors
    finally:
        app.close()
        celery.close()


def _noop() -> None:
    """A task body."""


def test_schedule_task_needs_a_bound_scheduler() -> None:
    from celery import Celery

    celery = Celery("unbound", broker=URL, set_as_current=False)
    task = celery.task(name="t.unbound", shared=False)(_noop)
    with pytest.raises(LookupError, match="install"):
        schedule_task(task)
    celery.close()


def test_tracking_results_needs_a_result_backend() -> None:
    from celery import Celery

    celery = Celery("nobackend", broker=URL, set_as_current=False)
    with pytest.raises(ValueError, match="result backend"):
        CeleryExecutor(celery)
    CeleryExecutor(celery, track_results=False).shutdown()
    celery.close()


def test_own_celery_retries_mean_one_chronoq_attempt(tmp_path: Path) -> None:
    from celery import Celery

    app = Scheduler(f"rocksdb://{tmp_path}")
    celery = Celery("own", broker=URL, backend=URL, set_as_current=False)
    install(celery, app)

    @celery.task(name="t.retrying", shared=False, autoretry_for=(OSError,))
    def retrying() -> None: ...

    @celery.task(name="t.plain2", shared=False)
    def plain() -> None: ...

    assert task_job(app, retrying).spec.max_attempts == 1
    assert task_job(app, plain).spec.max_attempts == 16
    app.close()
    celery.close()


def test_job_not_started_names_the_message() -> None:
    err = JobNotStarted("m1", "celery broker unreachable")
    assert "m1" in str(err) and "unreachable" in str(err)


class _Refusing:
    """An executor whose broker is always down."""

    def submit(self, spec: object, call: object, message: ReceivedMessage) -> Future[None]:
        fut: Future[None] = Future()
        fut.set_exception(JobNotStarted(message.msg_id, "celery broker unreachable"))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def test_job_not_started_is_released_with_backoff_and_counts_no_attempt(
    data_dir: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job with one attempt and a retry_on that does not cover the failure
    app = Scheduler(f"rocksdb://{data_dir}", clock=manual_clock)

    @app.job(executor="celery", max_attempts=1, retry=RetryPolicy((5_000,), retry_on=(KeyError,)))
    def close() -> None: ...

    receipt = close.schedule()
    caplog.set_level(logging.WARNING, logger="chronoq.workers.Dispatcher")
    with Dispatcher(app, executors={"celery": _Refusing()}) as dispatcher:
        # When its executor cannot start it, twice (the backoff passes in between)
        assert dispatcher.run_until_idle() == 1
        view = app.broker.query(receipt.msg_id)
        assert view is not None and view.deliver_at_ms == manual_clock.now_ms() + 5_000
        manual_clock.advance(5_000)
        assert dispatcher.run_until_idle() == 1
    # Then it is back for a retry, never dead: a job that never ran counts no attempt
    view = app.broker.query(receipt.msg_id)
    assert view is not None and view.state is MessageState.PENDING
    assert view.attempts == 0  # deliveries counted as attempts
    assert view.deliver_at_ms == manual_clock.now_ms() + 5_000
    lines = [r.getMessage() for r in caplog.records if receipt.msg_id in r.getMessage()]
    assert len(lines) == 2 and all("not started" in x and "unreachable" in x for x in lines)
    app.close()


def test_publish_declares_a_queue_once_and_reprs_args_like_send_task() -> None:
    # Given a Celery app on kombu's in-memory transport (no service needed here)
    from celery import Celery
    from celery.utils.saferepr import saferepr

    app = Celery("units", broker="memory://", set_as_current=False)
    declared: set[str] = set()
    long_args = ["x" * 2_000]
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("orders")
        with app.producer_or_acquire() as producer:
            declares: list[str] = []
            real_declare = producer.maybe_declare

            def counting_declare(entity: object, *a: object, **kw: object) -> object:
                declares.append(str(getattr(entity, "name", entity)))
                return real_declare(entity, *a, **kw)

            producer.maybe_declare = counting_declare
            # When three tasks are published to one queue, the last with a long argument
            publish(
                app, producer, "t.a", [1, "b"], {"k": None}, "id-1", {"queue": "orders"}, declared
            )
            publish(app, producer, "t.a", [2], {}, "id-2", {"queue": "orders"}, declared)
            publish(app, producer, "t.a", long_args, {}, "id-3", {"queue": "orders"}, declared)
        got = [queue.get(timeout=1) for _ in range(3)]
        queue.close()
    # Then the queue was declared by the first publish only, the tasks arrive in order under their ids, and
    # argsrepr/kwargsrepr read as send_task's saferepr reads them, long ones cut to size
    assert declared == {"orders"} and declares == ["orders"]
    assert [m.headers["id"] for m in got] == ["id-1", "id-2", "id-3"]
    assert got[0].headers["argsrepr"] == saferepr([1, "b"]) == "[1, 'b']"
    assert got[0].headers["kwargsrepr"] == saferepr({"k": None})
    long_repr = got[2].headers["argsrepr"]
    assert len(long_repr) == app.amqp.argsrepr_maxsize and long_repr.endswith("...")
    assert got[2].payload[0] == long_args  # the body itself is whole
