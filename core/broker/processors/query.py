"""QUERY_MESSAGE (by key, through the key index) and VIEW_MESSAGE_BY_ID (QueryMessageProcessor)."""

from __future__ import annotations

import logging
import time

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.errors import CorruptDataError
from tidemq.message import decode_message
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)

MAX_QUERY_NUM = 64  # defaultQueryMaxNum of RocketMQ's MessageStoreConfig


class QueryProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    async def query_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "QUERY_MESSAGE")
        topic, key = h.str("topic"), h.str("key")
        max_num = h.int("maxNum", MAX_QUERY_NUM)
        begin, end = h.int("beginTimestamp", 0), h.int("endTimestamp", int(time.time() * 1000))
        unique = h.bool("_UNIQUE_KEY_QUERY")
        if unique:
            max_num = MAX_QUERY_NUM
        max_num = max(1, min(max_num, MAX_QUERY_NUM))
        if b.index is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, "this broker runs without a key index")
        result = b.index.query(topic, key, max_num, begin, end)
        parts: list[bytes] = []
        for phy in result.phy_offsets:
            raw = b.store.look_message_by_offset(phy)
            if raw is None:
                continue
            try:
                msg = decode_message(raw, with_body=False)
            except CorruptDataError:
                continue
            # The index hashes keys, so candidates are re-checked against the real key.
            if msg.topic != topic or (key not in msg.keys and msg.uniq_key != key):
                continue
            parts.append(bytes(raw))
            if len(parts) >= max_num:
                break
        fields = kv(
            indexLastUpdateTimestamp=result.last_update_timestamp,
            indexLastUpdatePhyoffset=result.last_update_phy_offset,
        )
        if not parts:
            return request.reply(
                ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields
            )
        return request.reply(ResponseCode.SUCCESS, None, fields, body_parts=tuple(parts))

    async def view_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        offset = Header(request.ext_fields, "VIEW_MESSAGE_BY_ID").int("offset")
        raw = self.broker.store.look_message_by_offset(offset) if offset >= 0 else None
        if raw is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return request.reply(ResponseCode.SUCCESS, body=bytes(raw))


def register(register: ProcessorRegister) -> None:
    p = QueryProcessor(register.context)
    register.add(RequestCode.QUERY_MESSAGE, p.query_message)
    register.add(RequestCode.VIEW_MESSAGE_BY_ID, p.view_message)
