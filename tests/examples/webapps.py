"""What the web app examples' tests share: real processes, real HTTP, one order scenario.

:class:`Service` runs one command (a uvicorn, a ``manage.py runserver``, a
dispatcher) in its own session, its output in a log file, and stops it with
SIGTERM then SIGKILL (the whole process group, so a server's workers go too).
:func:`run_orders` drives an order service over HTTP (``POST /orders``,
``POST /orders/{id}/pay``, ``GET /orders/{id}``: the FastAPI and the Django
examples answer the same JSON) and checks the outcome in its SQLite database:
every unpaid order closed exactly once, no paid one touched, the late payment
refused. Everything waits on conditions with deadlines; nothing asserts a timing.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
#: Real-time bound for one step (a server to start, the closes to happen); not a claim.
DEADLINE_S = 40.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free now; the caller binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """One child process in its own session, its stdout and stderr in ``log``.

    :param name: for messages.
    :param argv: the command.
    :param env: its environment.
    :param cwd: its working directory.
    :param log: the file its output goes to.
    """

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path
    ) -> None:
        self.name = name
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        """What it printed so far."""
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        """Fail the test, with its output, if it exited."""
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited with {code}:\n{self.output()[-4000:]}")

    def wait_for_output(self, text: str, count: int = 1, timeout: float = DEADLINE_S) -> None:
        """Wait until ``text`` appears ``count`` times in its output."""
        deadline = time.monotonic() + timeout
        while self.output().count(text) < count:
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: {text!r} not printed {count}x in {timeout} s:\n"
                    f"{self.output()[-4000:]}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM it and wait; SIGKILL its process group when it outlives ``timeout``.
        Then SIGKILL whatever of its group is left (workers of a killed server).

        :returns: its exit status (negative: the signal that ended it).
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_group()
            code = self.proc.wait(10)
        self._kill_group()
        self._out.close()
        return code

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def python_env(**extra: str) -> dict[str, str]:
    """This environment, the checkout on ``PYTHONPATH``, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)


def dispatcher_argv(target: str) -> list[str]:
    """``chronoq run TARGET`` with this interpreter's ``chronoq``."""
    return [str(Path(sys.executable).with_name("chronoq")), "run", target]


def wait_http(url: str, services: Sequence[Service], timeout: float = DEADLINE_S) -> None:
    """Poll ``url`` until it answers 200 (failing early if a service exited)."""
    deadline = time.monotonic() + timeout
    while True:
        for service in services:
            service.check_alive()
        try:
            if httpx.get(url, timeout=5.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not answering after {timeout} s")
        time.sleep(0.1)


def _call(method: str, url: str) -> httpx.Response:
    """One request on a connection of its own (so a multi-worker server spreads them)."""
    if method == "POST":
        return httpx.post(url, json={"item": "book"}, timeout=30.0)
    return httpx.get(url, timeout=30.0)


@dataclass
class Outcome:
    """What :func:`run_orders` saw: which orders, who served them."""

    created: list[int] = field(default_factory=list)
    paid: set[int] = field(default_factory=set)
    late: int = 0
    creators: Counter[int] = field(default_factory=Counter)
    roles: dict[int, str] = field(default_factory=dict)

    def saw(self, body: dict[str, Any]) -> None:
        """Note the worker that served ``body``."""
        served = body["served_by"]
        self.roles[int(served["pid"])] = str(served["role"])


def close_runs(db: Path) -> list[tuple[int, str]]:
    """``(order_id, outcome)`` of every auto-close run recorded in ``db``."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT order_id, outcome FROM close_runs ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(int(order_id), str(outcome)) for order_id, outcome in rows]


def run_orders(
    base: str,
    db: Path,
    services: Sequence[Service],
    *,
    count: int,
    workers: int = 1,
    max_count: int | None = None,
) -> Outcome:
    """Create ``count`` orders over HTTP (8 at a time, each on its own connection),
    paying every third one right after its creation; pay one unpaid order after its
    auto-close ran; wait for every close; check it all.

    With ``workers`` > 1, keep creating orders (up to ``max_count``) until that many
    distinct server processes created some.

    Checks: in-time payments answer 200 ``ABORTED``, their orders end ``paid`` with
    the job ``ABORTED`` and no run at all; the late payment answers 409
    ``ALREADY_DELIVERED`` and leaves the order ``closed``; every unpaid order ends
    ``closed`` with exactly one ``closed`` run and one run in all, its job ``DONE``.
    """
    out = Outcome()
    max_count = max_count or count * 3

    def create(n: int) -> tuple[int, bool]:
        res = _call("POST", f"{base}/orders")
        assert res.status_code == 201, res.text
        body = res.json()
        order = body["order"]
        assert order["status"] == "open" and order["close_msg_id"], body
        pay = n % 3 == 0
        if pay:  # paid at once: long before the auto-close is due
            paid = _call("POST", f"{base}/orders/{order['id']}/pay")
            assert paid.status_code == 200, paid.text
            answer = paid.json()
            assert answer["paid"] is True and answer["auto_close"] == "ABORTED", answer
            assert answer["order"]["status"] == "paid", answer
            out.saw(answer)
        out.saw(body)
        out.creators[int(order["created_by"])] += 1
        return int(order["id"]), pay

    with ThreadPoolExecutor(8) as pool:
        n = 0
        while n < count or (len(out.creators) < workers and n < max_count):
            batch = range(n, n + 8 if n >= count else count)
            for order_id, pay in pool.map(create, batch):
                out.created.append(order_id)
                if pay:
                    out.paid.add(order_id)
            n = batch.stop
    assert len(out.creators) >= workers, f"orders created by {dict(out.creators)} only"
    unpaid = [o for o in out.created if o not in out.paid]
    assert len(set(out.created)) == len(out.created) and len(unpaid) >= 2

    # The auto-close's view: the job as the broker shows it, its due time as stored.
    shown = _call("GET", f"{base}/orders/{unpaid[0]}").json()
    job = shown["auto_close"]
    assert job["msg_id"] == shown["order"]["close_msg_id"], shown
    assert job["deliver_at_ms"] == shown["order"]["close_due_ms"], shown
    assert job["key"] == f"order:{unpaid[0]}", shown
    assert job["state"] in {"PENDING", "READY", "INFLIGHT", "DONE"}, shown

    # Too late: wait until the auto-close closed the order, then pay.
    out.late = unpaid[-1]
    _eventually(
        lambda: _call("GET", f"{base}/orders/{out.late}").json()["order"]["status"] == "closed",
        services,
        f"order {out.late} closed by its auto-close",
    )
    late = _call("POST", f"{base}/orders/{out.late}/pay")
    assert late.status_code == 409, late.text
    answer = late.json()
    assert answer["paid"] is False and answer["auto_close"] == "ALREADY_DELIVERED", answer
    assert answer["order"]["status"] == "closed", answer
    out.saw(answer)

    # Every unpaid order closed, and its job acknowledged (nothing left to redeliver).
    _eventually(
        lambda: {o for o, what in close_runs(db) if what == "closed"} >= set(unpaid),
        services,
        f"the {len(unpaid)} unpaid orders closed",
    )

    def settled(order_id: int) -> dict[str, Any] | None:
        return _settled(_call("GET", f"{base}/orders/{order_id}").json())

    for order_id in out.created:
        shown = _eventually(
            functools.partial(settled, order_id),
            services,
            f"order {order_id}'s auto-close settled",
        )
        out.saw(shown)
        if order_id in out.paid:
            assert shown["order"]["status"] == "paid", shown
            assert shown["auto_close"]["state"] == "ABORTED", shown
        else:
            assert shown["order"]["status"] == "closed", shown
            assert shown["auto_close"]["state"] == "DONE", shown

    runs = close_runs(db)
    closed = Counter(o for o, what in runs if what == "closed")
    ran = Counter(o for o, _ in runs)
    assert {o for o in closed if closed[o] != 1} == set(), f"closed more than once: {closed}"
    assert set(closed) == set(unpaid), f"closed {sorted(closed)}, unpaid {sorted(unpaid)}"
    assert set(ran) == set(unpaid), f"a paid order's auto-close ran: {runs}"
    assert all(ran[o] == 1 for o in unpaid), f"an auto-close ran twice: {runs}"
    return out


def _settled(shown: dict[str, Any]) -> dict[str, Any] | None:
    """``shown`` when its job is ``ABORTED`` or ``DONE`` (acked), else ``None``."""
    job = shown["auto_close"]
    return shown if job is not None and job["state"] in {"ABORTED", "DONE"} else None


def _eventually(predicate: Callable[[], Any], services: Sequence[Service], what: str) -> Any:
    """Poll ``predicate`` until truthy (failing early, with its output, if a service died)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = predicate()
        if value:
            return value
        for service in services:
            service.check_alive()
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {s.name}\n{s.output()[-3000:]}" for s in services)
            raise AssertionError(f"{what}: still not after {DEADLINE_S} s\n{logs}")
        time.sleep(0.1)
