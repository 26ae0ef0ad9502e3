"""RetryDecider: one test per rule, in the order the rules apply."""

from __future__ import annotations

from scheduler.spec import JobSpec, RetryPolicy
from workers.context import JobTimeout
from workers.executors.base import JobNotStarted
from workers.retry_decision import RetryDecider
from workers.settlement import Decision, Settlement


class Flaky(Exception):
    """Worth a retry."""


def _spec(**kw: object) -> JobSpec:
    def job() -> None: ...

    return JobSpec(name="shop.job", func=job, **kw)  # type: ignore[arg-type]


decide = RetryDecider().decide
STRICT = RetryPolicy(delays_ms=(1_000, 5_000), retry_on=(Flaky,))


def test_not_started_is_deferred_with_backoff_whatever_retry_on_and_attempts_say() -> None:
    spec = _spec(max_attempts=1, retry=STRICT)
    error = JobNotStarted("m1", "broker down")
    assert decide(spec, 2, error, cron=True) == Decision(
        Settlement.DEFER, "JobNotStarted: job of msg m1 not started: broker down", 5_000
    )


def test_a_failed_cron_run_is_dead_even_when_retry_on_covers_it() -> None:
    d = decide(_spec(retry=STRICT), 1, Flaky("x"), cron=True)
    assert d == Decision(Settlement.DEAD, "Flaky: x (cron runs are not retried)")


def test_an_error_outside_retry_on_is_dead_at_once() -> None:
    d = decide(_spec(retry=STRICT), 1, KeyError("k"))
    assert d == Decision(Settlement.DEAD, "KeyError: 'k' (not retried: not in retry_on)")


def test_the_last_attempt_is_dead_with_its_count() -> None:
    d = decide(_spec(max_attempts=3, retry=STRICT), 3, Flaky("x"))
    assert d == Decision(Settlement.DEAD, "Flaky: x (attempt 3 of 3)")


def test_otherwise_a_retry_after_the_backoff_of_that_attempt() -> None:
    spec = _spec(max_attempts=3, retry=STRICT)
    assert decide(spec, 1, Flaky("x")) == Decision(Settlement.RETRY, "Flaky: x", 1_000)
    assert decide(spec, 2, Flaky("x")) == Decision(Settlement.RETRY, "Flaky: x", 5_000)


def test_a_timeout_follows_the_same_rules() -> None:
    spec = _spec(max_attempts=2, retry=RetryPolicy.fixed(2))
    error = JobTimeout("shop.job", 0.5)
    assert decide(spec, 1, error).settlement is Settlement.RETRY
    assert decide(spec, 2, error).settlement is Settlement.DEAD
