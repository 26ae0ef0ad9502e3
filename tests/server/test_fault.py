"""Latency-based fault avoidance (the issue's table) and endpoint parsing."""

from __future__ import annotations

import pytest

from broker_adapter.errors import InvalidArgument
from broker_adapter.server.endpoint import parse_endpoints
from broker_adapter.server.fault import FaultTolerance, not_available_ms


@pytest.mark.parametrize(
    ("latency", "window"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (100, 0),
        (549, 0),
        (550, 2000),
        (1799, 2000),
        (1800, 5000),
        (3000, 6000),
        (5000, 10000),
        (14999, 10000),
        (15000, 30000),
        (30000, 30000),
    ],
)
def test_latency_maps_to_the_not_available_window(latency: int, window: int) -> None:
    assert not_available_ms(latency) == window


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_round_robin_skips_a_slow_endpoint_until_its_window_passed() -> None:
    clock = FakeClock()
    ft = FaultTolerance(3, clock)
    assert [ft.pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    ft.update(1, 600)  # 2 s out
    assert not ft.available(1)
    assert {ft.pick() for _ in range(6)} == {0, 2}
    clock.now += 2.0
    assert ft.available(1)
    assert 1 in {ft.pick() for _ in range(3)}


def test_a_failed_endpoint_is_out_for_30_s_and_avoid_skips_the_last_one() -> None:
    clock = FakeClock()
    ft = FaultTolerance(2, clock)
    ft.update(0, 1, failed=True)
    assert [ft.pick() for _ in range(4)] == [1, 1, 1, 1]
    clock.now += 29.9
    assert not ft.available(0)
    clock.now += 0.1
    assert ft.available(0)
    assert ft.pick(avoid=1) == 0


def test_when_every_endpoint_is_out_the_soonest_back_is_used() -> None:
    clock = FakeClock()
    ft = FaultTolerance(3, clock)
    ft.update(0, 20_000)  # 30 s
    ft.update(1, 600)  # 2 s
    ft.update(2, 6_000)  # 10 s
    assert ft.pick() == 1
    assert ft.pick(avoid=1) == 2


def test_parse_endpoints() -> None:
    assert parse_endpoints("h1:1, h2:2,[::1]:3") == [("h1", 1), ("h2", 2), ("::1", 3)]
    for bad in ("h1", "h1:x", "h1:0", "h1:70000"):
        with pytest.raises(InvalidArgument):
            parse_endpoints(bad)


def test_url_options() -> None:
    from broker_adapter.server.client import RemoteBroker
    from broker_adapter.server.endpoint import url_options

    assert url_options({"token": "t", "send_timeout_ms": "500", "retries": "0"}) == {
        "token": "t",
        "send_timeout_ms": 500,
        "retries": 0,
    }
    assert url_options({"token": ""}) == {"token": None}
    with pytest.raises(InvalidArgument, match="unknown parameter"):
        url_options({"tokn": "t"})
    with pytest.raises(InvalidArgument, match="not a number"):
        url_options({"retries": "two"})
    b = RemoteBroker.from_url("chronoq://h1:1,h2:2/?retries=5")
    assert ([e.address for e in b.endpoints], b.retries, b.multi) == (["h1:1", "h2:2"], 5, True)
    b.close()
