"""The :class:`CatchUp`: which occurrences a delivered occurrence runs.

When an occurrence is delivered late, the occurrences due from it up to now are
put through the schedule's misfire policy
(:func:`~scheduler.misfire.resolve_misfires`). What the policy keeps is bounded
by what the :class:`~scheduler.cron.CronPlanner` knows has a message of its own
(:class:`~scheduler.armed.ArmedOccurrences`): the catch-up stops at the first
occurrence armed after the delivered one, which runs from its own message. A
redelivery runs only its own occurrence: its catch-up goes to messages of their
own (:meth:`CatchUp._leave_to_own_messages`), since another process may have
run those already.

The planner arms the next occurrence first, then asks :meth:`CatchUp.decide`;
the catch-up sends through the planner's own batched arming.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from scheduler.armed import ArmedOccurrences
from scheduler.misfire import MAX_COUNTED, resolve_misfires
from scheduler.plan import Plan

# The planner's logger: these lines are its misfire warnings, filtered by that name.
_log = logging.getLogger("chronoq.scheduler.CronPlanner")

#: The reason a delivery runs nothing under the misfire policy.
MISFIRE_SKIPPED = "misfire policy skipped it"
#: The reason a redelivery runs nothing: what it would catch up has messages of its own.
LEFT_TO_OWN_MESSAGES = "its catch-up occurrences run from their own messages"

#: Arms occurrences ``(plan, fire_ms)`` (idempotent) and remembers them as armed.
Send = Callable[[list[tuple[Plan, int]]], object]


class CatchUp:
    """Decides what a delivered occurrence runs under its schedule's misfire policy.

    Safe to use from several threads (it keeps no state of its own).

    :param armed: the occurrences the planner armed, per plan series.
    :param send: the planner's arming, for occurrences left to their own messages.
    """

    def __init__(self, armed: ArmedOccurrences, send: Send) -> None:
        self._armed = armed
        self._send = send

    def decide(
        self, plan: Plan, fire_ms: int, now: int, redelivery: bool
    ) -> tuple[tuple[int, ...], str]:
        """Apply ``plan``'s misfire policy to the occurrences from ``fire_ms`` up to
        ``now`` (epoch ms, ``now >= fire_ms``); logs what it skipped.

        :param redelivery: whether this is not the message's first delivery.
        :returns: the occurrence times to run here (ascending), and why nothing runs
            when nothing does (:data:`MISFIRE_SKIPPED`, :data:`LEFT_TO_OWN_MESSAGES`).
        """
        decision = resolve_misfires(plan.trigger, fire_ms - 1, now, plan.policy)
        cap = self._armed.first_after(plan.series, fire_ms)
        run = tuple(t for t in decision.run if (cap is None or t < cap) and plan.in_window(t))
        if redelivery and any(t != fire_ms for t in run):
            run = self._leave_to_own_messages(plan, fire_ms, run)
            if not run:
                return run, LEFT_TO_OWN_MESSAGES
        if cap is not None and cap <= now:
            # A redelivery after later occurrences were armed: those run on their own.
            due = plan.trigger.fire_times_between(fire_ms - 1, cap - 1, limit=MAX_COUNTED)
            skipped = len(due) - len(run)
        else:
            skipped = decision.skipped
        if not run:
            _log.warning(
                "schedule %s: skipped occurrence %s, %d ms late (misfire_grace_time=%s s); "
                "%d occurrence(s) not run",
                plan.name,
                plan.trigger.local(fire_ms).isoformat(),
                now - fire_ms,
                plan.misfire.grace_s,
                skipped,
            )
        elif skipped:
            _log.info(
                "schedule %s: %d ms late; running %d missed occurrence(s), %d not run "
                "(coalesce=%s, misfire_grace_time=%s s)",
                plan.name,
                now - fire_ms,
                len(run),
                skipped,
                plan.misfire.coalesce,
                plan.misfire.grace_s,
            )
        return run, "" if run else MISFIRE_SKIPPED

    def _leave_to_own_messages(
        self, plan: Plan, fire_ms: int, run: tuple[int, ...]
    ) -> tuple[int, ...]:
        """A redelivered occurrence's catch-up: of ``run``, only ``fire_ms`` runs here.

        Its first delivery already armed what came next, maybe in another process,
        whose arming this planner cannot know (it remembers its own); the occurrences
        after that then had messages of their own and ran. So every occurrence of
        ``run`` after ``fire_ms`` is armed as its own message instead, which is
        idempotent: one that had a message keeps it (the broker answers ``DUPLICATE``,
        also after it fired), and one that had none (the first delivery was itself a
        catch-up, cut short) gets one now, due at once.
        """
        self._send([(plan, t) for t in run if t != fire_ms])
        return tuple(t for t in run if t == fire_ms)


__all__ = ["LEFT_TO_OWN_MESSAGES", "MISFIRE_SKIPPED", "CatchUp", "Send"]
