"""POP over remoting (RocketMQ 5): the codec over :mod:`tidemq.broker.services.pop`.

POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION and
POLLING_INFO with RocketMQ 5's header field names; the POP answer's body is the stored records, as
a pull's.  QUERY_ASSIGNMENT and SET_MESSAGE_REQUEST_MODE
(:mod:`tidemq.broker.pop.assignment`) too.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable
from typing import Any

import orjson

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header, HeaderFieldError, kv
from tidemq.broker.pop.acks import AckRequest
from tidemq.broker.pop.handle import info_items, retry_mark
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.pop import INVALID_PARAMETER, MAX_BATCH_ACK, POLLING_TIMEOUT, PopError, PopService
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection, Failed

#: Offsets one BatchAck's bit set may name (8 KiB of bits).
MAX_BITSET_BYTES = 8192


def bitset_offsets(encoded: Any, start: int) -> list[int]:
    """Offsets a BatchAck's ``b`` names: fastjson's base64 of Java's ``BitSet.toByteArray()``
    (little-endian; bit i is ``start + i``)."""
    if not isinstance(encoded, str):
        raise ValueError("the bit set 'b' is not a base64 string")
    raw = base64.b64decode(encoded, validate=True)
    if len(raw) > MAX_BITSET_BYTES:
        raise ValueError(f"the bit set holds {len(raw) * 8} bits; at most {MAX_BITSET_BYTES * 8} are taken")
    bits = int.from_bytes(raw, "little")
    out = []
    i = 0
    while bits:
        if bits & 1:
            out.append(start + i)
        bits >>= 1
        i += 1
    return out


def encode_bitset(offsets: list[int], start: int) -> str:
    bits = 0
    for o in offsets:
        bits |= 1 << (o - start)
    return base64.b64encode(bits.to_bytes((bits.bit_length() + 7) // 8 or 1, "little")).decode()


class PopProcessor:
    def __init__(self, service: PopService, broker_name: str) -> None:
        self.pop_service = service
        self.broker_name = broker_name

    async def pop(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        h = Header(request.ext_fields, "POP_MESSAGE")
        try:
            poll_ms = h.int("pollTime", 0)
            result = await self.pop_service.pop(
                h.str("consumerGroup"),
                h.str("topic"),
                h.int("queueId", -1),
                h.int("maxMsgNums", 32),
                h.int("invisibleTime"),
                poll_ms,
                h.int("initMode", 0),
                h.str("expType", "TAG") or "TAG",
                h.str("exp", "*") or "*",
                h.bool("order"),
                closed=lambda: conn.closed,
            )
        except HeaderFieldError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        await self.pop_service.durable()
        if conn.closed:
            return None
        fields = kv(
            popTime=result.pop_time,
            invisibleTime=result.invisible_ms,
            reviveQid=result.revive_qid,
            restNum=result.rest_num,
        )
        if not result.found:
            code = POLLING_TIMEOUT if poll_ms > 0 else ResponseCode.PULL_NOT_FOUND
            return request.reply(code, "NO_MATCHED_MESSAGE", fields)
        fields["startOffsetInfo"] = info_items(
            (retry_mark(b.topic), b.queue_id, str(b.start)) for b in result.batches
        )
        fields["msgOffsetInfo"] = info_items(
            (retry_mark(b.topic), b.queue_id, ",".join(map(str, b.offsets))) for b in result.batches
        )
        if result.revive_qid != 0:  # FIFO: the attempt count the client shows as reconsumeTimes
            fields["orderCountInfo"] = info_items(
                (retry_mark(b.topic), b.queue_id, str(b.attempt)) for b in result.batches
            )
        parts = tuple(buf for b in result.batches for buf in b.wire)
        return request.reply(ResponseCode.SUCCESS, None, fields, body_parts=parts)

    async def peek(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "PEEK_MESSAGE")
        try:
            result = self.pop_service.peek(
                h.str("consumerGroup"), h.str("topic"), h.int("queueId", -1), h.int("maxMsgNums", 32)
            )
        except HeaderFieldError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        fields = kv(popTime=result.pop_time, invisibleTime=0, reviveQid=0, restNum=result.rest_num)
        if not result.found:
            return request.reply(ResponseCode.PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE", fields)
        parts = tuple(buf for b in result.batches for buf in b.wire)
        return request.reply(ResponseCode.SUCCESS, None, fields, body_parts=parts)

    async def batch_ack(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            body = orjson.loads(request.payload() or b"null")
        except orjson.JSONDecodeError as exc:
            return request.reply(INVALID_PARAMETER, f"the BATCH_ACK_MESSAGE body is not JSON: {exc}")
        acks = body.get("acks") if isinstance(body, dict) else None
        if not isinstance(acks, list) or not acks:
            return request.reply(ResponseCode.NO_MESSAGE, "the BATCH_ACK_MESSAGE body names no acks")
        if len(acks) > MAX_BATCH_ACK:
            return request.reply(
                INVALID_PARAMETER,
                f"{len(acks)} BatchAck entries in one request; at most {MAX_BATCH_ACK} are taken",
            )
        done = refused = 0
        problems: list[str] = []
        for entry in acks:
            try:
                if not isinstance(entry, dict):
                    raise ValueError("a BatchAck entry is not an object")
                start = int(_pick(entry, "so", "startOffset"))
                offsets = bitset_offsets(_pick(entry, "b", "bitSet"), start)
                ok, bad = self.pop_service.batch_ack(
                    str(_pick(entry, "c", "consumerGroup")),
                    str(_pick(entry, "t", "topic")),
                    str(_pick(entry, "r", "retry")),
                    int(_pick(entry, "q", "queueId")),
                    start,
                    int(_pick(entry, "pt", "popTime")),
                    int(_pick(entry, "it", "invisibleTime")),
                    int(_pick(entry, "rq", "reviveQueueId")),
                    offsets,
                )
                done += ok
                refused += bad
            except PopError as exc:
                refused += 1
                problems.append(exc.remark)
            except (KeyError, TypeError, ValueError, binascii.Error) as exc:
                refused += 1
                problems.append(f"malformed BatchAck entry: {exc}")
        await self.pop_service.durable()
        if refused:
            detail = f"; first problem: {problems[0]}" if problems else ""
            return request.reply(
                ResponseCode.NO_MESSAGE,
                f"acknowledged {done}, refused {refused} (not in flight for the group, or already acknowledged){detail}",
            )
        return request.reply(ResponseCode.SUCCESS)

    async def change_invisible(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "CHANGE_MESSAGE_INVISIBLETIME")
        try:
            pop_time, invisible, rqid = self.pop_service.change_invisible(
                h.str("consumerGroup"),
                h.str("topic"),
                h.int("queueId"),
                h.int("offset"),
                h.str("extraInfo"),
                h.int("invisibleTime"),
            )
        except HeaderFieldError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        await self.pop_service.durable()
        return request.reply(
            ResponseCode.SUCCESS, None, kv(popTime=pop_time, invisibleTime=invisible, reviveQid=rqid)
        )

    async def notification(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        h = Header(request.ext_fields, "NOTIFICATION")
        try:
            has = await self.pop_service.notification(
                h.str("consumerGroup"), h.str("topic"), h.int("queueId", -1), h.int("pollTime", 0)
            )
        except HeaderFieldError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        if conn.closed:
            return None
        return request.reply(ResponseCode.SUCCESS, None, kv(hasMsg=has, pollingFull=False))

    async def polling_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "POLLING_INFO")
        try:
            topic = h.str("topic")
            self.pop_service.check_group(h.str("consumerGroup"))
            self.pop_service.check_topic(topic, h.int("queueId", -1), any_queue=True)
        except HeaderFieldError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        return request.reply(ResponseCode.SUCCESS, None, kv(pollingNum=self.pop_service.polling_num(topic)))

    async def query_assignment(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            body = orjson.loads(request.payload() or b"null")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
            topic, group = str(body["topic"]), str(body["consumerGroup"])
            client_id = str(body.get("clientId") or "")
            model = str(body.get("messageModel") or "CLUSTERING")
        except (orjson.JSONDecodeError, KeyError, ValueError) as exc:
            return request.reply(INVALID_PARAMETER, f"QUERY_ASSIGNMENT body: {exc}")
        try:
            mode, queues = self.pop_service.assignment(topic, group, client_id, model)
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        name = self.broker_name
        out = {
            "messageQueueAssignments": [
                {
                    "messageQueue": {"topic": topic, "brokerName": name, "queueId": q},
                    "mode": mode,
                    "attachments": {},
                }
                for q in queues
            ]
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(out))

    async def set_request_mode(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            body = orjson.loads(request.payload() or b"null")
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
            topic, group = str(body["topic"]), str(body["consumerGroup"])
            mode = str(body.get("mode") or "PULL")
            share = int(body.get("popShareQueueNum") or 0)
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            return request.reply(INVALID_PARAMETER, f"SET_MESSAGE_REQUEST_MODE body: {exc}")
        if topic.startswith("%RETRY%"):
            return request.reply(ResponseCode.NO_PERMISSION, "retry topic is not allowed to set mode")
        try:
            self.pop_service.check_topic(topic, -1, any_queue=True)
            self.pop_service.check_group(group)
            self.pop_service.modes.set(topic, group, mode, share)
        except PopError as exc:
            return request.reply(exc.code, exc.remark)
        except ValueError as exc:
            return request.reply(INVALID_PARAMETER, str(exc))
        return request.reply(ResponseCode.SUCCESS)


class AckProcessor:
    """ACK_MESSAGE, one request alone or every ACK_MESSAGE of one read together (a
    :class:`~tidemq.transport.BatchedProcessor`): their acks are taken with one revive-log record,
    and each answer is built here, without a coroutine per request."""

    def __init__(self, service: PopService) -> None:
        self.pop_service = service

    async def __call__(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        answer = self.many(conn, [request], _raise)[0]
        if isinstance(answer, RemotingCommand):
            return answer
        response = await answer
        assert response is not None  # _after answers a command
        return response

    def many(
        self, conn: Connection, requests: list[RemotingCommand], failed: Failed
    ) -> list[RemotingCommand | Awaitable[RemotingCommand | None]]:
        answers: dict[int, RemotingCommand] = {}
        acks: list[AckRequest] = []
        places: list[int] = []
        for i, request in enumerate(requests):
            h = Header(request.ext_fields, "ACK_MESSAGE")
            try:
                acks.append(
                    (
                        h.str("consumerGroup"),
                        h.str("topic"),
                        h.int("queueId"),
                        h.int("offset"),
                        h.str("extraInfo"),
                    )
                )
                places.append(i)
            except HeaderFieldError as exc:
                answers[i] = request.reply(INVALID_PARAMETER, str(exc))
        if acks:
            for i, refusal in zip(places, self.pop_service.ack_many(acks), strict=True):
                request = requests[i]
                answers[i] = (
                    request.reply(ResponseCode.SUCCESS)
                    if refusal is None
                    else request.reply(refusal.code, refusal.remark)
                )
        ordered = [answers[i] for i in range(len(requests))]
        settling = self.pop_service.settle()
        if settling is None:
            return list(ordered)
        shared = asyncio.ensure_future(settling)
        return [_after(shared, a) for a in ordered]


async def _after(settling: asyncio.Future[None], answer: RemotingCommand) -> RemotingCommand:
    """``answer`` once the revive-log records it depends on are flushed and replicated."""
    await asyncio.shield(settling)
    return answer


def _raise(request: RemotingCommand, exc: Exception) -> RemotingCommand:
    raise exc


def _pick(entry: dict[str, Any], short: str, long: str) -> Any:
    """A BatchAck field by its JSON name or its alternate name (fastjson's alternateNames)."""
    if short in entry:
        return entry[short]
    return entry[long]


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = PopProcessor(services.pop, register.context.settings.name)
    register.add(RequestCode.POP_MESSAGE, p.pop)
    register.add(RequestCode.PEEK_MESSAGE, p.peek)
    register.add(RequestCode.ACK_MESSAGE, AckProcessor(services.pop))
    register.add(RequestCode.BATCH_ACK_MESSAGE, p.batch_ack)
    register.add(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, p.change_invisible)
    register.add(RequestCode.NOTIFICATION, p.notification)
    register.add(RequestCode.POLLING_INFO, p.polling_info)
    register.add(RequestCode.QUERY_ASSIGNMENT, p.query_assignment)
    register.add(RequestCode.SET_MESSAGE_REQUEST_MODE, p.set_request_mode)
