"""What the per-job kernel work of ``chronoq://`` costs on this machine (issue 16).

Run from the project root (``/work/main``)::

    .venv/bin/python bench/remote_syscall_cost.py [--n 20000]

Prints CPU time (``time.process_time``: user + system of this process, all threads)
per operation, for the pieces a job's trip through a server and a dispatcher is
made of:

* a trivial system call (``os.getppid``);
* a message over a loopback TCP socket and back: two threads of this process,
  each ``sendall`` + ``recv`` of 40 bytes (per round trip: 2 sends, 2 receives and
  2 thread wake-ups, as one pull answered by a waiting server);
* the same over a Unix socket pair;
* a thread hand-off and back: a bare lock released by one thread and taken by
  another, twice per round trip (a dispatcher handing a job to a pool thread, or a
  reader waking a caller), including the GIL's passage between them;
* a ``Condition.wait`` with a 1 ms timeout that times out (a parked pull's or the
  wheel's timed wait).

These are the units the job's CPU breakdown is counted in (README "Job-start
latency", ``chronoq://``).
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence


def per_op_us(n: int, run: Callable[[int], None]) -> float:
    """CPU microseconds (whole process) per one of ``n`` operations done by ``run(n)``."""
    t0 = time.process_time()
    run(n)
    return (time.process_time() - t0) / n * 1e6


def syscalls(n: int) -> None:
    getppid = os.getppid
    for _ in range(n):
        getppid()


def socket_round_trips(n: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    server.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    echo_round_trips(n, a, b)


def unix_round_trips(n: int) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    echo_round_trips(n, a, b)


def echo_round_trips(n: int, a: socket.socket, b: socket.socket) -> None:
    """``n`` round trips of 40 bytes from ``a`` to a thread echoing on ``b``; closes both."""
    payload = b"x" * 40

    def echo() -> None:
        for _ in range(n):
            b.sendall(b.recv(64))

    t = threading.Thread(target=echo)
    t.start()
    for _ in range(n):
        a.sendall(payload)
        a.recv(64)
    t.join()
    a.close()
    b.close()


def hand_offs(n: int) -> None:
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        for _ in range(n):
            ping.acquire()
            pong.release()

    t = threading.Thread(target=other)
    t.start()
    for _ in range(n):
        ping.release()
        pong.acquire()
    t.join()


def timed_waits(n: int) -> None:
    cond = threading.Condition()
    with cond:
        for _ in range(n):
            cond.wait(0.001)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="operations per figure")
    args = p.parse_args(argv)
    n = args.n
    print(f"== remote_syscall_cost: n={n}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"trivial system call                      {per_op_us(n, syscalls):7.2f} us CPU")
    print(
        f"loopback TCP round trip (2 threads)      {per_op_us(n, socket_round_trips):7.2f} us CPU"
    )
    print(f"Unix socket round trip (2 threads)       {per_op_us(n, unix_round_trips):7.2f} us CPU")
    print(f"thread hand-off and back (2 wake-ups)    {per_op_us(n, hand_offs):7.2f} us CPU")
    m = max(n // 20, 100)
    print(f"1 ms timed wait that times out           {per_op_us(m, timed_waits):7.2f} us CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
