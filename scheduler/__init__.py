"""chronoq's scheduler layer: jobs, cron triggers, misfire rules and settings.

:class:`Scheduler` is the facade apps use (``@app.job``, ``@app.cron``,
``job.schedule``/``cancel``); it builds on the broker-independent parts here and
on :mod:`broker_adapter`. Importing it is cheap (no Celery, no Spark, no broker opened).
"""

import logging

from scheduler.cron import CronPlanner
from scheduler.errors import (
    DuplicateJob,
    DuplicateSchedule,
    InvalidCron,
    InvalidJobSpec,
    InvalidSchedule,
    InvalidSettings,
    JobNotFound,
    ScheduleNotFound,
    SchedulerError,
    UnserializableArgument,
)
from scheduler.executor import Executor, Handoff, JobNotStarted
from scheduler.executor_kinds import (
    EXECUTOR_KINDS,
    DuplicateExecutor,
    ExecutorKind,
    ExecutorRegistry,
    UnknownExecutor,
    register_kind,
)
from scheduler.handles import Call, JobHandle, ScheduledJob
from scheduler.interval import IntervalTrigger
from scheduler.jobcall import JobCall
from scheduler.loop_rule import SyncCallInEventLoop
from scheduler.misfire import MisfireDecision, latest_fire_times, resolve_misfires
from scheduler.pending_runs import PendingRun
from scheduler.receipts import CancelAllResult, RescheduleReceipt
from scheduler.registry import JobRegistry
from scheduler.runners import NoAppRunner
from scheduler.schedule_def import ScheduleDef
from scheduler.scheduler import Scheduler
from scheduler.schedules import ScheduleInfo, Schedules
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
    "EXECUTOR_KINDS",
    "Call",
    "CancelAllResult",
    "CronPlanner",
    "CronSpec",
    "CronTrigger",
    "DuplicateExecutor",
    "DuplicateJob",
    "DuplicateSchedule",
    "Executor",
    "ExecutorKind",
    "ExecutorRegistry",
    "Handoff",
    "IntervalTrigger",
    "InvalidCron",
    "InvalidJobSpec",
    "InvalidSchedule",
    "InvalidSettings",
    "JobCall",
    "JobHandle",
    "JobNotFound",
    "JobNotStarted",
    "JobRegistry",
    "JobSpec",
    "MisfireDecision",
    "MisfirePolicy",
    "NoAppRunner",
    "PendingRun",
    "RescheduleReceipt",
    "RetryPolicy",
    "ScheduleDef",
    "ScheduleInfo",
    "ScheduleNotFound",
    "ScheduledJob",
    "Scheduler",
    "SchedulerError",
    "Schedules",
    "Settings",
    "SyncCallInEventLoop",
    "TimingFields",
    "UnknownExecutor",
    "UnserializableArgument",
    "cron_key",
    "latest_fire_times",
    "parse_cron_key",
    "register_kind",
    "resolve_misfires",
    "resolve_timing",
]
