"""JobRegistry: register, look up, refuse duplicates, iterate."""

from __future__ import annotations

import threading

import pytest

from scheduler.errors import DuplicateJob, JobNotFound
from scheduler.registry import JobRegistry
from scheduler.spec import CronSpec, JobSpec, MisfirePolicy
from scheduler.triggers import CronTrigger


def close_order(order_id: int) -> None:
    """A job."""


def refund(order_id: int) -> None:
    """Another job."""


def test_register_get_contains_len_iter() -> None:
    reg = JobRegistry()
    a = reg.register(JobSpec("shop.close_order", close_order))
    b = reg.register(JobSpec("shop.refund", refund))
    assert reg.get("shop.close_order") is a
    assert reg.find("shop.refund") is b and reg.find("nope") is None
    assert "shop.refund" in reg and "nope" not in reg
    assert len(reg) == 2
    assert list(reg) == [a, b]
    assert reg.names() == ["shop.close_order", "shop.refund"]
    assert "2 jobs" in repr(reg)


def test_get_unknown_raises_job_not_found_with_suggestion() -> None:
    reg = JobRegistry()
    reg.register(JobSpec("shop.close_order", close_order))
    with pytest.raises(JobNotFound, match="did you mean 'shop.close_order'") as info:
        reg.get("shop.close_ordr")
    assert isinstance(info.value, LookupError)
    assert info.value.name == "shop.close_ordr"


def test_duplicate_name_raises() -> None:
    reg = JobRegistry()
    reg.register(JobSpec("job", close_order))
    with pytest.raises(DuplicateJob, match="close_order") as info:
        reg.register(JobSpec("job", refund))
    assert info.value.name == "job"
    assert reg.get("job").func is close_order


def test_same_spec_twice_is_a_no_op_but_other_options_are_not() -> None:
    reg = JobRegistry()
    first = reg.register(JobSpec("job", close_order))
    assert reg.register(JobSpec("job", close_order)) is first
    assert len(reg) == 1
    with pytest.raises(DuplicateJob):
        reg.register(JobSpec("job", close_order, max_attempts=3))


def test_register_takes_specs_only() -> None:
    with pytest.raises(TypeError, match="JobSpec"):
        JobRegistry().register(close_order)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CronSpec"):
        JobRegistry().register_cron(JobSpec("j", close_order))  # type: ignore[arg-type]


def test_register_cron_registers_its_job_too() -> None:
    reg = JobRegistry()
    cron = CronSpec(JobSpec("nightly", close_order), CronTrigger("0 5 * * *", "Asia/Shanghai"))
    assert reg.register_cron(cron) is cron
    assert reg.get("nightly") is cron.job
    assert reg.crons() == [cron]
    assert reg.register_cron(cron) is cron  # idempotent
    other = CronSpec(JobSpec("nightly", close_order), CronTrigger("0 6 * * *"))
    with pytest.raises(DuplicateJob):
        reg.register_cron(other)
    taken = CronSpec(
        JobSpec("nightly", refund),
        CronTrigger("0 5 * * *", "Asia/Shanghai"),
        MisfirePolicy(grace_s=60),
    )
    with pytest.raises(DuplicateJob):
        reg.register_cron(taken)
    assert reg.crons() == [cron]


def test_cron_name_taken_by_plain_job_is_a_duplicate() -> None:
    reg = JobRegistry()
    reg.register(JobSpec("nightly", refund))
    with pytest.raises(DuplicateJob):
        reg.register_cron(CronSpec(JobSpec("nightly", close_order), CronTrigger("@daily")))
    assert reg.crons() == []


def test_concurrent_registration_keeps_every_job() -> None:
    reg = JobRegistry()

    def add(start: int) -> None:
        for i in range(start, start + 200):
            reg.register(JobSpec(f"job{i}", close_order))

    threads = [threading.Thread(target=add, args=(k * 200,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reg) == 1600
    assert sorted(reg.names()) == sorted(f"job{i}" for i in range(1600))
