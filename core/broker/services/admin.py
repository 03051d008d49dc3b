"""The admin reads the remoting processors serve: queue offsets, topic and consumer statistics,
client connections (AdminBrokerProcessor's reads; writes stay with their processors).

Results are typed values; the JSON bodies RocketMQ's tools read (fastjson's MessageQueue-keyed
maps) are the remoting codecs' business.
"""

from __future__ import annotations

import attrs

from tidemq.broker.clients import ClientChannel, ConsumerGroupInfo
from tidemq.broker.context import BrokerContext
from tidemq.broker.services.readable import ReadableQueues
from tidemq.broker.services.status import Outcome, Status
from tidemq.broker.stats import StatsSnapshot
from tidemq.flush import RoundStatistics
from tidemq.queues import MessageQueue
from tidemq.store import store_introspection


@attrs.frozen(slots=True)
class QueueStats:
    """One queue's offsets and the store time of its last message (TopicOffset)."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int


@attrs.frozen(slots=True)
class QueueConsumeStats:
    """How far a group has consumed one queue (OffsetWrapper)."""

    broker_offset: int
    consumer_offset: int
    last_timestamp: int
    #: A queue the group pops (RocketMQ 5, issue 39): its pop offset, None when never popped.
    pull_offset: int | None = None
    #: Popped messages of the queue not yet acknowledged.
    inflight_msg_count: int = 0


@attrs.frozen(slots=True)
class TopicConsumeStats:
    """A group's progress in one topic: per queue, its consume TPS and its total lag."""

    topic: str
    queues: dict[MessageQueue, QueueConsumeStats]
    tps: float
    diff: int


class AdminService:
    """Reads for operators and monitoring tools."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        #: The queue reads bounded by the confirm offset (RocketMQ 5 dispatches only up to it).
        self.queues = ReadableQueues(broker)

    # ------------------------------------------------------------------ offsets of queues
    def max_offset(self, topic: str, queue_id: int) -> int:
        # GET_MAX_OFFSET: the committed end whatever the ``committed`` field says (RocketMQ 5's
        # AdminBrokerProcessor does not read it either).
        return self.queues.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.broker.store.get_min_offset_in_queue(topic, queue_id)

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, upper: bool = False) -> int:
        return self.queues.offset_by_time(topic, queue_id, timestamp, upper)

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        return self.queues.earliest_store_time(topic, queue_id)

    # ------------------------------------------------------------------ statistics
    def topic_stats(self, topic: str) -> dict[MessageQueue, QueueStats] | Outcome:
        """Every queue of ``topic`` with its offsets (GET_TOPIC_STATS_INFO): max(read, write)
        queues, as RocketMQ 5 (a queue only read, after the write queues were cut, still shows)."""
        b = self.broker
        cfg = b.topics.get(topic)
        if cfg is None:
            return Outcome(Status.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store, queues = b.store, self.queues
        table: dict[MessageQueue, QueueStats] = {}
        for qid in range(max(cfg.read_queue_nums, cfg.write_queue_nums)):
            max_off = max(queues.max_offset(topic, qid), 0)
            min_off = max(store.get_min_offset_in_queue(topic, qid), 0)
            last = store.get_store_time(topic, qid, max_off - 1) if max_off > 0 else 0
            table[MessageQueue(topic, b.settings.name, qid)] = QueueStats(min_off, max_off, max(last, 0))
        return table

    def consume_stats(self, group: str, topic: str = "") -> list[TopicConsumeStats]:
        """``group``'s progress in ``topic``, or in every topic it has offsets of (GET_CONSUME_STATS)."""
        topics = [topic] if topic else sorted(self.broker.offsets.topics_of_group(group))
        return self.group_consume_stats(group, topics, read_queues=True)

    def broker_consume_stats(self, only_order: bool) -> list[tuple[str, list[TopicConsumeStats]]]:
        """Every subscription group's progress per topic (GET_BROKER_CONSUME_STATS), ordered topics
        only when ``only_order``."""
        b = self.broker
        out = []
        for group in sorted(b.groups.all()):
            topics = sorted(b.offsets.topics_of_group(group))
            if only_order:
                topics = [t for t in topics if (cfg := b.topics.get(t)) is not None and cfg.order]
            out.append((group, self.group_consume_stats(group, topics, read_queues=False)))
        return out

    def group_consume_stats(
        self, group: str, topics: list[str], read_queues: bool
    ) -> list[TopicConsumeStats]:
        """``group``'s progress per topic it consumes here.

        As AdminBrokerProcessor: a topic the broker lacks is skipped, and so is one the group does
        not subscribe to while it has subscriptions (an online group); offsets below 0 count as 0.
        GET_CONSUME_STATS walks the read queues, GET_BROKER_CONSUME_STATS the write queues.
        """
        b = self.broker
        info = b.consumers.get(group)
        out = []
        for topic in topics:
            cfg = b.topics.get(topic)
            if cfg is None:
                continue
            if info is not None and info.subscriptions and topic not in info.subscriptions:
                continue
            committed = b.offsets.query_all(group, topic)
            table: dict[MessageQueue, QueueConsumeStats] = {}
            diff = 0
            nqueues = cfg.read_queue_nums if read_queues else cfg.write_queue_nums
            for qid in range(nqueues):
                limit = self.queues.limit(topic, qid)
                end = b.store.get_max_offset_in_queue(topic, qid) if limit is None else limit
                broker_off = max(end, 0)
                consumer_off = max(committed.get(qid, 0), 0)
                last = 0
                # RocketMQ reads no store time past the readable end (not dispatched there): 0.
                if 0 < consumer_off and (limit is None or consumer_off <= limit):
                    last = max(b.store.get_store_time(topic, qid, consumer_off - 1), 0)
                diff += broker_off - consumer_off
                popped = b.pop.queue_progress(group, topic, qid)  # POP groups (issue 39)
                pulled, inflight = popped if popped is not None else (None, 0)
                table[MessageQueue(topic, b.settings.name, qid)] = QueueConsumeStats(
                    broker_off, consumer_off, last, pulled, inflight
                )
            out.append(TopicConsumeStats(topic, table, b.stats.group_get_tps(group, topic), diff))
        return out

    def pop_figures(self) -> dict[str, int]:
        """POP consumption's figures for GET_BROKER_RUNTIME_INFO (``popInFlight``, ``popReviveLagMs``...)."""
        return self.broker.pop.figures()

    def timer_figures(self) -> dict[str, str]:
        """Timer messages' figures for GET_BROKER_RUNTIME_INFO (RocketMQ 5's ``timerReadBehind``,
        ``timerOffsetBehind``, ``timerCongestNum``, ``timerEnqueueTps``, ``timerDequeueTps``)."""
        return self.broker.timers.runtime_info()

    def flush_figures(self) -> dict[str, str]:
        """The flush policy's counters for GET_BROKER_RUNTIME_INFO (tidemq's: ``flushRounds``,
        ``flushRequests``; under sync flush how the rounds ran, ``flushInlineRounds``,
        ``flushCompiledRounds``, ``flushGatheredRounds``, ``flushGatherTimeouts``,
        ``flushKicksHeld``, ``flushKicksSparse``, ``flushWorkerGatheredRounds``,
        ``flushWorkerGatherTimeouts``); empty for a store or policy that keeps none."""
        introspection = store_introspection(self.broker.store)
        flush = introspection.flush_statistics() if introspection is not None else None
        if flush is None:
            return {}
        table = {"flushRounds": str(flush.flush_rounds), "flushRequests": str(flush.requests)}
        if isinstance(flush, RoundStatistics):
            rounds = flush.round_stats()
            table.update(
                flushInlineRounds=str(rounds.inline),
                flushCompiledRounds=str(rounds.compiled),
                flushGatheredRounds=str(rounds.gathered),
                flushGatherTimeouts=str(rounds.gather_timeouts),
                flushKicksHeld=str(rounds.kicks_held),
                flushKicksSparse=str(rounds.kicks_sparse),
                flushWorkerGatheredRounds=str(rounds.worker_gathered),
                flushWorkerGatherTimeouts=str(rounds.worker_gather_timeouts),
            )
        return table

    def stats_snapshots(self, name: str, key: str) -> dict[str, StatsSnapshot] | Outcome:
        """Minute, hour and day figures of one stats item (VIEW_BROKER_STATS_DATA)."""
        snaps = self.broker.stats.snapshots(name, key)
        if snaps is None:
            return Outcome(Status.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return snaps

    # ------------------------------------------------------------------ clients
    def producers(self) -> dict[str, list[ClientChannel]]:
        """Every producer group's connections (GET_ALL_PRODUCER_INFO)."""
        return self.broker.producers.table()

    def consumer_group(self, group: str) -> ConsumerGroupInfo | Outcome:
        """The online consumers of ``group`` (GET_CONSUMER_CONNECTION_LIST)."""
        info = self.broker.consumers.get(group)
        if info is None:
            return Outcome(Status.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return info

    def consumer_ids(self, group: str) -> list[str] | Outcome:
        """The client ids of ``group``'s online consumers (GET_CONSUMER_LIST_BY_GROUP)."""
        info = self.broker.consumers.get(group)
        if info is None or not info.channels:
            return Outcome(Status.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return info.client_ids()

    def producer_group(self, group: str) -> list[ClientChannel] | Outcome:
        """The connections of producer ``group`` (GET_PRODUCER_CONNECTION_LIST)."""
        channels = self.broker.producers.channels(group)
        if channels is None:
            return Outcome(Status.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return list(channels)

    def topic_consumed_by(self, topic: str) -> list[str]:
        """Groups subscribed to ``topic``, or with offsets in it (QUERY_TOPIC_CONSUME_BY_WHO)."""
        b = self.broker
        return sorted(set(b.consumers.groups_of_topic(topic)) | b.offsets.groups_of_topic(topic))
