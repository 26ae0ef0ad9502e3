"""Four dispatchers on two namespaced hosts, a broker on a third, one fault per test.

Run with ``.venv/bin/pytest -m slow tests/netns -p no:randomly -s`` (``-s`` shows
each test's figures). Each test schedules :attr:`Plan.count` = 4,000 keyed jobs of
100 ms due over 40 s (the issue's 50,000 over 60 s is ``bench/netns_faults.py``: too much
for a test on 2 shared cores) and cancels every 10th; see
:mod:`tests.netns.scenario` for the faults and :mod:`tests.netns.ledger` for the
rules every run must keep.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.netns.lab import Lab
from tests.netns.scenario import FAULTS, Plan, run_scenario
from tests.redis_server import require_redis_server

pytestmark = [pytest.mark.slow, pytest.mark.external_service, pytest.mark.timeout(600)]

#: Hosts whose dispatchers must run jobs again after the fault ended.
REJOIN = {"partition_b": ("b",), "restart_r": ("a", "b")}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("broker", ["redis", "server"])
def test_fault(lab: Lab, tmp_path: Path, broker: str, fault: str) -> None:
    if broker == "redis":
        require_redis_server()
    # Given two dispatchers on A and on B and a producer on A, when the fault strikes
    verdict = run_scenario(lab, tmp_path, Plan(broker=broker, fault=fault))
    print(f"\n[{broker}] {verdict.summary()}")  # the figures the issue asks for
    # Then every uncancelled job ran, no ABORTED one did, repeats are the fault's,
    # each interval occurrence ran once, and the healed hosts work again
    assert verdict.scheduled == Plan(broker, fault).count
    assert verdict.cancelled > 0
    assert verdict.failures(REJOIN.get(fault, ())) == []
    assert verdict.ticks >= 10
