"""The last run of each schedule, as ``app.schedules.list()`` shows it.

Recording must stay cheap with thousands of schedules, so a dispatcher does not
write per run: it keeps the last run of every schedule it ran in memory and,
every few seconds when something changed, writes them as a few records (up to
:data:`RUNS_PER_RECORD` schedules each) on topic :data:`RUNS_TOPIC`, keyed
``runs:<owner>:<n>`` (the owner names the dispatcher process), body JSON::

    {"f": 1, "runs": {"tenant-42": [fire_ms, started_ms, ended_ms, "ok"], ...}}

Like schedule records they are keyed records (:mod:`scheduler.keyed_records`),
pending messages nobody consumes, due
:data:`RUNS_HORIZON_MS` ahead: the records of a dispatcher gone for that long
fall due and are forgotten. A reader merges every dispatcher's records and keeps,
per schedule, the run that ended last. What a dispatcher ran since its last write
is lost if it dies (at most a few seconds of runs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker_adapter.base import BrokerAdapter
from scheduler.keyed_records import iter_records, put_record

_log = logging.getLogger("chronoq.scheduler.RunBook")

#: The topic of last-run records.
RUNS_TOPIC = "chronoq.schedules.runs"
#: How far ahead a last-run record is due after a write (a day).
RUNS_HORIZON_MS = 24 * 3600 * 1000
#: Schedules per record (keeps each body well under the brokers' 4 MiB limit).
RUNS_PER_RECORD = 5000
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class LastRun:
    """One run of a schedule.

    :param fire_ms: the occurrence it stood for (epoch ms).
    :param started_ms: when its body started (epoch ms).
    :param ended_ms: when it ended (epoch ms).
    :param outcome: ``"ok"``, or ``"failed: <error type>"``.
    """

    fire_ms: int
    started_ms: int
    ended_ms: int
    outcome: str


class RunBook:
    """Writes one dispatcher's last runs and reads everyone's.

    :param broker: returns the broker to use.
    :param now_ms: the current time, epoch ms.
    """

    def __init__(self, broker: Callable[[], BrokerAdapter], now_ms: Callable[[], int]) -> None:
        self._broker = broker
        self._now_ms = now_ms

    def write(self, owner: str, runs: Mapping[str, LastRun]) -> None:
        """Store ``runs`` (every schedule ``owner`` ran, its latest run) in place of
        what ``owner`` stored before."""
        broker = self._broker()
        names = sorted(runs)
        due = self._now_ms() + RUNS_HORIZON_MS
        for n, i in enumerate(range(0, max(1, len(names)), RUNS_PER_RECORD)):
            doc = {
                "f": _FORMAT,
                "runs": {
                    k: [r.fire_ms, r.started_ms, r.ended_ms, r.outcome]
                    for k in names[i : i + RUNS_PER_RECORD]
                    for r in (runs[k],)
                },
            }
            body = json.dumps(doc, separators=(",", ":")).encode()
            put_record(broker, RUNS_TOPIC, f"runs:{owner}:{n}", body, due)

    def read(self) -> dict[str, LastRun]:
        """The last run of each schedule, over every dispatcher's records."""
        out: dict[str, LastRun] = {}
        for view in iter_records(self._broker(), RUNS_TOPIC):
            try:
                doc = json.loads(view.body or b"")
                for name, (fire, started, ended, outcome) in doc["runs"].items():
                    seen = out.get(name)
                    if seen is None or ended > seen.ended_ms:
                        out[name] = LastRun(fire, started, ended, outcome)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                _log.warning("last-run record %s ignored: %s", view.key, e)
        return out


__all__ = ["RUNS_HORIZON_MS", "RUNS_PER_RECORD", "RUNS_TOPIC", "LastRun", "RunBook"]
