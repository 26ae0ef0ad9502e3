"""SharedBroker: ``rocksdb://DIR`` opened by many processes at once.

RocksDB lets one process own a data directory. The first process to open
``rocksdb://DIR`` becomes its **owner**: it opens the embedded broker (wheel and
all) and also serves it on the Unix socket ``DIR/chronoq.sock`` (mode 0600:
the owning user only; nothing on TCP), reusing the broker server
(:class:`~broker_adapter.server.server.BrokerServer`). A later process that
opens the same URL finds the directory locked and becomes a **client** of the
owner over that socket (a :class:`~broker_adapter.server.client.RemoteBroker`):
it sends, aborts, queries and, for a dispatcher, pulls and acks through the
owner, with the owner's guarantees. :attr:`SharedBroker.role` and
:attr:`SharedBroker.owner_pid` say which it is; so does an INFO log line.

Handover. When the owner closes or dies (even ``kill -9``), its clients notice
at once (each keeps an idle connection, :class:`~broker_adapter.shared.watch.OwnerWatch`)
and race for the directory's lock: exactly one wins and becomes the owner (its
wheel fires what fell due meanwhile); the others become its clients. The lock is
the truth: a socket file left by a dead owner is never trusted, only a
connection that answers; a new owner replaces the file in one rename.

What a caller sees while that happens:

* A call made after the handover goes to the new owner as if nothing happened.
* A call *in flight* when the owner died fails with :class:`OwnerLost` (a
  :class:`~broker_adapter.errors.ConnectionFailed`): for a send, whether the
  message was stored is unknown. Retry it. A send the old owner acknowledged is
  durable (RocksDB's WAL); a retried send **with a key** is safe: keyed sends
  are idempotent, so a second one answers ``DUPLICATE`` with the first id if the
  first was stored. A send without a key may then be stored twice.
* Reads (``query``, ``pending``, ``stats``, ``find_pending``: a page's cursor stays
  valid on the new owner) and ``abort`` (idempotent: a second abort answers
  ``ABORTED`` again) are retried once on the new owner instead. So are the other
  runtime calls, each idempotent or harmless to repeat: ``abort_prefix`` (the
  repeat aborts what the first did not reach, and counts only that),
  ``reschedule`` (the same move again: ``RESCHEDULED``, or ``ALREADY_DELIVERED``
  if the new time passed meanwhile and the message fired), and the rate limits and
  slots, whose state lives in the owner's memory: a new owner starts every bucket
  full and every semaphore empty, as a restart does, so a repeated
  ``acquire_rate``/``acquire_slot`` takes from the fresh state and a repeated
  ``release_slot`` answers ``False``.
* A consumer keeps pulling from the new owner. Messages it pulled from the old
  one cannot be settled any more (``ack`` answers ``False``): they are delivered
  again (at-least-once; the message id is the idempotency key downstream). A
  handover is a restart of the embedded broker: what any process had pulled and
  not settled comes back, and after a kill also what was acked since the group's
  last cursor commit (see :mod:`~broker_adapter.embedded.groups`).

A keyed retry answers ``DUPLICATE`` while the first send is pending (or, once it
fired, when both asked for the same absolute ``deliver_at_ms``): retry at once.

A *clean* close of the owner drains first (``handover_drain_ms``, default 10,000):
its clients' consumers get no more messages (their pulls wait and return none),
while acks, nacks, extends, releases and sends are still served (a send is stored
durably as ever); once the clients settled everything they had pulled, or the
time is up, the owner closes and a client takes over. So a dispatcher that is a
client runs each job it held once; what is still unsettled at the timeout is
delivered again (a WARNING gives the count), as after a kill.

Configuration: ``rocksdb://DIR?share=0`` (or ``CHRONOQ_SHARE=0``) turns sharing
off: a second opener then gets :class:`~broker_adapter.errors.BrokerLocked`, as
before. ``share_timeout_ms`` (default 10,000) bounds how long an opener waits
for an owner that holds the lock but does not answer on the socket yet (one
starting up, or one that does not share: then ``BrokerLocked``). A ``clock``
argument (tests) opens a private :class:`~broker_adapter.embedded.EmbeddedBroker`:
other processes cannot follow a manual clock. Broker options (``durability``...)
apply when this process becomes the owner; a client uses the owner's. All the
options: :mod:`broker_adapter.shared.options`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from broker_adapter.adapter import AdapterBase, ConsumerLimits
from broker_adapter.base import BrokerAdapter, Consumer
from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.errors import BrokerClosed, BrokerLocked, ConnectionFailed, InvalidArgument
from broker_adapter.message import Message
from broker_adapter.results import AbortResult, BrokerStats, MessageView, SendResult
from broker_adapter.server.client import RemoteBroker
from broker_adapter.server.link import RequestTimeout
from broker_adapter.server.server import BrokerServer
from broker_adapter.shared.consumer import SharedConsumer
from broker_adapter.shared.options import (
    DEFAULT_HANDOVER_DRAIN_MS,
    DEFAULT_SHARE_TIMEOUT_MS,
    HANDOVER_DRAIN_ENV,
    ms_option,
    share_enabled,
)
from broker_adapter.shared.roles import Attachment, OwnerLost, Role
from broker_adapter.shared.runtime_calls import SharedRuntimeCalls
from broker_adapter.shared.watch import OwnerWatch, say_hello
from broker_adapter.urls import split_url

log = logging.getLogger("chronoq.broker_adapter.SharedBroker")
log.addHandler(logging.NullHandler())

#: The owner's socket, inside the data directory.
SOCKET_NAME = "chronoq.sock"
#: A client's bound on one send through the owner (the socket is local: only a stuck
#: owner is this slow; it raises RequestTimeout and does not count as gone).
CLIENT_SEND_TIMEOUT_MS = 30_000
_T = TypeVar("_T")


class SharedBroker(SharedRuntimeCalls, AdapterBase):
    """The adapter of ``rocksdb://DIR`` when sharing is on (the default); see the module
    docstring for the roles, the handover and what a caller sees.

    :param path: the data directory.
    :param share_timeout_ms: how long to wait for an owner that holds the lock to answer.
    :param handover_drain_ms: when this process owns, how long :meth:`close` waits for
        clients to settle the messages they pulled (0: no wait).
    :param broker_options: ``EmbeddedBroker`` arguments, used when this process owns.
    :raises BrokerLocked: when the owner does not answer on the socket in time.
    """

    local = True  # answered on this machine (see BrokerAdapter.local)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        share_timeout_ms: int = DEFAULT_SHARE_TIMEOUT_MS,
        handover_drain_ms: int = DEFAULT_HANDOVER_DRAIN_MS,
        **broker_options: Any,
    ) -> None:
        if handover_drain_ms < 0:
            raise InvalidArgument(f"handover_drain_ms must be >= 0, got {handover_drain_ms}")
        self.path = Path(path).resolve()
        self.socket_path = self.path / SOCKET_NAME
        self.share_timeout_ms = share_timeout_ms
        self.handover_drain_ms = handover_drain_ms
        self._broker_options = broker_options
        self._lock = threading.Lock()  # one (re)attachment at a time
        self._generation = 0
        self._attachment: Attachment | None = None
        self._server: BrokerServer | None = None
        self._watch: OwnerWatch | None = None
        with self._lock:
            self._attach()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> BrokerAdapter:
        """Open ``rocksdb://DIR[?share=0&share_timeout_ms=...&durability=...]``: shared
        (this class) unless ``share=0`` or a ``clock`` is given (an ``EmbeddedBroker``)."""
        _scheme, path, params = split_url(url)
        shared = share_enabled(params) and "clock" not in kwargs
        timeout = ms_option(params, "share_timeout_ms")
        drain = ms_option(params, "handover_drain_ms", HANDOVER_DRAIN_ENV)
        opts = EmbeddedBroker.url_options(url, path, params)
        opts.update(kwargs)
        if not shared:
            return EmbeddedBroker(path, **opts)
        for name, value in (("share_timeout_ms", timeout), ("handover_drain_ms", drain)):
            if value is not None:
                opts.setdefault(name, value)
        return cls(path, **opts)

    # -- who we are ---------------------------------------------------------------------

    @property
    def role(self) -> Role:
        """``Role.OWNER`` or ``Role.CLIENT`` (of :attr:`owner_pid`), as of now."""
        return self._current().role

    @property
    def owner_pid(self) -> int:
        """The pid of the process that owns the directory (this one's when owner)."""
        return self._current().owner_pid

    @property
    def generation(self) -> int:
        """How many times this broker attached (1 at first; each handover adds one)."""
        return self._generation

    def describe(self) -> str:
        """The role in words, for logs and errors."""
        att = self._attachment
        if att is None:
            return f"no owner of {self.path} answers yet"
        if att.role is Role.OWNER:
            return f"this process (pid {att.owner_pid}) owns {self.path}"
        return f"this process is a client of the owner of {self.path} (pid {att.owner_pid})"

    def __repr__(self) -> str:
        return f"<SharedBroker {self.describe()}>"

    # -- attaching ----------------------------------------------------------------------

    def _current(self) -> Attachment:
        """The attachment now, attaching again first if the last one failed."""
        att = self._attachment
        if att is None:
            self.reattach(None)
            att = self._attachment
            assert att is not None
        return att

    def _attach(self) -> None:
        """Own the directory or become a client of its owner (lock held).

        :raises BrokerLocked: when the lock is held but no owner answers in time.
        """
        deadline = time.monotonic() + self.share_timeout_ms / 1000
        pause = 0.01
        while True:
            self.check_open()
            try:
                server = BrokerServer(
                    self.path, unix_path=self.socket_path, broker_options=self._broker_options
                )
            except BrokerLocked as e:
                locked = e
            else:
                server.start()
                self._server = server
                self._set(Role.OWNER, server.broker, os.getpid())
                return
            try:
                sock, info = say_hello(self.socket_path, max(0.1, deadline - time.monotonic()))
            except ConnectionFailed:
                # The owner is starting (or just died, or does not share): the lock decides.
                if time.monotonic() >= deadline:
                    raise BrokerLocked(
                        str(self.path),
                        f"{locked.holder}, which does not answer on {self.socket_path} (it may "
                        "have been opened with share=0 or by `chronoq broker serve`)",
                    ) from locked
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            client = RemoteBroker(
                [(str(self.socket_path), None)],
                retries=0,
                send_timeout_ms=CLIENT_SEND_TIMEOUT_MS,
                connect_timeout_s=max(1.0, self.share_timeout_ms / 1000),
            )
            generation = self._generation + 1
            self._watch = OwnerWatch(
                sock,
                functools.partial(self._owner_gone, generation),
                f"chronoq-owner-watch:{self.path.name}",
            )
            self._set(Role.CLIENT, client, int(info.get("pid", 0)))
            return

    def _set(self, role: Role, broker: BrokerAdapter, pid: int) -> None:
        self._generation += 1
        self._attachment = Attachment(self._generation, role, broker, pid)
        log.info("rocksdb://%s: %s", self.path, self.describe())

    def _owner_gone(self, generation: int) -> None:
        """The watch saw the owner leave: take over now (not at the next call)."""
        att = self._attachment
        if att is not None and att.generation == generation:
            log.warning("rocksdb://%s: the owner (pid %d) is gone", self.path, att.owner_pid)
        try:
            self.reattach(generation)
        except BrokerClosed:
            pass  # closed meanwhile
        except BrokerLocked as e:
            log.warning(
                "rocksdb://%s: no new owner yet (%s); the next call tries again", self.path, e
            )

    def reattach(self, generation: int | None) -> None:
        """Own the directory or join its new owner, unless that already happened since
        ``generation`` (``None``: only if unattached).

        :raises BrokerLocked: when no owner answers in time (the next call tries again).
        :raises BrokerClosed: when this broker is closed.
        """
        with self._lock:
            att = self._attachment
            if att is not None and (generation is None or att.generation != generation):
                return
            self.check_open()
            self._attachment = None
            self._detach(att)
            self._attach()

    def _detach(self, att: Attachment | None) -> None:
        """Leave the client role ``att`` (lock held); an owner never detaches but to close."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()
        if att is not None and att.role is Role.CLIENT:
            try:
                att.broker.close()
            except Exception:
                log.warning("closing the link to the old owner failed", exc_info=True)

    # -- calls ----------------------------------------------------------------------------

    def _call(self, op: str, fn: Callable[[BrokerAdapter], _T], retry: bool) -> _T:
        """``fn(broker)`` on the current attachment. A client whose owner went away
        attaches again; the call is then repeated if ``retry`` (reads, aborts), else
        it raises :class:`OwnerLost`."""
        while True:
            att = self._current()
            try:
                return fn(att.broker)
            except RequestTimeout:
                raise  # the owner is slow, not gone
            except (ConnectionFailed, BrokerClosed) as e:
                if self._closed or att.role is Role.OWNER:
                    raise
                self.reattach(att.generation)
                if not retry:
                    raise OwnerLost(self.path, att.owner_pid, op, self.describe()) from e
                retry = False

    def member(
        self, group: str, topics: tuple[str, ...], limits: ConsumerLimits
    ) -> tuple[int, Consumer]:
        """A new member of ``group`` on the current owner, and the generation it is of
        (for :class:`~broker_adapter.shared.consumer.SharedConsumer`)."""

        def join(broker: BrokerAdapter) -> tuple[int, Consumer]:
            consumer = broker.consumer(group, topics, **dataclasses.asdict(limits))
            return self._current().generation, consumer

        return self._call("consumer", join, retry=True)

    def send(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""
        att = self._attachment
        if att is not None and att.role is Role.OWNER and not self._closed:
            # The hot path of schedule() (issue 16): the owner's broker checks the
            # message itself, so no check, frame, closure or retry here.
            return att.broker.send(message)
        return super().send(message)

    def _send_one(self, message: Message) -> SendResult:
        """See :meth:`BrokerAdapter.send`."""
        return self._call("send", lambda b: b.send(message), retry=False)

    def _send_checked(self, messages: Sequence[Message]) -> list[SendResult]:
        """See :meth:`BrokerAdapter.send_batch`."""
        return self._call("send_batch", lambda b: b.send_batch(messages), retry=False)

    def _abort(self, msg_id: str | None, key: str | None, topic: str | None) -> AbortResult:
        """See :meth:`BrokerAdapter.abort` (repeated once after a handover: idempotent)."""
        return self._call("abort", lambda b: b.abort(msg_id, key=key, topic=topic), retry=True)

    def _query(self, msg_id: str) -> MessageView | None:
        """See :meth:`BrokerAdapter.query`."""
        return self._call("query", lambda b: b.query(msg_id), retry=True)

    def _pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """See :meth:`BrokerAdapter.pending`."""
        return self._call("pending", lambda b: b.pending(topic, start_ms, end_ms, limit), True)

    def _stats(self) -> BrokerStats:
        """See :meth:`BrokerAdapter.stats`."""
        return self._call("stats", lambda b: b.stats(), retry=True)

    def _consumer(self, group: str, topics: tuple[str, ...], limits: ConsumerLimits) -> Consumer:
        """See :meth:`BrokerAdapter.consumer`: the owner's own consumer when this process
        owns (it never hands over while open), else one that follows handovers."""
        att = self._current()
        if att.role is Role.OWNER:
            return att.broker.consumer(group, topics, **dataclasses.asdict(limits))
        return SharedConsumer(self, group, topics, limits)

    def _close(self) -> None:
        """See :meth:`BrokerAdapter.close`: an owner drains (its clients settle what they
        pulled, up to ``handover_drain_ms``), stops serving (answering what is in flight),
        closes the broker and so frees the directory for the next owner."""
        server = self._server
        if server is not None:
            left = server.drain(self.handover_drain_ms / 1000)
            if left:
                log.warning(
                    "rocksdb://%s: clients still hold %d unsettled message(s) after the "
                    "handover drain (%d ms); the next owner delivers them again",
                    self.path,
                    left,
                    self.handover_drain_ms,
                )
        with self._lock:
            att, self._attachment = self._attachment, None
            self._detach(att)
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()


__all__ = ["SOCKET_NAME", "Attachment", "OwnerLost", "Role", "SharedBroker", "share_enabled"]
