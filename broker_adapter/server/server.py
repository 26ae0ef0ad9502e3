"""BrokerServer: one :class:`EmbeddedBroker` served to many processes over TCP.

RocksDB lets one process own a data directory; the server is that process, and
web apps, workers and Spark drivers reach it with ``chronoq://host:port``
(:class:`~broker_adapter.server.client.RemoteBroker`). Protocol:
:mod:`broker_adapter.server.protocol`.

Threads: one accept thread (:mod:`~broker_adapter.server.acceptor`: a connection
waits there without a thread until it speaks), one reader thread per connection
(quick requests run there), a pool for parked long polls, and a housekeeping thread that closes
the consumers of vanished clients once their in-flight messages went back (after
their invisible time). Security: it binds 127.0.0.1 by default and refuses a
non-loopback address without a token; the token is compared in constant time.
Floods: connections that have not said hello are counted, capped and timed out
apart from working ones, each address holds at most ``max_connections_per_peer``,
and refusals are logged once per few seconds with counts
(:mod:`~broker_adapter.server.admission`).
With ``unix_path`` it listens on a Unix socket instead (mode 0600, no TCP at
all): how a process that owns a data directory shares it with later openers of
the same ``rocksdb://`` URL (:mod:`broker_adapter.shared`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_adapter.base import Consumer
from broker_adapter.checks import check_positive_settings
from broker_adapter.clock import ManualClock
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.embedded.consumer import EmbeddedConsumer
from broker_adapter.errors import InvalidArgument
from broker_adapter.listen import check_bind
from broker_adapter.server import protocol as P
from broker_adapter.server.acceptor import Acceptor
from broker_adapter.server.admission import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_PER_PEER,
    DEFAULT_MAX_UNAUTHENTICATED,
    Admission,
    RefusalLog,
)
from broker_adapter.server.connection import Connection
from broker_adapter.server.handlers import Handlers, arg
from broker_adapter.server.metrics import ServerMetrics
from broker_adapter.server.unix import inode, listen_unix, remove_if_same

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger("chronoq.broker_adapter.BrokerServer")
log.addHandler(logging.NullHandler())

DEFAULT_PORT = 7420
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_INFLIGHT = 128
#: Threads running slow requests (``abort_prefix``) at once, all connections together.
SLOW_THREADS = 4
NODE_FILE = "chronoq-node-id"


class BrokerServer:
    """Serve the broker on ``data_dir`` at ``host:port``.

    :param data_dir: the embedded broker's RocksDB directory.
    :param host: address to bind (default 127.0.0.1).
    :param port: TCP port (0 picks a free one; see :attr:`port`).
    :param token: clients must present it; required for a non-loopback ``host``.
    :param manual_clock_ms: test-only: run the broker on a ``ManualClock`` from
        this time and accept the ``advance`` and ``reset`` requests.
    :param max_connections: authenticated connections served at once; more are refused.
    :param max_connections_per_peer: connections one address may hold (both stages;
        see :mod:`~broker_adapter.server.admission`).
    :param max_unauthenticated: connections that have not said hello yet; past it a
        newcomer replaces the oldest silent one of the busiest address.
    :param hello_timeout_s: seconds a new connection has to say a valid hello.
    :param max_inflight: unanswered requests per connection before it is not read.
    :param max_frame: largest frame accepted (bytes).
    :param broker_options: more ``EmbeddedBroker`` arguments (e.g. ``durability``).
    :param unix_path: listen on a Unix socket at this path (made 0600, replacing a stale
        one) instead of ``host:port``.
    :raises InvalidArgument: for a non-loopback ``host`` without a token.
    :raises BrokerLocked: when another process owns ``data_dir``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        manual_clock_ms: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_frame: int = P.MAX_FRAME,
        broker_options: Mapping[str, Any] | None = None,
        unix_path: str | os.PathLike[str] | None = None,
        max_connections_per_peer: int = DEFAULT_MAX_PER_PEER,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
    ) -> None:
        if unix_path is None:
            check_bind(
                host,
                token,
                f"refusing to bind {host!r} without a token: anyone who can reach it could "
                "send and abort messages; pass --token (or CHRONOQ_TOKEN) or bind 127.0.0.1",
            )
        check_positive_settings(
            max_connections=max_connections,
            max_inflight=max_inflight,
            max_frame=max_frame,
            max_connections_per_peer=max_connections_per_peer,
            max_unauthenticated=max_unauthenticated,
        )
        if not hello_timeout_s > 0:
            raise InvalidArgument(f"hello_timeout_s must be > 0, got {hello_timeout_s!r}")
        self.data_dir = Path(data_dir)
        self.token = token or None
        self.max_connections = max_connections
        self.max_inflight = max_inflight
        self.max_frame = max_frame
        self.hello_timeout_s = hello_timeout_s
        # Flood control: who may connect, and refusals logged once per few seconds.
        self.admission: Admission[Connection] = Admission(
            max_connections,
            max_connections_per_peer,
            max_unauthenticated,
            hello_timeout_s,
            Connection.is_silent,
        )
        self.refusals = RefusalLog(log)
        self.bad_frames = RefusalLog(log, headline="connections closed for malformed frames")
        self._broker_options = dict(broker_options or {})
        self.manual_clock = None if manual_clock_ms is None else ManualClock(manual_clock_ms)
        self.broker = self._open_broker()
        self.node = self._node_id()
        self.metrics = ServerMetrics(self)
        self.handlers = Handlers(self)
        self.pull_pool = ThreadPoolExecutor(
            max_workers=max(64, max_connections * 2), thread_name_prefix="chronoq-pull"
        )
        # Requests that may run long (connection.SLOW_OPS); few at once: each works in
        # chunks that take the broker's locks, so more threads would only queue there.
        self.slow_pool = ThreadPoolExecutor(
            max_workers=SLOW_THREADS, thread_name_prefix="chronoq-slow"
        )
        self._conns: set[Connection] = set()
        self._orphans: list[Consumer] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._stopped = threading.Event()
        self.unix_path = None if unix_path is None else Path(unix_path)
        try:
            if self.unix_path is None:
                # A deep queue: under a flood a client's connect waits its turn there
                # instead of being dropped (the kernel caps it at net.core.somaxconn).
                self._sock = socket.create_server((host, port), backlog=4096, reuse_port=False)
            else:
                self._sock = listen_unix(self.unix_path)
        except BaseException:
            self.broker.close()  # the directory is not left locked by a server that never ran
            raise
        self._sock_inode = None if self.unix_path is None else inode(self.unix_path)
        self.host = host
        self.port: int = 0 if self.unix_path is not None else self._sock.getsockname()[1]
        self.address = str(self.unix_path) if self.unix_path is not None else f"{host}:{self.port}"
        self._threads: list[threading.Thread] = []

    def _open_broker(self) -> EmbeddedBroker:
        return EmbeddedBroker(self.data_dir, clock=self.manual_clock, **self._broker_options)

    def _node_id(self) -> str:
        """This data directory's node id (made once, kept in ``chronoq-node-id``)."""
        path = self.data_dir / NODE_FILE
        try:
            node = path.read_text().strip()
        except FileNotFoundError:
            node = ""
        if len(node) != 8:
            node = secrets.token_hex(4)
            path.write_text(node + "\n")
        return node

    def hello_info(self) -> dict[str, Any]:
        """What ``hello`` answers."""
        return {
            "v": P.VERSION,
            "node": self.node,
            "max_body": self.broker.max_body_bytes,
            "max_frame": self.max_frame,
            "manual_clock": self.manual_clock is not None,
            "pid": os.getpid(),
            "ops": sorted(P.OPS),
        }

    # -- running -------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve on background threads (accept and housekeeping)."""
        # The acceptor registers the listener here, before a shutdown can close it: a
        # server stopped right after start() must not fail in its accept thread.
        acceptor = Acceptor(self, self._sock)
        for target, name in (
            (acceptor.run, "chronoq-accept"),
            (self._housekeep_loop, "chronoq-server-housekeep"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("serving %s on %s (node %s)", self.data_dir, self.address, self.node)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._stopping.is_set()

    def serve(self, conn: Connection) -> None:
        """Start serving an admitted connection that spoke (its reader thread)."""
        with self._lock:
            self._conns.add(conn)
        conn.thread.start()

    def authenticate(self, conn: Connection) -> str | None:
        """``conn`` said a valid hello: count it as a working connection. Returns why it
        must be refused instead (the server has its maximum), else ``None``."""
        why = self.admission.authenticate(conn)
        if why is not None:
            self.metrics.refused()
            self.refusals.note("refused at hello (server full, or closed for newer)", conn.address)
        return why

    def _housekeep_loop(self) -> None:
        while not self._stopping.wait(1.0):
            self.refusals.flush()  # the counts of the last refusals, once the interval passed
            self.bad_frames.flush()
            with self._lock:
                orphans, self._orphans = self._orphans, []
            keep = []
            for c in orphans:
                if getattr(c, "held", 0) > 0 and not getattr(c, "closed", True):
                    keep.append(c)
                else:
                    with contextlib.suppress(Exception):
                        c.close()
            with self._lock:
                self._orphans.extend(keep)

    def forget(self, conn: Connection) -> None:
        """A connection ended: its consumers become orphans (unless it was reset away)."""
        conn.release_consumers(orphan=not self._stopping.is_set())
        self.admission.release(conn)
        with self._lock:
            self._conns.discard(conn)

    def adopt_orphan(self, consumer: Consumer) -> None:
        """Keep a vanished client's consumer until its in-flight messages went back."""
        with self._lock:
            self._orphans.append(consumer)

    @property
    def connections(self) -> int:
        """Connections served now."""
        return len(self._conns)

    def reset(self, requester: Connection, args: dict[str, Any]) -> None:
        """Test-only: drop every other connection, empty the data directory and start
        again on a ``ManualClock`` at ``start_ms``.

        :raises InvalidArgument: unless the server runs with a manual clock.
        """
        if self.manual_clock is None:
            raise InvalidArgument("reset is test-only: start the server with --manual-clock")
        start_ms = arg(args, "start_ms", int)
        with self._lock:
            others = [c for c in self._conns if c is not requester]
        for c in others:
            c.close()
        for c in others:
            c.thread.join(timeout=5)
        requester.release_consumers(orphan=False)
        with self._lock:
            orphans, self._orphans = self._orphans, []
        for o in orphans:
            with contextlib.suppress(Exception):
                o.close()
        self.broker.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.manual_clock = ManualClock(start_ms)
        self.broker = self._open_broker()
        self.node = self._node_id()

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` was called: clients' consumers get no more messages."""
        return self._draining.is_set()

    def _pause_clients(self) -> int:
        """Pause every consumer clients hold open now; how many messages they hold."""
        with self._lock:
            conns = list(self._conns)
        held = 0
        for conn in conns:
            for consumer in list(conn.consumers.values()):
                if isinstance(consumer, EmbeddedConsumer):
                    consumer.pause()
                    held += consumer.held
        return held

    def drain(self, timeout_s: float) -> int:
        """Before a clean :meth:`shutdown`: hand clients no more messages (their pulls wait
        and return nothing) and wait up to ``timeout_s`` until they settled what they hold.
        Everything else is still served: acks, nacks, extends, releases, and sends (stored
        durably as ever). Consumers of clients that vanished are not waited for.

        :param timeout_s: the longest wait, in seconds (0: only pause).
        :returns: how many messages clients still hold (0 once all are settled); those
            are delivered again by the next broker on this directory.
        """
        self._draining.set()
        deadline = time.monotonic() + timeout_s
        while True:
            held = self._pause_clients()
            if held == 0 or time.monotonic() >= deadline or self._stopping.is_set():
                return held
            time.sleep(0.02)

    def shutdown(self, drain_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``drain_s``; parked long
        polls are cut short), flush and close the broker. Calling it twice is harmless."""
        if self._stopping.is_set():
            self._stopped.wait(drain_s + 30)
            return
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        if self.unix_path is not None:  # still ours: the broker (and its lock) is not closed yet
            remove_if_same(self.unix_path, self._sock_inode)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.stop_reading()
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and any(c.busy for c in conns if not c.closed):
            time.sleep(0.01)
        self.broker.close()  # wakes parked pulls (they answer BrokerClosed)
        self.pull_pool.shutdown(wait=True, cancel_futures=True)
        self.slow_pool.shutdown(wait=True, cancel_futures=True)
        for c in conns:
            c.close()
        for c in conns:
            c.thread.join(timeout=5)
        self.metrics.stop()
        self.refusals.flush(force=True)  # the last counts, not lost with the process
        self.bad_frames.flush(force=True)
        self._stopped.set()
        log.info("broker server on %s stopped", self.address)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`shutdown` finished (or ``timeout`` s passed)."""
        return self._stopped.wait(timeout)
