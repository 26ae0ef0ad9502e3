"""A chronoq dispatcher in a process of its own, for the test that kills it.

``python -m tests.celery.dispatcher_proc DATA_DIR URL [PUBLISH_SCRIPT]`` schedules
one ``t.slow`` job due now, prints its message id, and publishes due jobs until it
is killed (``PUBLISH_SCRIPT``: ``True``, the default, or ``False``: the executor's
``publish_script``).
"""

from __future__ import annotations

import sys

from scheduler.scheduler import Scheduler
from tests.celery import jobs
from workers import Dispatcher
from workers.celery import celery_app_for


def main(data_dir: str, url: str, publish_script: bool = True) -> None:
    scheduler = Scheduler(f"rocksdb://{data_dir}", max_workers=4, prefetch=64)
    jobs.define(scheduler)
    options = {"publish_script": publish_script}
    celery_app_for(scheduler, url, executor_options=options, **jobs.celery_conf(3600))
    receipt = scheduler.handle("t.slow").schedule("killed")
    sys.stdout.write(receipt.msg_id + "\n")
    sys.stdout.flush()
    Dispatcher(scheduler).run_forever(poll_ms=50)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:4] != ["False"])
