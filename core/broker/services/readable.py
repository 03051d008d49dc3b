"""What the query and admin reads show of a queue under a confirm offset (controller mode).

RocketMQ 5 dispatches its consume queues and its key index only up to the confirm offset
(``ReputMessageService``, ``readUnCommitted = false``), so every read that goes through them sees
only what the in-sync set holds: the max offset (GET_MAX_OFFSET, whose ``committed`` flag the
broker does not read), the offset by time (SEARCH_OFFSET_BY_TIMESTAMP, reset by time), the store
times of queue entries (GET_EARLIEST_MSG_STORETIME, QUERY_CONSUME_TIME_SPAN, the consume and topic
stats), the entries QUERY_CONSUME_QUEUE lists and the records QUERY_MESSAGE finds by key.  tidemq
writes its consume queues and index with the put; :class:`ReadableQueues` applies the broker's
:class:`~tidemq.broker.confirmed.ReadBound` to those reads instead.  A read by commit-log offset
(VIEW_MESSAGE_BY_ID, ``lookMessageByOffset``) is not bounded in RocketMQ and is not here.

Without a bound (``read_bound.active`` False, or the confirm offset at the log's end) every
answer is the store's own.
"""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.replication import ConfirmsReads
from tidemq.store import InMemoryWindow, memory_for_messages, store_introspection


def memory_window(broker: BrokerContext) -> int:
    """Bytes behind the commit log's end a record counts as in memory: ``[broker]
    access_message_in_memory_max_ratio`` (accessMessageInMemoryMaxRatio, 40 %) of the machine's
    memory.  The one place the option is read: the first-start rule below (RocketMQ 5.0's
    checkInDiskByConsumeOffset) and, through :func:`apply_memory_window`, the store's pull rule
    (suggestPullingFromSlave)."""
    return memory_for_messages(broker.settings.access_message_in_memory_max_ratio)


def apply_memory_window(broker: BrokerContext) -> None:
    """Give the store the window its pulls judge ``suggest_pulling_from_slave`` by (at start, and
    when UPDATE_BROKER_CONFIG changes the option)."""
    store = broker.store
    if isinstance(store, InMemoryWindow):
        store.memory_for_messages = memory_window(broker)


class ReadableQueues:
    """The store's queue reads, bounded by the confirm offset as RocketMQ 5's dispatch bounds them."""

    __slots__ = ("broker",)

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def limit(self, topic: str, queue_id: int) -> int | None:
        """The queue's readable end when the confirm offset cuts it, else None (all readable)."""
        bound = self.broker.read_bound
        return bound.limit(topic, queue_id) if bound.active else None

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's readable end (``getMaxOffsetInQueue``, committed)."""
        limit = self.limit(topic, queue_id)
        return self.broker.store.get_max_offset_in_queue(topic, queue_id) if limit is None else limit

    def store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """The store time of the entry at ``offset``; -1 past the readable end (not dispatched)."""
        limit = self.limit(topic, queue_id)
        if limit is not None and offset >= limit:
            return -1
        return self.broker.store.get_store_time(topic, queue_id, offset)

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """The store time of the queue's first readable entry; -1 when none is readable."""
        store = self.broker.store
        return self.store_time(topic, queue_id, store.get_min_offset_in_queue(topic, queue_id))

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, upper: bool = False) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP with RocketMQ 5's ``boundaryType``.

        LOWER (the default): the first readable offset stored at or after ``timestamp``, the
        readable end when none is.  UPPER: the last readable offset stored at or before it (of
        several messages with that very store time, the last), the queue's first offset when none
        is -- RocketMQ's ConsumeQueue answers 0 there, the same offset for a queue that still
        holds its head.
        """
        store = self.broker.store
        if not upper:
            offset = store.get_offset_by_time(topic, queue_id, timestamp)
            limit = self.limit(topic, queue_id) if offset > 0 else None
            return offset if limit is None else min(offset, limit)
        # The last offset at or before ``timestamp`` is one before the first one after it.
        after = store.get_offset_by_time(topic, queue_id, timestamp + 1)
        limit = self.limit(topic, queue_id)
        if limit is not None:
            after = min(after, limit)
        return max(after - 1, store.get_min_offset_in_queue(topic, queue_id), 0)

    def head_in_memory(self, topic: str, queue_id: int) -> bool:
        """Whether the queue's entry 0 is readable and its record still in memory: RocketMQ 5's
        ``checkInMemByConsumeOffset(topic, queueId, 0, 1)`` (the consume queue has entry 0, the
        commit log still has its record, and that record is resident; resident here: at most
        :func:`memory_window` behind the commit log's end, as RocketMQ 5.0 judged it)."""
        store = self.broker.store
        if self.max_offset(topic, queue_id) <= 0:
            return False  # an empty queue (or its entry 0 past the confirm offset): not dispatched
        position = store.get_commit_log_offset(topic, queue_id, 0)
        if position < 0 or position < store.get_min_phy_offset():
            return False
        return store.get_max_phy_offset() - position <= memory_window(self.broker)

    def dispatch_behind(self) -> int:
        """RocketMQ 5's ``dispatchBehindBytes`` (``ReputMessageService.behind()``): the confirm
        offset minus the dispatched offset.  Without a confirm bound the confirm offset is the
        commit log's end (RocketMQ's ``getConfirmOffset`` outside controller mode); with one,
        records past it count as not dispatchable yet, not as behind (RocketMQ's reput stops at
        the confirm offset).  0 for a store that does not say where its dispatch is."""
        store = store_introspection(self.broker.store)
        if store is None:
            return 0
        confirm = self.confirm_offset()
        end = self.broker.store.get_max_phy_offset()
        if confirm is None or confirm > end:
            confirm = end
        return max(confirm - store.dispatched_offset(), 0)

    def confirm_offset(self) -> int | None:
        """The commit-log offset records must end at or before to be readable; None: no bound."""
        replication = self.broker.replication
        if not self.broker.read_bound.active or not isinstance(replication, ConfirmsReads):
            return None
        return replication.confirm_offset()

    def last_readable_record(self, confirm: int) -> tuple[int, int]:
        """The commit-log offset and store time of the newest record before ``confirm`` that a
        consume queue holds ((0, 0) when none): where RocketMQ 5's dispatch, hence its key index,
        has got under that confirm offset.  One bounded look per queue: for the operators'
        queries (QUERY_MESSAGE's header), not a hot path."""
        store = self.broker.store
        bound = self.broker.read_bound
        best = (0, 0)
        for topic, queue_ids in store.topics().items():
            for queue_id in queue_ids:
                end = bound.max_offset(topic, queue_id)
                if end <= max(store.get_min_offset_in_queue(topic, queue_id), 0):
                    continue
                phy = store.get_commit_log_offset(topic, queue_id, end - 1)
                if best[0] < phy < confirm:
                    best = (phy, store.get_store_time(topic, queue_id, end - 1))
        return best

    def record_readable(self, commit_log_offset: int, confirm: int | None) -> bool:
        """Whether the record at ``commit_log_offset`` is confirmed (``confirm`` from
        :meth:`confirm_offset`; the set acknowledges whole records, so starting before it is
        ending at or before it)."""
        return confirm is None or commit_log_offset < confirm
