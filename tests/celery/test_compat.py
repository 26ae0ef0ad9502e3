"""Pins of :mod:`workers.celery.compat`, the one module that touches private names of
Celery, kombu and redis-py: each function's assumption holds on the installed
versions, those versions lie in the range ``pyproject.toml`` allows, and no other
module of :mod:`workers.celery` reaches a private name itself."""

from __future__ import annotations

import ast
import base64
import importlib.metadata
import inspect
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.backends.base import BaseKeyValueStoreBackend
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu import Connection, Producer, Queue
from kombu.transport import redis as kombu_redis
from packaging.requirements import Requirement

from workers.celery import compat
from workers.celery.redis_backend import RedisResultBackend
from workers.celery.redis_transport import RedisChannel

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workers" / "celery"


def _requirements(name: str) -> list[Requirement]:
    """Every requirement on ``name`` in pyproject.toml, in the base dependencies or
    any extra (wherever the extras put it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    reqs = [Requirement(line) for line in lines if not line.startswith("chronoq")]
    return [r for r in reqs if r.name.lower() == name]


@pytest.mark.parametrize("name", ["celery", "redis"])
def test_installed_versions_lie_in_the_range_pyproject_allows(name: str) -> None:
    reqs = _requirements(name)
    assert reqs, f"pyproject.toml names no {name} requirement"
    installed = importlib.metadata.version(name)
    for req in reqs:
        assert req.specifier.contains(installed, prereleases=True), (name, installed, str(req))


def test_installed_kombu_is_the_one_the_installed_celery_asks_for() -> None:
    reqs = [Requirement(r) for r in importlib.metadata.requires("celery") or []]
    [kombu] = [r for r in reqs if r.name == "kombu" and r.marker is None]
    assert kombu.specifier.contains(importlib.metadata.version("kombu"), prereleases=True)


def test_no_other_module_of_the_package_reaches_a_private_name() -> None:
    """``x._name`` outside compat.py only on ``self``/``cls`` (a class's own names)."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") and node.attr.endswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert found == []


def test_chronoq_s_own_attributes_are_not_celery_s_or_kombu_s() -> None:
    # Our subclasses keep state under names their bases must not have (or gain).
    assert not hasattr(kombu_redis.Channel, "_sync_client")
    for name in ("_store_script", "_store_unless_success", "write_result"):
        assert not hasattr(RedisBackend, name), name
    assert RedisChannel._sync_client is None and RedisResultBackend._store_script is None


@pytest.fixture
def channel(redis_url: str) -> Iterator[Any]:
    conn = Connection(redis_url)
    try:
        yield conn.default_channel
    finally:
        conn.release()


def _message(channel: Any, priority: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = channel.prepare_message(
        '{"n": 1}', priority, "application/json", "utf-8", {"id": "t1"}, {}
    )
    return message


def test_augment_message_encodes_the_body_and_fills_the_delivery_fields(channel: Any) -> None:
    message = _message(channel)
    compat.augment_message(channel, message, "", "orders")
    props = message["properties"]
    assert props["body_encoding"] == "base64"
    assert base64.b64decode(message["body"]) == b'{"n": 1}'
    assert isinstance(props["delivery_tag"], str) and props["delivery_tag"]
    assert props["delivery_info"] == {"exchange": "", "routing_key": "orders"}
    again = _message(channel)
    compat.augment_message(channel, again, "", "orders")
    assert again["properties"]["delivery_tag"] != props["delivery_tag"]


@pytest.mark.parametrize("priority", [None, 0, 5, 9])
def test_queue_list_key_is_the_list_kombu_pushes_onto(
    channel: Any, redis_url: str, priority: int | None
) -> None:
    key = compat.queue_list_key(channel, "compat.q", _message(channel, priority))
    expected = {None: "compat.q", 0: "compat.q", 5: "compat.q\x06\x163", 9: "compat.q\x06\x169"}
    assert key == expected[priority]
    queue = Queue("compat.q")
    Producer(channel).publish({"n": 1}, routing_key="compat.q", declare=[queue], priority=priority)
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.llen(key) == 1
    finally:
        client.close()


def test_queue_expires_tells_a_queue_declared_with_an_expiry(channel: Any) -> None:
    Queue("compat.expiring", expires=30)(channel).declare()
    Queue("compat.lasting")(channel).declare()
    assert compat.queue_expires(channel, "compat.expiring")
    assert not compat.queue_expires(channel, "compat.lasting")
    assert not compat.queue_expires(object(), "compat.expiring")  # another transport


def test_new_channel_client_is_a_fresh_client_on_the_channel_pool(channel: Any) -> None:
    first, second = compat.new_channel_client(channel), compat.new_channel_client(channel)
    assert isinstance(first, redis.Redis) and first is not second
    assert first.connection_pool is channel.pool is second.connection_pool
    assert first.ping()


def test_task_exec_options_are_the_task_s_routing_options() -> None:
    app = Celery("compat", broker="memory://", set_as_current=False)
    try:

        @app.task(name="t.compat", shared=False, queue="orders", priority=4)  # type: ignore[untyped-decorator]
        def task() -> None: ...

        options = compat.task_exec_options(task)
        assert options["queue"] == "orders" and options["priority"] == 4
        options["queue"] = "changed"  # a copy: the task's own stay as they were
        assert compat.task_exec_options(task)["queue"] == "orders"
    finally:
        app.close()


def test_thread_backend_is_this_thread_s_backend_never_made_by_asking(redis_url: str) -> None:
    app = Celery("compat", broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        assert compat.thread_backend(app) is None
        backend = app.backend
        assert compat.thread_backend(app) is backend
        seen: list[Any] = []
        other = threading.Thread(target=lambda: seen.append(compat.thread_backend(app)))
        other.start()
        other.join()
        assert seen == [None]  # Redis's backend is per thread
    finally:
        app.close()


def test_built_client_is_the_client_once_made(redis_url: str) -> None:
    app = Celery("compat", broker=redis_url, backend=redis_url, set_as_current=False)
    try:
        backend = app.backend
        assert compat.built_client(backend) is None
        client = backend.client
        assert compat.built_client(backend) is client is backend.client
    finally:
        app.close()


def _backend(redis_url: str, cls: type[Any] = RedisBackend) -> Any:
    app = Celery("compat", broker=redis_url, set_as_current=False)
    return cls(app=app, url=redis_url)


def test_max_value_size_is_the_limit_celery_s_redis_backend_enforces(redis_url: str) -> None:
    backend = _backend(redis_url)
    assert compat.max_value_size(backend) == 512 * 1024 * 1024
    backend._MAX_STR_VALUE_SIZE = 10  # what the shim reads is what Celery checks
    assert compat.max_value_size(backend) == 10
    with pytest.raises(BackendStoreError):
        backend.set("compat-key", "x" * 11)


def test_result_meta_is_the_meta_celery_stores(redis_url: str) -> None:
    backend = _backend(redis_url)
    done = compat.result_meta(backend, 42, "SUCCESS")
    assert {k: done[k] for k in ("status", "result", "traceback", "children")} == {
        "status": "SUCCESS", "result": 42, "traceback": None, "children": None,
    }  # fmt: skip
    assert isinstance(done["date_done"], str)
    assert compat.result_meta(backend, None, "STARTED")["date_done"] is None
    assert next(iter(done)) == "status"  # the script path reads the status from the first bytes


def test_celery_stores_every_state_through_the_hook(redis_url: str) -> None:
    params = list(inspect.signature(BaseKeyValueStoreBackend._store_result).parameters)
    assert params == ["self", "task_id", "result", "state", "traceback", "request", "kwargs"]
    calls: list[tuple[str, str]] = []

    class Recording(compat.StoreResultHook):
        def write_result(self, task_id: Any, result: Any, state: str, *a: Any, **kw: Any) -> Any:
            calls.append((task_id, state))
            return super().write_result(task_id, result, state, *a, **kw)

    backend = _backend(redis_url, Recording)
    backend.store_result("compat-t", 7, "SUCCESS")
    backend.mark_as_failure("compat-t", ValueError("late"))
    assert calls == [("compat-t", "SUCCESS"), ("compat-t", "FAILURE")]
    # the default write is Celery's own: the SUCCESS stays
    meta = backend.get_task_meta("compat-t", cache=False)
    assert (meta["status"], meta["result"]) == ("SUCCESS", 7)
