"""The scheduler's error tree: roots, stdlib bases and messages that say what to do."""

from __future__ import annotations

import pytest

from broker_adapter.errors import ChronoqError
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


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (SchedulerError, (ChronoqError,)),
        (JobNotFound, (SchedulerError, LookupError)),
        (DuplicateJob, (SchedulerError, ValueError)),
        (InvalidJobSpec, (SchedulerError, ValueError)),
        (InvalidSchedule, (SchedulerError, ValueError)),
        (InvalidCron, (InvalidSchedule, ValueError)),
        (InvalidSettings, (SchedulerError, ValueError)),
        (UnserializableArgument, (SchedulerError, TypeError)),
    ],
)
def test_error_tree(error: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    for base in bases:
        assert issubclass(error, base), f"{error.__name__} should derive from {base.__name__}"
    assert issubclass(error, ChronoqError)


def test_job_not_found_suggests_close_name_and_what_to_do() -> None:
    err = JobNotFound("shop.close_ordr", ["shop.close_order", "shop.refund"])
    assert err.name == "shop.close_ordr"
    assert "did you mean 'shop.close_order'" in str(err)
    assert "@app.job" in str(err)


def test_job_not_found_without_close_names_has_no_suggestion() -> None:
    assert "did you mean" not in str(JobNotFound("x", ["completely.different"]))


def test_duplicate_job_names_the_holder() -> None:
    err = DuplicateJob("close", "shop.orders.close")
    assert "shop.orders.close" in str(err) and "name=" in str(err)


def test_messages_carry_fields() -> None:
    cron = InvalidCron("61 * * * *", "UTC", "out of range")
    assert (cron.expr, cron.tz) == ("61 * * * *", "UTC")
    assert "61 * * * *" in str(cron) and "out of range" in str(cron)
    settings = InvalidSettings("prefetch", "CHRONOQ_PREFETCH", 0, "must be >= 1")
    assert "CHRONOQ_PREFETCH" in str(settings) and "prefetch" in str(settings)
    arg = UnserializableArgument("args[0]", {1, 2}, "pass a sorted list")
    assert "args[0]" in str(arg) and "set" in str(arg) and "sorted list" in str(arg)
