"""KeyIndex: a memory broker's business keys, by ``(topic, key)`` and in key order.

``get``/``put``/``drop`` are dict operations (the keyed-duplicate rule on every
send). For ``abort_prefix`` and ``find_pending(key_prefix=...)`` each topic also
keeps its keys in a sorted list, so the keys under a prefix are one slice found by
bisection. Keys new since the last prefix read wait in a per-topic list and are
sorted in at the next one (one ``list.sort``: Timsort merges the two runs); keys
dropped by retention stay in the sorted list until dropped ones are half of it.
All guarded by the store's lock.
"""

from __future__ import annotations

import bisect

from broker_adapter.memory.records import StoredMessage


class KeyIndex:
    """The last message sent with each ``(topic, key)``, and each topic's keys in order."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], StoredMessage] = {}
        self._sorted: dict[str, list[str]] = {}
        self._new: dict[str, list[str]] = {}
        self._dropped: dict[str, int] = {}

    def get(self, topic: str, key: str) -> StoredMessage | None:
        """The last message sent to ``topic`` with ``key``, if the store still knows it."""
        return self._last.get((topic, key))

    def put(self, topic: str, key: str, msg: StoredMessage) -> None:
        """``msg`` is now the last message sent to ``topic`` with ``key``."""
        if (topic, key) not in self._last:
            self._new.setdefault(topic, []).append(key)
        self._last[(topic, key)] = msg

    def drop(self, topic: str, key: str, msg: StoredMessage) -> None:
        """Forget ``key`` of ``topic`` if ``msg`` is still its last message."""
        if self._last.get((topic, key)) is msg:
            del self._last[(topic, key)]
            self._dropped[topic] = self._dropped.get(topic, 0) + 1

    def under(self, topic: str, prefix: str) -> list[str]:
        """The keys of ``topic`` starting with ``prefix``, in key order: one slice, so it
        may hold keys dropped since (look each one up) and a key dropped and sent again
        twice in a row."""
        keys = self._sorted.setdefault(topic, [])
        new = self._new.pop(topic, None)
        if new:
            keys.extend(new)
            keys.sort()
        if 2 * self._dropped.get(topic, 0) > len(keys):
            keys[:] = [k for k in dict.fromkeys(keys) if (topic, k) in self._last]
            self._dropped[topic] = 0
        start = bisect.bisect_left(keys, prefix)
        after = _after(prefix)
        end = len(keys) if after is None else bisect.bisect_left(keys, after, start)
        return keys[start:end]


def _after(prefix: str) -> str | None:
    """The least str greater than every str starting with ``prefix`` (``None``: none)."""
    stripped = prefix.rstrip(chr(0x10FFFF))
    if not stripped:
        return None
    return stripped[:-1] + chr(ord(stripped[-1]) + 1)


__all__ = ["KeyIndex"]
