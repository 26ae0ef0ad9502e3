"""``open_broker`` and URL parsing (``broker_adapter/urls.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_adapter import open_broker
from broker_adapter.clock import ManualClock
from broker_adapter.errors import ChronoqError, InvalidArgument, UnknownScheme
from broker_adapter.message import Message
from broker_adapter.results import SendStatus
from broker_adapter.urls import ADAPTERS, split_url


@pytest.mark.parametrize("url", ["kafka://localhost:9092", "amqp://guest@h//", "file:///tmp/x"])
def test_unknown_scheme_raises_unknown_scheme(url: str) -> None:
    with pytest.raises(UnknownScheme) as info:
        open_broker(url)
    assert isinstance(info.value, ChronoqError) and isinstance(info.value, ValueError)
    assert url in str(info.value)
    assert "rocksdb" in str(info.value)  # says which schemes would work


@pytest.mark.parametrize(
    "url",
    ["", "rocksdb", "rocksdb:/tmp/x", "/tmp/chronoq-data", "localhost:6379", None, 42],
)
def test_malformed_url_raises_invalid_argument(url: object) -> None:
    with pytest.raises(InvalidArgument):
        open_broker(url)  # type: ignore[arg-type]


def test_rocksdb_url_without_a_path_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        open_broker("rocksdb://", clock=ManualClock())


def test_rocksdb_url_with_an_unknown_parameter_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        open_broker(f"rocksdb://{tmp_path}/d?no_such_option=1", clock=ManualClock())


def test_split_url_parts() -> None:
    assert split_url("RocksDB:///var/lib/q?durability=sync&x=") == (
        "rocksdb",
        "/var/lib/q",
        {"durability": "sync", "x": ""},
    )
    assert split_url("redis://127.0.0.1:6379/0") == ("redis", "127.0.0.1:6379/0", {})


def test_every_scheme_names_a_module_and_class() -> None:
    assert "rocksdb" in ADAPTERS
    for target in ADAPTERS.values():
        module, _, cls = target.partition(":")
        assert module.startswith("broker_adapter.") and cls


def test_rocksdb_url_opens_an_embedded_broker_with_its_parameters(tmp_path: Path) -> None:
    from broker_adapter.embedded import EmbeddedBroker

    path = tmp_path / "data"
    clock = ManualClock()
    with open_broker(f"rocksdb://{path}?durability=sync", clock=clock) as broker:
        assert isinstance(broker, EmbeddedBroker)
        r = broker.send(Message("t", b"x", delay_ms=1_000))
        assert r.status is SendStatus.OK
        assert r.deliver_at_ms == clock.now_ms() + 1_000
    assert path.is_dir()


def test_scheme_is_case_insensitive_and_relative_paths_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_broker("ROCKSDB://./rel-data", clock=ManualClock()) as broker:
        broker.send(Message("t", b"x", delay_ms=1_000))
    assert (tmp_path / "rel-data").is_dir()
