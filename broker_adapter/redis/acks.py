"""AckBatcher: acks of a Redis broker written in batches, off the caller's thread.

A consumer answers ``ack`` from what it knows (the delivery is one it holds and
its invisible time has not passed by broker time) and queues the write; this
thread writes queued acks in one pipeline as soon as it can. Every other call
that reads or changes group state (pull, nack, dead letter, query, stats,
pending, flush, close) flushes the queue first, so it sees every ack made
before it. A pull carries its group's queued acks in its own round trip
(:meth:`AckBatcher.carried`), so while pulls come often this thread writes
nothing: it writes what stayed queued through a whole gathering. If Redis
refuses or loses a queued ack, the delivery comes back after its invisible
time: at least once, as always.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container, Iterator
from contextlib import contextmanager

from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Scripts, Step

MAX_BATCH = 2000
#: Seconds the writer waits after the first queued ack, gathering more.
GATHER_S = 0.002
#: The same while pulls carry the acks (the oldest went with a pull during the last
#: gathering): the thread then wakes this rarely instead of after every pull (issue 16).
CARRIED_GATHER_S = 0.02


class AckBatcher:
    """Queues ``(shard, group, n, deliveries)`` acks and writes them in pipelines.

    :param scripts: the broker's scripts (``ack_batch.lua`` writes the acks).
    :param keys: the broker's keyspace.
    """

    def __init__(self, scripts: Scripts, keys: Keyspace) -> None:
        self._scripts = scripts
        self._keys = keys
        self._queue: list[tuple[int, str, bytes, bytes]] = []
        self._cond = threading.Condition(threading.Lock())
        self._flush_lock = threading.Lock()  # one writer at a time keeps acks in order
        self._closed = False
        self._gathering = False  # the thread waits for more: no need to wake it
        self._gather_s = GATHER_S
        self.log = logging.getLogger("chronoq.broker_adapter.AckBatcher")
        self.log.addHandler(logging.NullHandler())
        self._thread = threading.Thread(target=self._run, name="chronoq-redis-acks", daemon=True)
        self._thread.start()

    def add(self, shard: int, group: str, n: bytes, deliveries: bytes) -> None:
        """Queue one ack."""
        with self._cond:
            self._queue.append((shard, group, n, deliveries))
            n_queued = len(self._queue)
            if (n_queued == 1 and not self._gathering) or n_queued >= MAX_BATCH:
                self._cond.notify()

    @contextmanager
    def carried(self, group: str, shards: Container[int] | None = None) -> Iterator[Step | None]:
        """Take ``group``'s queued acks of ``shards`` (``None``: of every shard) out as
        an ``ack_batch`` step for a caller's round trip (``None``: none queued). On a
        cluster a pull passes the shards of the masters it calls anyway: an ack of
        another master would add that master to its round trip, and the pull would
        wait for it too; such acks stay queued for a later trip or this thread. The
        flush lock is held meanwhile, so a :meth:`flush` returns only once they are
        written too; while this thread writes (it holds the lock), nothing is carried
        and the caller does not wait. If the caller's call fails they are dropped,
        as a failed flush drops its batch."""
        if not self._flush_lock.acquire(blocking=False):
            yield None
            return
        try:
            with self._cond:
                queue = self._queue
                mine = [a for a in queue if a[1] == group and (shards is None or a[0] in shards)]
                if mine:
                    self._queue = [
                        a
                        for a in queue
                        if a[1] != group or (shards is not None and a[0] not in shards)
                    ]
            if not mine:
                yield None
                return
            keys = self._keys
            per: dict[int, list[bytes]] = {}
            for s, _g, n, att in mine:
                per.setdefault(s, []).extend((n, att))
            yield (
                "ack_batch",
                list(per),
                (group,),
                [(keys.bases[s], len(pairs) // 2, *pairs) for s, pairs in per.items()],
            )
        finally:
            self._flush_lock.release()

    def flush(self) -> None:
        """Write every ack queued so far (returns at once when none is queued).

        :raises RedisError: when the write fails (the acks are dropped: their
            deliveries come back after the invisible time).
        """
        # Always take the lock, even with an empty queue: the background thread
        # may have taken a batch out of the queue and still be writing it, and a
        # caller that reads group state right after an ack must see that write.
        with self._flush_lock:
            while True:
                with self._cond:
                    batch = self._queue[:MAX_BATCH]
                    del self._queue[:MAX_BATCH]
                if not batch:
                    return
                keys = self._keys
                per: dict[str, dict[int, list[bytes]]] = {}
                for s, g, n, att in batch:
                    per.setdefault(g, {}).setdefault(s, []).extend((n, att))
                for g, shards in per.items():  # one call per group (per master on a cluster)
                    self._scripts.fan(
                        "ack_batch",
                        [keys.due_keys[s] for s in shards],
                        (g,),
                        [(keys.bases[s], len(pairs) // 2, *pairs) for s, pairs in shards.items()],
                    )

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
        try:
            self.flush()
        except Exception:
            self.log.warning(
                "acks lost at close; their messages will be redelivered", exc_info=True
            )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                # gather for a moment: one pipeline for many acks costs far less CPU
                self._gathering = True
                head = self._queue[0]
                self._cond.wait(self._gather_s)
                self._gathering = False
                # The oldest ack went meanwhile: pulls carry them (AckBatcher.carried),
                # and those queued since go with the next pull. Write only what stayed
                # through a whole gathering (another group's or master's, or no pull
                # came): while pulls flow this thread writes nothing, where it wrote
                # every few ms (the acks of the jobs run since the last pull), a round
                # trip and a redis-server wake-up each (issue 16).
                if not self._queue or self._queue[0] is not head:
                    self._gather_s = CARRIED_GATHER_S
                    continue
                self._gather_s = GATHER_S
            try:
                self.flush()
            except Exception:
                self.log.warning(
                    "writing acks failed; their messages will be redelivered", exc_info=True
                )
