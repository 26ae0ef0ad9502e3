"""Pulls that fire: a waiting pull takes the fire duty, fires what falls due and claims
it in one round trip; the firing threads keep what no pull comes for (issue 16)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import redis

from broker_adapter.clock import SystemClock
from broker_adapter.message import Message
from broker_adapter.redis import RedisBroker
from broker_adapter.redis.firer import Firer
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.news import ReadyNews
from broker_adapter.redis.scripts import Scripts
from broker_adapter.results import MessageState
from tests.helpers import eventually


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    b = RedisBroker.from_url(redis_url)  # the system clock: pulls wait to fire
    try:
        yield b
    finally:
        b.close()


S = TypeVar("S", bound=Scripts)


@contextmanager
def started_firer(
    redis_url: str, make_scripts: Callable[[Any], S], shards: int = 1
) -> Iterator[tuple[Firer, S, Keyspace, ReadyNews]]:
    """A started firer on ``shards`` shards, the system clock and scripts
    ``make_scripts(client)``."""
    client = redis.Redis.from_url(redis_url)
    keys = Keyspace.build("cq", shards)
    scripts = make_scripts(client)
    scripts.load()
    news = ReadyNews(client, keys.ready_channel)
    f = Firer(scripts, client, keys, SystemClock(), news, lambda: None, retention_ms=60_000)
    f.start()
    try:
        yield f, scripts, keys, news
    finally:
        f.close()
        client.close()


@pytest.fixture
def firer(redis_url: str) -> Iterator[tuple[Firer, Scripts, Keyspace]]:
    with started_firer(redis_url, Scripts) as (f, scripts, keys, _news):
        yield f, scripts, keys


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_waiting_pull_fires_and_claims_in_one_round_trip(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a spy on the round trips that fire and claim together (in addition)
    fired_by_pulls: list[int] = []
    real = Scripts.fan_steps

    def spy(self: Scripts, keys: Any, steps: Any) -> list[list[Any]]:
        out = real(self, keys, steps)
        names = [s[0] for s in steps]
        if "fire" in names:
            fired_by_pulls.append(sum(int(r[0]) for r in out[names.index("fire")]))
        return out

    monkeypatch.setattr(Scripts, "fan_steps", spy)
    consumer = broker.consumer("g", ["t"])
    got: list[str] = []
    # When a pull waits past a message's due time (a few tries: on a loaded machine the
    # firing thread may come first, which is correct too)
    for _ in range(5):
        sent = broker.send(Message("t", b"x", deliver_at_ms=now_ms() + 250)).msg_id
        msgs = consumer.pull(10, 3000)
        got += [m.msg_id for m in msgs]
        assert [m.msg_id for m in msgs] == [sent]
        consumer.ack_batch(msgs)
        if sum(fired_by_pulls):
            break
    # Then the pull fired it itself, and every message came once
    assert sum(fired_by_pulls) >= 1
    assert len(got) == len(set(got))


def test_a_pull_carries_its_groups_acks(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a spy on the pulls' round trips (in addition): (group, message numbers)
    carried: list[tuple[bytes, list[bytes]]] = []
    real = Scripts.fan_steps

    def spy(self: Scripts, keys: Any, steps: Any) -> list[list[Any]]:
        for name, _shards, common, per in steps:
            if name == "ack_batch":
                carried.extend((str(common[0]).encode(), list(p[2::2])) for p in per)
        return real(self, keys, steps)

    monkeypatch.setattr(Scripts, "fan_steps", spy)
    g, h = broker.consumer("g", ["t"]), broker.consumer("h", ["t"])
    acked: list[str] = []
    # When a message is acked in both groups and g pulls at once (a few tries: the
    # ack thread, 2 ms later, may write them first, which is correct too)
    for i in range(5):
        sent = broker.send(Message("t", b"%d" % i, deliver_at_ms=now_ms() - 1)).msg_id
        [mine] = eventually(lambda: g.pull(10, 100), what="g's message")
        [theirs] = eventually(lambda: h.pull(10, 100), what="h's message")
        assert mine.msg_id == theirs.msg_id == sent
        assert g.ack(mine) and h.ack(theirs)
        acked.append(sent)
        assert g.pull(10, 0) == []
        if any(group == b"g" for group, _ns in carried):
            break
    # Then g's pull wrote g's acks in its own round trip
    ns = {m.split("-")[1].encode() for m in acked}
    assert any(group == b"g" and set(n) <= ns for group, n in carried)
    broker.flush()
    for msg_id in acked:  # and every ack is written, whoever wrote it
        view = broker.query(msg_id)
        assert view is not None
        assert view.groups == {"g": MessageState.DONE, "h": MessageState.DONE}


def test_due_messages_fire_when_no_pull_comes(broker: RedisBroker) -> None:
    # Given a pull that fired the first of two messages
    consumer = broker.consumer("g", ["t"])
    due = now_ms() + 200
    first = broker.send(Message("t", b"1", deliver_at_ms=due)).msg_id
    second = broker.send(Message("t", b"2", deliver_at_ms=due + 30)).msg_id
    msgs = consumer.pull(1, 3000)
    assert [m.msg_id for m in msgs] == [first]

    # When nobody pulls again
    def fired() -> bool:
        view = broker.query(second)
        return view is not None and view.state is MessageState.READY

    # Then the firing thread fires the second one after the grace it leaves to pulls
    eventually(fired, timeout=5, what="the second message fired without a pull")
    assert [m.msg_id for m in consumer.pull(10, 1000)] == [second]


def test_fire_duty_goes_to_one_pull_at_a_time(firer: tuple[Firer, Scripts, Keyspace]) -> None:
    f, _scripts, _keys = firer
    eventually(lambda: f.next_due(0) == float("inf"), what="the first sweep")
    due = now_ms() + 60_000
    f.note_due(0, due)
    # a head beyond the offer's horizon is not taken
    assert f.take_duty(due - 1) is None
    # the first offer takes it, a second one waits for news instead
    assert f.take_duty(due) == due
    assert f.take_duty(due) is None
    # given back without firing: the next pull may take it
    f.end_duty(fired=False)
    assert f.take_duty(due) == due
    # picking before it is due picks nothing and keeps the head
    assert f.pick_due(due - 1) == []
    assert f.next_due(0) == due
    f.end_duty(fired=False)


def test_a_picked_shard_is_the_pulls_until_its_reply(
    firer: tuple[Firer, Scripts, Keyspace], redis_url: str
) -> None:
    f, scripts, keys = firer
    eventually(lambda: f.next_due(0) == float("inf"), what="the first sweep")
    # Given a pending message that is due already, known to the firer
    due = now_ms() - 5
    client = redis.Redis.from_url(redis_url)
    try:
        client.zadd(keys.due_keys[0], {"1": due})
    finally:
        client.close()
    f.note_due(0, due)
    assert f.take_duty(now_ms()) == due
    shards = f.pick_due(now_ms())
    f.end_duty(fired=True)
    assert shards == [0]
    # the thread leaves it alone (its head is unknown until the pull's reply)
    assert f.next_due(0) == float("inf")
    # When the pull's fire step runs, its reply tells the firer the next head
    now = now_ms()
    [results] = scripts.fan_steps(keys.due_keys, [f.fire_step(shards, [False], now)])
    assert f.fired(shards, results, now) == []  # no record for "1": nothing moved
    assert f.next_due(0) == float("inf")


class HeldScripts(Scripts):
    """Real scripts whose firing passes wait for ``release`` first (a double, in addition)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.entered = threading.Event()
        self.release = threading.Event()

    def fan(self, name: str, keys: Any, common: Any, per_shard: Any) -> list[Any]:
        if name == "fire":
            self.entered.set()
            assert self.release.wait(10)
        return super().fan(name, keys, common, per_shard)


def test_a_pull_refused_the_duty_during_a_threads_pass_hears_when_the_pass_ends(
    redis_url: str,
) -> None:
    with started_firer(redis_url, HeldScripts) as (f, scripts, _keys, news):
        try:
            # Given the thread's first pass (a sweep of the empty shard) in flight: it
            # hides the shard's head, so a pull is refused the duty
            assert scripts.entered.wait(10)
            epoch = news.epoch
            assert f.take_duty(now_ms() + 100) is None
            # When the pass ends, having moved nothing, Then the pull hears of it (it
            # would otherwise sleep until news, or the firing threads' grace)
            scripts.release.set()
            assert news.wait_changed(epoch, 5)
        finally:
            scripts.release.set()  # before the firer's close joins its thread


def test_a_pull_holding_the_duty_hears_of_an_earlier_head_a_threads_pass_found(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    with started_firer(redis_url, HeldScripts, shards=2) as (f, scripts, keys, news):
        try:
            # Given the thread's first pass (a sweep of both shards) in flight, hiding
            # their heads, a later head known in shard 1 and a sooner message lying in
            # shard 0 (the pass will find it)
            assert scripts.entered.wait(10)
            later = now_ms() + 60_000
            f.note_due(1, later)
            client.zadd(keys.due_keys[0], {"1": later - 30_000})
            # and a pull holding the duty for the only head it could see
            assert f.take_duty(later) == later
            epoch = news.epoch
            # When the pass ends, its reply showing shard 0's sooner head
            scripts.release.set()
            # Then the pull hears of it (before, it slept until its later head while the
            # threads left the due shard to it: the due-slice bench's 100 ms stalls)
            assert news.wait_changed(epoch, 5)
            assert f.next_due(0) == later - 30_000
        finally:
            scripts.release.set()  # before the firer's close joins its thread
            f.end_duty(fired=False)
    client.close()
