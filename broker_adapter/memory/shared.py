"""Named memory brokers, shared within one process.

``memory://`` (no name) opens a new private broker each time. ``memory://NAME``
opens the broker called NAME in this process, creating it if no handle to it is
open: an app's ``open_broker("memory://shop")`` and a test's see the same
messages. Like SQLite's shared in-memory databases, a named broker lives as long
as at least one handle to it is open; closing the last one drops its data.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from broker_adapter.clock import Clock
from broker_adapter.errors import InvalidArgument
from broker_adapter.memory.store import MemoryStore


@dataclass(frozen=True)
class StoreSettings:
    """How a memory store is made; a later open of the same name must agree."""

    max_body_bytes: int
    max_delay_ms: int
    retention_ms: int


@dataclass
class _Entry:
    store: MemoryStore
    settings: StoreSettings
    handles: int


class SharedStores:
    """The named stores of this process and how many handles each has open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._named: dict[str, _Entry] = {}

    def acquire(
        self,
        name: str,
        clock: Clock | None,
        settings: StoreSettings,
        given: set[str],
        default_clock: Clock,
    ) -> tuple[MemoryStore, StoreSettings]:
        """The store called ``name`` (new if none is open) and its settings.

        :param given: the names of the settings the caller passed explicitly: they
            must match an open store's.
        :raises InvalidArgument: when ``clock`` or a given setting differs from
            those of the open store of that name.
        """
        with self._lock:
            entry = self._named.get(name)
            if entry is None:
                store = MemoryStore(
                    clock or default_clock,
                    max_delay_ms=settings.max_delay_ms,
                    retention_ms=settings.retention_ms,
                )
                entry = self._named[name] = _Entry(store, settings, 0)
            else:
                if clock is not None and clock is not entry.store.clock:
                    raise InvalidArgument(
                        f"memory://{name} is already open with another clock; pass the same "
                        "clock, or none to share the open broker's"
                    )
                for field in given:
                    mine, theirs = getattr(settings, field), getattr(entry.settings, field)
                    if mine != theirs:
                        raise InvalidArgument(
                            f"memory://{name} is already open with {field}={theirs}; "
                            f"leave {field} out to share it, or use another name"
                        )
            entry.handles += 1
            return entry.store, entry.settings

    def release(self, name: str, store: MemoryStore) -> bool:
        """One handle of ``name`` closed; ``True`` when it was the last (the store is
        dropped and must be closed by the caller)."""
        with self._lock:
            entry = self._named.get(name)
            if entry is None or entry.store is not store:
                return False
            entry.handles -= 1
            if entry.handles > 0:
                return False
            del self._named[name]
            return True

    def names(self) -> list[str]:
        """The names of the memory brokers open in this process."""
        with self._lock:
            return sorted(self._named)


#: The process's named memory brokers.
SHARED = SharedStores()

__all__ = ["SHARED", "SharedStores", "StoreSettings"]
