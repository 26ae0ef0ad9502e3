"""The dead-letter contract: ``dead_letters``, ``requeue_dead``, ``purge_dead`` and
``count_pending``.

The part of the broker contract (:mod:`broker_adapter.base`) that looks at what a
group gave up on and at how much is pending; ``BrokerAdapter`` inherits it, and
:class:`~broker_adapter.dead_letter_calls.DeadLetterCalls` implements it for the
adapters. Its docstrings are the contract, as the broker's are: every adapter
keeps each sentence, and ``tests/conformance/`` has a test for each.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from broker_adapter.results import DeadLetterPage, PendingCounts


class DeadLetterContract(abc.ABC):
    """A broker's dead letters and pending counts (a part of ``BrokerAdapter``)."""

    @abc.abstractmethod
    def dead_letters(
        self,
        group: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        with_body: bool = False,
    ) -> DeadLetterPage:
        """A page of ``group``'s dead letters, oldest death first, without consuming them.

        A dead letter is a message the group gave up on: nacked after its last
        attempt (``max_attempts``) or moved by ``dead_letter()``, and not requeued or
        purged since. Each view has ``state`` ``DEAD``, the message's id and
        *original* ``topic`` (not ``%DLQ%<group>``), ``error`` the reason given to
        ``nack``/``dead_letter`` (``None`` when none was given), ``attempts`` the
        deliveries made to the group, ``key``, ``tags``, ``deliver_at_ms`` the time it
        became a dead letter (broker time), ``groups`` ``{group: DEAD}``, and with
        ``with_body`` its body. Dead letters are kept as long as the broker keeps
        fired messages (its retention time).

        Pass the page's ``cursor`` back for the next page; ``None`` means no more. A
        page holds at most ``limit`` dead letters and may hold fewer, even none,
        before the last: each call does bounded work. A group the broker never saw
        has none (an empty last page).

        :raises InvalidTopic: for a bad group name.
        :raises InvalidArgument: for ``limit`` < 1 or a malformed cursor.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def requeue_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """Give ``group``'s dead letters another chance: each one named in ``msg_ids``
        (with ``None``: up to ``limit`` of the oldest) goes back to that group only,
        as a fresh delivery due now on its original topic with ``attempts`` reset to 0
        (the next pull counts 1), and is no longer a dead letter. Other groups are
        unaffected. Returns how many were requeued: an id that is not a dead letter
        of the group (unknown, malformed, never dead, already requeued or purged) is
        skipped and not counted. The work per call is bounded (at most ``limit``
        dead letters, each chunk atomic): to requeue them all, call again until it
        answers 0. The requeue is durable, and the group's ``dead`` in ``stats()``
        goes down by as many.

        :raises InvalidTopic: for a bad group name.
        :raises InvalidArgument: for ``limit`` < 1, ``msg_ids`` that is not a list or
            tuple of str (a single id goes in a list), or more than ``limit`` ids.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def purge_dead(
        self, group: str, msg_ids: Sequence[str] | None = None, *, limit: int = 1000
    ) -> int:
        """Drop ``group``'s dead letters for good: each one named in ``msg_ids`` (with
        ``None``: up to ``limit`` of the oldest) is no longer a dead letter, and the
        group's state of it (``query``'s ``groups``) becomes ``DONE``. Counts, skips
        and bounds are those of :meth:`requeue_dead`; the purge is durable.

        :raises InvalidTopic: for a bad group name.
        :raises InvalidArgument: as for :meth:`requeue_dead`.
        :raises BrokerClosed: when the broker is closed.
        """

    @abc.abstractmethod
    def count_pending(self, edges_ms: Sequence[int], *, topic: str | None = None) -> PendingCounts:
        """How many pending messages are due in each bucket between ``edges_ms``:
        ``counts[i]`` counts those due in ``[edges_ms[i], edges_ms[i + 1])``, so there
        are ``len(edges_ms) - 1`` counts (e.g. edges now, +1 h, +1 d, +1 w).

        Pending means on the timing wheel and not aborted: messages not yet fired
        and retries waiting for their time. ``topic`` counts only the messages first
        sent to it (its retries included); a topic without pending messages counts
        zeros. The call does bounded work however many messages are pending (well
        under 100 ms with a million): where an adapter cannot count exactly within
        that bound it answers ``exact=False`` with an estimate, documented by the
        adapter; ``exact=True`` counts are exact at one instant.

        :raises InvalidArgument: unless ``edges_ms`` is a list or tuple of 2 to
            :data:`~broker_adapter.results.MAX_COUNT_EDGES` ints from 0 to
            2**63 - 1 in strictly increasing order.
        :raises InvalidTopic: for a bad topic name.
        :raises BrokerClosed: when the broker is closed.
        """


__all__ = ["DeadLetterContract"]
