"""The runtime calls on a ``rocksdb://`` directory shared by several processes: a
client process's calls reach the owner's broker, and a handover (the owner killed)
keeps what they did. Real processes and a real directory."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from broker_adapter import Message, open_broker
from broker_adapter.results import RescheduleStatus
from broker_adapter.shared.broker import SOCKET_NAME, Role, SharedBroker
from tests.broker_adapter.shared_procs import kill_script, run_script_json, start_script
from tests.helpers import eventually

HOUR = 3_600_000

CLIENT = """
import json, sys
from broker_adapter import open_broker
broker = open_broker(f"rocksdb://{sys.argv[1]}")
moved = broker.reschedule(
    key="order:42:close", topic="orders", deliver_at_ms=int(sys.argv[2]), body=b"v2"
)
page = broker.find_pending("orders", key_prefix="order:42:", with_body=True)
print(json.dumps({
    "role": broker.role.value,
    "moved": [moved.status.value, moved.msg_id, moved.deliver_at_ms],
    "page": [[v.key, v.body.decode(), v.deliver_at_ms] for v in page.messages],
    "permits": [broker.acquire_rate("exports", 3, 600_000) for _ in range(2)],
    "slot": broker.acquire_slot("nightly", 1, "client-run", 60_000),
}))
broker.close()
"""

OWNER = """
import sys
from broker_adapter import Message, open_broker
broker = open_broker(f"rocksdb://{sys.argv[1]}")
sent = broker.send(Message("orders", b"v1", key="order:7:close", delay_ms=1_800_000))
print(broker.role.value, sent.msg_id, flush=True)
sys.stdin.readline()  # held open until the test kills it
"""


def test_a_client_process_reschedules_on_the_owner(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_broker(f"rocksdb://{data}") as owner:
        assert isinstance(owner, SharedBroker) and owner.role is Role.OWNER
        remind = owner.send(Message("orders", b"r", key="order:42:remind", delay_ms=HOUR // 4))
        close = owner.send(Message("orders", b"v1", key="order:42:close", delay_ms=HOUR // 2))
        assert owner.acquire_rate("exports", 3, 600_000) == 0
        at = int(time.time() * 1000) + 50 * 60_000

        # a second process opens the same directory: a client; its calls go to the owner
        seen = run_script_json(CLIENT, str(data), str(at))
        assert seen["role"] == "client"
        assert seen["moved"] == ["RESCHEDULED", close.msg_id, at]
        assert seen["page"] == [
            ["order:42:remind", "r", remind.deliver_at_ms],
            ["order:42:close", "v2", at],
        ]
        assert seen["permits"] == [0, 0]  # with the owner's one: the bucket's 3
        assert seen["slot"] is True

        # the owner sees what the client did: the new time and body, the bucket, the slot
        view = owner.query(close.msg_id)
        assert view is not None and view.deliver_at_ms == at
        page = owner.find_pending("orders", key_prefix="order:42:close", with_body=True)
        assert [(v.msg_id, v.body) for v in page.messages] == [(close.msg_id, b"v2")]
        assert owner.acquire_rate("exports", 3, 600_000) > 0
        assert not owner.acquire_slot("nightly", 1, "owner-run", 60_000)
        assert owner.release_slot("nightly", "client-run")


def test_a_reschedule_survives_a_handover(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    data = tmp_path / "data"
    owner = start_script(procs, OWNER, str(data))
    assert owner.stdout is not None
    role, msg_id = owner.stdout.readline().split()
    assert role == "owner"
    eventually(lambda: (data / SOCKET_NAME).exists(), timeout=30, what="the owner serves")

    with open_broker(f"rocksdb://{data}") as broker:
        assert isinstance(broker, SharedBroker) and broker.role is Role.CLIENT
        at = int(time.time() * 1000) + 2 * HOUR
        moved = broker.reschedule(key="order:7:close", topic="orders", deliver_at_ms=at)
        assert (moved.status, moved.msg_id, moved.deliver_at_ms) == (
            RescheduleStatus.RESCHEDULED,
            msg_id,
            at,
        )

        # the owner dies (kill -9); this process takes over, and calls go on
        kill_script(owner)
        page = broker.find_pending("orders", key_prefix="order:7:")  # a read: never OwnerLost
        assert [(v.msg_id, v.deliver_at_ms) for v in page.messages] == [(msg_id, at)]
        eventually(lambda: broker.role is Role.OWNER, timeout=30, what="this process owns")
        assert broker.owner_pid == os.getpid()

        # the same move again is the same answer; then one call cancels the order's timers
        again = broker.reschedule(key="order:7:close", topic="orders", deliver_at_ms=at)
        assert (again.status, again.deliver_at_ms) == (RescheduleStatus.RESCHEDULED, at)
        assert broker.abort_prefix("orders", "order:7:").aborted == 1
        assert broker.find_pending("orders", key_prefix="order:7:").messages == []
        assert broker.acquire_rate("exports", 1, 600_000) == 0  # the new owner's fresh bucket
