"""Consume-queue inspection: QUERY_CONSUME_QUEUE (321) and QUERY_CONSUME_TIME_SPAN (303).

Bodies as RocketMQ 4.9's AdminBrokerProcessor sends them (QueryConsumeQueueResponseBody,
QueryConsumeTimeSpanBody); fastjson leaves out null fields, and so do these.  Under a confirm
offset both show a queue up to its readable end only, as RocketMQ 5's consume queues, dispatched
up to the confirm offset, hold it (:mod:`tidemq.broker.services.readable`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.services.readable import ReadableQueues
from tidemq.message import iter_messages, tags_hash_code
from tidemq.mqjson import mq_to_json
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import store_introspection
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.services import BrokerServices

#: Entries one QUERY_CONSUME_QUEUE returns at most (RocketMQ stops at the end of the mapped file).
MAX_COUNT = 1000


def cq_entry(b: BrokerContext, topic: str, queue_id: int, index: int) -> tuple[int, int, int] | None:
    """(commit-log offset, size, tags code) of a consume-queue entry; None outside the queue."""
    store = store_introspection(b.store)
    if store is not None:  # the entry as the store holds it
        return store.queue_entry(topic, queue_id, index)
    phy = b.store.get_commit_log_offset(topic, queue_id, index)
    if phy < 0:
        return None
    data = b.store.look_message_by_offset(phy)
    if not data:
        return None
    msg = next(iter_messages(data), None)
    return phy, len(data), tags_hash_code(msg.tags if msg is not None else None)


class QueueQueryProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.queues = ReadableQueues(broker)

    async def query_consume_queue(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """QUERY_CONSUME_QUEUE: ``count`` raw entries of one consume queue from ``index``."""
        b = self.broker
        h = Header(request.ext_fields, "QUERY_CONSUME_QUEUE")
        topic, queue_id = h.str("topic"), h.int("queueId")
        index, count = h.int("index"), h.int("count")
        group = h.str("consumerGroup", None)
        if queue_id not in (b.store.topics().get(topic) or ()):
            return request.reply(ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        lo = b.store.get_min_offset_in_queue(topic, queue_id)
        hi = self.queues.max_offset(topic, queue_id)  # entries past the confirm offset: not there
        body: dict[str, Any] = {"maxQueueIndex": hi, "minQueueIndex": lo}
        if group is not None:
            sub = b.consumers.find_subscription(group, topic)
            if sub is None:
                body["filterData"] = f"{group}@{topic} is not online!"
            else:
                body["subscriptionData"] = sub.to_json()
                # RocketMQ's ConsumerFilterData exists for SQL92 subscriptions only (else "null").
                filter_data: Any = None
                if sub.expression_type != "TAG":
                    filter_data = {
                        "consumerGroup": group,
                        "expression": sub.sub_string,
                        "expressionType": sub.expression_type,
                        "topic": topic,
                    }
                body["filterData"] = orjson.dumps(filter_data, option=orjson.OPT_INDENT_2).decode()
        if not lo <= index < hi:
            # RocketMQ answers SUCCESS without a body when the index is outside the queue.
            return request.reply(ResponseCode.SUCCESS, f"Index {index} of {queue_id}@{topic} is not exist!")
        rows = []
        for i in range(index, min(hi, index + max(min(count, MAX_COUNT), 0))):
            entry = cq_entry(b, topic, queue_id, i)
            if entry is None:
                break
            rows.append(
                {"eval": False, "physicOffset": entry[0], "physicSize": entry[1], "tagsCode": entry[2]}
            )
        body["queueData"] = rows
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))

    async def query_time_span(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """QUERY_CONSUME_TIME_SPAN: per queue, the store times of the oldest, newest and consumed message."""
        b = self.broker
        h = Header(request.ext_fields, "QUERY_CONSUME_TIME_SPAN")
        topic, group = h.str("topic"), h.str("group")
        cfg = b.topics.get(topic)
        if cfg is None:
            return request.reply(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = b.store
        now = int(time.time() * 1000)
        spans = []
        for qid in range(cfg.write_queue_nums):
            lo = store.get_min_offset_in_queue(topic, qid)
            hi = self.queues.max_offset(topic, qid)  # the readable end (the confirm offset's)
            min_time = store.get_store_time(topic, qid, lo) if hi > lo else -1
            max_time = store.get_store_time(topic, qid, hi - 1) if hi > lo else -1
            consumed = b.offsets.query(group, topic, qid)
            if consumed > 0:  # -1 past the readable end, as RocketMQ's undispatched entry
                consume_time = store.get_store_time(topic, qid, consumed - 1) if consumed <= hi else -1
            else:
                consume_time = min_time
            delay = 0
            if consumed < hi:
                # The next message to consume; a group without an offset starts at the oldest.
                next_time = store.get_store_time(topic, qid, max(consumed, lo))
                if next_time > 0:
                    delay = now - next_time
            spans.append(
                {
                    "consumeTimeStamp": consume_time,
                    "delayTime": delay,
                    "maxTimeStamp": max_time,
                    "messageQueue": mq_to_json(MessageQueue(topic, b.settings.name, qid)),
                    "minTimeStamp": min_time,
                }
            )
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"consumeTimeSpanSet": spans}))


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers."""
    p = QueueQueryProcessor(register.context)
    register.add(RequestCode.QUERY_CONSUME_QUEUE, p.query_consume_queue)
    register.add(RequestCode.QUERY_CONSUME_TIME_SPAN, p.query_time_span)
