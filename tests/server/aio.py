"""Helpers of the asyncio client tests: a coroutine run on a fresh loop, a server
paused with SIGSTOP, a turn of the loop for requests to go out."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from broker_adapter.server.client import RemoteBroker
from tests.helpers import eventually
from tests.server.serverproc import ServerProcess

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a test's coroutine on a fresh event loop."""

    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


@contextmanager
def paused(server: ServerProcess) -> Iterator[int]:
    """The server stopped (SIGSTOP: its socket accepts, nothing answers) inside the block."""
    assert server.proc is not None
    pid = server.proc.pid
    server.proc.send_signal(signal.SIGSTOP)
    eventually(lambda: "\tT" in Path(f"/proc/{pid}/status").read_text(), what="server stopped")
    try:
        yield pid
    finally:
        server.proc.send_signal(signal.SIGCONT)


async def in_flight() -> None:
    """Let the loop write what the tasks just created asked for."""
    for _ in range(5):
        await asyncio.sleep(0)


def sync_client(server: ServerProcess) -> RemoteBroker:
    return RemoteBroker.from_url(server.url)
