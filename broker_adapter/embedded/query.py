"""MessageQuery: read-only views of messages in the embedded broker.

A message id locates the message (see ``keys``): its current wheel key (the id's,
or where ``moves`` says a reschedule put it) holds it while pending, a tombstone
once aborted, its ready key once fired. Each group's
state of a fired message comes from the group's cursor and in-flight set, or
from the group's note in ``consume`` once it was retried or dead-lettered.
"""

from __future__ import annotations

from broker_adapter.embedded import keys as K
from broker_adapter.embedded.core import BrokerCore
from broker_adapter.embedded.group_registry import GroupRegistry
from broker_adapter.embedded.groups import ConsumerGroup
from broker_adapter.embedded.records import Record, record_id
from broker_adapter.errors import DecodeError
from broker_adapter.results import MessageState, MessageView, overall_state


class MessageQuery:
    """Answers ``query`` and ``pending`` for an embedded broker.

    :param core: the broker's core (store, topics, fire position).
    :param groups: its consumer groups (each one's state of a fired message).
    """

    def __init__(self, core: BrokerCore, groups: GroupRegistry) -> None:
        self._core = core
        self._groups = groups

    def _view(
        self,
        msg_id: str,
        record: bytes,
        state: MessageState,
        extra: dict[str, object] | None = None,
        with_body: bool = False,
    ) -> MessageView:
        rec = Record(record)
        fields: dict[str, object] = {
            "msg_id": msg_id,
            "topic": self._core.topic_names.get(K.id_tid(rec.raw_id), "?"),
            "state": state,
            "deliver_at_ms": rec.deliver_at,
            "born_ms": rec.born,
            "attempts": rec.attempts,
            "key": rec.key,
            "tags": rec.tags,
            "body_size": len(rec.body),
        }
        if with_body:
            fields["body"] = rec.body
        fields.update(extra or {})
        return MessageView(**fields)  # type: ignore[arg-type]

    def view(self, msg_id: str) -> MessageView | None:
        """The view of ``msg_id``, or ``None`` when unknown or malformed."""
        raw = K.parse_id(msg_id)
        core = self._core
        if raw is None or K.id_tid(raw) not in core.topic_names:
            return None
        tid = K.id_tid(raw)
        try:
            with core.lock:  # the store read under the lock: no fire comes in between
                cf = core.store.cf
                wkey = core.locate(K.id_wheel_key(raw))
                record = cf[K.CF_WHEEL].get(wkey)
                if record is not None:
                    return self._view(msg_id, record, MessageState.PENDING)
                aborted = cf[K.CF_ABORTED].get(wkey)
                if aborted is not None:
                    return self._view(msg_id, aborted[8:], MessageState.ABORTED)
                fired = cf[K.CF_READY].get(core.prefixes[tid] + wkey)
            if fired is None:
                return None
            return self._fired_view(msg_id, raw, tid, wkey, fired)
        except DecodeError:
            return None

    def found_view(self, record: bytes, with_body: bool) -> MessageView:
        """The view ``find_pending`` gives of the pending first send in ``record`` (with
        its body if asked).

        :raises DecodeError: for a record that does not decode.
        """
        msg_id = record_id(record).hex()
        return self._view(msg_id, record, MessageState.PENDING, with_body=with_body)

    def dead_view(
        self, group: str, record: bytes, attempts: int, error: str | None, with_body: bool
    ) -> MessageView:
        """The view ``dead_letters`` gives of ``group``'s dead letter in ``record`` (its
        copy on ``%DLQ%<group>``: due at its death, the first send's topic).

        :raises DecodeError: for a record that does not decode.
        """
        extra: dict[str, object] = {
            "attempts": attempts,
            "error": error,
            "groups": {group: MessageState.DEAD},
        }
        msg_id = record_id(record).hex()
        return self._view(msg_id, record, MessageState.DEAD, extra, with_body)

    def _fired_view(
        self, msg_id: str, raw: bytes, tid: int, wkey: bytes, record: bytes
    ) -> MessageView:
        groups: dict[str, MessageState] = {}
        attempts = 0
        error = None
        deliver_at = None
        for group in self._groups.subscribers_of(tid):
            state, tries, why, due = self._group_state(group, raw, tid, wkey)
            groups[group.name] = state
            attempts = max(attempts, tries)
            error = why or error
            if due is not None:
                deliver_at = due
        state = overall_state(groups)
        extra: dict[str, object] = {"groups": groups, "attempts": attempts, "error": error}
        if deliver_at is not None and state is MessageState.PENDING:
            extra["deliver_at_ms"] = deliver_at
        return self._view(msg_id, record, state, extra)

    def _group_state(
        self, group: ConsumerGroup, raw: bytes, tid: int, wkey: bytes
    ) -> tuple[MessageState, int, str | None, int | None]:
        """(state, deliveries so far, last error, retry due time) of one group."""
        cf = self._core.store.cf
        note = cf[K.CF_CONSUME].get(group.gid_bytes + raw)
        with group.lock:
            if note is None:
                ready_key = self._core.prefixes[tid] + wkey
                state = group.state_of(tid, ready_key)
                flight = group.flight(ready_key)
                tries = flight.attempts if flight else (0 if state is MessageState.READY else 1)
                return state, tries, None, None
            kind = note[:1]
            tries = int(K.U16.unpack_from(note, 1)[0])
            loc = note[3:19]
            why = note[19:].decode(errors="replace") or None
            if kind == b"D":
                return MessageState.DEAD, tries, why, None
            if kind == b"X":  # a purged dead letter (see dead_letters.py)
                return MessageState.DONE, tries, why, None
            if cf[K.CF_WHEEL].get(loc) is not None:
                return MessageState.PENDING, tries, why, K.wheel_time(loc)
            ready_key = K.tid_bytes(group.retry_tid) + loc
            state = group.state_of(group.retry_tid, ready_key)
            return state, tries + (0 if state is MessageState.READY else 1), why, None

    def pending(
        self, topic: str | None, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[MessageView]:
        """Pending messages in due order, filtered by topic and ``[start_ms, end_ms)``."""
        tid = None
        if topic is not None:
            tid = self._core.topic_ids.get(topic)
            if tid is None:
                return []
        lower = max(K.wheel_key(start_ms or 0, 0), self._core.fired_upto)
        upper = K.wheel_key(end_ms, 0) if end_ms is not None else b"\xff" * 17
        out: list[MessageView] = []
        while len(out) < limit and lower < upper:
            rows = self._core.store.scan(K.CF_WHEEL, lower, upper, 1024)
            for _key, record in rows:
                rec = Record(record)
                # a retry waits in %RETRY%<group> but still counts for its first topic
                if tid is not None and tid not in (rec.tid, K.id_tid(rec.raw_id)):
                    continue
                out.append(self._view(rec.raw_id.hex(), record, MessageState.PENDING))
                if len(out) >= limit:
                    break
            if len(rows) < 1024:
                break
            lower = K.next_key(rows[-1][0])
        return out
