"""InFlight.claim_ended: a job's end claims its run without the lock; the slot and the
run stay held until the settle is reported, and exactly one thread ever claims."""

from __future__ import annotations

import threading

from broker_adapter.results import ReceivedMessage
from scheduler.jobcall import JobCall
from scheduler.spec import JobSpec
from workers.context import JobContext
from workers.inflight import InFlight, JobEnd
from workers.runs import Run


def _run() -> Run:
    def job() -> None: ...

    spec = JobSpec(name="j", func=job, timeout=1.0)
    call = JobCall(spec.name)
    m = ReceivedMessage("m1", "t", b"", 0, 0, 1, b"r")
    return Run(m, spec, call, JobContext(spec, call, m, None, lambda: 0.0))


def test_an_ended_job_claims_and_holds_its_slot_and_run_until_settled() -> None:
    flow = InFlight(capacity=1, max_awaiting=1)
    run = _run()
    flow.add(run)
    assert flow.claim_ended(run) and run.settled
    assert not flow.claim(run, run.job)  # its timeout, seen late: not a second claimer
    assert not flow.claim_ended(run)
    # Then: still held and its slot taken, so no pull and no drain sees it gone
    assert (flow.slots_taken, len(flow), flow.processed, flow.room(0)) == (1, 1, 0, 0)
    waited: list[list[Run]] = []
    drain = threading.Thread(target=lambda: waited.append(flow.wait_and_claim_rest(30.0)))
    drain.start()
    drain.join(0.2)
    assert drain.is_alive()
    flow.settled(run, slot=True)
    drain.join(10)
    assert waited == [[]]
    assert (flow.slots_taken, len(flow), flow.processed, flow.room(0)) == (0, 0, 1, 1)


def test_a_timeout_first_leaves_the_end_to_free_the_slot() -> None:
    flow = InFlight(capacity=2, max_awaiting=1)
    run = _run()
    flow.add(run)
    assert flow.claim(run, run.job)  # the timeout settles it
    flow.settled(run)
    assert not flow.claim_ended(run)  # the job's late end
    assert flow.end_job(run, slot=True, next_job=None) is JobEnd.SETTLED
    assert (flow.slots_taken, len(flow), flow.processed) == (0, 0, 1)


def test_exactly_one_of_many_racing_threads_claims() -> None:
    for _ in range(200):
        run = _run()
        wins: list[bool] = []
        go = threading.Barrier(4)

        def race(run: Run = run, wins: list[bool] = wins, go: threading.Barrier = go) -> None:
            go.wait()
            wins.append(run.take_claim())

        threads = [threading.Thread(target=race) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False, False, False, True]
