"""Faults between hosts, at the issue's size: 50,000 keyed jobs due over 60 s
(issue 19 §1).

The same harness as ``tests/netns/test_faults.py`` (:mod:`tests.netns.scenario`),
which runs 4,000 jobs over 40 s to stay inside a test's budget on 2 shared cores:
hosts ``R``, ``A``, ``B`` are Linux network namespaces on one bridge
(198.51.100.0/24 only); ``R`` runs the broker, ``A`` and ``B`` two ``chronoq run``
dispatchers each, ``A`` the producer, which schedules ``--count`` keyed jobs due
over ``--window-s`` and cancels every 10th. For each broker and fault asked for,
it prints the verdict: jobs scheduled / cancelled / expected, runs, lost, cancelled
but ran, duplicated (in flight on the faulted host, or unexplained), runs per host
and after the fault, the time until a dead or cut host's in-flight work ran
elsewhere, the lateness of first runs (start minus due), interval occurrences,
then the load average. Needs root (``ip netns``); exits 1 when a run broke a rule.

Run from the project root::

    .venv/bin/python bench/netns_faults.py                          # redis, every fault
    .venv/bin/python bench/netns_faults.py --broker server --fault kill_b partition_b
    .venv/bin/python bench/netns_faults.py --count 20000 --window-s 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.netns.lab import Lab
from tests.netns.scenario import FAULTS, Plan, run_scenario

#: Hosts whose dispatchers must run jobs again after the fault ended.
REJOIN = {"partition_b": ("b",), "restart_r": ("a", "b")}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the asked scenarios and print their figures; 1 when one broke a rule."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", nargs="+", choices=["redis", "server"], default=["redis"])
    parser.add_argument("--fault", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--lead-s", type=float, default=15.0, help="first due time after start")
    parser.add_argument("--fault-at-s", type=float, default=15.0, help="after the first due time")
    parser.add_argument("--cut-s", type=float, default=20.0, help="how long partition_b lasts")
    parser.add_argument("--job-ms", type=int, default=20, help="how long each job works")
    parser.add_argument("--keep", action="store_true", help="keep the logs and ledgers")
    args = parser.parse_args(argv)
    failed = 0
    tmp = Path(tempfile.mkdtemp(prefix="chronoq-netns-"))
    for broker in args.broker:
        for fault in args.fault:
            root = tmp / f"{broker}-{fault}"
            plan = Plan(broker, fault, count=args.count, window_s=args.window_s,
                        lead_s=args.lead_s, fault_at_s=args.fault_at_s,
                        job_ms=args.job_ms, cut_s=args.cut_s)  # fmt: skip
            load_before = os.getloadavg()[0]
            with Lab(root) as lab:
                verdict = run_scenario(lab, root, plan)
            problems = verdict.failures(REJOIN.get(fault, ()))
            failed += bool(problems)
            print(f"[{broker}] {verdict.summary()}", flush=True)
            print(
                f"  load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
                f"{'OK' if not problems else 'BROKEN: ' + '; '.join(problems)}\n",
                flush=True,
            )
    if args.keep:
        print(f"logs and ledgers in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
