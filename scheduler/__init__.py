"""chronoq's scheduler layer: jobs, cron triggers, misfire rules and settings.

This package holds the broker-independent parts; the ``Scheduler`` facade builds
on them and on :mod:`broker_adapter`. Importing it is cheap (no Celery, no Spark).
"""

import logging

from scheduler.errors import (
    DuplicateJob,
    InvalidCron,
    InvalidJobSpec,
    InvalidSchedule,
    InvalidSettings,
    JobNotFound,
    SchedulerError,
    UnserializableArgument,
)
from scheduler.jobcall import JobCall
from scheduler.misfire import MisfireDecision, latest_fire_times, resolve_misfires
from scheduler.registry import JobRegistry
from scheduler.settings import Settings
from scheduler.spec import (
    CronSpec,
    JobSpec,
    MisfirePolicy,
    RetryPolicy,
    cron_key,
    parse_cron_key,
)
from scheduler.timing import TimingFields, resolve_timing
from scheduler.triggers import CronTrigger

logging.getLogger("chronoq.scheduler").addHandler(logging.NullHandler())

__all__ = [
    "CronSpec",
    "CronTrigger",
    "DuplicateJob",
    "InvalidCron",
    "InvalidJobSpec",
    "InvalidSchedule",
    "InvalidSettings",
    "JobCall",
    "JobNotFound",
    "JobRegistry",
    "JobSpec",
    "MisfireDecision",
    "MisfirePolicy",
    "RetryPolicy",
    "SchedulerError",
    "Settings",
    "TimingFields",
    "UnserializableArgument",
    "cron_key",
    "latest_fire_times",
    "parse_cron_key",
    "resolve_misfires",
    "resolve_timing",
]
