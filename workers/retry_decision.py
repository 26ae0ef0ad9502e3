"""RetryDecider: what happens to a message whose job failed.

The rules, first match wins (``reason`` is ``"Type: message"`` of the error):

1. :class:`~workers.executors.base.JobNotStarted` (the executor could not start
   the job, e.g. its Celery broker is down): ``DEFER`` after the job's backoff,
   whatever ``retry_on`` says. The job never ran, so the attempt is not counted
   and an outage never dead-letters it.
2. A cron run: ``DEAD`` (the next occurrence is the retry; the failure stays visible).
3. An error outside ``spec.retry.retry_on``: ``DEAD``.
4. The last attempt (``attempt >= spec.max_attempts``): ``DEAD``.
5. Otherwise ``RETRY`` after ``spec.retry.backoff_ms(attempt)``.
"""

from __future__ import annotations

from scheduler.spec import JobSpec
from workers.executors.base import JobNotStarted
from workers.outcomes import describe_error
from workers.settlement import Decision, Settlement


class RetryDecider:
    """Decides how a failed job's message is settled; see the module docstring.

    Stateless; one instance serves every thread of a dispatcher.
    """

    def decide(
        self, spec: JobSpec, attempt: int, error: BaseException, *, cron: bool = False
    ) -> Decision:
        """How to settle the message of ``spec``'s job that failed with ``error``.

        :param spec: the job's spec (``retry`` and ``max_attempts``).
        :param attempt: which delivery failed, 1 on the first.
        :param error: what the job (or its executor) raised.
        :param cron: whether it was a cron run (never retried).
        :returns: the decision; its reason is what the broker and the log record.
        """
        reason = describe_error(error)
        if isinstance(error, JobNotStarted):
            return Decision(Settlement.DEFER, reason, spec.retry.backoff_ms(attempt))
        if cron:
            return Decision(Settlement.DEAD, f"{reason} (cron runs are not retried)")
        if not spec.retry.should_retry(error):
            return Decision(Settlement.DEAD, f"{reason} (not retried: not in retry_on)")
        if attempt >= spec.max_attempts:
            return Decision(Settlement.DEAD, f"{reason} (attempt {attempt} of {spec.max_attempts})")
        return Decision(Settlement.RETRY, reason, spec.retry.backoff_ms(attempt))


__all__ = ["RetryDecider"]
