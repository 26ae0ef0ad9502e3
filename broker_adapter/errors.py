"""The one error tree of chronoq.

Every error chronoq raises derives from :class:`ChronoqError`. Errors about bad
input also derive from :class:`ValueError` (a wrong type included), so callers
that already catch those keep working. Each message says what
was wrong and what to do about it.

::

    ChronoqError
    ├── InvalidMessage (ValueError)         a Message that cannot be sent
    │   ├── InvalidDelay                    bad delay_ms/delay_sec/delay_level/deliver_at_ms
    │   ├── InvalidTopic                    empty, too long, bad characters, reserved
    │   └── MessageTooLarge                 body over the broker's max size
    ├── InvalidArgument (ValueError)        a bad argument to any other call
    │   └── UnknownTopic                    a call names a topic the broker has never seen
    ├── UnknownScheme (ValueError)          open_broker() got a URL it cannot serve
    ├── MissingExtra (ImportError)          a feature whose optional extra is not installed
    ├── MessageNotFound (LookupError)       an id or key names no message
    ├── DecodeError                         stored or received bytes that do not decode
    └── BrokerError                         the broker itself failed
        ├── BrokerClosed                    call on a closed broker or consumer
        ├── BrokerLocked                    data directory owned by another process
        ├── StorageFull                     no space left for the data directory: writes refused
        ├── ConnectionFailed                a remote broker could not be reached
        │   └── OwnerLost                   a shared rocksdb:// owner died mid-call (broker_adapter.shared)
        └── AuthenticationFailed            wrong or missing token
"""

from __future__ import annotations


class ChronoqError(Exception):
    """Root of every error chronoq raises."""


class InvalidMessage(ChronoqError, ValueError):
    """A :class:`~broker_adapter.message.Message` that cannot be sent as given."""


class InvalidDelay(InvalidMessage):
    """A timing field that is negative, of the wrong type, or out of range."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid {field}={value!r}: {reason}")


class InvalidTopic(InvalidMessage):
    """A topic name that is empty, too long, reserved or has bad characters."""

    def __init__(self, topic: object, reason: str) -> None:
        self.topic = topic
        super().__init__(f"invalid topic {topic!r}: {reason}")


class MessageTooLarge(InvalidMessage):
    """A body (or properties) larger than the broker accepts."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"message body is {size} bytes, over the limit of {limit} bytes; "
            "store large payloads elsewhere and send a reference, or raise max_body_bytes"
        )


class InvalidArgument(ChronoqError, ValueError):
    """A bad argument to a broker, consumer or scheduler call."""


class UnknownTopic(InvalidArgument):
    """A call that reads or changes the messages of a topic names one the broker has
    never had a message on (a typo, or the wrong broker)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(
            f"no topic {topic!r} on this broker: nothing was ever sent to it; check the "
            "name (and the broker URL), or list the topics with `chronoq stats`"
        )


class UnknownScheme(ChronoqError, ValueError):
    """``open_broker`` got a URL whose scheme no adapter serves."""

    def __init__(self, url: str, known: list[str]) -> None:
        self.url = url
        super().__init__(
            f"no broker adapter for URL {url!r}; known schemes: {', '.join(sorted(known))}"
        )


class MissingExtra(ChronoqError, ImportError):
    """A feature needs an optional part of chronoq that is not installed.

    :param extra: the extra's name (``celery``, ``spark``, ``redis``, ``report``, ``metrics``).
    :param feature: what was asked for, in words (``"the Celery executor"``).
    """

    def __init__(self, extra: str, feature: str) -> None:
        self.extra = extra
        self.feature = feature
        super().__init__(
            f"{feature} needs chronoq's {extra!r} extra, which is not installed: "
            f"pip install 'chronoq[{extra}]'"
        )


class MessageNotFound(ChronoqError, LookupError):
    """An id or key that names no message the broker knows."""


class DecodeError(ChronoqError):
    """Bytes (stored or received) that do not decode to what they should."""


class BrokerError(ChronoqError):
    """The broker failed to do what was asked; nothing is known to have changed."""


class BrokerClosed(BrokerError):
    """The broker or consumer was closed; open a new one."""


class BrokerLocked(BrokerError):
    """The data directory is owned by another process (RocksDB allows one owner)."""

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"data directory {path!r} is held by {holder}; stop that process, or reach its "
            "broker through `chronoq broker serve` and a chronoq:// URL"
        )


class StorageFull(BrokerError):
    """No space is left on the disk of the broker's data directory: the write was
    refused and nothing of it was stored (a send that raised this was not accepted;
    retrying it, keyed or not, stores it once). Reads keep working meanwhile.

    :param path: the data directory.
    :param detail: what the storage engine said.
    """

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"no space left for the broker's data directory {path!r}; the write was refused "
            "and nothing of it was stored: free space on that disk (or move the directory "
            "to a bigger one) and retry; the broker resumes writing by itself within about "
            f"a second once there is room, reads work meanwhile ({detail})"
        )


class ConnectionFailed(BrokerError):
    """A remote broker could not be reached or the connection broke."""


class AuthenticationFailed(BrokerError):
    """The remote broker refused the token."""
