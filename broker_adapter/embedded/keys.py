"""Key layout of the embedded broker's RocksDB directory (raw mode, big-endian,
so byte order is time order).

Column families and their keys::

    wheel    time(8) seq(8)                      -> record      the durable timing wheel
    ready    tid(2) time(8) seq(8)               -> record      fired messages, per topic, in fire order
    keys     tid(2) key(utf-8)                   -> wheel key(16) + asked due ms(8): latest message
                                                    with that business key, and the due time
                                                    its sender asked for (before clamping to now);
                                                    dropped with its message by retention
    aborted  time(8) seq(8)                      -> abort ms(8) + record: tombstone of an aborted
                                                    message (at the wheel key it was aborted from)
    moves    first wheel key(16)                 -> current wheel key(16): where a rescheduled
                                                    message is; kept while it is pending, fired or
                                                    aborted, dropped with its message by retention
    consume  gid(2) msg id(16)                   -> group note  a group's retry/dead state of a message:
                                                    kind(1) attempts(2) wheel key(16) reason;
                                                    kind R: a retry (or requeued dead letter,
                                                    attempts 0) at that wheel key of
                                                    %RETRY%<group>; D: a dead letter, its copy
                                                    at that wheel key of %DLQ%<group>; X: a
                                                    purged dead letter (done); see
                                                    dead_letters.py
    meta     b"T" name                           -> tid(2)      topic registry
             b"G" name                           -> gid(2) + JSON list of subscribed topics
             b"C" gid(2) tid(2)                  -> ready key(18) + acked total(8): group cursor
             b"N" tid(2)                         -> pending(8) fired total(8): topic counters
             b"S"                                -> seq(8): sequence numbers below it may be used
             b"F"                                -> wheel key(16): everything below it has fired
             b"D" gid(2)                         -> settled(8): a group's dead letters requeued
                                                    or purged so far (stats' dead: the DLQ
                                                    topic's fired total less this)

``time`` is the due time in epoch ms, ``seq`` a broker-wide sequence number, so
``time seq`` (the *wheel key*) is unique and sorts in fire order. A *ready key*
is ``tid`` + the wheel key the message fired from; retries and dead letters get
new wheel keys in the topics ``%RETRY%<group>`` and ``%DLQ%<group>``.

A message id is 16 bytes, shown as 32 hex digits: ``time(6) seq(8) tid(2)`` of
the message's first send, i.e. its *first wheel key* and topic. A message that was
never rescheduled is found from its id alone: its wheel key while pending, a
tombstone at that key once aborted, its ready key once fired. A reschedule moves
the message to a new wheel key (new time, new seq) and records the move in
``moves``; from then on every lookup by id or key goes through ``moves`` first
(:meth:`~broker_adapter.embedded.core.BrokerCore.locate`): the *current* wheel key
is where it waits, where its tombstone is and what its ready key holds. The
``keys`` family keeps pointing at the first wheel key and the due time the first
send asked for, so re-sending that occurrence stays a duplicate after a move.
"""

from __future__ import annotations

import struct

CF_WHEEL = "wheel"
CF_READY = "ready"
CF_KEYS = "keys"
CF_ABORTED = "aborted"
CF_CONSUME = "consume"
CF_META = "meta"
CF_MOVES = "moves"
COLUMN_FAMILIES = (CF_WHEEL, CF_READY, CF_KEYS, CF_ABORTED, CF_CONSUME, CF_META, CF_MOVES)

META_TOPIC = b"T"
META_GROUP = b"G"
META_CURSOR = b"C"
META_COUNTERS = b"N"
META_SEQ = b"S"
META_FIRED_UPTO = b"F"
META_DEAD_SETTLED = b"D"

MAX_TOPICS = 0xFFFF
MAX_TIME_MS = (1 << 48) - 1  # the id keeps 6 bytes of time: year 10889

_WHEEL = struct.Struct(">QQ")
_ID = struct.Struct(">6s8s2s")
U16 = struct.Struct(">H")
U64 = struct.Struct(">Q")
U64X2 = struct.Struct(">QQ")


def wheel_key(time_ms: int, seq: int) -> bytes:
    """The wheel key of a message due at ``time_ms`` with sequence ``seq``."""
    return _WHEEL.pack(time_ms, seq)


#: :func:`wheel_key` without its Python call (the struct's own ``pack``), for hot paths.
pack_wheel_key = _WHEEL.pack


def wheel_time(key: bytes) -> int:
    """The due time (epoch ms) at the start of a wheel key."""
    return int.from_bytes(key[:8], "big")


def ready_time(key: bytes) -> int:
    """The due time (epoch ms) in a ready key."""
    return int.from_bytes(key[2:10], "big")


def tid_bytes(tid: int) -> bytes:
    """A topic id as its 2-byte key prefix."""
    return U16.pack(tid)


def topic_range(tid: int) -> tuple[bytes, bytes]:
    """``[start, end)`` of a topic's keys in the ``ready`` family."""
    return U16.pack(tid), U16.pack(tid + 1) if tid < MAX_TOPICS else b"\xff\xff\xff"


def next_key(key: bytes) -> bytes:
    """The smallest key greater than ``key``."""
    return key + b"\x00"


def make_id(wkey: bytes, tid: int) -> bytes:
    """The 16 raw bytes of a message id from its first wheel key and topic id."""
    return wkey[2:8] + wkey[8:16] + U16.pack(tid)


def id_wheel_key(raw_id: bytes) -> bytes:
    """The wheel key a message id was first scheduled under."""
    return b"\x00\x00" + raw_id[:14]


def id_tid(raw_id: bytes) -> int:
    """The topic id a message was first sent to."""
    return int(U16.unpack_from(raw_id, 14)[0])


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (non-empty,
    not all ``0xff``; a UTF-8 key after a topic id never is)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def parse_id(msg_id: object) -> bytes | None:
    """The raw bytes of a message id string, or ``None`` if it is malformed."""
    if not isinstance(msg_id, str) or len(msg_id) != 32:
        return None
    try:
        return bytes.fromhex(msg_id)
    except ValueError:
        return None
