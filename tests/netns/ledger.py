"""What the ledgers of a namespaced-hosts run say: lost, cancelled-but-ran,
duplicated (and whether a fault explains each), interval occurrences, rejoins.

A keyed job ran when a run of it *ended*; it is duplicated when it *started* more
than once (a run cut short by a kill counts: its job started again elsewhere). An
interval occurrence is duplicated when it started more than once; like a keyed
job's, a repeat is the fault's when every earlier run was on a faulted host around
the fault (a run whose ack the fault cut off comes back: at least once).
Input: the producer's answers (``producer.json``, see :mod:`tests.netns.producer`)
and every ``<host>-<pid>.jsonl`` of :mod:`tests.netns.app`. All hosts share the
machine's clock, so start times from different hosts compare directly.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.netns.app import TICK, TICK_S, WORK

#: A run that started this long before a fault may still have been unacknowledged
#: when it struck (acks of one pull are sent together, after the pull's last run).
ACK_SLACK_MS = 5_000


@dataclass(frozen=True)
class Fault:
    """When a fault struck and ended (epoch ms), and which hosts' runs it may repeat.

    :param kind: ``none``, ``kill_b``, ``partition_b``, ``slow_a``, ``restart_r``.
    :param hosts: hosts whose unacknowledged runs may be repeated (``()``: none).
    """

    kind: str
    start_ms: int = 0
    end_ms: int = 0
    hosts: tuple[str, ...] = ()

    def explains(self, first: dict[str, Any]) -> bool:
        """Whether a repeat of the run ``first`` is explained by this fault: that run
        was on a faulted host and could still be unacknowledged when the fault struck."""
        return first["h"] in self.hosts and self.start_ms - ACK_SLACK_MS <= first["t"] <= max(
            self.end_ms, self.start_ms
        )


def read_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every ledger line of every process (a torn last line of a killed one is skipped)."""
    runs = []
    for path in sorted(runs_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return runs


def _pct(values: list[int], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


@dataclass
class Verdict:
    """The checks of one run; :meth:`failures` lists what broke the rules."""

    fault: Fault
    scheduled: int = 0
    cancelled: int = 0
    expected: int = 0
    ran: int = 0
    lost: list[str] = field(default_factory=list)
    cancelled_ran: list[str] = field(default_factory=list)
    dup_explained: list[str] = field(default_factory=list)
    dup_unexplained: list[str] = field(default_factory=list)
    ticks: int = 0
    tick_dups: list[int] = field(default_factory=list)  # unexplained by the fault
    tick_dups_explained: list[int] = field(default_factory=list)
    tick_gaps: list[tuple[int, int]] = field(default_factory=list)
    runs_after_fault: dict[str, int] = field(default_factory=dict)
    takeover_ms: int | None = None
    late_p50_ms: int = 0
    late_p99_ms: int = 0
    late_max_ms: int = 0
    runs_by_host: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    shifted: int = 0
    max_shift_ms: int = 0

    def failures(self, rejoin_hosts: tuple[str, ...] = ()) -> list[str]:
        """The broken rules, as sentences (empty when the run passed)."""
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} uncancelled jobs never ran, e.g. {self.lost[:5]}")
        if self.cancelled_ran:
            out.append(f"{len(self.cancelled_ran)} ABORTED jobs ran, e.g. {self.cancelled_ran[:5]}")
        if self.dup_unexplained:
            out.append(
                f"{len(self.dup_unexplained)} jobs ran twice without a fault to explain it, "
                f"e.g. {self.dup_unexplained[:5]}"
            )
        if self.tick_dups:
            out.append(
                "interval occurrences ran more than once without a fault to explain it: "
                f"{self.tick_dups[:5]}"
            )
        if self.tick_gaps:
            out.append(f"interval occurrences missing between {self.tick_gaps[:5]}")
        for host in rejoin_hosts:
            if not self.runs_after_fault.get(host):
                out.append(f"the dispatchers of {host} ran nothing after the fault ended")
        return out

    def summary(self) -> str:
        """One block of figures for the run's output."""
        dups = len(self.dup_explained) + len(self.dup_unexplained)
        take = "-" if self.takeover_ms is None else f"{self.takeover_ms / 1000:.1f} s"
        return (
            f"[{self.fault.kind}] jobs {self.scheduled} scheduled, {self.cancelled} cancelled "
            f"(ABORTED), {self.expected} expected, {self.ran} runs; lost {len(self.lost)}; "
            f"cancelled but ran {len(self.cancelled_ran)}; duplicated {dups} "
            f"({len(self.dup_explained)} in flight on {','.join(self.fault.hosts) or '-'} "
            f"at the fault, {len(self.dup_unexplained)} unexplained)\n"
            f"  runs by host {self.runs_by_host}; after the fault ended {self.runs_after_fault}; "
            f"takeover of in-flight work {take} after the fault\n"
            f"  lateness P50 {self.late_p50_ms} ms, P99 {self.late_p99_ms} ms, "
            f"max {self.late_max_ms} ms; interval occurrences {self.ticks} "
            f"(dups {len(self.tick_dups_explained)} at the fault, {len(self.tick_dups)} "
            f"unexplained, gaps {len(self.tick_gaps)}); "
            f"producer retries {self.retries}, due times shifted (producer behind) "
            f"{self.shifted} by up to {self.max_shift_ms / 1000:.1f} s"
        )


def judge(producer: dict[str, Any], runs: list[dict[str, Any]], fault: Fault) -> Verdict:
    """Check the runs against what the producer was told (see the module docstring)."""
    v = Verdict(fault=fault)
    aborted = {k for k, status in producer["aborts"].items() if status == "ABORTED"}
    expected = set(producer["sent"]) - aborted
    v.scheduled, v.cancelled, v.expected = len(producer["sent"]), len(aborted), len(expected)
    v.retries = {"send": producer["send_retries"], "abort": producer["abort_retries"]}
    v.shifted, v.max_shift_ms = producer["shifted"], producer["max_shift_ms"]
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    fires: dict[int, list[dict[str, Any]]] = defaultdict(list)
    hosts: dict[str, int] = defaultdict(int)
    after: dict[str, int] = defaultdict(int)
    end = max(fault.end_ms, fault.start_ms)
    done: set[str] = set()
    for run in runs:
        if run.get("e"):
            done.add(run["k"])
            continue
        hosts[run["h"]] += 1
        if fault.kind != "none" and run["t"] > end:
            after[run["h"]] += 1
        if run["j"] == WORK:
            by_key[run["k"]].append(run)
        elif run["j"] == TICK:
            fires[run["f"]].append(run)
    v.runs_by_host, v.runs_after_fault = dict(hosts), dict(after)
    v.ran = sum(len(r) for r in by_key.values())
    v.lost = sorted(expected - done)  # a run counts once it ended
    v.cancelled_ran = sorted(aborted & set(by_key))
    retaken: list[int] = []
    for key, key_runs in by_key.items():
        if len(key_runs) < 2:
            continue
        if _repeats_explained(key_runs, fault):
            v.dup_explained.append(key)
            retaken.append(key_runs[-1]["t"])
        else:
            v.dup_unexplained.append(key)
    if retaken:
        v.takeover_ms = max(retaken) - fault.start_ms
    late = [min(r["t"] for r in rs) - rs[0]["d"] for rs in by_key.values()]
    v.late_p50_ms, v.late_p99_ms = _pct(late, 0.5), _pct(late, 0.99)
    v.late_max_ms = max(late, default=0)
    v.ticks = len(fires)
    for f, tick_runs in sorted(fires.items()):
        if len(tick_runs) > 1:
            explained = _repeats_explained(tick_runs, fault)
            (v.tick_dups_explained if explained else v.tick_dups).append(f)
    ordered = sorted(fires)
    step = TICK_S * 1000
    v.tick_gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != step]
    return v


def _repeats_explained(runs: list[dict[str, Any]], fault: Fault) -> bool:
    """Whether every run but the last of one job or occurrence (sorted here by start)
    could have been cut off by ``fault`` before its ack."""
    runs.sort(key=lambda r: r["t"])
    return all(fault.explains(r) for r in runs[:-1])
