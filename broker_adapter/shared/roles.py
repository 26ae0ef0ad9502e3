"""The roles of a process on a shared ``rocksdb://`` directory, and the error of a call
lost with its owner (see :mod:`broker_adapter.shared.broker`)."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from broker_adapter.base import BrokerAdapter
from broker_adapter.errors import ConnectionFailed


class Role(enum.Enum):
    """What a process is to a shared directory."""

    OWNER = "owner"
    CLIENT = "client"


class OwnerLost(ConnectionFailed):
    """The directory's owner went away while a call was in flight; its outcome is unknown.

    :param path: the data directory.
    :param pid: the owner that went away.
    :param op: the call (``send``, ``send_batch``).
    :param now: who serves the directory now, in words.
    """

    def __init__(self, path: Path, pid: int, op: str, now: str) -> None:
        self.path, self.pid, self.op = path, pid, op
        super().__init__(
            f"the owner of {path} (pid {pid}) went away while this {op} was in flight, so "
            f"whether it was stored is unknown; {now}. Retry it: with a key a retried send is "
            "safe (a stored one answers DUPLICATE), without one it may be stored twice"
        )


@dataclasses.dataclass(frozen=True)
class Attachment:
    """One period of this process's role: the broker calls go to, and who owns."""

    generation: int
    role: Role
    broker: BrokerAdapter
    owner_pid: int


__all__ = ["Attachment", "OwnerLost", "Role"]
