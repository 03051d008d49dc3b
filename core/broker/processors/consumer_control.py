"""Offset reset and consumer diagnostics, relayed between admin tools and live clients: 222, 223, 314, 308, 307, 309.

As RocketMQ 4.9's ``Broker2Client`` and ``AdminBrokerProcessor``: the broker computes what it can
(offsets by time, the lowest offset of all groups) and asks the group's online clients for the
rest (RESET_CONSUMER_CLIENT_OFFSET, GET_CONSUMER_STATUS_FROM_CLIENT), or hands an admin's
GET_CONSUMER_RUNNING_INFO / CONSUME_MESSAGE_DIRECTLY to the one client named and passes its
answer back unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidemq import mqjson
from tidemq.broker.clients import ClientChannel
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.status import Outcome
from tidemq.message import decode_message_id
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingTimeoutError
from tidemq.transport import Connection

log = logging.getLogger(__name__)

#: Broker2Client.callClient's wait for a client's answer (ms 10000 in RocketMQ).
CALL_CLIENT_TIMEOUT_S = 10.0
#: getConsumeStatus' wait per client (invokeSync 5000 ms).
STATUS_TIMEOUT_S = 5.0
#: resetOffset's oneway send per client.
ONEWAY_TIMEOUT_S = 5.0
LONG_MAX = 2**63 - 1


def reset_body(table: dict[MessageQueue, int], for_cpp: bool) -> bytes:
    """ResetOffsetBody (fastjson map), or ResetOffsetBodyForC (a list) for rocketmq-client-cpp."""
    if for_cpp:
        rows = [{**mqjson.mq_to_json(mq), "offset": off} for mq, off in table.items()]
        return mqjson.dumps({"offsetTable": rows})
    return mqjson.dumps({"offsetTable": table})


class ConsumerControlProcessor:
    def __init__(self, broker: BrokerContext, services: BrokerServices):
        self.broker = broker
        self.offsets = services.offsets

    # ------------------------------------------------------------------ 222
    async def reset_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET: offsets by time, pushed to every online client of the group."""
        h = Header(request.ext_fields, "INVOKE_BROKER_TO_RESET_OFFSET")
        topic, group, timestamp = h.str("topic"), h.str("group"), h.int("timestamp")
        force = h.bool("isForce", False)
        reset = self.offsets.reset(group, topic, timestamp, force)
        if isinstance(reset, Outcome):
            return answer(request, reset)
        table = reset.table
        fields = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
        # RocketMQ picks the C++ body by the admin's language; a mixed group needs it per client.
        admin_cpp = request.language == "CPP"
        await asyncio.gather(
            *(
                self._send_reset(ch, fields, reset_body(table, admin_cpp or ch.language == "CPP"))
                for ch in reset.consumers
            )
        )
        return request.reply(ResponseCode.SUCCESS, body=reset_body(table, False))

    async def _send_reset(self, ch: ClientChannel, fields: dict[str, Any], body: bytes) -> None:
        req = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fields, body)
        req.mark_oneway()
        try:
            await asyncio.wait_for(ch.conn.invoke_oneway(req), ONEWAY_TIMEOUT_S)
            log.info("[reset-offset] sent to %s (%s)", ch.client_id, ch.address)
        except Exception as exc:
            log.warning("[reset-offset] cannot reach %s (%s): %s", ch.client_id, ch.address, exc)

    # ------------------------------------------------------------------ 223
    async def consumer_status(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS: each client's offsets of the topic (clientAddr: one)."""
        h = Header(request.ext_fields, "INVOKE_BROKER_TO_GET_CONSUMER_STATUS")
        topic, group, only = h.str("topic"), h.str("group"), h.str("clientAddr", "")
        channels = [
            ch for ch in self.broker.consumers.live_channels(group) if not only or ch.client_id == only
        ]
        if not self.broker.consumers.live_channels(group):
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"No Any Consumer online in the consumer group: [{group}]"
            )
        ask = {"topic": topic, "group": group}

        async def one(ch: ClientChannel) -> tuple[str, dict[MessageQueue, Any] | None]:
            req = RemotingCommand.request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, ask)
            try:
                resp = await ch.conn.invoke(req, STATUS_TIMEOUT_S)
                if resp.code != ResponseCode.SUCCESS or not resp.body:
                    return ch.client_id, None
                return ch.client_id, mqjson.mq_map(mqjson.loads(resp.body).get("messageQueueTable"))
            except Exception as exc:
                log.warning("[get-consumer-status] %s of %s: %s", ch.client_id, group, exc)
                return ch.client_id, None

        answers = await asyncio.gather(*(one(ch) for ch in channels))
        table = {cid: offsets for cid, offsets in answers if offsets is not None}
        body = mqjson.dumps({"consumerTable": table, "messageQueueTable": {}})
        return request.reply(ResponseCode.SUCCESS, body=body)

    # ------------------------------------------------------------------ 314, 308
    async def clone_group_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CLONE_GROUP_OFFSET: copy srcGroup's offsets (of one topic, or all it has) to destGroup."""
        b = self.broker
        h = Header(request.ext_fields, "CLONE_GROUP_OFFSET")
        src, dest, only = h.str("srcGroup"), h.str("destGroup"), h.str("topic", "")
        offline = h.bool("offline", False)
        topics = [only] if only else sorted(b.offsets.topics_of_group(src))
        info = b.consumers.get(src)
        for topic in topics:
            if b.topics.get(topic) is None:
                log.warning("[cloneGroupOffset] topic config not exist, %s", topic)
                continue
            # An online source group that does not subscribe the topic has no offsets worth copying.
            if not offline and info is not None and info.subscriptions and topic not in info.subscriptions:
                log.warning("[cloneGroupOffset] the consumer group[%s], topic[%s] not exist", src, topic)
                continue
            b.offsets.clone_offset(src, dest, topic)
        return request.reply(ResponseCode.SUCCESS)

    async def query_correction_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """QUERY_CORRECTION_OFFSET: per queue the lowest offset of all groups but filterGroups, or
        Long.MAX_VALUE where compareGroup is behind it."""
        b = self.broker
        h = Header(request.ext_fields, "QUERY_CORRECTION_OFFSET")
        topic, compare = h.str("topic"), h.str("compareGroup")
        exclude = {g for g in h.str("filterGroups", "").split(",") if g}
        queues = b.offsets.query_all(compare, topic)
        cfg = b.topics.get(topic)
        qids = set(range(cfg.write_queue_nums if cfg else 0)) | set(queues)
        mins = {q: b.store.get_min_offset_in_queue(topic, q) for q in qids}
        correction = b.offsets.min_offset_in_all_groups(topic, exclude, mins)
        for qid, offset in queues.items():
            if qid in correction:
                correction[qid] = LONG_MAX if correction[qid] > offset else correction[qid]
        return request.reply(
            ResponseCode.SUCCESS, body=mqjson.dumps({"correctionOffsets": dict(sorted(correction.items()))})
        )

    # ------------------------------------------------------------------ 307, 309
    async def running_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_CONSUMER_RUNNING_INFO")
        return await self._call_consumer(
            RequestCode.GET_CONSUMER_RUNNING_INFO, request, h.str("consumerGroup"), h.str("clientId")
        )

    async def consume_directly(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY: the message named by msgId (an offset id), to one client."""
        h = Header(request.ext_fields, "CONSUME_MESSAGE_DIRECTLY")
        group, client_id, msg_id = h.str("consumerGroup"), h.str("clientId", ""), h.str("msgId", "")
        try:
            _host, offset = decode_message_id(msg_id)
        except ValueError:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"msgId {msg_id!r} is not an offset message id")
        raw = self.broker.store.look_message_by_offset(offset)
        if raw is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        fields = dict(request.ext_fields or {})
        fields["brokerName"] = self.broker.settings.name
        return await self._call_consumer(
            RequestCode.CONSUME_MESSAGE_DIRECTLY, request, group, client_id, fields, bytes(raw)
        )

    async def _call_consumer(
        self,
        code: int,
        request: RemotingCommand,
        group: str,
        client_id: str,
        fields: dict[str, Any] | None = None,
        body: bytes | None = None,
    ) -> RemotingCommand:
        """RocketMQ's callConsumer: relay to ``client_id`` and answer with what it answered."""
        ch = self.broker.consumers.find_channel(group, client_id)
        if ch is None:
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        relay = RemotingCommand.request(
            code,
            dict(request.ext_fields or {}) if fields is None else fields,
            request.body if body is None else body,
        )
        try:
            resp = await ch.conn.invoke(relay, CALL_CLIENT_TIMEOUT_S)
        except (TimeoutError, RemotingTimeoutError) as exc:
            return request.reply(
                ResponseCode.CONSUME_MSG_TIMEOUT,
                f"consumer <{group}> <{client_id}> Timeout: {exc or 'no answer'}",
            )
        except Exception as exc:
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {exc}"
            )
        return request.reply(resp.code, resp.remark, dict(resp.ext_fields or {}), resp.body)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers."""
    p = ConsumerControlProcessor(register.context, services)
    register.add(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, p.reset_offset)
    register.add(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, p.consumer_status)
    register.add(RequestCode.CLONE_GROUP_OFFSET, p.clone_group_offset)
    register.add(RequestCode.QUERY_CORRECTION_OFFSET, p.query_correction_offset)
    register.add(RequestCode.GET_CONSUMER_RUNNING_INFO, p.running_info)
    register.add(RequestCode.CONSUME_MESSAGE_DIRECTLY, p.consume_directly)
