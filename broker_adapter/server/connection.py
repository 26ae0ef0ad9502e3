"""One client connection of a :class:`~broker_adapter.server.server.BrokerServer`.

A reader thread reads frames in order. The first must be ``hello`` with the
right token. Each ``recv`` may bring several frames (pipelining): they run in
order on the reader thread, consecutive ``send`` requests as one write batch
(group commit: one WAL write for all, falling back to one by one if any is
refused), and their answers go out in one write. A ``pull`` that finds nothing
and may wait is parked on the server's pull pool and answers when it ends, so a
long poll blocks neither this connection nor any other; but when the wheel's next
due time is at most :data:`~broker_adapter.server.handlers.INLINE_WAIT_MS` away,
the reader waits for it and fires it itself (one thread hand-off less per answer,
issue 16). A request that may run
long (:data:`SLOW_OPS`: an ``abort_prefix`` over millions of keys) runs on the
server's slow pool the same way, so the connection's later requests are answered
meanwhile (other connections have readers of their own). At most
``max_inflight`` requests of a connection wait parked; past that the reader runs
and reads nothing more until one is answered (TCP then pushes back on the
client). A malformed frame closes this connection only.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import select
import socket
import threading
from typing import TYPE_CHECKING, Any

from broker_adapter.base import Consumer
from broker_adapter.errors import (
    AuthenticationFailed,
    BrokerClosed,
    ChronoqError,
    InvalidArgument,
)
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V
from broker_adapter.server.handlers import Handlers, arg
from broker_adapter.server.parking import Parked
from broker_adapter.server.stage_log import stage_log

if TYPE_CHECKING:
    from broker_adapter.server.server import BrokerServer

log = logging.getLogger("chronoq.broker_adapter.Connection")
log.addHandler(logging.NullHandler())

#: Operations run off the reader thread, on the server's slow pool.
SLOW_OPS = frozenset({"abort_prefix"})


class Connection:
    """Serves one accepted socket until it closes.

    :param server: the owning server.
    :param sock: the accepted socket.
    :param peer: the client's address, for logs.
    :param address: the client's IP (what the per-address cap counts); ``peer`` by default.
    """

    _ids = itertools.count(1)

    def __init__(
        self, server: BrokerServer, sock: socket.socket, peer: str, address: str = ""
    ) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.address = address or peer
        self.id = next(self._ids)
        self.consumers: dict[int, Consumer] = {}
        self._cids = itertools.count(1)
        self._wlock = threading.Lock()
        self._processing = False  # running requests of the last chunk read
        self._parked = Parked(server.max_inflight)  # long polls and slow requests
        self.closed = False
        self.heard = False  # a byte arrived (a hello is being read): not silent
        self._stages = stage_log()  # None unless a benchmark turned it on
        self._unwritten: list[str] = []  # with it: ids of pull answers not yet written
        self.thread = threading.Thread(
            target=self._run, name=f"chronoq-conn-{self.id}", daemon=True
        )

    def is_silent(self) -> bool:
        """Whether nothing at all has arrived on this connection yet (a flood's socket;
        a client sends its hello right after connecting)."""
        if self.heard or self.closed:
            return not self.heard
        # poll, not a non-blocking recv: a socket with a timeout waits for that timeout
        # inside Python before any recv.
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):  # closed meanwhile
            return True

    @property
    def busy(self) -> bool:
        """Whether requests read are still being run (parked long polls aside)."""
        return self._processing or self._parked.slow > 0

    def add_consumer(self, consumer: Consumer) -> int:
        """Register a consumer opened by this connection; its id."""
        cid = next(self._cids)
        self.consumers[cid] = consumer
        return cid

    def write(self, data: bytes) -> None:
        """Send one frame (whole); a dead socket closes the connection."""
        try:
            with self._wlock:
                self.sock.sendall(data)
        except OSError:
            self.close()

    def bad_frame(self, error: P.ProtocolError) -> None:
        """Count a malformed frame or request that closes this connection: one WARNING
        line per few seconds over all connections, with counts (the detail at DEBUG)."""
        self.server.metrics.bad_frame()
        self.server.bad_frames.note("malformed", self.address)
        log.debug("connection %d from %s: %s; closing it", self.id, self.peer, error)

    def close(self) -> None:
        """Close the socket; the reader thread then ends and cleans up."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop_reading(self) -> None:
        """Read no more requests (drain); answers still go out."""
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    # -- the reader thread -------------------------------------------------------------------

    def _run(self) -> None:
        reader = P.FrameReader(self.sock, self.server.max_frame)
        try:
            # The server also closes it at its hello deadline (a byte at a time would
            # restart this timeout): silent connections must not hold places.
            self.sock.settimeout(self.server.hello_timeout_s)
            # Peek first: until the hello is read its bytes stay readable, and from
            # then on `heard` says so (is_silent never sees a client mid-hello as silent).
            if not self.sock.recv(1, socket.MSG_PEEK):
                return
            self.heard = True
            frames = reader.frames()
            self.sock.settimeout(None)
            if frames and self._hello(frames[0]):
                self._serve(reader, frames[1:])
        except P.ProtocolError as e:
            self.bad_frame(e)
        except OSError:
            pass
        except Exception:
            log.exception("connection %d from %s failed", self.id, self.peer)
        finally:
            self.close()
            self.sock.close()
            self.server.forget(self)

    def _hello(self, payload: bytes) -> bool:
        req = P.decode_request(payload)
        if req.op != "hello":
            raise P.ProtocolError(f"the first request must be hello, got {req.op!r}")
        token = req.args.get("token")
        expected = self.server.token
        if expected is not None and not (
            isinstance(token, str)
            and hmac.compare_digest(
                token.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
            )
        ):
            self.server.metrics.auth_failed()
            # Counted, and logged once per few seconds: a flood of bad tokens must not
            # flood the log.
            self.server.refusals.note("refused: wrong or missing token", self.address)
            self.write(
                P.error_response(
                    req.rid,
                    AuthenticationFailed(
                        "the broker server refused the token; pass ?token=... or set CHRONOQ_TOKEN"
                    ),
                )
            )
            return False
        why = self.server.authenticate(self)
        if why is not None:
            self.write(P.error_response(req.rid, InvalidArgument(why)))
            return False
        self.write(P.response(req.rid, self.server.hello_info()))
        return True

    def _serve(self, reader: P.FrameReader, frames: list[bytes]) -> None:
        """Answer requests chunk by chunk: all frames one ``recv`` brought are run in
        order, consecutive sends as one write batch (group commit), and their answers
        go out in one write."""
        handlers = self.server.handlers
        while not self.closed:
            self._processing = True
            out: list[bytes] = []
            sends: list[P.Request] = []
            for payload in frames:
                req = P.decode_request(payload)
                if req.op == "send":
                    sends.append(req)
                    continue
                if sends:
                    out.extend(self._send_group(handlers, sends))
                    sends = []
                if self._parked.full:
                    self._flush(out)
                    self._parked.wait_for_room(lambda: self.closed)
                if req.op == "pull":
                    answer = self._pull(handlers, req)
                    if answer is not None:
                        out.append(answer)
                elif req.op in SLOW_OPS:
                    answer = self._run_slow(handlers, req)
                    if answer is not None:
                        out.append(answer)
                else:
                    out.append(_frame(req.rid, self.execute(handlers, req.op, req.args)))
            if sends:
                out.extend(self._send_group(handlers, sends))
            self._flush(out)
            self._processing = False
            got = reader.frames()
            if got is None:
                return
            frames = got

    def _flush(self, out: list[bytes]) -> None:
        if out:
            self.write(b"".join(out))
            out.clear()
            if self._stages is not None:
                self._stages.written(self._unwritten)
                self._unwritten = []

    def _send_group(self, handlers: Handlers, reqs: list[P.Request]) -> list[bytes]:
        """Answers to consecutive ``send`` requests, stored in one batch when all are
        valid (else one by one, so one bad message fails only its own send)."""
        if len(reqs) > 1:
            try:
                messages = [V.decode_message(arg(r.args, "m", list)) for r in reqs]
                results = self.server.broker.send_batch(messages)
            except P.ProtocolError:
                raise
            except ChronoqError:
                pass  # answered one by one below
            else:
                metrics = self.server.metrics
                metrics.sent(len(reqs))
                for _ in reqs:
                    metrics.request("send")
                encode = V.encode_result
                return [
                    P.response(r.rid, encode(res)) for r, res in zip(reqs, results, strict=True)
                ]
        return [_frame(r.rid, self.execute(handlers, "send", r.args)) for r in reqs]

    def execute(self, handlers: Handlers, op: str, args: dict[str, Any]) -> tuple[bool, Any]:
        """Run ``op``; ``(True, result)`` or ``(False, error)``.

        :raises ProtocolError: for args of the wrong shape (closes the connection).
        """
        self.server.metrics.request(op)
        try:
            if op == "batch":
                return True, [
                    _batch_item(self.execute(handlers, *self._member(m)))
                    for m in handlers_arg_list(args)
                ]
            if op in ("hello", "reset"):
                if op == "reset":
                    self.server.reset(self, args)
                    return True, None
                raise P.ProtocolError("hello was already said")
            return True, handlers.table[op](self, args)
        except P.ProtocolError:
            raise
        except ChronoqError as e:
            return False, e
        except Exception as e:
            log.exception("request %s on connection %d failed", op, self.id)
            return False, e

    @staticmethod
    def _member(m: Any) -> tuple[str, dict[str, Any]]:
        if (
            type(m) is not list
            or len(m) != 2
            or m[0] not in P.OPS
            or m[0] == "batch"
            or type(m[1]) is not dict
        ):
            raise P.ProtocolError("a batch member is [op, args] (no nested batch)")
        return m[0], m[1]

    def _pull(self, handlers: Handlers, req: P.Request) -> bytes | None:
        """Answer a pull at once if it has messages or may not wait, or after a short
        wait here for a due time (:meth:`Handlers.inline_wait_ms`); else park it on the
        pull pool (it answers itself) and return ``None``."""
        max_messages, max_wait = handlers.pull_args(req.args)
        inline = handlers.inline_wait_ms(max_wait)
        if inline:
            self.server.metrics.request("pull")
            outcome = self._pull_for(handlers, req.args, inline, max_messages)
            max_wait -= inline
        else:
            outcome = self.execute(handlers, "pull", req.args)
        if not outcome[0] or outcome[1] or max_wait <= 0:
            if self._stages is not None and outcome[0]:
                self._unwritten.extend(row[0] for row in outcome[1])
            return _frame(req.rid, outcome)

        def park() -> None:
            result = self._pull_for(handlers, req.args, max_wait, max_messages)
            self.write(_frame(req.rid, result))
            if self._stages is not None and result[0]:
                self._stages.written([row[0] for row in result[1]])

        if self._parked.run(self.server.pull_pool, park):
            return None
        return _frame(req.rid, (False, BrokerClosed("the broker server is stopping")))

    def _pull_for(
        self, handlers: Handlers, args: dict[str, Any], wait_ms: int, max_messages: int
    ) -> tuple[bool, Any]:
        """A pull of up to ``max_messages`` (checked) waiting up to ``wait_ms``:
        ``(True, rows)`` or ``(False, error)``."""
        try:
            return True, handlers.pull(self, args, wait_ms, max_messages)
        except P.ProtocolError:
            raise
        except ChronoqError as e:
            return False, e
        except Exception as e:
            log.exception("pull on connection %d failed", self.id)
            return False, e

    def _run_slow(self, handlers: Handlers, req: P.Request) -> bytes | None:
        """Park a slow request on the server's slow pool (it answers itself) and return
        ``None``; its answer now if the server is stopping."""

        def run() -> None:
            try:
                self.write(_frame(req.rid, self.execute(handlers, req.op, req.args)))
            except P.ProtocolError as e:  # its args were malformed: as on the reader
                self.bad_frame(e)
                self.close()

        if self._parked.run(self.server.slow_pool, run, slow=True):
            return None
        return _frame(req.rid, (False, BrokerClosed("the broker server is stopping")))

    def release_consumers(self, orphan: bool) -> None:
        """Hand this connection's consumers to the server (``orphan``: their in-flight
        messages come back after their invisible time) or close them now."""
        consumers, self.consumers = list(self.consumers.values()), {}
        for c in consumers:
            if orphan:
                self.server.adopt_orphan(c)
            else:
                try:
                    c.close()
                except ChronoqError:
                    pass


def _frame(rid: int, outcome: tuple[bool, Any]) -> bytes:
    ok, value = outcome
    return P.response(rid, value) if ok else P.error_response(rid, value)


def _batch_item(outcome: tuple[bool, Any]) -> list[Any]:
    ok, value = outcome
    return [P.OK, value] if ok else [P.ERROR, P.error_payload(value)]


def handlers_arg_list(args: dict[str, Any]) -> list[Any]:
    """The ``reqs`` list of a batch request.

    :raises ProtocolError: when missing or not a list.
    """
    reqs = args.get("reqs")
    if type(reqs) is not list:
        raise P.ProtocolError("batch needs reqs: [[op, args], ...]")
    return reqs
