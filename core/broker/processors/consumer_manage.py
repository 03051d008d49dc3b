"""GET_CONSUMER_LIST_BY_GROUP, QUERY/UPDATE_CONSUMER_OFFSET and LOCK/UNLOCK_BATCH_MQ."""

from __future__ import annotations

from typing import Any

import orjson

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection


def _mq_json(mq: MessageQueue) -> dict[str, Any]:
    return {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id}


def _parse_mqs(items: Any) -> list[MessageQueue]:
    return [
        MessageQueue(str(i["topic"]), str(i.get("brokerName", "")), int(i["queueId"])) for i in items or []
    ]


class ConsumerManageProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    async def consumer_list(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        group = Header(request.ext_fields, "GET_CONSUMER_LIST_BY_GROUP").str("consumerGroup")
        info = self.broker.consumers.get(group)
        if info is None or not info.channels:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"consumerIdList": info.client_ids()}))

    async def query_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "QUERY_CONSUMER_OFFSET")
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        offset = b.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return request.reply(ResponseCode.SUCCESS, None, kv(offset=offset))
        # A group's first start: RocketMQ lets it read from 0 while the queue's head is still
        # stored (no message was ever deleted); otherwise the client picks its ConsumeFromWhere.
        if b.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return request.reply(ResponseCode.SUCCESS, None, kv(offset=0))
        return request.reply(
            ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
        )

    async def update_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "UPDATE_CONSUMER_OFFSET")
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        offset = h.int("commitOffset")
        b.offsets.commit(group, topic, queue_id, offset)
        b.stats.on_commit(group, topic, queue_id)
        return request.reply(ResponseCode.SUCCESS)

    async def lock_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = orjson.loads(request.payload() or b"{}")
            group, client_id, mqs = (
                str(data["consumerGroup"]),
                str(data["clientId"]),
                _parse_mqs(data.get("mqSet")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed LOCK_BATCH_MQ body: {exc}")
        locked = self.broker.locks.try_lock_batch(group, mqs, client_id)
        return request.reply(
            ResponseCode.SUCCESS, body=orjson.dumps({"lockOKMQSet": [_mq_json(m) for m in locked]})
        )

    async def unlock_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = orjson.loads(request.payload() or b"{}")
            group, client_id, mqs = (
                str(data["consumerGroup"]),
                str(data["clientId"]),
                _parse_mqs(data.get("mqSet")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed UNLOCK_BATCH_MQ body: {exc}")
        self.broker.locks.unlock_batch(group, mqs, client_id)
        return request.reply(ResponseCode.SUCCESS)


def register(register: ProcessorRegister) -> None:
    p = ConsumerManageProcessor(register.context)
    register.add(RequestCode.GET_CONSUMER_LIST_BY_GROUP, p.consumer_list)
    register.add(RequestCode.QUERY_CONSUMER_OFFSET, p.query_offset)
    register.add(RequestCode.UPDATE_CONSUMER_OFFSET, p.update_offset)
    register.add(RequestCode.LOCK_BATCH_MQ, p.lock_batch)
    register.add(RequestCode.UNLOCK_BATCH_MQ, p.unlock_batch)
