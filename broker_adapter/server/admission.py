"""Who may hold a connection to a broker server: caps per address and per stage.

A connection is *unauthenticated* from accept until its ``hello`` (with the right
token, when one is set) is accepted, then *authenticated*. The two stages have
separate pools, so sockets that connect and never speak cannot take the places
of working clients:

* authenticated connections: at most ``max_connections`` in all;
* unauthenticated ones: at most ``max_unauthenticated``, each given
  ``hello_timeout_s`` to say hello. When that pool is full a newcomer is still
  let in: the oldest *silent* connection (not a byte received yet) of the address
  holding the most is closed for it;
* one address (the peer's IP; each Unix-socket connection is its own) holds at
  most ``max_per_peer`` connections of both stages. A newcomer over that cap
  closes its address's oldest silent connection; it is refused when there is none
  (all are saying hello) or when its address's authenticated connections alone
  reach the cap.

A client sends its hello right after connecting, so its connection has bytes by
the time the next one is accepted: a flood of sockets that never speak evicts only
its own, from any address, and cannot keep a client out.

:class:`Admission` is only the bookkeeping (no sockets, no threads); the server
closes what it says to evict. :class:`RefusalLog` keeps refusals from flooding the
log: one WARNING per interval, with counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: A connection, as the server knows it (anything hashable to the bookkeeping).
C = TypeVar("C", bound=Hashable)

#: Connections one address may hold by default. Every process on the server's own
#: host shares 127.0.0.1, and a ``chronoq run`` holds about 2-3 (one per endpoint,
#: one per consumer), so this leaves room for ~20 such processes per host.
DEFAULT_MAX_PER_PEER = 64
#: Connections that have not said hello yet, by default.
DEFAULT_MAX_UNAUTHENTICATED = 64
#: Seconds a new connection has to send a valid hello, by default.
DEFAULT_HELLO_TIMEOUT_S = 3.0
#: Seconds between two refusal lines in the log.
REFUSAL_LOG_INTERVAL_S = 5.0
#: How many of an address's oldest opening connections are looked at for a silent one.
SILENT_SCAN = 16


@dataclass
class _Peer(Generic[C]):
    unauth: dict[C, float] = field(default_factory=dict)  # conn -> deadline, oldest first
    auth: int = 0


@dataclass(frozen=True)
class Verdict(Generic[C]):
    """What to do with a new connection.

    :ivar refusal: why it is refused, for the client (``None``: it is admitted).
    :ivar evict: unauthenticated connections to close to make room for it (also
        when it is refused).
    :ivar label: the refusal's kind, for the log's counts.
    """

    refusal: str | None
    evict: tuple[C, ...] = ()
    label: str = ""


class Admission(Generic[C]):
    """Counts connections by address and stage; thread-safe.

    :param max_connections: authenticated connections in all.
    :param max_per_peer: connections (both stages) of one address.
    :param max_unauthenticated: connections that have not said hello yet.
    :param hello_timeout_s: how long a connection may stay unauthenticated.
    :param silent: whether an unauthenticated connection has received nothing yet
        (only those are closed for newcomers); every one is, by default. Called
        under this object's lock: keep it quick (a poll, a flag).
    """

    def __init__(
        self,
        max_connections: int,
        max_per_peer: int = DEFAULT_MAX_PER_PEER,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
        silent: Callable[[C], bool] = lambda conn: True,
    ) -> None:
        self._silent = silent
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.max_unauthenticated = max_unauthenticated
        self.hello_timeout_s = hello_timeout_s
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer[C]] = {}
        self._peer_of: dict[C, str] = {}
        self._authed: set[C] = set()
        self._unauth_total = 0

    @property
    def unauthenticated(self) -> int:
        """Connections that have not said hello yet."""
        return self._unauth_total

    @property
    def authenticated(self) -> int:
        """Connections that said hello."""
        return len(self._authed)

    def admit(self, conn: C, peer: str, now: float | None = None) -> Verdict[C]:
        """Decide about a new connection ``conn`` from address ``peer``; when admitted it
        is counted as unauthenticated (the evicted ones are no longer counted)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            mine = self._peers.get(peer)
            if mine is not None and mine.auth >= self.max_per_peer:
                return Verdict(
                    f"{peer} has its maximum of {self.max_per_peer} connections "
                    "(--max-connections-per-peer)",
                    label="address at its cap",
                )
            evict: list[C] = []
            if mine is not None and mine.auth + len(mine.unauth) >= self.max_per_peer:
                victim = self._oldest_silent(peer)
                if victim is None:
                    return Verdict(
                        f"{peer} has {self.max_per_peer} connections saying hello",
                        label="address at its cap, all saying hello",
                    )
                evict.append(victim)
            if self._unauth_total >= self.max_unauthenticated:
                victim = None
                for busy in sorted(self._peers, key=lambda p: -len(self._peers[p].unauth)):
                    victim = self._oldest_silent(busy)
                    if victim is not None:
                        break
                if victim is None:
                    return Verdict(
                        f"{self.max_unauthenticated} connections are saying hello",
                        tuple(evict),
                        "all opening ones saying hello",
                    )
                evict.append(victim)
            mine = self._peers.setdefault(peer, _Peer[C]())
            mine.unauth[conn] = now + self.hello_timeout_s
            self._peer_of[conn] = peer
            self._unauth_total += 1
            return Verdict(None, tuple(evict))

    def _oldest_silent(self, peer: str) -> C | None:
        """Forget and return ``peer``'s oldest silent unauthenticated connection (among
        its :data:`SILENT_SCAN` oldest), if any."""
        for i, conn in enumerate(self._peers[peer].unauth):
            if i >= SILENT_SCAN:
                break
            if self._silent(conn):
                self._forget(conn)
                return conn
        return None

    def authenticate(self, conn: C) -> str | None:
        """``conn`` said a valid hello: move it to the authenticated pool. Returns why
        it may not stay (the authenticated pool is full), else ``None``; a refused or
        no longer counted connection is forgotten."""
        with self._lock:
            peer = self._peer_of.get(conn)
            if peer is None or conn not in self._peers[peer].unauth:
                return "it was closed to make room for newer connections"
            if len(self._authed) >= self.max_connections:
                self._forget(conn)
                return (
                    f"the broker server has its maximum of {self.max_connections} "
                    "connections; try again later"
                )
            state = self._peers[peer]
            del state.unauth[conn]
            self._unauth_total -= 1
            state.auth += 1
            self._authed.add(conn)
            return None

    def expired(self, now: float | None = None) -> list[C]:
        """Unauthenticated connections past their hello deadline, forgotten: close them."""
        now = time.monotonic() if now is None else now
        out: list[C] = []
        with self._lock:
            for state in self._peers.values():
                for conn, deadline in state.unauth.items():
                    if deadline > now:
                        break  # oldest first: the rest are younger
                    out.append(conn)
            for conn in out:
                self._forget(conn)
        return out

    def release(self, conn: C) -> None:
        """``conn`` ended (harmless when already forgotten)."""
        with self._lock:
            self._forget(conn)

    def _forget(self, conn: C) -> None:
        peer = self._peer_of.pop(conn, None)
        if peer is None:
            return
        state = self._peers[peer]
        if conn in self._authed:
            self._authed.discard(conn)
            state.auth -= 1
        elif state.unauth.pop(conn, None) is not None:
            self._unauth_total -= 1
        if state.auth == 0 and not state.unauth:
            del self._peers[peer]


class RefusalLog:
    """Refusals and evictions logged at most once per ``interval_s``, with counts.

    :param logger: where the lines go.
    :param interval_s: least time between two lines.
    :param headline: what each line counts (a server also counts connections closed
        for malformed frames this way: a garbage flood must not flood the log).
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = REFUSAL_LOG_INTERVAL_S,
        headline: str = "connections turned away",
    ) -> None:
        self._log = logger
        self._interval = interval_s
        self._headline = headline
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._peers: Counter[str] = Counter()
        self._last: float | None = None  # when the last line was logged
        self.lines = 0

    def note(self, what: str, peer: str) -> None:
        """Count one refusal or eviction (``what``: a short reason); log if due."""
        with self._lock:
            self._counts[what] += 1
            self._peers[peer] += 1
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Log what was counted since the last line, if the interval passed (or ``force``)."""
        now = time.monotonic()
        with self._lock:
            last = self._last
            if not self._counts or (not force and last is not None and now - last < self._interval):
                return
            counts, self._counts = self._counts, Counter()
            peers, self._peers = self._peers, Counter()
            since = 0.0 if last is None else now - last
            self._last = now
            self.lines += 1
        total = sum(counts.values())
        reasons = ", ".join(f"{n} {what}" for what, n in counts.most_common())
        top = ", ".join(f"{p} x{n}" for p, n in peers.most_common(3))
        self._log.warning(
            "%s: %d in %.1f s (%s); most from %s",
            self._headline,
            total,
            since,
            reasons,
            top,
        )


__all__ = [
    "DEFAULT_HELLO_TIMEOUT_S",
    "DEFAULT_MAX_PER_PEER",
    "DEFAULT_MAX_UNAUTHENTICATED",
    "REFUSAL_LOG_INTERVAL_S",
    "SILENT_SCAN",
    "Admission",
    "RefusalLog",
    "Verdict",
]
