"""QUERY_MESSAGE (by key, through the key index) and VIEW_MESSAGE_BY_ID (QueryMessageProcessor): the
remoting codec over :class:`~tidemq.broker.services.messages.MessageService`."""

from __future__ import annotations

import logging
import time

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.messages import MAX_QUERY_NUM, MessageService
from tidemq.broker.services.status import Outcome
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)


class QueryProcessor:
    def __init__(self, service: MessageService):
        self.service = service

    async def query_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "QUERY_MESSAGE")
        topic, key = h.str("topic"), h.str("key")
        max_num = h.int("maxNum", MAX_QUERY_NUM)
        begin, end = h.int("beginTimestamp", 0), h.int("endTimestamp", int(time.time() * 1000))
        result = self.service.query(topic, key, max_num, begin, end, h.bool("_UNIQUE_KEY_QUERY"))
        if isinstance(result, Outcome):
            return answer(request, result)
        fields = kv(
            indexLastUpdateTimestamp=result.index_last_update_timestamp,
            indexLastUpdatePhyoffset=result.index_last_update_phy_offset,
        )
        if not result.records:
            return request.reply(
                ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields
            )
        return request.reply(ResponseCode.SUCCESS, None, fields, body_parts=result.records)

    async def view_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        offset = Header(request.ext_fields, "VIEW_MESSAGE_BY_ID").int("offset")
        raw = self.service.view(offset)
        if isinstance(raw, Outcome):
            return answer(request, raw)
        return request.reply(ResponseCode.SUCCESS, body=raw)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = QueryProcessor(services.messages)
    register.add(RequestCode.QUERY_MESSAGE, p.query_message)
    register.add(RequestCode.VIEW_MESSAGE_BY_ID, p.view_message)
