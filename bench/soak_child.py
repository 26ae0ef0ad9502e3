"""Child processes of ``bench/soak_kill9.py``, killed with ``kill -9`` and started
again on the same directory.

``python -m bench.soak_child embedded DATA LEDGER CYCLE [drain]``
    The embedded owner: opens ``rocksdb://DATA``, sends keyed messages and aborts
    (:class:`~bench.soak_load.Producer`, unless ``drain``) and consumes them
    (:class:`~bench.soak_load.Recorder`), writing ``LEDGER/embedded-CYCLE.log``.
``python -m bench.soak_child celery DATA URL LEDGER``
    A Celery-executor dispatcher: a shared client of ``rocksdb://DATA`` (the soak
    owns it) running the jobs of ``tests/celery/jobs.py`` on the Celery broker
    ``URL``; it records each message it pulls (``P`` lines) in ``LEDGER``.

Both print ``ready`` once working and stop cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.soak_ledger import LedgerFile
from bench.soak_load import Producer, Recorder
from broker_adapter import Message, open_broker
from broker_adapter.results import ReceivedMessage

TOPIC, GROUP = "soak", "soak-group"
#: Invisible time of the soak's consumers: what a killed one held comes back after it.
INVISIBLE_MS = 5_000


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def embedded(data: str, ledger_dir: str, cycle: int, drain: bool) -> None:
    """Run the embedded owner until SIGTERM (or a kill)."""
    stop = _stop_on_sigterm()
    broker = open_broker(f"rocksdb://{data}?share=0")
    ledger = LedgerFile(Path(ledger_dir) / f"embedded-{cycle}.log")
    consumer = broker.consumer(GROUP, [TOPIC], invisible_ms=INVISIBLE_MS)
    recorder = Recorder(ledger, consumer)
    recorder.start()

    def send(key: str, delay_ms: int) -> str:
        return broker.send(Message(TOPIC, b"x", key=key, delay_ms=delay_ms)).msg_id

    def abort(msg_id: str, key: str | None) -> str:
        res = broker.abort(key=key, topic=TOPIC) if key else broker.abort(msg_id=msg_id)
        return res.status.value

    producer = Producer(ledger, send, abort, f"c{cycle}", seed=cycle)
    if not drain:
        producer.start()
    print("ready", flush=True)
    stop.wait()
    producer.stop.set()
    recorder.stop.set()
    recorder.join(10)
    consumer.close()
    broker.close()


def celery(data: str, url: str, ledger_dir: str) -> None:
    """Run a Celery-executor dispatcher until SIGTERM (or a kill)."""
    from scheduler.scheduler import Scheduler
    from tests.celery import jobs
    from workers import Dispatcher
    from workers.celery import celery_app_for
    from workers.hooks import DispatchHook

    class Pulls(DispatchHook):
        """Records every message the dispatcher pulls."""

        def __init__(self, ledger: LedgerFile) -> None:
            self.ledger = ledger

        def on_pulled(self, messages: list[ReceivedMessage]) -> None:
            for m in messages:
                self.ledger.pulled(m.msg_id, m.attempts)

    stop = _stop_on_sigterm()
    scheduler = Scheduler(f"rocksdb://{data}", max_workers=4, prefetch=64)
    jobs.define(scheduler)
    celery_app_for(scheduler, url, **jobs.celery_conf(3600))
    pulls = Pulls(LedgerFile(Path(ledger_dir) / f"celery-pulls-{os.getpid()}.log"))
    dispatcher = Dispatcher(scheduler, drain_timeout_s=2, invisible_ms=INVISIBLE_MS, hooks=[pulls])
    print("ready", flush=True)
    dispatcher.run_forever(stop_event=stop, poll_ms=50)
    scheduler.close()


if __name__ == "__main__":
    if sys.argv[1] == "embedded":
        embedded(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:6] == ["drain"])
    else:
        celery(sys.argv[2], sys.argv[3], sys.argv[4])
