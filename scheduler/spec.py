"""What the scheduler knows about a job: :class:`JobSpec`, :class:`RetryPolicy`,
:class:`MisfirePolicy` and, for cron jobs, :class:`CronSpec`.

All are frozen dataclasses validated at construction, so a bad ``@app.job`` or
``@app.cron`` option fails at decoration time, not when the job first runs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, get_args

from broker_adapter.base import DEFAULT_MAX_ATTEMPTS, retry_backoff_ms
from broker_adapter.checks import is_int
from broker_adapter.message import MAX_KEY_CHARS, check_topic
from scheduler.errors import InvalidJobSpec
from scheduler.executor_kinds import EXECUTOR_KINDS, default_kind_for
from scheduler.interval import IntervalTrigger, Trigger
from scheduler.limits import RateLimit, check_max_running
from scheduler.triggers import CronTrigger

Coalesce = Literal["latest", "earliest", "all"]
COALESCE_MODES: tuple[str, ...] = get_args(Coalesce)
#: Longest job name: it must fit in the cron key ``cron:<name>:<fire_ms>`` (512 chars).
MAX_NAME_CHARS = 256
#: Most attempts a job may ask for (RocketMQ allows 16 by default; this is a sanity cap).
MAX_ATTEMPTS_LIMIT = 1000
#: Most missed runs one catch-up may start under ``coalesce="all"``.
DEFAULT_MAX_CATCH_UP = 100

assert MAX_NAME_CHARS + len("cron::") + 20 <= MAX_KEY_CHARS


def seconds(field_name: str, value: object, *, allow_zero: bool) -> float:
    """``value`` (seconds as int/float, or a :class:`~datetime.timedelta`) as float seconds.

    :raises InvalidJobSpec: for another type, a non-finite or negative value, or
        zero when not allowed.
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJobSpec(field_name, value, "give seconds (int or float) or a timedelta")
    sec = float(value)
    if not math.isfinite(sec) or sec < 0 or (sec == 0 and not allow_zero):
        low = ">= 0" if allow_zero else "> 0"
        raise InvalidJobSpec(field_name, value, f"must be finite and {low} seconds")
    return sec


def check_job_name(name: object) -> str:
    """Return ``name`` if it can name a job, else raise :class:`InvalidJobSpec`.

    A name is a non-empty str of at most :data:`MAX_NAME_CHARS` printable
    characters without whitespace (``module.qualname`` always qualifies).
    """
    if not isinstance(name, str) or not name:
        raise InvalidJobSpec("name", name, "a job name is a non-empty str")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidJobSpec("name", name, f"a job name has at most {MAX_NAME_CHARS} characters")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise InvalidJobSpec("name", name, "a job name has no whitespace or control characters")
    return name


def check_job_function(func: object) -> None:
    """Raise :class:`InvalidJobSpec` unless ``func`` can be a job's function.

    A coroutine *object* (``hello(1)`` of an ``async def hello``) is refused with
    what to do: decorate the function itself.
    """
    if inspect.iscoroutine(func):
        name = getattr(func, "__qualname__", "the function")
        raise InvalidJobSpec(
            "func",
            func,
            f"this is a coroutine object, not a function ({name}(...) was called); "
            f"decorate the async def function itself: @app.job above 'async def {name}'",
        )
    if not callable(func):
        raise InvalidJobSpec("func", func, "a job wraps a callable")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a failed job waits before its next attempt.

    By default RocketMQ's schedule (:func:`broker_adapter.base.retry_backoff_ms`):
    10 s, 30 s, 1 m, 2 m, ... 2 h. With ``delays_ms``, attempt ``n`` waits
    ``delays_ms[n - 1]``, and the last delay repeats.

    :param delays_ms: explicit delays in ms, each >= 0; empty for RocketMQ's.
    :param retry_on: exception types worth a retry; any other exception sends the
        message straight to the dead-letter topic.
    :raises InvalidJobSpec: for a negative or non-int delay, or a ``retry_on`` entry
        that is not an exception type.
    """

    delays_ms: tuple[int, ...] = ()
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        delays = tuple(self.delays_ms)
        for d in delays:
            if not is_int(d, 0):
                raise InvalidJobSpec("delays_ms", self.delays_ms, "each delay is an int >= 0 ms")
        object.__setattr__(self, "delays_ms", delays)
        retry_on = tuple(self.retry_on)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_on):
            raise InvalidJobSpec("retry_on", self.retry_on, "give exception classes")
        object.__setattr__(self, "retry_on", retry_on)

    @classmethod
    def fixed(cls, delay: float | timedelta) -> RetryPolicy:
        """The same delay (seconds or timedelta) before every retry."""
        return cls(delays_ms=(round(seconds("delay", delay, allow_zero=True) * 1000),))

    def backoff_ms(self, attempt: int) -> int:
        """The wait after failed attempt number ``attempt`` (1-based), in ms.

        :raises ValueError: for ``attempt`` < 1.
        """
        if not is_int(attempt, 1):
            raise ValueError(f"attempt is counted from 1, got {attempt!r}")
        if not self.delays_ms:
            return retry_backoff_ms(attempt)
        return self.delays_ms[min(attempt, len(self.delays_ms)) - 1]

    def should_retry(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt (an instance of ``retry_on``)."""
        return isinstance(error, self.retry_on)


@dataclass(frozen=True, slots=True)
class MisfirePolicy:
    """What to do with cron occurrences that were due while nothing ran them.

    :param grace_s: how late (seconds or timedelta) an occurrence may still run;
        older ones are skipped. ``None`` means no limit.
    :param coalesce: of the occurrences still within grace, run only the
        ``"latest"``, only the ``"earliest"``, or ``"all"`` of them in order.
    :param max_catch_up: under ``"all"``, run at most this many (the latest ones).
    :raises InvalidJobSpec: for a negative grace, an unknown mode, or ``max_catch_up`` < 1.
    """

    grace_s: float | None = None
    coalesce: Coalesce = "latest"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP

    def __post_init__(self) -> None:
        if self.grace_s is not None:
            object.__setattr__(
                self, "grace_s", seconds("misfire_grace_time", self.grace_s, allow_zero=True)
            )
        if self.coalesce not in COALESCE_MODES:
            raise InvalidJobSpec(
                "coalesce", self.coalesce, f"use one of {', '.join(map(repr, COALESCE_MODES))}"
            )
        n = self.max_catch_up
        if not is_int(n, 1):
            raise InvalidJobSpec("max_catch_up", n, "must be an int >= 1")

    @property
    def grace_ms(self) -> int | None:
        """The grace in whole milliseconds, or ``None`` for no limit."""
        return None if self.grace_s is None else round(self.grace_s * 1000)


def _describe(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", None) or "?"
    qualname = getattr(func, "__qualname__", None) or repr(func)
    return f"{module}.{qualname}"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A registered job: its name, function and how it runs.

    :param name: unique name, ``module.qualname`` by default (see :meth:`for_function`);
        messages carry it, so renaming a job orphans its pending messages.
    :param func: the function; it gets what its executor kind passes first (the
        SparkSession for ``executor="spark"``).
    :param executor: the name of a registered executor kind
        (:data:`~scheduler.executor_kinds.EXECUTOR_KINDS`): ``"local"`` (thread pool),
        ``"async"`` (the dispatcher's event loop), ``"celery"``, ``"spark"``, or one
        registered since; ``""`` (the default) picks by the function: ``"async"`` for
        an ``async def`` function, else ``"local"``.
    :param max_attempts: deliveries before the message goes to the dead-letter topic.
    :param timeout: seconds (or timedelta) one attempt may run; ``None`` for no limit.
    :param topic: the topic its messages go to; ``None`` for the settings' topic.
    :param queue: the queue, for an executor kind with queues (``executor="celery"``);
        ``None`` for its default.
    :param retry: backoff between attempts.
    :param max_running: most runs of this job going at once across every dispatcher
        of the app; ``None`` for no limit. A run over it waits (never fails).
    :param rate_limit: most runs started per period across every dispatcher
        (:class:`~scheduler.limits.RateLimit`, or its text such as ``"100/s"``);
        a run over it waits (never fails, never burns an attempt).
    :raises InvalidJobSpec: for any option that cannot work.
    :raises InvalidTopic: for a bad ``topic`` name.
    """

    name: str
    func: Callable[..., Any] = field(compare=False)
    executor: str = ""
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout: float | None = None
    topic: str | None = None
    queue: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_running: int | None = None
    rate_limit: RateLimit | None = None

    def __post_init__(self) -> None:
        check_job_name(self.name)
        check_max_running(self.max_running)
        if self.rate_limit is not None:
            object.__setattr__(self, "rate_limit", RateLimit.parse(self.rate_limit))
        check_job_function(self.func)
        if self.executor == "":
            object.__setattr__(self, "executor", default_kind_for(self.func))
        kind = EXECUTOR_KINDS.find(self.executor)
        if kind is None:
            known = EXECUTOR_KINDS.names()
            raise InvalidJobSpec(
                "executor", self.executor, f"use one of {', '.join(map(repr, known))}"
            )
        n = self.max_attempts
        if not is_int(n, 1, MAX_ATTEMPTS_LIMIT):
            raise InvalidJobSpec(
                "max_attempts", n, f"must be an int from 1 (no retry) to {MAX_ATTEMPTS_LIMIT}"
            )
        if self.timeout is not None:
            object.__setattr__(self, "timeout", seconds("timeout", self.timeout, allow_zero=False))
        if self.topic is not None:
            check_topic(self.topic)
        if self.queue is not None and (not isinstance(self.queue, str) or not self.queue):
            raise InvalidJobSpec("queue", self.queue, "a Celery queue name is a non-empty str")
        if self.queue is not None and not kind.queues:
            with_queues = " or ".join(k.name for k in EXECUTOR_KINDS if k.queues) or "no"
            raise InvalidJobSpec(
                "queue",
                self.queue,
                f"only {with_queues} jobs have a queue (executor={self.executor!r})",
            )
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidJobSpec("retry", self.retry, "give a RetryPolicy")
        kind.check_function(self.func)

    @classmethod
    def for_function(
        cls, func: Callable[..., Any], name: str | None = None, **options: Any
    ) -> JobSpec:
        """A spec for ``func`` named ``name`` or, by default, ``module.qualname``.

        :raises InvalidJobSpec: see the class.
        """
        return cls(name=_describe(func) if name is None else name, func=func, **options)

    @property
    def origin(self) -> str:
        """Where the function is defined, ``module.qualname`` (for messages and logs)."""
        return _describe(self.func)

    def topic_or(self, default: str) -> str:
        """The job's topic, or ``default`` (the settings' topic) when it names none."""
        return self.topic if self.topic is not None else default


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A schedule the dispatcher runs: which job fires, when, and what to do with
    late fires. A ``@app.cron``/``@app.every`` job has one, named after its job; a
    schedule of :attr:`app.schedules <scheduler.Scheduler.schedules>` has one per
    version of its definition, named after the schedule (``schedule``), since many
    schedules may run one job.

    :param job: the registered job it runs.
    :param trigger: its fire times: a :class:`~scheduler.triggers.CronTrigger` or an
        :class:`~scheduler.interval.IntervalTrigger`.
    :param misfire: the misfire policy.
    :param max_running: how many runs may overlap (>= 1).
    :param jitter: up to this many seconds of random delay per run; ``None`` for none.
    :param schedule: the schedule's name when it is not the job's (``app.schedules``).
    :raises InvalidJobSpec: for a wrong type or a value out of range.
    """

    job: JobSpec
    trigger: Trigger
    misfire: MisfirePolicy = field(default_factory=MisfirePolicy)
    max_running: int = 1
    jitter: float | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.job, JobSpec):
            raise InvalidJobSpec("job", self.job, "give the JobSpec this cron runs")
        if not isinstance(self.trigger, CronTrigger | IntervalTrigger):
            raise InvalidJobSpec("trigger", self.trigger, "give a CronTrigger or IntervalTrigger")
        if not isinstance(self.misfire, MisfirePolicy):
            raise InvalidJobSpec("misfire", self.misfire, "give a MisfirePolicy")
        n = self.max_running
        if not is_int(n, 1):
            raise InvalidJobSpec("max_running", n, "must be an int >= 1")
        if self.jitter is not None:
            object.__setattr__(self, "jitter", seconds("jitter", self.jitter, allow_zero=True))
        if self.schedule is not None:
            check_job_name(self.schedule)

    @property
    def name(self) -> str:
        """The schedule's name: the job's, unless it is a named schedule."""
        return self.job.name if self.schedule is None else self.schedule

    def key(self, fire_ms: int) -> str:
        """The idempotent message key of the occurrence at ``fire_ms``:
        ``cron:<name>:<fire_ms>``."""
        return cron_key(self.name, fire_ms)


CRON_KEY_PREFIX = "cron:"


def cron_key(name: str, fire_ms: int) -> str:
    """``cron:<name>:<fire_ms>``, the key of one cron occurrence."""
    return f"{CRON_KEY_PREFIX}{name}:{fire_ms}"


def parse_cron_key(key: str) -> tuple[str, int] | None:
    """``(name, fire_ms)`` from a cron key, or ``None`` if ``key`` is not one."""
    if not key.startswith(CRON_KEY_PREFIX):
        return None
    name, sep, ms = key[len(CRON_KEY_PREFIX) :].rpartition(":")
    if not sep or not name or not (ms.isascii() and ms.isdigit()):
        return None
    return name, int(ms)


__all__ = [
    "COALESCE_MODES",
    "CRON_KEY_PREFIX",
    "Coalesce",
    "CronSpec",
    "JobSpec",
    "MisfirePolicy",
    "RetryPolicy",
    "check_job_function",
    "check_job_name",
    "cron_key",
    "parse_cron_key",
]
