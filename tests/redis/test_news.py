"""ReadyNews: what pulls wait on, which shards consumers look at, what other
processes hear."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator

import pytest
import redis

from broker_adapter.redis.news import ReadyNews
from tests.helpers import eventually

CHANNEL = "cq:ready"


class Watcher:
    """Records the shards it is told about."""

    def __init__(self) -> None:
        self.marked: list[list[int]] = []

    def mark(self, shards: Iterable[int]) -> None:
        self.marked.append(list(shards))


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        c.close()


def test_news_marks_every_watcher_and_bumps_the_epoch(client: redis.Redis) -> None:
    news = ReadyNews(client, CHANNEL)
    a, b = Watcher(), Watcher()
    news.watch(a)
    news.watch(b)
    epoch = news.epoch
    news.tell(iter([2, 5]))
    assert a.marked == b.marked == [[2, 5]]
    assert news.epoch == epoch + 1
    # no shard named: waiting pulls wake up, nobody is marked
    news.tell(())
    assert a.marked == [[2, 5]] and news.epoch == epoch + 2
    news.unwatch(a)
    news.tell([1])
    assert a.marked == [[2, 5]] and b.marked == [[2, 5], [1]]


def test_watchers_are_held_weakly(client: redis.Redis) -> None:
    news = ReadyNews(client, CHANNEL)
    w = Watcher()
    news.watch(w)
    assert news.watchers() == [w]
    del w
    gc.collect()
    assert news.watchers() == []


def test_wait_changed_answers_whether_news_came_after_the_epoch(client: redis.Redis) -> None:
    news = ReadyNews(client, CHANNEL)
    epoch = news.epoch
    assert news.wait_changed(epoch, 0.01) is False  # nothing happened
    news.tell([0])
    assert news.wait_changed(epoch, 0.0) is True  # already changed: no wait
    # a waiter is woken by news told on another thread
    epoch = news.epoch
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(news.wait_changed(epoch, 30)))
    waiter.start()
    news.tell([3])
    waiter.join(timeout=30)
    assert woke == [True]


def test_news_heard_from_another_instance_is_told_and_our_own_is_skipped(
    client: redis.Redis,
) -> None:
    ours, theirs = ReadyNews(client, CHANNEL), ReadyNews(client, CHANNEL)
    assert ours.origin != theirs.origin
    w = Watcher()
    ours.watch(w)
    ours.heard(f"{ours.origin}:1,2".encode())  # told in process already
    assert w.marked == []
    epoch = ours.epoch
    ours.heard(f"{theirs.origin}:1,2".encode())
    assert w.marked == [[1, 2]] and ours.epoch == epoch + 1


def test_announce_tells_here_and_publishes_for_other_processes(client: redis.Redis) -> None:
    news = ReadyNews(client, CHANNEL)
    w = Watcher()
    news.watch(w)
    listener = client.pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe(CHANNEL)
        news.announce([0, 7])
        assert w.marked == [[0, 7]]
        message = eventually(lambda: listener.get_message(timeout=0.2), what="published news")
        assert message["data"] == f"{news.origin}:0,7".encode()
    finally:
        listener.close()
