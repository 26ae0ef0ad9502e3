"""Fixtures of the Spark suite: one real local SparkSession for the whole run.

The session (``local[2]``, loopback, no UI) starts once (~5-8 s) and is shared
by every test that asks for ``spark``. Without ``java`` the Spark tests skip
locally and fail under ``CI=true`` (the project's "honest skips" rule).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_adapter.clock import ManualClock
from scheduler.scheduler import Scheduler

#: The session settings of the suite (the loopback ones come from spark_tasks.session).
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared local SparkSession (``spark_tasks.session.get_spark``), stopped at the end."""
    if shutil.which("java") is None:
        if os.environ.get("CI"):
            pytest.fail("java is not installed: the Spark tests need it")
        pytest.skip("java is not installed")
    from spark_tasks.session import get_spark, stop_spark

    session = get_spark(master="local[2]", app_name="chronoq-tests", conf=TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_spark()


@pytest.fixture
def app(data_dir: Path, manual_clock: ManualClock) -> Iterator[Scheduler]:
    """A Scheduler on its own embedded broker, driven by ``manual_clock``."""
    scheduler = Scheduler(f"rocksdb://{data_dir}", clock=manual_clock, max_workers=2, prefetch=4)
    yield scheduler
    scheduler.close()


def wait_fired(app: Scheduler, *msg_ids: str) -> None:
    """Wait until the broker's wheel thread has fired these messages (READY).

    ``Dispatcher.run_until_idle`` can return early if a message fires between
    its last empty pull and its idle check (neither pending nor pulled), which a
    loaded machine makes likely; waiting for the fire first avoids that window.
    """
    import time

    from broker_adapter import MessageState

    deadline = time.monotonic() + 30
    for msg_id in msg_ids:
        while time.monotonic() < deadline:
            view = app.broker.query(msg_id)
            if view is not None and view.state is not MessageState.PENDING:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"message {msg_id} did not fire within 30 s")
