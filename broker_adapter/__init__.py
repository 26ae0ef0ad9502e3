"""chronoq's message layer: timed messages, abort messages, consumer groups.

``open_broker(url)`` opens an adapter; the embedded RocksDB broker
(``rocksdb://PATH``) is the default everywhere. ``open_async_broker(url)`` opens
its awaitable client (:mod:`broker_adapter.async_base`).
"""

from broker_adapter.async_base import AsyncBrokerAdapter
from broker_adapter.base import BrokerAdapter, Consumer, SendCallback
from broker_adapter.clock import Clock, ManualClock, SystemClock
from broker_adapter.errors import ChronoqError
from broker_adapter.message import DELAY_LEVELS, Message
from broker_adapter.results import (
    AbortResult,
    AbortStatus,
    BrokerStats,
    DeadLetterPage,
    GroupStats,
    MessageState,
    MessageView,
    PendingCounts,
    ReceivedMessage,
    SendResult,
    SendStatus,
    TopicStats,
)
from broker_adapter.urls import open_async_broker, open_broker

__all__ = [
    "DELAY_LEVELS",
    "AbortResult",
    "AbortStatus",
    "AsyncBrokerAdapter",
    "BrokerAdapter",
    "BrokerStats",
    "ChronoqError",
    "Clock",
    "Consumer",
    "DeadLetterPage",
    "GroupStats",
    "ManualClock",
    "Message",
    "MessageState",
    "MessageView",
    "PendingCounts",
    "ReceivedMessage",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "SystemClock",
    "TopicStats",
    "open_async_broker",
    "open_broker",
]
