"""The :class:`CronPlanner`: one pending message per cron occurrence, armed ahead.

Each occurrence of cron job ``name`` due at ``fire_ms`` is one message:

* topic ``spec.topic_or(settings.topic)``, body ``JobCall(name).encode()``;
* key ``cron:<name>:<fire_ms>`` (:func:`~scheduler.spec.cron_key`);
* ``deliver_at_ms = fire_ms + jitter``, where the jitter (``0`` unless the cron
  sets one) is derived from the key, so every scheduler picks the same time.

Why this is idempotent: the broker stores at most one pending message per key,
and also refuses a key whose last message already fired at the very same due
millisecond. So arming an occurrence twice, from two :class:`Scheduler` objects,
two processes sharing a broker server, or a restarted process, stores it once
and fires it once (the broker compares the due time asked for, so even a late
re-send of a past occurrence, e.g. from a machine whose clock lags, is refused).

The life of a cron job:

1. :meth:`CronPlanner.arm_all` at start-up arms each job's next occurrence after
   now (a no-op for the ones already armed).
2. When an occurrence's message is delivered, the dispatcher calls
   :meth:`CronPlanner.on_fired` *before* running the job and acks after. The
   planner arms the next occurrence after now and applies the misfire policy
   (:func:`~scheduler.misfire.resolve_misfires`) to the occurrences from the
   delivered one up to now: run it if on time; if late (the process was down, or
   the dispatcher fell behind), skip what is beyond ``misfire_grace_time`` and
   coalesce the rest (``latest``, ``earliest`` or ``all``). It returns the
   occurrence times to run now, usually ``[fire_ms]``.
3. Because the next occurrence is armed before the job runs, a crash mid-run
   loses no future occurrence; the unacked message is delivered again (at least
   once), and the repeated ``on_fired`` arms nothing new.

With ``jitter``, lateness is measured from the latest possible jittered time:
the grace is extended by the jitter, so a jittered run is never a misfire.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import threading
from typing import TYPE_CHECKING

from broker_adapter.message import Message
from broker_adapter.results import SendResult, SendStatus
from scheduler.errors import JobNotFound
from scheduler.jobcall import JobCall
from scheduler.misfire import MAX_COUNTED, resolve_misfires
from scheduler.spec import CronSpec, MisfirePolicy, cron_key, parse_cron_key

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

_log = logging.getLogger("chronoq.scheduler.CronPlanner")

#: Armed occurrences remembered per cron job (to bound catch-up; see ``on_fired``).
_REMEMBERED = 64


def jitter_ms(key: str, jitter_s: float | None) -> int:
    """The deterministic jitter of the occurrence with ``key``: ``0`` to the jitter
    in whole ms, from a hash of the key (the same in every process)."""
    if not jitter_s:
        return 0
    span = round(jitter_s * 1000) + 1
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % span


class CronPlanner:
    """Arms the occurrences of an app's cron jobs and decides misfires.

    Safe to use from several threads, and from several processes or
    :class:`~scheduler.scheduler.Scheduler` objects on one broker.

    :param app: the scheduler whose registry, settings, clock and broker it uses.
    """

    def __init__(self, app: Scheduler) -> None:
        self._app = app
        self._lock = threading.Lock()
        # Occurrences this planner armed (or found armed), per cron name, ascending.
        self._armed: dict[str, list[int]] = {}
        self._policies: dict[str, MisfirePolicy] = {}

    # -- messages ---------------------------------------------------------------------

    def message(self, spec: CronSpec, fire_ms: int) -> Message:
        """The message of ``spec``'s occurrence at ``fire_ms`` (see the module docstring)."""
        key = cron_key(spec.name, fire_ms)
        return Message(
            spec.job.topic_or(self._app.settings.topic),
            JobCall(spec.name).encode(),
            key,
            deliver_at_ms=fire_ms + jitter_ms(key, spec.jitter),
        )

    def parse(self, key: str | None) -> tuple[str, int] | None:
        """``(name, fire_ms)`` when ``key`` is an occurrence key of a cron job
        registered here, else ``None`` (a plain job's message)."""
        if not key:
            return None
        parsed = parse_cron_key(key)
        if parsed is None or self._app.registry.find_cron(parsed[0]) is None:
            return None
        return parsed

    def _send(self, occurrences: list[tuple[CronSpec, int]]) -> list[SendResult]:
        """Arm ``occurrences`` in one batch and remember them; returns the results."""
        if not occurrences:
            return []
        results = self._app.broker.send_batch([self.message(s, t) for s, t in occurrences])
        with self._lock:
            for (spec, fire_ms), result in zip(occurrences, results, strict=True):
                armed = self._armed.setdefault(spec.name, [])
                i = bisect.bisect_left(armed, fire_ms)
                if i == len(armed) or armed[i] != fire_ms:
                    armed.insert(i, fire_ms)
                    del armed[:-_REMEMBERED]
                _log.debug(
                    "%s %s at %s (msg %s)",
                    "armed" if result.status is SendStatus.OK else "already armed",
                    spec.key(fire_ms),
                    spec.trigger.local(fire_ms).isoformat(),
                    result.msg_id,
                )
        return results

    def _armed_after(self, name: str, fire_ms: int) -> int | None:
        """The first occurrence after ``fire_ms`` this planner knows is armed."""
        with self._lock:
            armed = self._armed.get(name, [])
            i = bisect.bisect_right(armed, fire_ms)
            return armed[i] if i < len(armed) else None

    def _policy(self, spec: CronSpec) -> MisfirePolicy:
        policy = self._policies.get(spec.name)
        if policy is None:
            policy = spec.misfire
            if policy.grace_s is not None and spec.jitter:
                policy = MisfirePolicy(
                    policy.grace_s + spec.jitter, policy.coalesce, policy.max_catch_up
                )
            self._policies[spec.name] = policy
        return policy

    def _spec(self, name: str) -> CronSpec:
        spec = self._app.registry.find_cron(name)
        if spec is None:
            raise JobNotFound(name, [c.name for c in self._app.registry.crons()])
        return spec

    # -- the two entry points ---------------------------------------------------------

    def arm_all(self, now_ms: int | None = None) -> int:
        """Make sure every cron job's next occurrence after ``now_ms`` is armed.

        One ``send_batch`` for all cron jobs. Idempotent: an occurrence already armed
        (by this or any other scheduler on the broker) is not armed again.

        :param now_ms: epoch ms; the app's clock by default.
        :returns: how many occurrences were newly armed.
        """
        now = self._app.clock.now_ms() if now_ms is None else now_ms
        occurrences = [
            (spec, spec.trigger.next_fire_ms(now)) for spec in self._app.registry.crons()
        ]
        results = self._send(occurrences)
        return sum(r.status is SendStatus.OK for r in results)

    def on_fired(self, name: str, fire_ms: int, now_ms: int) -> list[int]:
        """The occurrence ``fire_ms`` of cron job ``name`` was delivered at ``now_ms``:
        arm the next occurrence and say which occurrences to run now.

        Call it before running the job (and ack after), once per delivery; calling
        it again for the same occurrence arms nothing new.

        :returns: occurrence times (epoch ms, ascending) to run now: ``[fire_ms]``
            when on time; after a gap, what the misfire policy keeps of the
            occurrences from ``fire_ms`` up to ``now_ms`` (an occurrence this
            planner knows has its own message is left to that message); empty when
            all of them are beyond grace (logged as skipped).
        :raises JobNotFound: when no cron job has that name.
        """
        spec = self._spec(name)
        now = max(now_ms, fire_ms)
        self._send([(spec, spec.trigger.next_fire_ms(now))])
        decision = resolve_misfires(spec.trigger, fire_ms - 1, now, self._policy(spec))
        cap = self._armed_after(name, fire_ms)
        run = [t for t in decision.run if cap is None or t < cap]
        if cap is not None and cap <= now:
            # A redelivery after later occurrences were armed: those run on their own.
            due = spec.trigger.fire_times_between(fire_ms - 1, cap - 1, limit=MAX_COUNTED)
            skipped = len(due) - len(run)
        else:
            skipped = decision.skipped
        if not run:
            _log.warning(
                "cron %s: skipped occurrence %s, %d ms late (misfire_grace_time=%s s); "
                "%d occurrence(s) not run",
                name,
                spec.trigger.local(fire_ms).isoformat(),
                now - fire_ms,
                spec.misfire.grace_s,
                skipped,
            )
        elif skipped:
            _log.info(
                "cron %s: %d ms late; running %d missed occurrence(s), %d not run "
                "(coalesce=%s, misfire_grace_time=%s s)",
                name,
                now - fire_ms,
                len(run),
                skipped,
                spec.misfire.coalesce,
                spec.misfire.grace_s,
            )
        return run


__all__ = ["CronPlanner", "jitter_ms"]
