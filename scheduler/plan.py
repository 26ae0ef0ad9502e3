"""A :class:`Plan`: what the planner needs to arm and check one schedule's occurrences.

A plan is built from either kind of schedule, a ``@app.cron``/``@app.every`` job
(:meth:`Plan.of_cron`) or a stored definition of ``app.schedules``
(:meth:`Plan.of_def`), and needs no job registry: a process that only knows the
stored definition (``chronoq schedules resume``) arms exactly what a dispatcher
of the app would. The occurrence at ``fire_ms`` is one message:

* topic: the job's topic; body: ``JobCall(job, args, kwargs).encode()``;
* key ``cron:<name>:<fire_ms>`` (both kinds: the broker keeps at most one pending
  message per key, and refuses to fire the same key and due time twice);
* tags: the job's name (``find_pending(tag=job)`` finds its runs);
* ``deliver_at_ms = fire_ms + jitter``, the jitter derived from the key, so every
  process picks the same time;
* a stored schedule's occurrence also carries the property
  :data:`SCHEDULE_PROPERTY` (its version, as text), which tells a dispatcher it
  belongs to a stored schedule even after that schedule was removed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker_adapter.message import Message
from scheduler.interval import IntervalTrigger, Trigger
from scheduler.jobcall import JobCall
from scheduler.schedule_def import ScheduleDef
from scheduler.spec import CronSpec, MisfirePolicy, cron_key

#: Message property marking an occurrence of a stored schedule; its value is the version.
SCHEDULE_PROPERTY = "chronoq-schedule"


def jitter_ms(key: str, jitter_s: float | None) -> int:
    """The deterministic jitter of the occurrence with ``key``: ``0`` to the jitter
    in whole ms, from a hash of the key (the same in every process)."""
    if not jitter_s:
        return 0
    span = round(jitter_s * 1000) + 1
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % span


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """How to arm and recognise one schedule's occurrences (immutable).

    :param name: the schedule's name (the job's, for a decorator schedule).
    :param job: the job it runs (the message's tag).
    :param trigger: its fire times.
    :param misfire: its misfire policy as configured (for logs).
    :param jitter: seconds of deterministic delay, or ``None``.
    :param topic: the topic of its occurrences.
    :param body: the body of each occurrence.
    :param start_ms: no occurrence before this time, or ``None``.
    :param end_ms: no occurrence after this time, or ``None``.
    :param version: a stored schedule's version; ``None`` for a decorator schedule.
    """

    name: str
    job: str
    trigger: Trigger
    misfire: MisfirePolicy
    jitter: float | None
    topic: str
    body: bytes
    start_ms: int | None = None
    end_ms: int | None = None
    version: int | None = None
    #: The policy misfires are judged by: a jittered run is never a misfire, so the
    #: grace is extended by the jitter.
    policy: MisfirePolicy = field(init=False)
    properties: Mapping[str, str] | None = field(init=False)

    def __post_init__(self) -> None:
        policy = self.misfire
        if policy.grace_s is not None and self.jitter:
            policy = MisfirePolicy(
                policy.grace_s + self.jitter, policy.coalesce, policy.max_catch_up
            )
        object.__setattr__(self, "policy", policy)
        props = None if self.version is None else {SCHEDULE_PROPERTY: str(self.version)}
        object.__setattr__(self, "properties", props)

    @classmethod
    def of_cron(cls, spec: CronSpec, topic: str) -> Plan:
        """The plan of a ``@app.cron``/``@app.every`` job whose messages go to ``topic``."""
        return cls(
            spec.name,
            spec.job.name,
            spec.trigger,
            spec.misfire,
            spec.jitter,
            topic,
            JobCall(spec.job.name).encode(),
        )

    @classmethod
    def of_def(cls, d: ScheduleDef) -> Plan:
        """The plan of a stored schedule (``d.source == "data"``).

        :raises InvalidSchedule: for a definition whose trigger no longer parses.
        """
        return cls(
            d.name,
            d.job,
            d.trigger(),
            d.misfire(),
            d.jitter_s,
            d.topic,
            d.call().encode(),
            d.start_ms,
            d.end_ms,
            d.version,
        )

    @property
    def series(self) -> str:
        """What tells this plan's occurrences from another version's (for bookkeeping)."""
        return self.name if self.version is None else f"{self.name}\x00{self.version}"

    def next_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms`` within the window, or
        ``None`` when the schedule has ended."""
        if self.start_ms is not None and after_ms < self.start_ms - 1:
            after_ms = self.start_ms - 1
        t = self.trigger.next_fire_ms(after_ms)
        return None if self.end_ms is not None and t > self.end_ms else t

    def in_window(self, t_ms: int) -> bool:
        """Whether ``t_ms`` lies within ``[start_ms, end_ms]``."""
        return (self.start_ms is None or t_ms >= self.start_ms) and (
            self.end_ms is None or t_ms <= self.end_ms
        )

    def is_fire_time(self, t_ms: int) -> bool:
        """Whether ``t_ms`` is one of this plan's occurrences."""
        trigger = self.trigger
        if isinstance(trigger, IntervalTrigger):
            hit = trigger.is_fire_time(t_ms)
        else:
            hit = trigger.next_fire_ms(t_ms - 1) == t_ms
        return hit and self.in_window(t_ms)

    def owns(self, fire_ms: int, topic: str) -> bool:
        """Whether an occurrence message (its key's ``fire_ms``, its topic) stands for
        one of this plan's occurrences: if not, it was armed from another version
        (its body may be outdated even so: the caller compares it with :attr:`body`)."""
        return topic == self.topic and self.is_fire_time(fire_ms)

    def key(self, fire_ms: int) -> str:
        """``cron:<name>:<fire_ms>``."""
        return cron_key(self.name, fire_ms)

    def message(self, fire_ms: int) -> Message:
        """The message of the occurrence at ``fire_ms`` (see the module docstring)."""
        key = cron_key(self.name, fire_ms)
        return Message(
            self.topic,
            self.body,
            key,
            self.job,
            self.properties,
            deliver_at_ms=fire_ms + jitter_ms(key, self.jitter),
        )


__all__ = ["SCHEDULE_PROPERTY", "Plan", "jitter_ms"]
