"""TimingWheel: the durable wheel in RocksDB plus a bounded near window in memory.

Every pending message is one key ``time seq`` in the ``wheel`` column family, so
a message due in three years costs one key on disk and no RAM. The next
``window_ms`` of due entries (at most ``max_entries``) is loaded ahead into
memory, so firing never waits on a disk read. The *watermark* is a wheel key:
every entry below it is in memory (or fired, or aborted); nothing at or above
it is. What a refill loads comes in key order and above all that is held, so it
is appended to a sorted *run*, and firing takes a slice of it (a heap of 200k
entries cost ~1.3 us per pop, issue 16). New entries below the watermark (due
within the window when sent) go into a small heap as well as to disk; firing
merges the two.

Loading is a bounded sequential scan from the watermark (never from the start of
the family, where fired keys leave tombstones), a chunk at a time, and only once
the loaded window has shrunk by ``step_ms``: small steps keep the tail flat
(a refill runs in the thread that fires, often a pull of the dispatcher, and
holds the GIL through its scan: at 3,300 messages/s a 100 ms step loaded ~330
entries in ~130 us, a 20 ms step ~66 in ~33 us, for ~20 % more refill work).

The wheel is not thread-safe: its owner (the broker) calls it under one lock.
Four operations: :meth:`schedule`, :meth:`cancel`, :meth:`pop_due`,
:meth:`next_due_ms`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left

from broker_adapter.embedded.keys import CF_WHEEL, wheel_key, wheel_time
from broker_adapter.embedded.store import RocksStore

#: (wheel key, topic id, record)
Entry = tuple[bytes, int, bytes]

_END = b"\xff" * 17
# Fired entries at the run's head are deleted once this many and half the run.
_COMPACT_MIN = 4096


def due_end(run: list[Entry], probe: tuple[bytes], lo: int, hi: int) -> int:
    """``bisect_left(run, probe, lo, hi)``, searching from ``lo`` in growing steps:
    a fire takes the few entries at the head of a run of ~1,000, and a plain
    bisection's ten probes there land on ten cold entries (it was ~6 % of the
    firing thread's CPU at 670 fires/s, issue 16); this touches two or three."""
    step = 1
    while True:
        at = lo + step - 1
        if at >= hi:
            return bisect_left(run, probe, lo, hi)
        if not run[at] < probe:
            return bisect_left(run, probe, lo, at)
        lo = at + 1
        step += step


class TimingWheel:
    """Due-time order over the ``wheel`` family with an in-memory near window.

    :param store: the RocksDB store holding the ``wheel`` family.
    :param start: a wheel key below which nothing is pending (everything fired).
    :param window_ms: how far ahead of now entries are held in memory.
    :param step_ms: how much the window may shrink before it is topped up.
    :param max_entries: cap on entries held in memory (bounds RAM in a burst).
    :param chunk: entries loaded per refill (bounds the pause of one step).
    """

    def __init__(
        self,
        store: RocksStore,
        start: bytes,
        window_ms: int = 1000,
        step_ms: int = 20,
        max_entries: int = 200_000,
        chunk: int = 2048,
    ) -> None:
        if not 0 < step_ms < window_ms:
            raise ValueError("need 0 < step_ms < window_ms")
        self._store = store
        # Below the watermark: the run (sorted, live from _head on) and the heap.
        self._run: list[Entry] = []
        self._head = 0
        self._heap: list[Entry] = []
        self._cancelled: set[bytes] = set()
        self.watermark = start
        self._watermark_ms = wheel_time(start)  # read on every fire and pull: kept, not parsed
        self.window_ms = window_ms
        self.step_ms = step_ms
        self.max_entries = max_entries
        self.chunk = chunk
        # A lower bound of the earliest due time on disk at or above the
        # watermark; None when nothing is there.
        self._next_disk_ms: int | None = wheel_time(start)

    def __len__(self) -> int:
        """Entries held in memory (cancelled ones not yet popped included)."""
        return len(self._run) - self._head + len(self._heap)

    def held_keys(self) -> list[bytes]:
        """The wheel keys held in memory (cancelled ones not yet popped included), unordered."""
        return [entry[0] for entry in self._run[self._head :]] + [e[0] for e in self._heap]

    def schedule(self, key: bytes, tid: int, record: bytes) -> None:
        """Note an entry the caller has just written to the ``wheel`` family."""
        if key < self.watermark:
            heapq.heappush(self._heap, (key, tid, record))
        else:
            t = wheel_time(key)
            if self._next_disk_ms is None or t < self._next_disk_ms:
                self._next_disk_ms = t

    def cancel(self, key: bytes) -> None:
        """Forget an entry the caller has just deleted from the ``wheel`` family."""
        if key < self.watermark:
            self._cancelled.add(key)

    def pop_due(self, now_ms: int, limit: int) -> list[Entry]:
        """Remove and return up to ``limit`` entries due at ``now_ms`` or before, in order.

        Loads from disk first when the near window runs short. Order is safe:
        memory holds exactly the entries below the watermark, disk the rest.
        """
        run, heap = self._run, self._heap
        bound = wheel_key(now_ms + 1, 0)
        if (
            self._head == len(run)
            and not heap
            and self._next_disk_ms is not None
            and self._next_disk_ms <= now_ms
        ):
            # A backlog (burst, restart): fire straight from the sequential scan.
            rows = self._store.scan(CF_WHEEL, self.watermark, bound, limit)
            if rows:
                self._move_watermark(rows[-1][0] + b"\x00")
                self._next_disk_ms = self._watermark_ms
                return [(key, (record[2] << 8) | record[3], record) for key, record in rows]
        # The fallback: a pull tops the window up at a quiet moment (top_up) a step
        # sooner, so that a due chunk seldom waits behind this scan (issue 16).
        self.refill(now_ms, lag_ms=self.step_ms)
        cancelled = self._cancelled
        out: list[Entry] = []
        probe = (bound,)  # sorts before an entry whose key is bound or more
        while len(out) < limit:
            head = self._head
            if head == len(run) and not heap and not self.refill(now_ms, force=True):
                break
            stop = due_end(run, probe, head, min(len(run), head + limit - len(out)))
            if heap and heap[0][0] < bound:
                first = heap[0][0]
                if stop == head or first < run[head][0]:
                    entry = heapq.heappop(heap)
                    if cancelled and entry[0] in cancelled:
                        cancelled.discard(entry[0])
                    else:
                        out.append(entry)
                    continue
                stop = bisect_left(run, (first,), head, stop)  # the run's part before it
            if stop == head:
                break
            taken = run[head:stop]
            self._head = stop
            if cancelled:
                kept = []
                for entry in taken:
                    if entry[0] in cancelled:
                        cancelled.discard(entry[0])
                    else:
                        kept.append(entry)
                taken = kept
            out += taken
        head = self._head
        if head >= _COMPACT_MIN and 2 * head >= len(run):
            del run[:head]
            self._head = 0
        return out

    def next_due_ms(self) -> int | None:
        """When the wheel next needs attention: the earliest entry's due time, or
        the time the loader must run; ``None`` when nothing is pending at all."""
        run, heap, cancelled = self._run, self._heap, self._cancelled
        while heap and heap[0][0] in cancelled:
            cancelled.discard(heapq.heappop(heap)[0])
        head = self._head
        while head < len(run) and run[head][0] in cancelled:
            cancelled.discard(run[head][0])
            head += 1
        self._head = head
        first = run[head][0] if head < len(run) else None
        if heap and (first is None or heap[0][0] < first):
            first = heap[0][0]
        due = wheel_time(first) if first is not None else None
        if self._next_disk_ms is None or len(self) >= self.max_entries:
            return due
        load_at = max(
            self._next_disk_ms - self.window_ms,
            self._watermark_ms - self.window_ms + 2 * self.step_ms,
        )
        return load_at if due is None else min(due, load_at)

    def refill(self, now_ms: int, force: bool = False, lag_ms: int = 0) -> int:
        """Load one chunk of entries due before ``now + window_ms``; returns how many.

        Without ``force`` it loads only once the window has shrunk by ``step_ms``
        plus ``lag_ms``.
        """
        horizon = now_ms + self.window_ms
        # The usual answer first (the window is full enough), without a call.
        if not force and self._watermark_ms >= horizon - self.step_ms - lag_ms:
            return 0
        nd = self._next_disk_ms
        if nd is None or nd >= horizon or len(self) >= self.max_entries:
            return 0
        upper = wheel_key(horizon, 0)
        if self.watermark >= upper:
            return 0
        room = min(self.chunk, self.max_entries - len(self))
        rows = self._store.scan(CF_WHEEL, self.watermark, upper, room)
        # In key order, above everything held: the run stays sorted (tid: record_tid).
        self._run += [(key, (record[2] << 8) | record[3], record) for key, record in rows]
        if len(rows) < room:
            self._move_watermark(upper)
            beyond = self._store.scan(CF_WHEEL, upper, _END, 1)
            self._next_disk_ms = wheel_time(beyond[0][0]) if beyond else None
        else:
            self._move_watermark(rows[-1][0] + b"\x00")
            self._next_disk_ms = self._watermark_ms
        return len(rows)

    def _move_watermark(self, key: bytes) -> None:
        self.watermark = key
        self._watermark_ms = wheel_time(key)
