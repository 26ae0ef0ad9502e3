"""``chronoq dead-letters list|requeue|purge``: the real console script in a subprocess
against a real ``rocksdb://`` directory whose dead letters the test made (and reads
back). Exit status: 0 done, 1 nothing requeued or purged, 2 bad input (nothing changed)."""

from __future__ import annotations

import json
from pathlib import Path

from broker_adapter import Message, open_broker
from broker_adapter.results import MessageState
from tests.helpers import chronoq, pull_one


def test_list_requeue_and_purge_from_a_shell(tmp_path: Path) -> None:
    url = f"rocksdb://{tmp_path / 'data'}?share=0"
    ids = []
    with open_broker(url) as broker, broker.consumer("billing", ["orders"]) as consumer:
        for i in range(4):
            ids.append(broker.send(Message("orders", b"o%d" % i, key=f"order:{i}")).msg_id)
            assert consumer.dead_letter(pull_one(consumer), f"<b>bad</b> {i}")

    listed = chronoq("dead-letters", "list", "--url", url, "--group", "billing", "--json", "--body")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [
        (r["msg_id"], r["topic"], r["error"], r["key"], r["body"]) for r in doc["dead_letters"]
    ] == [(ids[i], "orders", f"<b>bad</b> {i}", f"order:{i}", f"o{i}") for i in range(4)]
    assert doc["more"] is False
    text = chronoq("dead-letters", "list", "--url", url, "--group", "billing", "--limit", "2")
    assert text.returncode == 0 and "2 dead letter(s) of billing (more" in text.stdout

    requeued = chronoq(
        "dead-letters", "requeue", "--url", url, "--group", "billing", "--id", ids[0]
    )
    assert (requeued.returncode, requeued.stdout.strip()) == (
        0,
        "requeued 1 dead letter(s) of billing",
    )
    purged = chronoq("dead-letters", "purge", "--url", url, "--group", "billing", "--all", "--json")
    assert (purged.returncode, json.loads(purged.stdout)) == (0, {"group": "billing", "purged": 3})
    again = chronoq("dead-letters", "purge", "--url", url, "--group", "billing", "--all")
    assert again.returncode == 1
    bad = chronoq("dead-letters", "requeue", "--url", url, "--group", "bad name", "--all")
    assert bad.returncode == 2 and "bad name" in bad.stderr and bad.stdout == ""

    with open_broker(url) as broker, broker.consumer("billing", ["orders"]) as consumer:
        got = pull_one(consumer)
        assert (got.msg_id, got.attempts) == (ids[0], 1)
        view = broker.query(ids[1])
        assert view is not None and view.groups["billing"] is MessageState.DONE
        assert broker.dead_letters("billing").messages == []
