"""The stored form of a message (values of the ``wheel`` and ``ready`` families).

One flat byte string so firing is a copy, not a decode::

    ver(1) flags(1) tid(2) attempts(2) deliver_at(8) born(8) id(16)
    key_len(2) tags_len(2) props_len(4)  key  tags  props(JSON)  body

``tid`` is the topic the record fires into (a retry topic for retries); ``id``
is the message id of the first send, kept across retries; ``attempts`` counts
deliveries already made to the group that retries it.
"""

from __future__ import annotations

import json
import struct

from broker_adapter.errors import DecodeError

VERSION = 1
#: The fixed head of a record (the fields up to ``props_len``); :func:`encode` packs it.
HEAD = _HEAD = struct.Struct(">BBHHQQ16sHHI")
HEAD_SIZE = _HEAD.size
_ATTEMPTS = struct.Struct(">H")
_LENS = struct.Struct(">HHI")  # key_len, tags_len, props_len
_LENS_AT = HEAD_SIZE - _LENS.size


def encode(
    tid: int,
    attempts: int,
    deliver_at: int,
    born: int,
    raw_id: bytes,
    key: bytes,
    tags: bytes,
    props: bytes,
    body: bytes,
) -> bytes:
    """Pack one record; ``key``, ``tags`` and ``props`` are already encoded bytes."""
    head = _HEAD.pack(
        VERSION, 0, tid, attempts, deliver_at, born, raw_id, len(key), len(tags), len(props)
    )
    return b"".join((head, key, tags, props, body))


def record_tid(record: bytes) -> int:
    """The topic id a record fires into."""
    return (record[2] << 8) | record[3]


def record_attempts(record: bytes) -> int:
    """Deliveries already made of the message in ``record``."""
    return (record[4] << 8) | record[5]


def record_id(record: bytes) -> bytes:
    """The raw message id (16 bytes) in a record."""
    return record[22:38]


def with_topic_and_attempts(record: bytes, tid: int, attempts: int, deliver_at: int) -> bytes:
    """A copy of ``record`` aimed at topic ``tid`` with new attempts and due time."""
    head = bytearray(record[:HEAD_SIZE])
    struct.pack_into(">HHQ", head, 2, tid, attempts, deliver_at)
    return bytes(head) + record[HEAD_SIZE:]


def with_due_and_body(record: bytes, deliver_at: int, body: bytes | None) -> bytes:
    """A copy of ``record`` due at ``deliver_at``, with ``body`` instead of its own if
    given (topic, attempts, id, key, tags and properties kept)."""
    head = bytearray(record[:HEAD_SIZE])
    struct.pack_into(">Q", head, 6, deliver_at)
    if body is None:
        return bytes(head) + record[HEAD_SIZE:]
    return b"".join((head, record[HEAD_SIZE : HEAD_SIZE + _fields_len(record)], body))


def props_size(record: bytes) -> int:
    """Bytes of the properties in ``record`` (what counts with a body against the max size)."""
    return int(_LENS.unpack_from(record, _LENS_AT)[2])


def key_and_tags(record: bytes) -> tuple[bytes, bytes]:
    """The key and tags of ``record`` as stored (UTF-8, empty when absent), without
    decoding the rest."""
    klen, tlen, _plen = _LENS.unpack_from(record, _LENS_AT)
    key_end = HEAD_SIZE + klen
    return record[HEAD_SIZE:key_end], record[key_end : key_end + tlen]


def _fields_len(record: bytes) -> int:
    klen, tlen, plen = _LENS.unpack_from(record, _LENS_AT)
    return int(klen + tlen + plen)


def delivery_fields(
    data: bytes,
) -> tuple[int, int, int, bytes, str | None, str | None, dict[str, str] | None, bytes]:
    """The fields a consumer needs, fast: ``(attempts, deliver_at, born, raw_id, key, tags,
    props or None, body)``."""
    _v, _f, _tid, attempts, deliver_at, born, raw_id, klen, tlen, plen = _HEAD.unpack_from(data)
    pos = HEAD_SIZE
    key = data[pos : pos + klen].decode() if klen else None
    pos += klen
    tags = data[pos : pos + tlen].decode() if tlen else None
    pos += tlen
    props = json.loads(data[pos : pos + plen]) if plen else None
    return attempts, deliver_at, born, raw_id, key, tags, props, data[pos + plen :]


class Record:
    """A decoded record (fields only; the body is a slice of the stored bytes)."""

    __slots__ = (
        "attempts",
        "body",
        "born",
        "deliver_at",
        "key",
        "props",
        "raw_id",
        "tags",
        "tid",
    )

    def __init__(self, data: bytes) -> None:
        try:
            ver, _flags, tid, attempts, deliver_at, born, raw_id, klen, tlen, plen = (
                _HEAD.unpack_from(data)
            )
        except struct.error as e:
            raise DecodeError(f"stored record of {len(data)} bytes is truncated") from e
        if ver != VERSION:
            raise DecodeError(f"stored record has version {ver}, this chronoq reads {VERSION}")
        pos = HEAD_SIZE
        self.tid: int = tid
        self.attempts: int = attempts
        self.deliver_at: int = deliver_at
        self.born: int = born
        self.raw_id: bytes = raw_id
        self.key: str | None = data[pos : pos + klen].decode() if klen else None
        pos += klen
        self.tags: str | None = data[pos : pos + tlen].decode() if tlen else None
        pos += tlen
        self.props: dict[str, str] = json.loads(data[pos : pos + plen]) if plen else {}
        pos += plen
        self.body: bytes = data[pos:]
