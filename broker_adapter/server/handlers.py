"""What each protocol operation does to the served ``EmbeddedBroker``.

:class:`Handlers` turns decoded request args into broker calls and results into
their wire form (see :mod:`broker_adapter.server.protocol`). Args of the wrong
type are a :class:`~broker_adapter.server.protocol.ProtocolError` (the
connection is closed); invalid values the broker refuses (a bad topic, a
negative delay) are ordinary errors answered to the client.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from broker_adapter.checks import check_pull_args, is_int
from broker_adapter.embedded.consumer import EmbeddedConsumer
from broker_adapter.embedded.core import FIRE_DUTY_GRACE_MS
from broker_adapter.errors import BrokerClosed, InvalidArgument
from broker_adapter.results import ReceivedMessage
from broker_adapter.server import protocol as P
from broker_adapter.server import values as V

if TYPE_CHECKING:
    from broker_adapter.base import Consumer
    from broker_adapter.server.connection import Connection
    from broker_adapter.server.server import BrokerServer

log = logging.getLogger("chronoq.broker_adapter.BrokerServer")

#: Longest a single server-side long poll waits; clients loop for longer waits.
MAX_POLL_MS = 30_000
#: A pull that would wait no longer than this (ms) for the wheel's next due time waits
#: on its connection's reader thread and fires that chunk there: no hand-off to the pull
#: pool and back (issue 16: that hand-off was ~15 % of the server's CPU at 3,300 jobs/s).
#: Other requests of the same connection wait that long at most.
INLINE_WAIT_MS = 2
#: A pull that may wait tells the wheel thread that pulls fire what falls due within
#: this long (ms) themselves (:meth:`BrokerCore.take_fire_duty`): a client that
#: long-polls is back within it (its pull waits and fires a due chunk itself; one
#: that is not yet back could not take the chunk anyway). Before, the wheel thread had
#: planned its wake at the next due time before the pull took that duty, fired it and
#: woke the waiting pull: two server wake-ups per due millisecond instead of one
#: (issue 16). A fire no pull makes comes at most ``FIRE_DUTY_GRACE_MS`` late.
FIRE_DUTY_AHEAD_MS = FIRE_DUTY_GRACE_MS


def arg(args: dict[str, Any], name: str, kind: type, optional: bool = False) -> Any:
    """``args[name]``, checked to be of ``kind`` (``None`` allowed when ``optional``; for
    ``int``, a bool is not one).

    :raises ProtocolError: when missing or of another type.
    """
    value = args.get(name)
    if value is None and optional:
        return None
    if not (is_int(value) if kind is int else isinstance(value, kind)):
        raise P.ProtocolError(f"argument {name!r} must be {kind}, got {type(value).__name__}")
    return value


def _receipt_message(receipt: bytes) -> ReceivedMessage:
    """A stand-in ``ReceivedMessage``: the embedded consumer needs only the receipt."""
    return ReceivedMessage("", "", b"", 0, 0, 0, receipt)


class Handlers:
    """The operations of one server; each takes ``(connection, args)``.

    :param server: the server whose broker (and metrics) they use.
    """

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.table = {
            "send": self.send,
            "send_batch": self.send_batch,
            "abort": self.abort,
            "query": self.query,
            "pending": self.pending,
            "stats": self.stats,
            "consumer_open": self.consumer_open,
            "pull": self.pull_now,
            "ack": self.ack,
            "ack_batch": self.ack_batch,
            "nack": self.nack,
            "dead_letter": self.dead_letter,
            "extend": self.extend,
            "release": self.release,
            "consumer_close": self.consumer_close,
            "reschedule": self.reschedule,
            "abort_prefix": self.abort_prefix,
            "find_pending": self.find_pending,
            "acquire_rate": self.acquire_rate,
            "acquire_slot": self.acquire_slot,
            "release_slot": self.release_slot,
            "advance": self.advance,
            "dead_letters": self.dead_letters,
            "requeue_dead": self.requeue_dead,
            "purge_dead": self.purge_dead,
            "count_pending": self.count_pending,
            "backup": self.backup,
        }

    # -- producer side -----------------------------------------------------------------------

    def send(self, conn: Connection, args: dict[str, Any]) -> Any:
        result = self.server.broker.send(V.decode_message(arg(args, "m", list)))
        self.server.metrics.sent(1)
        return V.encode_result(result)

    def send_batch(self, conn: Connection, args: dict[str, Any]) -> Any:
        messages = V.decode_messages(arg(args, "ms", list))
        results = self.server.broker.send_batch(messages)
        self.server.metrics.sent(len(messages))
        return V.encode_results(results)

    def abort(self, conn: Connection, args: dict[str, Any]) -> Any:
        result = self.server.broker.abort(
            arg(args, "id", str, True),
            key=arg(args, "key", str, True),
            topic=arg(args, "topic", str, True),
        )
        self.server.metrics.aborted(result.status.value)
        return [result.status.value, result.msg_id]

    def query(self, conn: Connection, args: dict[str, Any]) -> Any:
        view = self.server.broker.query(arg(args, "id", str))
        return None if view is None else V.encode_view(view)

    def pending(self, conn: Connection, args: dict[str, Any]) -> Any:
        views = self.server.broker.pending(
            arg(args, "topic", str, True),
            arg(args, "start", int, True),
            arg(args, "end", int, True),
            arg(args, "limit", int),
        )
        return [V.encode_view(v) for v in views]

    def stats(self, conn: Connection, args: dict[str, Any]) -> Any:
        s = self.server.broker.stats()
        return {
            "topics": {
                n: [t.pending, t.fired_total, t.ready, t.inflight] for n, t in s.topics.items()
            },
            "groups": {
                n: [g.ready, g.inflight, g.dead, g.acked_total] for n, g in s.groups.items()
            },
        }

    # -- runtime calls -----------------------------------------------------------------------

    def reschedule(self, conn: Connection, args: dict[str, Any]) -> Any:
        result = self.server.broker.reschedule(
            arg(args, "id", str, True),
            key=arg(args, "key", str, True),
            topic=arg(args, "topic", str, True),
            delay_ms=arg(args, "delay", int, True),
            deliver_at_ms=arg(args, "at", int, True),
            body=arg(args, "body", bytes, True),
        )
        self.server.metrics.rescheduled(result.status.value)
        return V.encode_reschedule(result)

    def abort_prefix(self, conn: Connection, args: dict[str, Any]) -> Any:
        """Runs off the connection's reader (see ``Connection``): it may take long."""
        result = self.server.broker.abort_prefix(arg(args, "topic", str), arg(args, "prefix", str))
        self.server.metrics.prefix_aborted(result.aborted)
        return V.encode_prefix_abort(result)

    def dead_letters(self, conn: Connection, args: dict[str, Any]) -> Any:
        page = self.server.broker.dead_letters(
            arg(args, "group", str),
            cursor=arg(args, "cursor", str, True),
            limit=arg(args, "limit", int),
            with_body=bool(arg(args, "body", bool, True)),
        )
        return V.encode_dead_page(page)

    def requeue_dead(self, conn: Connection, args: dict[str, Any]) -> Any:
        ids = arg(args, "ids", list, True)
        n = self.server.broker.requeue_dead(
            arg(args, "group", str), ids, limit=arg(args, "limit", int)
        )
        self.server.metrics.dead_settled("requeue", n)
        return n

    def purge_dead(self, conn: Connection, args: dict[str, Any]) -> Any:
        ids = arg(args, "ids", list, True)
        n = self.server.broker.purge_dead(
            arg(args, "group", str), ids, limit=arg(args, "limit", int)
        )
        self.server.metrics.dead_settled("purge", n)
        return n

    def count_pending(self, conn: Connection, args: dict[str, Any]) -> Any:
        counts = self.server.broker.count_pending(
            arg(args, "edges", list), topic=arg(args, "topic", str, True)
        )
        return V.encode_counts(counts)

    def backup(self, conn: Connection, args: dict[str, Any]) -> Any:
        """A backup of the data directory into ``dest`` on this machine (authenticated
        like every request; see :meth:`EmbeddedBroker.backup`)."""
        info = self.server.broker.backup(arg(args, "dest", str))
        log.info("backup taken by request: %s", info.describe())
        return info.to_list()

    def find_pending(self, conn: Connection, args: dict[str, Any]) -> Any:
        page = self.server.broker.find_pending(
            arg(args, "topic", str, True),
            key_prefix=arg(args, "prefix", str, True),
            tag=arg(args, "tag", str, True),
            start_ms=arg(args, "start", int, True),
            end_ms=arg(args, "end", int, True),
            limit=arg(args, "limit", int),
            cursor=arg(args, "cursor", str, True),
            with_body=bool(arg(args, "body", bool, True)),
        )
        return V.encode_page(page)

    def acquire_rate(self, conn: Connection, args: dict[str, Any]) -> Any:
        wait_ms = self.server.broker.acquire_rate(
            arg(args, "bucket", str), arg(args, "limit", int), arg(args, "period", int)
        )
        self.server.metrics.rate_asked(wait_ms == 0)
        return wait_ms

    def acquire_slot(self, conn: Connection, args: dict[str, Any]) -> Any:
        taken = self.server.broker.acquire_slot(
            arg(args, "name", str),
            arg(args, "limit", int),
            arg(args, "holder", str),
            arg(args, "lease", int),
        )
        self.server.metrics.slot_asked(taken)
        return taken

    def release_slot(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self.server.broker.release_slot(arg(args, "name", str), arg(args, "holder", str))

    # -- consumer side -----------------------------------------------------------------------

    def consumer_open(self, conn: Connection, args: dict[str, Any]) -> Any:
        topics = arg(args, "topics", list)
        consumer = self.server.broker.consumer(
            arg(args, "group", str),
            topics,
            invisible_ms=arg(args, "invisible_ms", int),
            max_attempts=arg(args, "max_attempts", int),
            max_inflight=arg(args, "max_inflight", int),
            max_inflight_bytes=arg(args, "max_inflight_bytes", int),
        )
        if self.server.draining and isinstance(consumer, EmbeddedConsumer):
            consumer.pause()  # the owner is leaving: a new member gets nothing either
        return conn.add_consumer(consumer)

    def _consumer(self, conn: Connection, args: dict[str, Any]) -> Consumer:
        cid = arg(args, "cid", int)
        consumer = conn.consumers.get(cid)
        if consumer is None:
            raise BrokerClosed(f"no open consumer {cid} on this connection; open one again")
        return consumer

    def pull_args(self, args: dict[str, Any]) -> tuple[int, int]:
        """``(max, wait)`` of a pull, the wait capped at :data:`MAX_POLL_MS`."""
        max_messages, wait_ms = arg(args, "max", int), arg(args, "wait", int)
        check_pull_args(max_messages, wait_ms)
        return max_messages, min(wait_ms, MAX_POLL_MS)

    def inline_wait_ms(self, max_wait: int) -> int:
        """How long a pull that may wait ``max_wait`` ms should wait on its reader thread:
        until just past the wheel's next due time if that comes within
        :data:`INLINE_WAIT_MS` (the pull then fires it), else 0 (park it)."""
        if max_wait == 0 or self.server.manual_clock is not None:
            return 0  # a manual clock: the wheel thread fires, pulls only wait
        core = self.server.broker.core
        due = core.next_due_ms()
        if due is None:
            return 0
        until_ms = core.seconds_until(due) * 1000
        if until_ms > INLINE_WAIT_MS:
            return 0
        return min(max_wait, max(1, math.ceil(until_ms) + 1))

    def pull_now(self, conn: Connection, args: dict[str, Any]) -> Any:
        """A pull that does not wait (the connection parks waiting pulls elsewhere)."""
        return self.pull(conn, args, 0)

    def pull(
        self, conn: Connection, args: dict[str, Any], wait_ms: int, max_messages: int = 0
    ) -> Any:
        """Pull for up to ``wait_ms``; the messages in wire form. ``max_messages``: the
        pull's ``max`` if already checked (:meth:`pull_args`), else 0."""
        consumer = self._consumer(conn, args)
        if not max_messages:
            max_messages = self.pull_args(args)[0]
        if wait_ms and self.server.manual_clock is None:
            core = self.server.broker.core
            core.take_fire_duty(core.now() + FIRE_DUTY_AHEAD_MS)
        got = consumer.pull(max_messages, wait_ms)
        if got and conn.closed:
            # The client vanished while this pull waited (e.g. kill -9): give back what
            # it took now, uncounted, rather than leave it invisible for its invisible time.
            for m in got:
                consumer.release(m)
            return []
        if not got:
            return got
        metrics = self.server.metrics
        if metrics.on:
            metrics.pulled(got, time.time() * 1000)
        encode = V.encode_received
        return [encode(m) for m in got]

    def ack(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self._consumer(conn, args).ack(_receipt_message(arg(args, "receipt", bytes)))

    def ack_batch(self, conn: Connection, args: dict[str, Any]) -> Any:
        receipts = arg(args, "receipts", list)
        for r in receipts:
            if type(r) is not bytes:
                raise P.ProtocolError("ack_batch receipts are bytes")
        return self._consumer(conn, args).ack_batch([_receipt_message(r) for r in receipts])

    def nack(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self._consumer(conn, args).nack(
            _receipt_message(arg(args, "receipt", bytes)),
            arg(args, "delay", int, True),
            arg(args, "reason", str, True),
        )

    def dead_letter(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self._consumer(conn, args).dead_letter(
            _receipt_message(arg(args, "receipt", bytes)), arg(args, "reason", str)
        )

    def extend(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self._consumer(conn, args).extend(
            _receipt_message(arg(args, "receipt", bytes)), arg(args, "invisible_ms", int)
        )

    def release(self, conn: Connection, args: dict[str, Any]) -> Any:
        return self._consumer(conn, args).release(
            _receipt_message(arg(args, "receipt", bytes)), arg(args, "delay", int)
        )

    def consumer_close(self, conn: Connection, args: dict[str, Any]) -> Any:
        consumer = conn.consumers.pop(arg(args, "cid", int), None)
        if consumer is not None:
            consumer.close()
        return None

    # -- test-only ---------------------------------------------------------------------------

    def advance(self, conn: Connection, args: dict[str, Any]) -> Any:
        """Move the manual clock (``ms`` forward, or ``to_ms``); test-only."""
        clock = self.server.manual_clock
        if clock is None:
            raise InvalidArgument("advance is test-only: start the server with --manual-clock")
        to_ms = arg(args, "to_ms", int, True)
        ms = arg(args, "ms", int, True)
        if (to_ms is None) == (ms is None):
            raise InvalidArgument("advance takes ms or to_ms")
        delta = to_ms - clock.now_ms() if to_ms is not None else ms
        if delta < 0:
            raise InvalidArgument("the manual clock only moves forward")
        return clock.advance(delta)
