"""The ``memory://`` broker: the whole broker contract in this process's memory,
not durable, for tests and demos (:class:`MemoryBroker`)."""

from broker_adapter.memory.broker import MemoryBroker
from broker_adapter.memory.shared import SHARED

__all__ = ["SHARED", "MemoryBroker"]
