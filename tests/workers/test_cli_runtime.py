"""``chronoq reschedule``, ``chronoq cancel --key-prefix`` and ``chronoq pending``: the
real console script (``.venv/bin/chronoq``) in a subprocess against a real
``rocksdb://`` directory that the test filled (and reads back) with a Scheduler.
Exit status: 0 done, 1 nothing to act on, 2 bad input (and nothing changed)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker_adapter.results import MessageState, MessageView
from scheduler import Scheduler
from tests.helpers import chronoq, pull_one

HOUR = 3600 * 1000
REMIND, CLOSE = "shop.remind_customer", "shop.close_order"


def make_app(url: str) -> Scheduler:
    app = Scheduler(url)

    @app.job(name=REMIND)
    def remind_customer(order_id: int, note: str = "") -> None: ...

    @app.job(name=CLOSE, topic="shop.close")
    def close_order(order_id: int) -> None: ...

    return app


@dataclass
class Shop:
    """The directory's URL and the ids of what the test scheduled there."""

    url: str
    ids: dict[str, str]
    born_ms: int

    def view(self, key: str) -> MessageView:
        with Scheduler(self.url) as app:
            found = app.get(self.ids[key])
        assert found is not None
        return found


@pytest.fixture
def shop(data_dir: Path) -> Iterator[Shop]:
    """Orders 42 and 43 (a reminder in 1 h and 3 h, an auto-close in 2 h and 4 h, on two
    topics) and order 41, whose reminder has already fired."""
    url = f"rocksdb://{data_dir}"
    ids: dict[str, str] = {}
    born = int(time.time() * 1000)
    with make_app(url) as app:
        remind, close = app.handle(REMIND), app.handle(CLOSE)
        for n, order in enumerate((42, 43)):
            r = remind.schedule(
                order, delay=timedelta(hours=1 + 2 * n), key=f"order:{order}:remind"
            )
            c = close.schedule(order, delay=timedelta(hours=2 + 2 * n), key=f"order:{order}:close")
            ids[f"order:{order}:remind"], ids[f"order:{order}:close"] = r.msg_id, c.msg_id
        fired = remind.schedule(41, key="order:41:remind")
        ids["order:41:remind"] = fired.msg_id
        with app.broker.consumer("cli-tests", sorted(app.topics())) as consumer:
            got = pull_one(consumer)
            assert got.msg_id == fired.msg_id and consumer.ack(got)
    yield Shop(url, ids, born)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


# -- reschedule -------------------------------------------------------------------------------


def test_reschedule_by_key_and_by_id(shop: Shop) -> None:
    before = int(time.time() * 1000)
    proc = chronoq(
        "reschedule",
        "--url",
        shop.url,
        "--key",
        "order:42:close",
        "--topic",
        "shop.close",
        "--delay",
        "18000",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = as_json(proc)
    assert (doc["status"], doc["msg_id"]) == ("RESCHEDULED", shop.ids["order:42:close"])
    assert before + 5 * HOUR <= doc["deliver_at_ms"] <= int(time.time() * 1000) + 5 * HOUR
    assert shop.view("order:42:close").deliver_at_ms == doc["deliver_at_ms"]
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    proc = chronoq(
        "reschedule",
        "--url",
        shop.url,
        "--id",
        shop.ids["order:42:remind"],
        "--at",
        "2031-01-02T04:04:05+01:00",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"RESCHEDULED {shop.ids['order:42:remind']} due 2031-01-02T03:04:05Z"
    )
    moved = shop.view("order:42:remind")
    assert (moved.state, moved.deliver_at_ms) == (MessageState.PENDING, int(at.timestamp() * 1000))


def test_reschedule_with_delay_0_runs_it_now(shop: Shop) -> None:
    proc = chronoq(
        "reschedule",
        "--url",
        shop.url,
        "--key",
        "order:43:remind",
        "--topic",
        "chronoq.jobs",
        "--delay",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    with make_app(shop.url) as app, app.broker.consumer("cli-tests", sorted(app.topics())) as c:
        got = pull_one(c)
        assert (got.msg_id, got.key, got.tags) == (
            shop.ids["order:43:remind"],
            "order:43:remind",
            REMIND,
        )


def test_reschedule_answers_1_when_there_is_nothing_to_move(shop: Shop) -> None:
    late = chronoq(
        "reschedule",
        "--url",
        shop.url,
        "--key",
        "order:41:remind",
        "--topic",
        "chronoq.jobs",
        "--delay",
        "60",
        "--json",
    )
    assert late.returncode == 1, late.stderr
    assert as_json(late)["status"] == "ALREADY_DELIVERED"
    missing = chronoq("reschedule", "--url", shop.url, "--id", "no-such-id", "--delay", "60")
    assert missing.returncode == 1
    assert missing.stdout.startswith("NOT_FOUND")


@pytest.mark.parametrize(
    "argv",
    [
        ["--key", "order:42:close", "--delay", "60"],  # a key needs its topic
        ["--delay", "60"],  # no run named
        ["--id", "x", "--key", "order:42:close", "--topic", "shop.close", "--delay", "60"],
        ["--key", "order:42:close", "--topic", "shop.close"],  # no time
        [
            "--key",
            "order:42:close",
            "--topic",
            "shop.close",
            "--delay",
            "60",
            "--at",
            "2031-01-01T00:00:00Z",
        ],
        [
            "--key",
            "order:42:close",
            "--topic",
            "shop.close",
            "--at",
            "2031-01-01T00:00:00",
        ],  # naive
        ["--key", "order:42:close", "--topic", "shop.close", "--at", "next tuesday"],
        [
            "--key",
            "order:42:close",
            "--topic",
            "shop.close",
            "--at",
            "2020-01-01T00:00:00Z",
        ],  # past
        ["--key", "order:42:close", "--topic", "shop.close", "--delay", "-5"],
        ["--key", "order:42:close", "--topic", "bad topic!", "--delay", "60"],
        ["--key", "order:42:close", "--topic", "shop.close", "--delay", "abc"],  # argparse
    ],
)
def test_bad_reschedule_input_exits_2_and_changes_nothing(shop: Shop, argv: list[str]) -> None:
    before = shop.view("order:42:close")
    proc = chronoq("reschedule", "--url", shop.url, *argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() and not proc.stdout
    assert shop.view("order:42:close") == before


# -- cancel --key-prefix ----------------------------------------------------------------------


def test_cancel_aborts_every_timer_under_the_prefix_on_every_topic(shop: Shop) -> None:
    proc = chronoq("cancel", "--url", shop.url, "--key-prefix", "order:42:", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = as_json(proc)
    assert (
        doc["aborted"] == 2
        and doc["already_delivered"] == []
        and doc["already_delivered_count"] == 0
    )
    assert set(doc["topics"]) >= {"chronoq.jobs", "shop.close"}
    for key in ("order:42:remind", "order:42:close"):
        assert shop.view(key).state is MessageState.ABORTED
    for key in ("order:43:remind", "order:43:close"):
        assert shop.view(key).state is MessageState.PENDING
    again = chronoq("cancel", "--url", shop.url, "--key-prefix", "order:42:")
    assert again.returncode == 1
    assert again.stdout.strip() == "aborted 0; already fired 0"


def test_cancel_reports_the_keys_that_had_fired_and_takes_a_topic(shop: Shop) -> None:
    proc = chronoq(
        "cancel", "--url", shop.url, "--key-prefix", "order:4", "--topic", "chronoq.jobs"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["aborted 2; already fired 1", "  fired: order:41:remind"]
    assert shop.view("order:42:close").state is MessageState.PENDING  # other topic
    unknown = chronoq(
        "cancel", "--url", shop.url, "--key-prefix", "order:", "--topic", "never.seen"
    )
    assert unknown.returncode == 1 and "never.seen" in unknown.stderr


@pytest.mark.parametrize("prefix", ["", "cron:", "c"])
def test_cancel_refuses_a_bad_prefix(shop: Shop, prefix: str) -> None:
    proc = chronoq("cancel", "--url", shop.url, "--key-prefix", prefix)
    assert proc.returncode == 2 and "key_prefix" in proc.stderr
    assert shop.view("order:42:close").state is MessageState.PENDING


# -- pending ----------------------------------------------------------------------------------


def test_pending_by_job_prefix_topic_and_window(shop: Shop) -> None:
    by_job = chronoq("pending", "--url", shop.url, "--job", CLOSE, "--json")
    assert by_job.returncode == 0, by_job.stderr
    runs = as_json(by_job)
    assert [(r["key"], r["job"], r["args"], r["topic"]) for r in runs] == [
        ("order:42:close", CLOSE, [42], "shop.close"),
        ("order:43:close", CLOSE, [43], "shop.close"),
    ]
    assert runs[0]["msg_id"] == shop.ids["order:42:close"] and runs[0]["state"] == "PENDING"
    assert runs[0]["deliver_at"] == datetime.fromtimestamp(
        runs[0]["deliver_at_ms"] / 1000, UTC
    ).isoformat().replace("+00:00", "Z")
    # Every topic, merged by due time: 42's reminder (1 h), 42's close (2 h), 43's (3 h, 4 h).
    merged = as_json(chronoq("pending", "--url", shop.url, "--key-prefix", "order:4", "--json"))
    assert [r["key"] for r in merged] == [
        "order:42:remind",
        "order:42:close",
        "order:43:remind",
        "order:43:close",
    ]
    only = as_json(chronoq("pending", "--url", shop.url, "--topic", "chronoq.jobs", "--json"))
    assert [r["key"] for r in only] == ["order:42:remind", "order:43:remind"]
    start = datetime.fromtimestamp((shop.born_ms + int(1.5 * HOUR)) / 1000, UTC).isoformat()
    end = datetime.fromtimestamp((shop.born_ms + int(3.5 * HOUR)) / 1000, UTC).isoformat()
    window = as_json(
        chronoq("pending", "--url", shop.url, "--start", start, "--end", end, "--json")
    )
    assert [r["key"] for r in window] == ["order:42:close", "order:43:remind"]
    limited = as_json(chronoq("pending", "--url", shop.url, "--limit", "1", "--json"))
    assert [r["key"] for r in limited] == ["order:42:remind"]
    text = chronoq("pending", "--url", shop.url, "--job", REMIND, "--key-prefix", "order:43:")
    assert text.returncode == 0
    (line,) = text.stdout.splitlines()
    assert line.endswith(
        f"{shop.ids['order:43:remind']} chronoq.jobs key=order:43:remind {REMIND}(43)"
    )
    none = chronoq("pending", "--url", shop.url, "--job", "no.such.job")
    assert (none.returncode, none.stdout.strip()) == (0, "(nothing pending)")


def test_pending_bad_input(shop: Shop) -> None:
    assert chronoq("pending", "--url", shop.url, "--start", "yesterday").returncode == 2
    assert chronoq("pending", "--url", shop.url, "--end", "2031-01-01T00:00:00").returncode == 2
    assert chronoq("pending", "--url", shop.url, "--limit", "0").returncode == 2
    assert chronoq("pending", "--url", shop.url, "--key-prefix", "").returncode == 2
    unknown = chronoq("pending", "--url", shop.url, "--topic", "never.seen")
    assert unknown.returncode == 1 and "never.seen" in unknown.stderr
