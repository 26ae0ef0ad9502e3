"""PendingCounter: ``count_pending`` on the embedded broker, with bounded work.

The ``wheel`` family is keyed by ``time(8) seq(8)``, so the messages due in
``[lo, hi)`` are one key range: without a topic, counting them is a keys-only
scan of that range (about 0.2 us a key here), and nothing is added to the send or
fire path. With a topic each record's id is read too (a retry counts for the
topic its message was first sent to).

The work is bounded: a call looks at no more than :data:`COUNT_BUDGET` keys (with
a topic :data:`TOPIC_BUDGET` records), shared out evenly among its buckets (at
least :data:`MIN_PER_BUCKET` each). A bucket is scanned in up to :data:`PROBES`
equal parts of due time, each from its own start with an equal part of the
bucket's budget. A bucket whose parts are all counted to their end is exact. A
part cut short is *estimated*: the count seen, extrapolated over the rest of the
part at the density seen (matches per ms from the part's start to the last key
looked at); the estimates together are capped at what the broker's pending
counters leave for them (the pending total less the exact buckets). The answer
then says ``exact=False``. Figures (1M pending, ``bench/dead_letters_counts.py``)
are in the README's "Dead letters" section.
"""

from __future__ import annotations

import itertools

from rocksdict import ReadOptions

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.records import record_id
from broker_adapter.results import PendingCounts

#: Most wheel keys one call looks at (keys only: no topic).
COUNT_BUDGET = 30_000
#: Most wheel records one call looks at with a topic (values are read).
TOPIC_BUDGET = 15_000
#: The least budget a bucket gets, however many buckets a call asks for.
MIN_PER_BUCKET = 64
#: Parts a bucket is scanned in (each from its own start), budget permitting.
PROBES = 8


class PendingCounter:
    """Answers ``count_pending`` for an embedded broker.

    :param core: the broker's core (its store, fire position and pending counters).
    """

    def __init__(self, core: BrokerCore) -> None:
        self._core = core

    def count(self, edges: tuple[int, ...], topic: str | None) -> PendingCounts:
        """See :meth:`BrokerAdapter.count_pending
        <broker_adapter.base.BrokerAdapter.count_pending>` and the module docstring."""
        core = self._core
        tid = None
        if topic is not None:
            tid = core.topic_ids.get(topic)
            if tid is None:
                return PendingCounts([0] * (len(edges) - 1))
        budget = COUNT_BUDGET if tid is None else TOPIC_BUDGET
        share = max(budget // (len(edges) - 1), MIN_PER_BUCKET)
        probes = max(min(PROBES, share // MIN_PER_BUCKET), 1)
        counts: list[int] = []
        cut: list[int] = []  # buckets that were estimated
        floor = K.wheel_time(core.fired_upto)  # nothing pending is due before it
        for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
            lo = max(lo, floor)
            hi = min(hi, K.MAX_TIME_MS + 1)
            if lo >= hi:
                counts.append(0)
                continue
            n = 0.0
            whole = True
            # the bucket in ``probes`` equal parts, each scanned from its start: a part
            # cut short is extrapolated from its own density (stratified, so an empty
            # or crowded stretch at the bucket's start does not skew the rest)
            cuts = [lo + (hi - lo) * k // probes for k in range(probes)] + [hi]
            for a, b in itertools.pairwise(cuts):
                if a >= b:
                    continue
                got, seen, last = self._scan(
                    max(K.wheel_key(a, 0), core.fired_upto), K.wheel_key(b, 0), tid, share // probes
                )
                if last is None:
                    n += got
                else:
                    whole = False
                    covered = max(last - a + 1, 1)
                    n += got * (b - a) / covered if seen else got
            counts.append(round(n))
            if not whole:
                cut.append(i)
        if cut:
            self._cap(counts, cut, tid)
        return PendingCounts(counts, exact=not cut)

    def _scan(
        self, lower: bytes, upper: bytes, tid: int | None, budget: int
    ) -> tuple[int, int, int | None]:
        """``(matches, keys looked at, due time of the last one)`` of the wheel in
        ``[lower, upper)``; the time is ``None`` when the range ended within
        ``budget`` (the count is exact)."""
        cf = self._core.store.cf[K.CF_WHEEL]
        opt = ReadOptions()
        opt.set_iterate_lower_bound(lower)
        opt.set_iterate_upper_bound(upper)
        n = 0
        last = None
        if tid is None:
            for key in cf.keys(from_key=lower, read_opt=opt):
                if key >= upper:  # belt and braces (see RocksStore.scan)
                    return n, n, None
                if n >= budget:
                    return n, n, last
                n += 1
                last = K.wheel_time(key)
            return n, n, None
        seen = 0
        for key, record in cf.items(from_key=lower, read_opt=opt):
            if key >= upper:
                return n, seen, None
            if seen >= budget:
                return n, seen, last
            seen += 1
            last = K.wheel_time(key)
            if K.id_tid(record_id(record)) == tid:
                n += 1
        return n, seen, None

    def _cap(self, counts: list[int], cut: list[int], tid: int | None) -> None:
        """Scale the estimated buckets down to what the pending counters leave for them."""
        core = self._core
        if tid is None:
            total = sum(core.pending_count(t) for t in list(core.topic_names))
        else:
            total = core.pending_count(tid) + sum(
                core.pending_count(t)
                for t, name in list(core.topic_names.items())
                if name.startswith("%RETRY%")
            )
        room = max(total - sum(c for i, c in enumerate(counts) if i not in cut), 0)
        estimated = sum(counts[i] for i in cut)
        if estimated > room:
            for i in cut:
                counts[i] = counts[i] * room // estimated


__all__ = ["COUNT_BUDGET", "MIN_PER_BUCKET", "PROBES", "TOPIC_BUDGET", "PendingCounter"]
