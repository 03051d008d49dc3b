"""GET_CONSUMER_LIST_BY_GROUP, QUERY/UPDATE_CONSUMER_OFFSET and LOCK/UNLOCK_BATCH_MQ: the remoting codec
over the offset, client and admin services."""

from __future__ import annotations

from typing import Any

import orjson

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.status import Outcome
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


def _batch_body(request: RemotingCommand, what: str) -> tuple[str, str, list[MessageQueue]] | RemotingCommand:
    """A LOCK/UNLOCK_BATCH_MQ body (LockBatchRequestBody): (group, client id, queues), or the
    SYSTEM_ERROR answer naming ``what`` when it does not parse."""
    try:
        data = orjson.loads(request.payload() or b"{}")
        return str(data["consumerGroup"]), str(data["clientId"]), _parse_mqs(data.get("mqSet"))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed {what} body: {exc}")


class ConsumerManageProcessor:
    def __init__(self, services: BrokerServices):
        self.offsets = services.offsets
        self.admin = services.admin
        self.clients = services.clients

    async def consumer_list(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        group = Header(request.ext_fields, "GET_CONSUMER_LIST_BY_GROUP").str("consumerGroup")
        ids = self.admin.consumer_ids(group)
        if isinstance(ids, Outcome):
            return answer(request, ids)
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"consumerIdList": ids}))

    async def query_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "QUERY_CONSUMER_OFFSET")
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        offset = self.offsets.query(group, topic, queue_id)
        if offset == 0 and not h.bool("setZeroIfNotFound", True):
            # RocketMQ 5's proxy asks for the committed offset only: no first-start 0.
            offset = self.offsets.committed(group, topic, queue_id)
        if isinstance(offset, Outcome):
            return answer(request, offset)
        return request.reply(ResponseCode.SUCCESS, None, kv(offset=offset))

    async def update_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "UPDATE_CONSUMER_OFFSET")
        group, topic, queue_id = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        return answer(request, self.offsets.commit(group, topic, queue_id, h.int("commitOffset")))

    async def lock_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        body = _batch_body(request, "LOCK_BATCH_MQ")
        if isinstance(body, RemotingCommand):
            return body
        group, client_id, mqs = body
        locked = self.clients.lock_queues(group, client_id, mqs)
        return request.reply(
            ResponseCode.SUCCESS, body=orjson.dumps({"lockOKMQSet": [_mq_json(m) for m in locked]})
        )

    async def unlock_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        body = _batch_body(request, "UNLOCK_BATCH_MQ")
        if isinstance(body, RemotingCommand):
            return body
        group, client_id, mqs = body
        return answer(request, self.clients.unlock_queues(group, client_id, mqs))


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = ConsumerManageProcessor(services)
    register.add(RequestCode.GET_CONSUMER_LIST_BY_GROUP, p.consumer_list)
    register.add(RequestCode.QUERY_CONSUMER_OFFSET, p.query_offset)
    register.add(RequestCode.UPDATE_CONSUMER_OFFSET, p.update_offset)
    register.add(RequestCode.LOCK_BATCH_MQ, p.lock_batch)
    register.add(RequestCode.UNLOCK_BATCH_MQ, p.unlock_batch)
