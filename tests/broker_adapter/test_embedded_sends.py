"""The embedded broker's send paths (``broker_adapter/embedded/sends.py``): a single
send and a batch store what was sent, byte for byte, whatever mix of topics, tags,
keys and properties a batch holds (the batch loop reuses a topic's id and a tag's
bytes from one message to the next, and packs plain records inline); a refused send
stores nothing, not even its new topic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.clock import ManualClock
from broker_adapter.embedded import EmbeddedBroker
from broker_adapter.embedded.records import Record, encode
from broker_adapter.errors import InvalidArgument, InvalidDelay, MessageTooLarge
from broker_adapter.message import Message
from broker_adapter.results import SendStatus
from tests.conftest import START_MS
from tests.helpers import pull_until

pytestmark = pytest.mark.timeout(60)

DAY_MS = 24 * 3600 * 1000

# A batch that changes topic and tags between neighbours, with keys, properties, a
# past due time and every kind of timing field.
MIXED = [
    Message("t.one", b"a", delay_ms=1000),
    Message("t.one", b"b", tags="job.x", delay_ms=2000),
    Message("t.two", b"c", tags="job.x", key="k1", delay_sec=3),
    Message("t.two", b"", tags="job.y", properties={"p": "1"}, delay_level=1),
    Message("t.one", b"e", tags=None, key="k2", deliver_at_ms=START_MS - 5000),
    Message("t.one", b"f" * 300, tags="job.y", properties={"a": "b", "c": "d"}),
    Message("t.two", b"g", tags="job.x", deliver_at_ms=START_MS + 4000),
]


@pytest.fixture
def two_brokers(tmp_path: Path, manual_clock: ManualClock) -> Iterator[list[EmbeddedBroker]]:
    brokers = [EmbeddedBroker(tmp_path / name, clock=manual_clock) for name in ("a", "b")]
    try:
        yield brokers
    finally:
        for b in brokers:
            b.close()


def wheel_records(broker: EmbeddedBroker) -> list[tuple[bytes, bytes]]:
    return broker.core.store.scan("wheel", b"", b"\xff" * 17, 1000)


def test_single_sends_and_one_batch_store_the_same_records(
    two_brokers: list[EmbeddedBroker],
) -> None:
    one_by_one, batched = two_brokers
    singles = [one_by_one.send(m) for m in MIXED]
    batch = batched.send_batch(MIXED)
    assert singles == batch  # same ids (same clock, same sequence) and due times
    rows = wheel_records(one_by_one)
    assert rows == wheel_records(batched)
    assert len(rows) == len(MIXED)
    ids = {r.msg_id: m for r, m in zip(batch, MIXED, strict=True)}
    topics = batched.core.topic_ids
    for _wkey, data in rows:
        rec = Record(data)
        m = ids[rec.raw_id.hex()]
        assert (rec.tid, rec.attempts, rec.born) == (topics[m.topic], 0, START_MS)
        assert (rec.key, rec.tags, rec.props, rec.body) == (
            m.key,
            m.tags,
            dict(m.properties or {}),
            m.body,
        )
        assert rec.deliver_at == max(START_MS, m.deliver_at(START_MS))
        # the inline packing of plain records is records.encode's layout
        tags, props = (m.tags or "").encode(), m.properties_bytes()
        key = (m.key or "").encode()
        assert data == encode(
            rec.tid, 0, rec.deliver_at, START_MS, rec.raw_id, key, tags, props, m.body
        )


def test_single_sends_write_the_counters_a_batch_writes(
    two_brokers: list[EmbeddedBroker],
) -> None:
    """A single send writes through BrokerCore.write_one, a batch through write_pending:
    the same pending counters (in memory and in ``meta``) and topics. (Not the same
    sequence mark: each reservation moves it a block past the numbers it took.)"""
    one_by_one, batched = two_brokers
    for m in MIXED:
        one_by_one.send(m)
    batched.send_batch(MIXED)
    meta = [
        [(k, v) for k, v in b.core.store.scan("meta", b"", b"\xff", 1000) if k[:1] in b"NT"]
        for b in two_brokers
    ]
    assert meta[0] == meta[1]
    assert [k[:1] for k, _ in meta[0]] == [b"N", b"N", b"T", b"T"]  # two topics' counters
    assert one_by_one.stats().pending == batched.stats().pending == len(MIXED)
    for tid in batched.core.topic_names:
        assert one_by_one.core.pending_count(tid) == batched.core.pending_count(tid)


def test_a_mixed_batch_is_received_as_sent(
    two_brokers: list[EmbeddedBroker], manual_clock: ManualClock
) -> None:
    broker = two_brokers[0]
    results = broker.send_batch(MIXED)
    assert [r.status for r in results] == [SendStatus.OK] * len(MIXED)
    consumer = broker.consumer("g", ["t.one", "t.two"])
    manual_clock.advance(DAY_MS)
    got = {m.msg_id: m for m in pull_until(consumer, len(MIXED))}
    assert set(got) == {r.msg_id for r in results}
    for r, sent in zip(results, MIXED, strict=True):
        m = got[r.msg_id]
        assert (m.topic, m.body, m.key, m.tags) == (sent.topic, sent.body, sent.key, sent.tags)
        assert dict(m.properties) == dict(sent.properties or {})
        assert m.deliver_at_ms == r.deliver_at_ms


def test_keys_repeated_in_a_batch_or_pending_are_duplicates_per_topic(
    two_brokers: list[EmbeddedBroker],
) -> None:
    broker = two_brokers[0]
    first = broker.send(Message("t.one", b"x", key="k", delay_ms=1000))
    results = broker.send_batch(
        [
            Message("t.one", b"y", key="k", delay_ms=1000),  # pending already
            Message("t.two", b"z", key="k", delay_ms=1000),  # another topic: new
            Message("t.two", b"w", key="k", delay_ms=1000),  # repeated in the batch
            Message("t.two", b"v", delay_ms=1000),
        ]
    )
    assert [r.status for r in results] == [
        SendStatus.DUPLICATE,
        SendStatus.OK,
        SendStatus.DUPLICATE,
        SendStatus.OK,
    ]
    assert results[0].msg_id == first.msg_id
    assert results[2].msg_id == results[1].msg_id
    assert broker.stats().pending == 3


@pytest.mark.parametrize("batched", [False, True], ids=["send", "send_batch"])
def test_a_refused_send_stores_nothing_not_even_its_topic(
    two_brokers: list[EmbeddedBroker], batched: bool
) -> None:
    broker = two_brokers[0]
    too_far = Message("t.new", b"x", delay_ms=broker.max_delay_ms + 1)
    with pytest.raises(InvalidDelay):
        if batched:
            broker.send_batch([Message("t.new", b"ok", delay_ms=5), too_far])
        else:
            broker.send(too_far)
    assert wheel_records(broker) == []
    assert "t.new" not in broker.core.topic_ids
    assert broker.stats().topics == {}


def test_a_single_send_still_checks_type_and_size(tmp_path: Path) -> None:
    """AdapterBase.send checks one message inline: the same refusals as a batch's."""
    with EmbeddedBroker(tmp_path / "small", max_body_bytes=10) as broker:
        with pytest.raises(InvalidArgument, match="Message"):
            broker.send(("t.one", b"x"))  # type: ignore[arg-type]
        with pytest.raises(MessageTooLarge):
            broker.send(Message("t.one", b"x" * 11))
        with pytest.raises(MessageTooLarge):  # the body fits, not with its properties
            broker.send(Message("t.one", b"x" * 5, properties={"k": "v"}))
        assert wheel_records(broker) == []
        assert broker.send(Message("t.one", b"x" * 10)).status is SendStatus.OK
