"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK: the remoting codec
over :class:`~tidemq.broker.services.send.SendService`.

Header in, one service call, response out: :meth:`SendHandler._prepare` reads the send header
(V2's one-letter names as they are) and hands its plain values to ``SendService.prepare``
(``prepare_batch`` for a batch); the send is put (one put for the sends of one read, see
:meth:`SendHandler.many`) and its settled outcome becomes the response.

Request coalescing: the sends of one read reach :meth:`SendHandler.many` together (it is a
:class:`~tidemq.transport.BatchedProcessor`).  Each is prepared on its own, in order (its own
checks, hooks and error), then the messages are stored one put per topic, queue and transaction
type (one lock, one append, one consume-queue write), and each request is answered with its own
message id and queue offset.  A put the store refuses for one bad message (too large, properties
too long) refuses it whole, atomically: the group is then put in halves, in order, halving again
where refused, so that message fails alone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import (
    DEFAULT_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    Header,
    field_bool,
    field_int,
    field_str,
)
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.put import STORED, Send, settled_many
from tidemq.broker.services.send import SendService
from tidemq.broker.services.status import Status
from tidemq.message import Prop
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection, Failed

log = logging.getLogger(__name__)

# SendMessageRequestHeaderV2 names its fields a..m to keep the header small.
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}
_V2_SHORT = frozenset(V2_NAMES)
_V2_BY_LONG = {long: short for short, long in V2_NAMES.items()}
#: The send header's fields, in the order a send reads them (which error a bad header gets).
_FIELDS = (
    "batch",
    "producerGroup",
    "topic",
    "queueId",
    "sysFlag",
    "defaultTopic",
    "defaultTopicQueueNums",
    "properties",
    "reconsumeTimes",
    "maxReconsumeTimes",
    "flag",
    "bornTimestamp",
)
_V2_FIELDS = tuple(_V2_BY_LONG[name] for name in _FIELDS)
_WHAT = "SEND_MESSAGE"
# Enum members as globals: an enum class attribute costs ~0.2 us a lookup.
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)
_SUCCESS = Status.SUCCESS
_SERVICE_NOT_AVAILABLE = int(Status.SERVICE_NOT_AVAILABLE)
#: The answer to a send the duplicate window could not judge in time (its rebuild after a promotion).
REBUILDING = "the duplicate window is being rebuilt after a promotion; send again"
_MSG_REGION = Prop.MSG_REGION
_TRACE_SWITCH = Prop.TRACE_SWITCH


def send_fields(request: RemotingCommand) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The send header's fields and the keys to read :data:`_FIELDS` by.

    V2's one-letter names are read as they are, without a renamed copy per send; a header that
    mixes in other names gets the renamed copy (of two names for one field, the later one wins).
    """
    fields = request.ext_fields
    if request.code == _SEND_MESSAGE_V2 or ("b" in fields and "topic" not in fields):
        if fields.keys() <= _V2_SHORT:
            return fields, _V2_FIELDS
        fields = {V2_NAMES.get(k, k): v for k, v in fields.items()}
    return fields, _FIELDS


def send_response(request: RemotingCommand, send: Send) -> RemotingCommand:
    """A settled send's response (SendMessageResponseHeader when it was stored)."""
    status = send.status
    epoch = send.epoch
    if status is not _SUCCESS and status not in STORED:
        if epoch is not None:
            return request.reply(status, send.remark, {"epoch": str(epoch)})
        return request.reply(status, send.remark)
    properties = send.msgs[0].properties
    fields = {
        "msgId": send.msg_id,
        "queueId": str(send.queue_id),
        "queueOffset": str(send.queue_offset),
        "MSG_REGION": properties.get(_MSG_REGION, "DefaultRegion"),
        "TRACE_ON": properties.get(_TRACE_SWITCH, "true"),
    }
    if epoch is not None:
        # Controller mode (issue 25): the epoch that acknowledged; RocketMQ clients ignore the key.
        fields["epoch"] = str(epoch)
    if send.recall_handle is not None:  # a parked timer message (issue 36)
        fields["recallHandle"] = send.recall_handle
    return request.reply_with(status, send.remark, fields)


class SendHandler:
    """The handler of the send codes: one request (``__call__``) or the sends of one read (``many``)."""

    __slots__ = ("_service",)

    def __init__(self, service: SendService) -> None:
        self._service = service

    @property
    def service(self) -> SendService:
        """The service it calls (the broker's send lane stores through the same one)."""
        return self._service

    def __call__(self, conn: Connection, request: RemotingCommand) -> Awaitable[RemotingCommand]:
        return self.send_message(conn, request)

    async def send_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """One send request of any of the three codes, on its own."""
        window = self._service.broker.dedup
        if not window.serving() and not await window.wait_rebuilt():  # a promotion's rebuild (issue 37)
            return request.reply(_SERVICE_NOT_AVAILABLE, REBUILDING)
        send = self._prepare(conn, request)
        if type(send) is not Send:  # not isinstance: a builtin call less per send
            return send  # type: ignore[return-value]
        service = self._service
        service.put_one(send)
        if not service.settled(send):
            await service.settle(send)
        return send_response(request, send)

    def many(
        self, conn: Connection, requests: list[RemotingCommand], failed: Failed
    ) -> list[RemotingCommand | Awaitable[RemotingCommand | None]]:
        """Prepare and store the sends of one read now; per request, in order, its response or an
        awaitable of it.  ``failed(request, exc)`` answers a request whose header was bad (the
        broker's one error mapping)."""
        service = self._service
        if not service.broker.dedup.serving():  # the duplicate window is rebuilt after a promotion
            return [self._after_rebuild(conn, request, failed) for request in requests]
        prepared: list[Send | RemotingCommand] = []
        sends: list[Send] = []
        for request in requests:
            try:
                item = self._prepare(conn, request)  # a bad header fails this request alone
            except Exception as exc:
                item = failed(request, exc)
            prepared.append(item)
            if type(item) is Send:
                sends.append(item)
        done = [False] * len(sends)
        if sends:
            service.put(sends)  # one call for the read: one put per destination
            settled_many(service.broker, sends, done)  # each put's futures asked once
        out: list[RemotingCommand | Awaitable[RemotingCommand | None]] = []
        ready = iter(done)
        for request, item in zip(requests, prepared, strict=True):
            if type(item) is Send:
                out.append(send_response(request, item) if next(ready) else self._later(request, item))
            else:
                out.append(item)  # type: ignore[arg-type]
        return out

    async def _later(self, request: RemotingCommand, send: Send) -> RemotingCommand:
        await self._service.settle(send)
        return send_response(request, send)

    async def _after_rebuild(
        self, conn: Connection, request: RemotingCommand, failed: Failed
    ) -> RemotingCommand | None:
        """A send that came while the window is rebuilt: served once it is (a resend must be
        known as one), or answered SERVICE_NOT_AVAILABLE, which producers send again."""
        if not await self._service.broker.dedup.wait_rebuilt():
            return request.reply(_SERVICE_NOT_AVAILABLE, REBUILDING)
        out = self.many(conn, [request], failed)[0]
        return out if type(out) is RemotingCommand else await out  # type: ignore[misc]

    def _prepare(self, conn: Connection, request: RemotingCommand) -> Send | RemotingCommand:
        """The header read, the send prepared: the send to store, or the response that ends it here."""
        fields, keys = send_fields(request)
        get = fields.get
        # RocketMQ dispatches on the header's batch flag, whatever the code.
        if request.code == _SEND_BATCH_MESSAGE or field_bool(get(keys[0])):
            return self._prepare_batch(conn, request, get, keys)
        group = field_str(get(keys[1]), "producerGroup", _WHAT, "")
        topic = field_str(get(keys[2]), "topic", _WHAT)
        send = self._service.prepare(
            conn,
            group,
            topic,
            field_int(get(keys[3]), "queueId", _WHAT, -1),
            field_int(get(keys[4]), "sysFlag", _WHAT, 0),
            field_str(get(keys[5]), "defaultTopic", _WHAT, DEFAULT_TOPIC),
            field_int(get(keys[6]), "defaultTopicQueueNums", _WHAT, 4),
            field_str(get(keys[7]), "properties", _WHAT, ""),
            field_int(get(keys[8]), "reconsumeTimes", _WHAT, 0),
            # read for a retry topic only, as RocketMQ reads it
            field_int(get(keys[9]), "maxReconsumeTimes", _WHAT, -1)
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            else -1,
            field_int(get(keys[10]), "flag", _WHAT, 0),
            field_int(get(keys[11]), "bornTimestamp", _WHAT, 0),
            request.payload(),
        )
        return send if type(send) is Send else answer(request, send)  # type: ignore[arg-type]

    def _prepare_batch(
        self, conn: Connection, request: RemotingCommand, get: Callable[[str], Any], keys: tuple[str, ...]
    ) -> Send | RemotingCommand:
        """SEND_BATCH_MESSAGE: the batch body's messages, stored by one put."""
        group = field_str(get(keys[1]), "producerGroup", _WHAT, "")
        send = self._service.prepare_batch(
            conn,
            group,
            field_str(get(keys[2]), "topic", _WHAT),
            field_int(get(keys[3]), "queueId", _WHAT, -1),
            field_int(get(keys[4]), "sysFlag", _WHAT, 0),
            field_str(get(keys[5]), "defaultTopic", _WHAT, DEFAULT_TOPIC),
            field_int(get(keys[6]), "defaultTopicQueueNums", _WHAT, 4),
            field_int(get(keys[8]), "reconsumeTimes", _WHAT, 0),
            field_int(get(keys[11]), "bornTimestamp", _WHAT, 0),
            request.payload(),
        )
        return send if type(send) is Send else answer(request, send)  # type: ignore[arg-type]


class SendBackProcessor:
    """CONSUMER_SEND_MSG_BACK over ``SendService.send_back``."""

    def __init__(self, service: SendService) -> None:
        self._service = service

    async def consumer_send_back(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "CONSUMER_SEND_MSG_BACK")
        outcome = await self._service.send_back(
            h.str("group"),
            h.int("offset"),
            h.int("delayLevel", 0),
            h.int("maxReconsumeTimes", -1),
            h.str("originMsgId", ""),
        )
        return answer(request, outcome)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    handler = SendHandler(services.send)
    # One handler object for the three send codes: a read's sends of any of them are coalesced
    # (a plugin that wraps one of the codes takes it out of coalescing, and its wrapper still runs).
    register.add(RequestCode.SEND_MESSAGE, handler)
    register.add(RequestCode.SEND_MESSAGE_V2, handler)
    register.add(RequestCode.SEND_BATCH_MESSAGE, handler)
    register.add(RequestCode.CONSUMER_SEND_MSG_BACK, SendBackProcessor(services.send).consumer_send_back)
