"""Reads bounded by the replication's confirm offset (RocketMQ 5's ``confirmOffset``).

In controller mode a SYNC master stores a message before the members of its in-sync set hold it;
a failover then cuts what they did not acknowledge, and the new epoch reuses the cut tail's queue
offsets.  A consumer that read that tail would skip the new master's messages in those slots.  So
consumers read only what the set acknowledged: :class:`ReadBound` answers a queue's readable end
(the first entry whose record starts at or past the confirm offset) and a ``get_message`` that
stops there.  RocketMQ 5 gets the same effect by dispatching to the consume queues only up to the
confirm offset (``readUnCommitted = false``); tidemq's consume queues are written with the put,
so the bound is applied where consumers read: pulls (and the compiled pull lane), POP, gRPC
receive and the max-offset queries.  The broker's own readers of system queues read through it
too (RocketMQ 5's read the consume queues its bounded dispatch fills): the delay levels
(SCHEDULE_TOPIC_XXXX), the timer's enqueue (rmq_sys_wheel_timer, on slaves too), the transaction
check's half and op queues; a reader held at the bound is woken by the acknowledgement
(:meth:`ReadBound.bind`, :meth:`ReadBound.holds`) or re-polls.

Without a replication that :class:`~tidemq.replication.ConfirmsReads` (master_slave, none), while
it sets no bound (ASYNC groups, ``read_uncommitted``) or while the confirm offset is at the log's
end, every call is the store's own answer, at the cost of one attribute test (``active``) or of
one offset comparison.  The ``controller`` replication bounds a SYNC master by its in-sync set's
acknowledgements and its slaves by the confirm offset their master sends on the HA stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import attrs

from tidemq.filter import MessageFilter
from tidemq.replication import ConfirmsReads
from tidemq.store import GetResult, GetStatus, MessageStore

log = logging.getLogger(__name__)

__all__ = ["ReadBound"]


class ReadBound:
    """The confirm offset as the broker's readers apply it (see the module docstring)."""

    __slots__ = ("_confirm", "_loop", "_rechecks", "active", "store")

    def __init__(self, store: MessageStore, replication: object) -> None:
        self.store = store
        confirms = replication if isinstance(replication, ConfirmsReads) else None
        self._confirm: Callable[[], int | None] | None = confirms.confirm_offset if confirms else None
        #: Whether reads may ever be bounded (a replication that confirms reads).
        self.active = confirms is not None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rechecks: tuple[tuple[Callable[[], None], Callable[[], bool]], ...] = ()
        if confirms is not None:
            confirms.bind_confirm_listener(self._advanced)

    def bind(
        self, loop: asyncio.AbstractEventLoop, recheck: Callable[[], None], waited: Callable[[], bool]
    ) -> None:
        """Held reads: ``recheck`` runs on ``loop`` after each advance of the confirm offset while
        ``waited()`` (any thread, cheap) says something is held."""
        self._loop = loop
        self._rechecks = (*self._rechecks, (recheck, waited))

    def _advanced(self) -> None:
        loop = self._loop
        if loop is None:
            return
        for recheck, waited in self._rechecks:
            if waited():
                try:
                    loop.call_soon_threadsafe(recheck)
                except RuntimeError:  # loop closed during shutdown
                    return

    def holds(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the bound, not the queue's end, stops a read at ``offset`` (stored entries wait
        there for the confirm offset): a reader that :meth:`bind` a recheck waits for it then."""
        if not self.active:
            return False
        limit = self.limit(topic, queue_id)
        return limit is not None and offset >= limit

    def confirm_offset(self) -> int | None:
        """The replication's confirm offset; None when reads are not bounded now."""
        confirm = self._confirm
        return confirm() if confirm is not None else None

    def limit(self, topic: str, queue_id: int) -> int | None:
        """The queue's readable end when it is below its stored end, else None (all readable)."""
        confirm = self._confirm
        if confirm is None:
            return None
        bound = confirm()
        store = self.store
        if bound is None or bound >= store.get_max_phy_offset():
            return None
        hi = store.get_max_offset_in_queue(topic, queue_id)
        if hi <= 0:
            return None
        entry = store.get_commit_log_offset
        if entry(topic, queue_id, hi - 1) < bound:
            return None  # the queue's last record is confirmed (the common case: one lookup)
        # The first entry whose record starts at or past the bound (phy offsets grow along a
        # queue; the set acknowledges whole records, so "starts before" is "ends at or before").
        lo = max(store.get_min_offset_in_queue(topic, queue_id), 0)
        top = hi - 1
        while lo < top:
            mid = (lo + top) // 2
            if entry(topic, queue_id, mid) < bound:
                lo = mid + 1
            else:
                top = mid
        return lo

    def max_offset(self, topic: str, queue_id: int) -> int:
        """``get_max_offset_in_queue`` bounded by the confirm offset."""
        limit = self.limit(topic, queue_id) if self.active else None
        return self.store.get_max_offset_in_queue(topic, queue_id) if limit is None else limit

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        flt: MessageFilter | None = None,
    ) -> GetResult:
        """``store.get_message`` that serves no record past the confirm offset.

        An offset at or past the readable end but within the stored queue is answered
        OFFSET_OVERFLOW_ONE at that same offset (a pull holds there until the set acknowledges);
        ``max_offset`` is the readable end.
        """
        store = self.store
        limit = self.limit(topic, queue_id) if self.active else None
        if limit is None:
            return store.get_message(group, topic, queue_id, offset, max_count, flt)
        if offset >= limit and offset <= store.get_max_offset_in_queue(topic, queue_id):
            return GetResult(
                GetStatus.OFFSET_OVERFLOW_ONE,
                offset,
                store.get_min_offset_in_queue(topic, queue_id),
                limit,
            )
        if offset >= limit:  # past the stored end too: the store's own answer (moved to its end)
            return store.get_message(group, topic, queue_id, offset, max_count, flt)
        result = store.get_message(group, topic, queue_id, offset, min(max_count, limit - offset), flt)
        if result.max_offset > limit:
            result = attrs.evolve(result, max_offset=limit)
        if result.next_begin_offset <= limit:
            return result
        # A filter skipped entries past the bound: keep the records before it, resume there.
        qoffsets = result.queue_offsets
        keep = sum(1 for q in qoffsets if q < limit) if qoffsets else 0
        if not result.buffers or keep == len(result.buffers):
            return attrs.evolve(result, next_begin_offset=limit)
        buffers = result.buffers[:keep]
        status = result.status if buffers else GetStatus.NO_MATCHED_MESSAGE
        return attrs.evolve(
            result,
            status=status,
            next_begin_offset=limit,
            buffers=buffers,
            queue_offsets=qoffsets[:keep],
            wire=(),
        )
