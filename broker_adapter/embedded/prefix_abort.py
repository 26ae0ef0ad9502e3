"""abort_prefix on the embedded broker: every pending message of a topic under a key
prefix, aborted in chunks.

The ``keys`` family is sorted by ``tid`` + key, so the keys under a prefix are one
range: it is read :data:`CHUNK` keys at a time from where the last chunk stopped.
Each chunk is one step under the broker lock (locate each key's message, abort the
pending ones with one write batch); the lock is let go between chunks, so the
wheel thread fires what falls due meanwhile and a prefix with millions of keys
never holds the wheel up for more than one chunk.
"""

from __future__ import annotations

import time

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.timing_wheel import Entry
from broker_adapter.errors import UnknownTopic
from broker_adapter.results import MAX_REPORTED_KEYS, PrefixAbortResult

#: Keys handled per hold of the broker lock (and per write batch). Measured with
#: 100,000 keys under 1,000 fires/s: chunks of 1,000 (~4 ms each, lock and GIL held)
#: put the median fire lateness during the call at ~4 ms, chunks of 250 at ~1 ms
#: for ~30 % more time in all (bench/runtime_calls.py).
CHUNK = 250


def abort_prefix(core: BrokerCore, topic: str, key_prefix: str) -> PrefixAbortResult:
    """Abort the pending messages of ``topic`` whose key starts with ``key_prefix``; see
    :meth:`BrokerAdapter.abort_prefix <broker_adapter.base.BrokerAdapter.abort_prefix>`.

    :raises UnknownTopic: for a topic the broker never had a message on.
    """
    tid = core.topic_ids.get(topic)
    if tid is None or not core.had_messages(tid):
        raise UnknownTopic(topic)
    lower = core.prefixes[tid] + key_prefix.encode()
    upper = K.prefix_end(lower)
    aborted = 0
    delivered: list[str] = []
    delivered_count = 0
    while True:
        with core.lock:  # the store read under the lock: no fire comes in between
            store = core.store
            rows = store.scan(K.CF_KEYS, lower, upper, CHUNK)
            wheel, tombstones = store.cf[K.CF_WHEEL], store.cf[K.CF_ABORTED]
            fired_upto = core.fired_upto
            pending: list[Entry] = []
            for index, entry in rows:
                current = core.locate(entry[:16])
                record = wheel.get(current)
                if record is not None:
                    pending.append((current, tid, record))
                elif current < fired_upto and tombstones.get(current) is None:
                    delivered_count += 1  # its last message fired (and was not aborted)
                    if len(delivered) < MAX_REPORTED_KEYS:
                        delivered.append(index[2:].decode())
            core.abort_many(pending)
        aborted += len(pending)
        if len(rows) < CHUNK:
            break
        lower = K.next_key(rows[-1][0])
        time.sleep(0)  # the wheel thread (and senders) take the lock in between
    return PrefixAbortResult(aborted, tuple(delivered), delivered_count)


__all__ = ["CHUNK", "abort_prefix"]
