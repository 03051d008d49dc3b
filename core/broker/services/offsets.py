"""Consumer offsets: query, commit and reset (QUERY/UPDATE_CONSUMER_OFFSET, INVOKE_BROKER_TO_RESET_OFFSET)."""

from __future__ import annotations

import attrs

from tidemq.broker.clients import ClientChannel
from tidemq.broker.context import BrokerContext
from tidemq.broker.services.readable import ReadableQueues
from tidemq.broker.services.status import DONE, Outcome, Status
from tidemq.queues import MessageQueue


@attrs.frozen(slots=True)
class OffsetReset:
    """The offsets a group is to restart from, per queue, and the live consumers to tell."""

    table: dict[MessageQueue, int]
    consumers: list[ClientChannel]


class OffsetService:
    """What a consumer group has consumed, per queue."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.queues = ReadableQueues(broker)

    def query(self, group: str, topic: str, queue_id: int) -> int | Outcome:
        """The committed offset, or where a group's first start reads from; QUERY_NOT_FOUND when
        the client is to pick its ConsumeFromWhere."""
        b = self.broker
        offset = b.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return offset
        # A group's first start reads from 0 when the queue never lost its head and entry 0 is
        # still in memory (RocketMQ 5's checkInMemByConsumeOffset) or not there yet: an empty
        # queue, or entry 0 not confirmed.  There RocketMQ 4.9 answers 0 and 5.1+ QUERY_NOT_FOUND;
        # 0 is kept, since NOT_FOUND makes a CONSUME_FROM_LAST_OFFSET client ask for the end next
        # and skip a message stored between its two requests.  A backlog swapped out, or a head
        # deleted: the client picks its ConsumeFromWhere (by default the end, not the backlog).
        queues = self.queues
        if b.store.get_min_offset_in_queue(topic, queue_id) <= 0 and (
            queues.max_offset(topic, queue_id) <= 0 or queues.head_in_memory(topic, queue_id)
        ):
            return 0
        return Outcome(
            Status.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
        )

    def committed(self, group: str, topic: str, queue_id: int) -> int | Outcome:
        """The committed offset only (QUERY_NOT_FOUND without one: RocketMQ 5's setZeroIfNotFound=false)."""
        offset = self.broker.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return offset
        return Outcome(Status.QUERY_NOT_FOUND, f"no committed offset of group {group} in this queue")

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> Outcome:
        """Record ``offset`` as ``group``'s progress in the queue."""
        b = self.broker
        b.offsets.commit(group, topic, queue_id, offset)
        b.stats.on_commit(group, topic, queue_id)
        return DONE

    def reset(self, group: str, topic: str, timestamp: int, force: bool) -> OffsetReset | Outcome:
        """Offsets by time (``-1``: the end of each queue) for every write queue of ``topic``; an
        offset ahead of the committed one is kept unless ``force``.  The group's live consumers
        are to be told (the transport's business); refused when none is online.  Both targets
        stop at the confirm offset (RocketMQ 5 searches its consume queues, dispatched up to it)."""
        b = self.broker
        cfg = b.topics.get(topic)
        if cfg is None:
            return Outcome(
                Status.SYSTEM_ERROR,
                f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}",
            )
        table: dict[MessageQueue, int] = {}
        for qid in range(cfg.write_queue_nums):
            committed = b.offsets.query(group, topic, qid)
            if committed == -1:
                return Outcome(
                    Status.SYSTEM_ERROR,
                    f"THe consumer group <{group}> not exist (no committed offset of {topic} queue {qid})",
                )
            if timestamp == -1:
                target = self.queues.max_offset(topic, qid)
            else:
                target = self.queues.offset_by_time(topic, qid, timestamp)
            target = max(target, 0)
            table[MessageQueue(topic, b.settings.name, qid)] = (
                target if force or target < committed else committed
            )
        channels = b.consumers.live_channels(group)
        if not channels:
            return Outcome(
                Status.CONSUMER_NOT_ONLINE,
                f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} Timestamp: {timestamp}",
            )
        return OffsetReset(table, list(channels))
