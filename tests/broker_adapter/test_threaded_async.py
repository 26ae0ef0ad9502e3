"""ThreadedAsyncBroker: the sends of one loop turn become one batch, answered as
separate sends (a real embedded broker under it)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_adapter import Message, open_broker
from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import BrokerClosed, InvalidDelay
from broker_adapter.results import SendResult, SendStatus
from broker_adapter.threaded_async import ThreadedAsyncBroker


class CountingBroker:
    """A real broker whose ``send_batch`` calls are counted (everything else passes)."""

    def __init__(self, broker: BrokerAdapter) -> None:
        self.broker = broker
        self.batches: list[int] = []

    def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        self.batches.append(len(messages))
        return self.broker.send_batch(messages)

    def __getattr__(self, name: str) -> object:
        return getattr(self.broker, name)


@pytest.fixture
def counting(tmp_path: Path) -> CountingBroker:
    broker = open_broker(f"rocksdb://{tmp_path / 'data'}?share=0")
    yield CountingBroker(broker)
    broker.close()


def adapter(counting: CountingBroker) -> ThreadedAsyncBroker:
    return ThreadedAsyncBroker(counting)  # type: ignore[arg-type]


def test_sends_of_one_loop_turn_go_in_batches_of_at_most_max_batch(
    counting: CountingBroker,
) -> None:
    async def main() -> list[SendResult]:
        async with adapter(counting) as client:
            return await asyncio.gather(
                *(client.send(Message("t", b"x", key=f"k{i}", delay_ms=60_000)) for i in range(500))
            )

    results = asyncio.run(main())
    assert [r.status for r in results] == [SendStatus.OK] * 500
    assert len({r.msg_id for r in results}) == 500
    cap = ThreadedAsyncBroker.max_batch
    assert counting.batches == [cap] * (500 // cap) + [500 % cap]
    assert counting.broker.query(results[123].msg_id) is not None


def test_a_key_sent_twice_in_one_turn_is_a_duplicate_as_it_would_be_later(
    counting: CountingBroker,
) -> None:
    async def main() -> list[SendResult]:
        async with adapter(counting) as client:
            return await asyncio.gather(
                client.send(Message("t", b"a", key="order:1", delay_ms=60_000)),
                client.send(Message("t", b"b", key="order:1", delay_ms=60_000)),
            )

    first, second = asyncio.run(main())
    assert (first.status, second.status) == (SendStatus.OK, SendStatus.DUPLICATE)
    assert second.msg_id == first.msg_id


def test_a_refused_message_fails_only_its_own_caller(counting: CountingBroker) -> None:
    far = 20 * 366 * 24 * 3600 * 1000  # beyond the broker's max delay: refused when sent

    async def main() -> list[SendResult | BaseException]:
        async with adapter(counting) as client:
            return await asyncio.gather(
                client.send(Message("t", b"ok1", delay_ms=60_000)),
                client.send(Message("t", b"bad", delay_ms=far)),
                client.send_batch([Message("t", b"ok2", delay_ms=60_000)] * 2),
                return_exceptions=True,
            )

    ok1, bad, ok2 = asyncio.run(main())
    assert isinstance(bad, InvalidDelay)
    assert isinstance(ok1, SendResult) and ok1.status is SendStatus.OK
    assert isinstance(ok2, list) and [r.status for r in ok2] == [SendStatus.OK] * 2
    assert counting.broker.stats().topics["t"].pending == 3  # the refused one stored nothing
    assert counting.batches[0] == 4  # tried together first, then each batch alone
    assert sorted(counting.batches[1:]) == [1, 1, 2]


def test_a_closed_broker_fails_every_caller_of_the_turn(counting: CountingBroker) -> None:
    counting.broker.close()

    async def main() -> list[SendResult | BaseException]:
        async with adapter(counting) as client:
            return await asyncio.gather(
                *(client.send(Message("t", b"x")) for _ in range(3)), return_exceptions=True
            )

    assert all(isinstance(r, BrokerClosed) for r in asyncio.run(main()))


def test_a_caller_batch_larger_than_max_batch_goes_whole_and_alone(
    counting: CountingBroker,
) -> None:
    big = ThreadedAsyncBroker.max_batch + 5

    async def main() -> tuple[SendResult, list[SendResult], SendResult]:
        async with adapter(counting) as client:
            return await asyncio.gather(
                client.send(Message("t", b"a", delay_ms=60_000)),
                client.send_batch([Message("t", b"b", delay_ms=60_000)] * big),
                client.send(Message("t", b"c", delay_ms=60_000)),
            )

    first, many, last = asyncio.run(main())
    assert len(many) == big and first.status is last.status is SendStatus.OK
    assert counting.batches == [1, big, 1]


def test_a_send_cancelled_while_waiting_for_its_batch_stores_nothing(
    counting: CountingBroker,
) -> None:
    cap = ThreadedAsyncBroker.max_batch

    async def main() -> None:
        async with adapter(counting) as client:
            first = [
                asyncio.ensure_future(client.send(Message("t", b"x", delay_ms=60_000)))
                for _ in range(cap)
            ]
            late = asyncio.ensure_future(client.send(Message("t", b"late", delay_ms=60_000)))
            await asyncio.sleep(0)  # every send queued; the first batch leaves next turn
            late.cancel()
            await asyncio.gather(*first)
            with pytest.raises(asyncio.CancelledError):
                await late

    asyncio.run(main())
    assert counting.batches == [cap]
    assert counting.broker.stats().topics["t"].pending == cap
