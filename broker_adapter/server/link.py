"""Link: one client connection to one broker server, pipelined.

Any thread may send a request; answers are matched to requests by id, so many
requests (a long poll among them) share one socket. Reading the socket is a
*role* one thread holds at a time (leader/follower): a sync call whose thread
finds nobody reading reads itself, delivering any other answers it meets on the
way, so a lone caller pays no thread hand-off (the hand-off cost more than the
server's work per send). A sync call that finds the role taken waits on a bare
lock for the reader to deliver its answer. A background reader thread takes the
role when answers are awaited and no caller reads (async sends, callers that
timed out). When the socket breaks, every waiting request fails with
:class:`ConnectionFailed` and the link is dead.

Acks a consumer answered itself (:meth:`Link.ack_later`) go out without anyone
waiting for them, batched: see :mod:`~broker_adapter.server.ack_queue`.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from broker_adapter.errors import ChronoqError, ConnectionFailed
from broker_adapter.server import protocol as P
from broker_adapter.server.ack_queue import ACK_WRITE_DELAY_S, AckQueue
from broker_adapter.server.link_socket import LinkSocket
from broker_adapter.server.session import check_request_size
from broker_adapter.server.waiters import TimedWaiter, Waiter

log = logging.getLogger("chronoq.broker_adapter.Link")
log.addHandler(logging.NullHandler())

#: ``done(result, error)``: exactly one of them is not ``None`` (a result may be ``None``).
Done = Callable[[Any, BaseException | None], None]

#: Longest a reader waits in one receive before it looks at its deadline again.
READ_SLICE_S = 0.02
#: How long answers to :meth:`Link.ack_later` may wait for a caller's read before the
#: background reader reads them.
ACK_READ_DELAY_S = 0.05
#: Bound on answers to requests other than sync sends (their own timeout) and long polls
#: (their wait plus this).
REQUEST_TIMEOUT_S = 30.0


class RequestTimeout(ConnectionFailed):
    """No answer within the time allowed; the link itself may still be fine."""


class Link:
    """A connected, authenticated link to ``host:port`` (or, with ``port=None``, to the
    Unix socket at the path ``host``).

    :param token: the server's token, or ``None``.
    :param connect_timeout_s: bound on connecting and on the ``hello`` exchange.
    :raises ConnectionFailed: when the server cannot be reached.
    :raises AuthenticationFailed: when it refuses the token.
    """

    def __init__(
        self, host: str, port: int | None, token: str | None, connect_timeout_s: float = 3.0
    ) -> None:
        self._sock = LinkSocket(host, port, token, connect_timeout_s, READ_SLICE_S)
        self.address = self._sock.address
        self.hello = hello = self._sock.hello
        self.info: dict[str, Any] = hello.info
        self.node: str = hello.node
        self.max_body: int = hello.max_body
        self.max_frame: int = hello.max_frame
        self._rids = itertools.count(1)
        self._pending: dict[int, Done] = {}
        self._lock = threading.Lock()  # guards _pending, _acks, _alive and _reading
        self._write_lock = threading.Lock()  # one frame at a time onto the socket
        self._reader_wanted = threading.Condition(self._lock)
        self._reading = False  # a thread holds the read role
        self._alive = True
        self._error: ChronoqError | None = None
        self._acks = AckQueue(self._lock, self.address)
        self._wake_at = 0.0  # when the background reader's wait ends (0: not waiting)
        self._call_ended = -math.inf  # monotonic time the last call() ended
        self._callers = 0  # threads in call(): each reads until its answer comes
        self._role_waiters = 0  # of them, those waiting while another thread reads
        self._reader = threading.Thread(
            target=self._read_loop, daemon=True, name=f"chronoq-link-{self.address}"
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        """Whether the link still works."""
        return self._alive

    # -- reading -----------------------------------------------------------------------------

    def _read_loop(self) -> None:
        """The background reader: reads while answers are awaited and nobody else does;
        when only :meth:`ack_later` answers are awaited, after :data:`ACK_READ_DELAY_S`
        (a caller's read usually takes them on its way: were this thread reading then,
        that caller's own answer would reach it through a thread hand-off). It also
        writes acks no request carried within :data:`ACK_WRITE_DELAY_S`."""
        while True:
            write_acks = False
            with self._lock:
                since = 0.0
                while self._alive:
                    now = time.monotonic()
                    ack_wait = self._acks.wait_s(now)
                    if ack_wait is not None and ack_wait <= 0:
                        write_acks = True
                        break
                    if self._reading or not self._pending:
                        since = 0.0
                        self._wait(ack_wait, now)
                        continue
                    if self._unattended():
                        break
                    since = since or now
                    if now - since >= ACK_READ_DELAY_S:
                        break
                    linger = since + ACK_READ_DELAY_S - now
                    self._wait(linger if ack_wait is None else min(linger, ack_wait), now)
                if not self._alive:
                    return
                if not write_acks:
                    self._reading = True
            if write_acks:
                self._write_acks()
                continue
            try:
                self._read_once(None)
            finally:
                self._release_role()

    def _wait(self, timeout: float | None, now: float) -> None:
        """The background reader waits (lock held), noting until when."""
        self._wake_at = math.inf if timeout is None else now + timeout
        try:
            self._reader_wanted.wait(timeout)
        finally:
            self._wake_at = 0.0

    def _take_role(self) -> bool:
        """Become the reader if nobody is."""
        with self._lock:
            if self._reading or not self._alive:
                return False
            self._reading = True
            return True

    def _release_role(self) -> None:
        with self._lock:
            self._reading = False
            if self._unattended():  # callers read for themselves; acks: see _read_loop
                self._reader_wanted.notify()

    def _read_once(self, deadline: float | None) -> None:
        """Holding the read role: wait for data (about :data:`READ_SLICE_S` at most,
        none past ``deadline``, a monotonic time), read it and deliver every whole
        answer. A broken or closed stream fails the link."""
        try:
            for payload in self._sock.read(deadline):
                self._deliver(P.decode_response(payload))
        except P.ProtocolError as e:
            self._fail(ConnectionFailed(f"bad answer from {self.address}: {e}"))
        except ConnectionFailed as e:
            self._fail(e)

    def _deliver(self, resp: P.Response) -> None:
        with self._lock:
            done = self._pending.pop(resp.rid, None)
        if done is None:
            return  # answer to a call that timed out
        try:
            if resp.ok:
                done(resp.result, None)
            else:
                done(None, P.decode_error(resp.result))
        except Exception:
            log.exception("completion of request %d raised", resp.rid)

    def _fail(self, error: ChronoqError) -> None:
        with self._lock:
            self._alive = False
            self._error = self._error or error
            pending, self._pending = self._pending, {}
            self._reader_wanted.notify_all()
        for done in pending.values():
            try:
                done(None, error)
            except Exception:
                log.exception("completion of a failed request raised")
        self._sock.shutdown()

    # -- requests ----------------------------------------------------------------------------

    def submit(self, op: str, args: dict[str, Any], done: Done) -> int:
        """Send a request; ``done`` hears its answer on whichever thread reads it. Its id.

        :raises ConnectionFailed: when the link is dead (``done`` is not called).
        """
        rid = self._submit(op, args, done)
        with self._lock:
            if not self._reading:
                self._reader_wanted.notify()
        return rid

    def _submit(self, op: str, args: dict[str, Any], done: Done) -> int:
        rid = next(self._rids)  # atomic: itertools.count holds the GIL throughout
        data = P.request(rid, op, args)
        check_request_size(data, self.max_frame)
        with self._lock:
            if not self._alive:
                raise self._error or ConnectionFailed(f"link to {self.address} is closed")
            self._pending[rid] = done
        # Writes have a lock of their own, so the reader delivering answers never
        # waits for another thread's write (one sendall costs ~20 us here).
        try:
            with self._write_lock:
                if self._acks:  # acks queued before this request are applied before it
                    data = self._ack_frames() + data
                self._sock.sendall(data)
        except OSError as e:
            with self._lock:
                ours = self._pending.pop(rid, None) is not None
            failed = ConnectionFailed(f"send to {self.address} failed: {e}")
            self._fail(failed)  # the requests already waiting fail too
            if ours:
                raise failed from e
            # else the link had already failed and told ``done``: one report only
        return rid

    def ack_later(self, cid: int, receipt: bytes) -> None:
        """Ack ``receipt`` of consumer ``cid`` without waiting: written at once on a quiet
        link, else before the next request, or by the background reader within
        :data:`~broker_adapter.server.ack_queue.ACK_WRITE_DELAY_S` (see that module)."""
        t = time.monotonic()
        with self._lock:
            if not self._alive:
                return  # lost with the link: delivered again after its invisible time
            first = self._acks.add(cid, receipt)
            # A call that just ended (a dispatcher's pull) is likely followed by another
            # soon, which carries the acks: no frame and no answer of their own (issue 16).
            now = (
                not self._callers
                and not self._acks.batches
                and t - self._call_ended >= ACK_WRITE_DELAY_S
            )
            # The background reader times the write: woken unless it looks by then
            # anyway (or is running: it looks at the queue before it waits again).
            if first and not now:
                due = self._acks.arm(t)
                if self._wake_at > due:
                    self._reader_wanted.notify()
        if now:
            self._write_acks(wake=True)

    def _write_acks(self, wake: bool = False) -> None:
        """Write the queued acks; ``wake``: have the background reader read their answers
        (no caller on this link will)."""
        try:
            with self._write_lock:
                data = self._ack_frames()
                if data:
                    self._sock.sendall(data)
        except OSError as e:
            self._fail(ConnectionFailed(f"send to {self.address} failed: {e}"))
        if wake:
            with self._lock:
                if not self._reading:
                    self._reader_wanted.notify()

    def _ack_frames(self) -> bytes:
        """The queued acks as ``ack_batch`` frames, their answers awaited (write lock held)."""
        with self._lock:
            if not self._alive:
                self._acks.drop()
                return b""
            frames = self._acks.take_frames(self._rids, self._pending)
        # No wake-up here for their answers: a request that carried them is read by its
        # caller; _write_acks wakes the background reader when nobody else will read.
        return b"".join(frames)

    def call(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """Send a request and wait for its result.

        :raises ConnectionFailed: when the link breaks or no answer comes in ``timeout_s``.
        :raises ChronoqError: the error the server answered.
        """
        return self._call(op, args, timeout_s, Waiter())

    def call_timed(
        self, op: str, args: dict[str, Any], timeout_s: float
    ) -> tuple[Any, float, bool]:
        """:meth:`call`, also answering when the answer was read (epoch s) and whether
        the calling thread read it itself (for :mod:`~broker_adapter.server.stage_log`).

        :raises ConnectionFailed: when the link breaks or no answer comes in ``timeout_s``.
        :raises ChronoqError: the error the server answered.
        """
        waiter = TimedWaiter()
        result = self._call(op, args, timeout_s, waiter)
        return result, waiter.read_at, waiter.reader == threading.get_ident()

    def _call(self, op: str, args: dict[str, Any], timeout_s: float, waiter: Waiter) -> Any:
        # Counted as a caller, who reads for itself: the background reader leaves its
        # request alone (taking the role, it would hand the answer over to this thread).
        with self._lock:
            self._callers += 1
        try:
            return self._wait_call(op, args, timeout_s, waiter)
        finally:
            with self._lock:
                self._callers -= 1
                self._call_ended = time.monotonic()
                if not self._reading and self._unattended():
                    self._reader_wanted.notify()

    def _unattended(self) -> bool:
        """Whether a request waits that neither a caller nor a linger covers (lock held)."""
        return len(self._pending) > self._acks.batches + self._callers - self._role_waiters

    def _wait_call(self, op: str, args: dict[str, Any], timeout_s: float, waiter: Waiter) -> Any:
        deadline = time.monotonic() + timeout_s
        rid = self._submit(op, args, waiter)
        answered = waiter.lock.acquire
        while not answered(blocking=False):
            if self._take_role():
                try:
                    self._read_once(deadline)
                finally:
                    self._release_role()
                if time.monotonic() < deadline:
                    continue
            else:
                # Someone else reads; wake now and then to take the role if it frees
                # (meanwhile not counted as reading for itself: see _unattended).
                remaining = deadline - time.monotonic()
                with self._lock:
                    self._role_waiters += 1
                try:
                    got = remaining > 0 and answered(timeout=min(remaining, 0.05))
                finally:
                    with self._lock:
                        self._role_waiters -= 1
                if got:
                    break
                if remaining > 0:
                    continue
            with self._lock:
                self._pending.pop(rid, None)
            if answered(blocking=False):  # answered just now
                break
            raise RequestTimeout(f"no answer from {self.address} to {op} within {timeout_s:.3g} s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def close(self) -> None:
        """Close the link; waiting requests fail with ``ConnectionFailed``."""
        with self._lock:
            was_alive = self._alive
            self._alive = False
            self._reader_wanted.notify_all()
        if was_alive:
            self._sock.shutdown()
        self._fail(ConnectionFailed(f"link to {self.address} is closed"))
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        self._sock.close()
