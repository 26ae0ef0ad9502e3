"""Dead letters and pending counts on a ``rocksdb://`` directory shared by several
processes: a client process lists, requeues and purges the owner's dead letters and
counts its pending messages; dead letters made by an owner killed with ``kill -9`` are
there for the process that takes over. Real processes and a real directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from broker_adapter import Message, open_broker
from broker_adapter.results import MessageState
from broker_adapter.shared.broker import SOCKET_NAME, Role, SharedBroker
from tests.broker_adapter.shared_procs import kill_script, run_script_json, start_script
from tests.helpers import eventually, pull_one

HOUR = 3_600_000

CLIENT = """
import json, sys
from broker_adapter import open_broker
broker = open_broker(f"rocksdb://{sys.argv[1]}")
ids = json.loads(sys.argv[2])
page = broker.dead_letters("billing", with_body=True)
now = int(sys.argv[3])
print(json.dumps({
    "role": broker.role.value,
    "dead": [[v.msg_id, v.topic, v.error, v.body.decode()] for v in page.messages],
    "requeued": broker.requeue_dead("billing", [ids[0]]),
    "purged": broker.purge_dead("billing", [ids[1], "nope"]),
    "counts": broker.count_pending([now, now + 2 * 3_600_000]).counts,
}))
broker.close()
"""

OWNER = """
import sys
from broker_adapter import Message, open_broker
broker = open_broker(f"rocksdb://{sys.argv[1]}")
consumer = broker.consumer("billing", ["orders"])
for i in range(3):
    sent = broker.send(Message("orders", b"o%d" % i))
    got = []
    while not got:
        got = consumer.pull(max_messages=1, wait_ms=1000)
    consumer.dead_letter(got[0], "no such job %d" % i)
    print(broker.role.value, sent.msg_id, flush=True)
sys.stdin.readline()  # held open until the test kills it
"""


def test_a_client_process_settles_the_owners_dead_letters(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_broker(f"rocksdb://{data}") as owner:
        assert isinstance(owner, SharedBroker) and owner.role is Role.OWNER
        consumer = owner.consumer("billing", ["orders"])
        ids = []
        for i in range(3):
            ids.append(owner.send(Message("orders", b"o%d" % i)).msg_id)
            assert consumer.dead_letter(pull_one(consumer), f"bad {i}")
        pending = owner.send(Message("orders", b"later", delay_ms=HOUR)).msg_id
        now = owner.query(pending).born_ms  # type: ignore[union-attr]

        seen = run_script_json(CLIENT, str(data), json.dumps(ids), str(now))
        assert seen["role"] == "client"
        assert seen["dead"] == [[ids[i], "orders", f"bad {i}", f"o{i}"] for i in range(3)]
        assert (seen["requeued"], seen["purged"], seen["counts"]) == (1, 1, [1])

        # the owner sees what the client did
        again = pull_one(consumer)
        assert (again.msg_id, again.attempts) == (ids[0], 1)
        view = owner.query(ids[1])
        assert view is not None and view.groups["billing"] is MessageState.DONE
        assert [v.msg_id for v in owner.dead_letters("billing").messages] == [ids[2]]


def test_dead_letters_outlive_a_killed_owner(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    data = tmp_path / "data"
    owner = start_script(procs, OWNER, str(data))
    assert owner.stdout is not None
    ids = []
    for _ in range(3):
        role, msg_id = owner.stdout.readline().split()
        assert role == "owner"
        ids.append(msg_id)
    eventually(lambda: (data / SOCKET_NAME).exists(), timeout=30, what="the owner serves")
    with open_broker(f"rocksdb://{data}") as broker:
        assert isinstance(broker, SharedBroker) and broker.role is Role.CLIENT
        assert broker.purge_dead("billing", [ids[2]]) == 1
        kill_script(owner)  # kill -9: this process takes over
        listed = broker.dead_letters("billing").messages  # a read: repeated after handover
        assert [(v.msg_id, v.error) for v in listed] == [
            (ids[0], "no such job 0"),
            (ids[1], "no such job 1"),
        ]
        eventually(lambda: broker.role is Role.OWNER, timeout=30, what="this process owns")
        assert broker.requeue_dead("billing") == 2
        consumer = broker.consumer("billing", ["orders"])
        got = [pull_one(consumer), pull_one(consumer)]
        assert sorted((m.msg_id, m.attempts) for m in got) == sorted([(ids[0], 1), (ids[1], 1)])
