"""Dead letters through the dashboard's API: listed per group with their errors and
decoded calls, paged; requeue (the group pulls the message again) and purge,
checked through the broker."""

from __future__ import annotations

from broker_adapter import Message, MessageState
from scheduler.jobcall import JobCall
from tests.dashboard.conftest import DashboardProc, ids
from tests.helpers import pull_one, pull_until

GROUP = "dash-workers"
TOPIC = "dl"


def _kill(dashboard: DashboardProc, n: int) -> list[str]:
    """``n`` messages due now, pulled by ``GROUP`` and dead-lettered; their ids."""
    for i in range(n):
        body = JobCall("shop.close_order", (i,)).encode()
        dashboard.broker.send(Message(TOPIC, body, key=f"dl:{i}", tags="shop.close_order"))
    with dashboard.broker.consumer(GROUP, [TOPIC]) as consumer:
        got = pull_until(consumer, n)
        assert len(got) == n
        for m in got:
            assert consumer.dead_letter(m, f"ValueError('boom {m.key}')")
    return [m.msg_id for m in got]


def test_dead_letters_listed_requeued_and_purged(dashboard: DashboardProc) -> None:
    dead = _kill(dashboard, 3)
    doc = dashboard.ok("api/dead")
    assert {"group": GROUP, "dead": 3} in doc["groups"] and doc["items"] == []

    items = dashboard.ok("api/dead", group=GROUP)["items"]
    assert sorted(ids(items)) == sorted(dead)
    for item in items:
        assert item["state"] == "DEAD" and item["topic"] == TOPIC
        assert item["error"] == f"ValueError('boom {item['key']}')"
        assert item["job"] == "shop.close_order" and item["args"] == [int(item["key"][3:])]
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params = {"group": GROUP, "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = dashboard.ok("api/dead", **params)
        assert len(page["items"]) <= 2
        seen += ids(page["items"])
        cursor = page["cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(dead)

    first, second, third = dead
    assert dashboard.ok("api/dead/requeue", {"group": GROUP, "msg_ids": [first]}) == {"requeued": 1}
    with dashboard.broker.consumer(GROUP, [TOPIC]) as consumer:
        again = pull_one(consumer)
        assert again.msg_id == first and again.attempts == 1
        assert consumer.ack(again)
    assert dashboard.ok("api/dead/purge", {"group": GROUP, "msg_ids": [second]}) == {"purged": 1}
    view = dashboard.broker.query(second)
    assert view is not None and view.groups[GROUP] is MessageState.DONE
    assert ids(dashboard.ok("api/dead", group=GROUP)["items"]) == [third]

    assert dashboard.ok("api/dead/requeue", {"group": GROUP, "all": True}) == {"requeued": 1}
    with dashboard.broker.consumer(GROUP, [TOPIC]) as consumer:
        assert pull_one(consumer).msg_id == third
    assert dashboard.ok("api/dead", group=GROUP)["items"] == []
    assert dashboard.ok("api/dead/purge", {"group": GROUP, "all": True}) == {"purged": 0}


def test_bad_dead_letter_requests_change_nothing(dashboard: DashboardProc) -> None:
    (victim,) = _kill(dashboard, 1)
    for body in (
        {"group": GROUP},
        {"group": GROUP, "msg_ids": []},
        {"group": GROUP, "msg_ids": [victim], "all": True},
        {"group": GROUP, "msg_ids": "abc"},
        {"group": "", "all": True},
        {"group": "bad group!", "all": True},
        {"all": True},
    ):
        for action in ("requeue", "purge"):
            r = dashboard.post(f"api/dead/{action}", body)
            assert r.status_code == 400, (action, body, r.text)
            assert r.json()["error"] in ("InvalidArgument", "InvalidTopic")
    r = dashboard.post("api/dead/purge", {"group": GROUP, "all": True}, Origin="http://x.example")
    assert r.status_code == 403
    assert dashboard.get("api/dead", group="bad group!").status_code == 400
    assert victim in ids(dashboard.ok("api/dead", group=GROUP)["items"])  # still dead
    # Ids that are not dead letters of the group are skipped, not counted.
    assert dashboard.ok("api/dead/requeue", {"group": "nobody", "msg_ids": [victim]}) == {
        "requeued": 0
    }
    assert dashboard.ok("api/dead/purge", {"group": GROUP, "msg_ids": ["ffff"]}) == {"purged": 0}
    assert dashboard.ok("api/dead/purge", {"group": GROUP, "msg_ids": [victim]}) == {"purged": 1}
