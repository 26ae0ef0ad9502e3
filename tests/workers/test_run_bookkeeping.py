"""The dispatcher's bookkeeping helpers on their own: InFlight (slots, handoffs, who
settles), CronGate (max_running), TimeoutWatch (which job expires), Run."""

from __future__ import annotations

import threading
import time

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.scheduler import Scheduler
from scheduler.spec import CronSpec, JobSpec
from workers.context import JobContext
from workers.cron_gate import CronGate
from workers.inflight import InFlight, JobEnd
from workers.runs import Run
from workers.timeout_watch import TimeoutWatch


def _spec(timeout: float | None = None) -> JobSpec:
    def job() -> None: ...

    return JobSpec(name="j", func=job, timeout=timeout)


def _run(
    spec: JobSpec | None = None, cron: CronSpec | None = None, occurrences: tuple[int, ...] = ()
) -> Run:
    spec = spec or _spec()
    call = JobCall(spec.name)
    m = ReceivedMessage("m1", "t", b"", 0, 0, 1, b"r")
    first = occurrences[0] if occurrences else None
    return Run(m, spec, call, JobContext(spec, call, m, first, lambda: 0.0), cron, occurrences)


def _next_job(run: Run) -> JobContext:
    fire_ms = run.next_fire_ms()
    assert fire_ms is not None
    return JobContext(run.spec, run.call, run.message, fire_ms, lambda: 0.0)


# -- InFlight ----------------------------------------------------------------------------


def test_slots_bound_the_room_and_a_handoff_frees_its_slot() -> None:
    flow = InFlight(capacity=2, max_awaiting=1)
    a, b = _run(), _run()
    flow.add(a)
    assert flow.room(0) == 1
    flow.add(b)
    assert flow.room(0) == 0 and flow.slots_taken == 2
    flow.hand_off()  # a's job now runs elsewhere
    assert (flow.slots_taken, flow.awaiting) == (1, 1)
    assert flow.room(0) == 0  # max_awaiting reached: no pull either
    assert flow.end_job(a, slot=False, next_job=None) is JobEnd.SETTLE
    assert (flow.room(0), flow.awaiting, len(flow), flow.processed) == (1, 0, 2, 0)
    flow.settled(a)  # its claimer acked
    assert (len(flow), flow.processed) == (1, 1)


def test_only_one_thread_settles_a_run() -> None:
    flow = InFlight(capacity=4, max_awaiting=4)
    run = _run(_spec(timeout=1.0))
    flow.add(run)
    assert flow.claim(run, run.job)  # e.g. its timeout
    assert not flow.claim(run, run.job)
    assert flow.end_job(run, slot=True, next_job=None) is JobEnd.SETTLED  # its late end
    flow.settled(run)
    assert (flow.processed, len(flow), flow.slots_taken) == (1, 0, 0)


def test_a_claimed_run_is_held_until_its_settle_is_done() -> None:
    """The drain (and an idle check) must not see a run gone while its ack is on its
    way: the dispatcher would close the consumer and the message be released."""
    flow = InFlight(capacity=4, max_awaiting=4)
    run = _run()
    flow.add(run)
    assert flow.end_job(run, slot=True, next_job=None) is JobEnd.SETTLE
    assert (len(flow), flow.processed) == (1, 0)
    waited: list[list[Run]] = []
    drain = threading.Thread(target=lambda: waited.append(flow.wait_and_claim_rest(30.0)))
    drain.start()
    drain.join(0.2)
    assert drain.is_alive()  # still waiting for the settle in progress
    flow.settled(run)
    drain.join(10)
    assert waited == [[]]  # nothing left to release: the claimer settled it
    assert (len(flow), flow.processed) == (0, 1)


def test_a_cron_run_goes_on_and_a_late_timeout_of_its_last_job_cannot_claim_it() -> None:
    flow = InFlight(capacity=4, max_awaiting=4)
    run = _run(occurrences=(1_000, 2_000))
    first = run.job
    flow.add(run)
    second = _next_job(run)
    assert flow.end_job(run, slot=True, next_job=second) is JobEnd.NEXT
    assert run.job is second and not run.settled
    assert not flow.claim(run, first)  # the first job's timeout, seen late
    flow.take_slot()
    assert run.next_fire_ms() is None
    assert flow.end_job(run, slot=True, next_job=None) is JobEnd.SETTLE


def test_the_drain_claims_what_is_left_and_hurry_cuts_the_wait() -> None:
    flow = InFlight(capacity=4, max_awaiting=4)
    done, stuck = _run(), _run()
    flow.add(done)
    flow.add(stuck)
    assert flow.end_job(done, slot=True, next_job=None) is JobEnd.SETTLE
    flow.settled(done)
    flow.hurry()
    assert flow.wait_and_claim_rest(60.0) == [stuck]  # returns at once: hurried
    flow.settled(stuck)
    assert stuck.settled and flow.processed == 2


# -- CronGate ----------------------------------------------------------------------------


def test_cron_gate_counts_admitted_runs_until_they_end(app: Scheduler) -> None:
    @app.cron("* * * * * *", max_running=1)
    def tick() -> None: ...

    gate = CronGate(app.registry)
    cron = gate.find(tick.name)
    assert cron is not None and gate.find("no.such.cron") is None
    first, second = _run(cron.job, cron, (1,)), _run(cron.job, cron, (2,))
    assert gate.admit(first) == ""
    assert gate.admit(second) == "1 run(s) still going (max_running=1)"
    gate.after_run(second)  # refused: never counted, so it uncounts nothing
    assert gate.running(tick.name) == 1
    gate.after_run(first)
    assert gate.running(tick.name) == 0
    assert gate.admit(second) == ""
    assert gate.admit(_run()) == ""  # not a cron run: passes, uncounted


# -- TimeoutWatch ------------------------------------------------------------------------


def test_timeout_watch_expires_a_started_job_over_its_timeout_once() -> None:
    expired: list[tuple[Run, JobContext]] = []
    watch = TimeoutWatch(lambda run, job: expired.append((run, job)))
    assert watch.tick() is None
    untimed, queued, late = _run(), _run(_spec(timeout=5.0)), _run(_spec(timeout=5.0))
    for run in (untimed, queued, late):
        watch.before_start(run, run.job)
    assert len(watch) == 2  # no timeout: not watched
    late.job.started_mono = time.monotonic() - 10.0  # started 10 s ago
    wish = watch.tick()
    assert expired == [(late, late.job)]
    assert wish is not None and wish <= 1000  # the queued one is looked at again
    watch.tick()
    assert len(expired) == 1 and len(watch) == 1  # forgotten once expired


def test_timeout_watch_forgets_an_ended_job_but_not_its_successor() -> None:
    watch = TimeoutWatch(lambda run, job: None)
    run = _run(_spec(timeout=5.0), occurrences=(1_000, 2_000))
    first = run.job
    watch.before_start(run, first)
    second = _next_job(run)
    run.job = second
    watch.before_start(run, second)
    watch.after_job(run, first, None)  # the first one's end, seen late
    assert len(watch) == 1
    watch.after_job(run, second, None)
    assert len(watch) == 0
