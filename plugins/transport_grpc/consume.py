"""The v5 consumers' RPCs: QueryAssignment, ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue, RecallMessage, and the consumer side of Telemetry and Heartbeat.

Each RPC checks its request as RocketMQ 5's proxy does (names, invisible time, polling time, batch
size, receipt handles), calls a :class:`~.consume_types.ConsumeBackend` (inside a broker:
:class:`~.consume_backend.BrokerConsumeBackend`, over the POP engine) and answers with
``apache.rocketmq.v2.Code`` statuses.  A ReceiveMessage stream answers as the proxy's writer: a
status, the messages, then the delivery timestamp; the messages it could not write (the client
went away) are made visible again a second later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any

import attrs

from tidemq.names import check_group_name, check_topic_name
from tidemq.topic_attributes import TopicMessageType, type_conflict

from .agent import agent_of
from .consume_types import (
    ConsumeBackend,
    ConsumeRefused,
    Delivered,
    GroupPolicy,
    ReceiptHandle,
    Subscribed,
    decode_receipt_handle,
)
from .messages import fill_v5
from .peer import StreamPeer
from .renew import Renewals
from .running import CONSUME_ACTIVELY, CONSUME_PASSIVELY, ConsumerFacts

log = logging.getLogger(__name__)

#: The unary consumer RPCs (ReceiveMessage is a server stream).
CONSUME_UNARY = (
    "QueryAssignment",
    "AckMessage",
    "ChangeInvisibleDuration",
    "ForwardMessageToDeadLetterQueue",
    "RecallMessage",
)
#: RocketMQ's proxy defaults (ProxyConfig).
MAX_BATCH = 32  # MAX_MSG_NUMS_FOR_POP_REQUEST: a larger batch_size is cut to it
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # maxInvisibleTimeMills
MAX_POLLING_MS = 20_000  # grpcClientConsumerMaxLongPollingTimeoutMillis
NACK_INVISIBLE_MS = 1_000  # a message the stream could not write comes back after this
#: The POP engine's shortest invisibility: ChangeInvisibleDuration below it (0: "now") gets it.
ENGINE_MIN_INVISIBLE_MS = 100
#: Ack entries one AckMessage may carry.
MAX_ACK_ENTRIES = 1024
#: What the deadline keeps for the answer to reach the client (longPollingReserveTimeInMillis).
_RESERVE_MS = 200
#: (group, topic) name pairs remembered as valid, at most (then forgotten and checked again).
_VALID_NAMES_KEPT = 4096
#: RocketMQ's default consumer retry backoff (CustomizedRetryPolicy), seconds.
RETRY_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


@attrs.frozen
class ReceiveLimits:
    """The receive checks of RocketMQ 5's proxy; the two minimums are options
    (``[transport.grpc] receive_min_invisible_ms`` / ``receive_min_polling_ms``)."""

    min_invisible_ms: int = 10_000  # minInvisibleTimeMillsForRecv
    min_polling_ms: int = 5_000  # grpcClientConsumerMinLongPollingTimeoutMillis


@attrs.define
class _Consumer:
    peer: StreamPeer
    language: str
    group: str
    subscriptions: list[Subscribed]
    consume_type: str


class ConsumeRpcs:
    """The consumer RPCs over one backend; :mod:`.server` binds them by name."""

    def __init__(
        self,
        backend: ConsumeBackend,
        pb: ModuleType,
        endpoints: Callable[[], Any],
        client_settings: Callable[[str], Any],
        limits: ReceiveLimits | None = None,
    ) -> None:
        self.backend = backend
        self.pb = pb
        self.endpoints = endpoints
        #: A client's latest settings as answered (None before its Telemetry said hello).
        self.client_settings = client_settings
        self.limits = limits or ReceiveLimits()
        self.consumers: dict[str, _Consumer] = {}  # client id -> its registration
        #: Nacks and clears under way (held so that they are not garbage-collected).
        self.pending_tasks: set[asyncio.Task[None]] = set()
        #: What auto_renew receives handed out, kept invisible until settled (renew.py).
        self.renewals = Renewals(backend)
        #: Statuses without a message of their own, by code (see :meth:`status`).
        self._plain: dict[int, Any] = {}
        #: (group, topic) pairs whose names passed the checks.
        self._valid_names: set[tuple[str, str]] = set()
        #: The ``message.type`` a topic takes (None: the topic is unknown), for RecallMessage's
        #: check; None: no check (the service sets it unless enable_topic_message_type_check is off).
        self.topic_type: Callable[[str], Awaitable[TopicMessageType | None]] | None = None

    def close(self) -> None:
        """Stop renewing (the endpoint stops)."""
        self.renewals.close()

    # ------------------------------------------------------------------ helpers
    def status(self, code: int | str, message: str = "") -> Any:
        pb = self.pb
        number = pb.Code.Value(code) if isinstance(code, str) else code
        if not message:  # the common answers, made once (a message field copies its value)
            plain = self._plain.get(number)
            if plain is None:
                plain = self._plain[number] = pb.Status(code=number, message=pb.Code.Name(number))
            return plain
        return pb.Status(code=number, message=message)

    def _check_names(self, group: str, topic: str) -> None:
        """ILLEGAL_CONSUMER_GROUP / ILLEGAL_TOPIC for a bad name, as the proxy validates them."""
        if (group, topic) in self._valid_names:  # checked before: every settle names them again
            return
        problem = check_group_name(group)
        if problem:
            raise ConsumeRefused("ILLEGAL_CONSUMER_GROUP", problem)
        problem = check_topic_name(topic)
        if problem:
            raise ConsumeRefused("ILLEGAL_TOPIC", problem)
        if len(self._valid_names) >= _VALID_NAMES_KEPT:
            self._valid_names.clear()
        self._valid_names.add((group, topic))

    @staticmethod
    def _handle(text: str) -> ReceiptHandle:
        """A receipt handle still valid: parsed, not past its invisible time."""
        handle = decode_receipt_handle(text)
        if handle.deadline_ms <= time.time() * 1000:
            raise ConsumeRefused("INVALID_RECEIPT_HANDLE", "receipt handle is expired")
        return handle

    def _invisible(self, duration: Any, minimum: int) -> int:
        ms = int(duration.ToMilliseconds())
        if ms < minimum:
            raise ConsumeRefused(
                "ILLEGAL_INVISIBLE_TIME", f"the invisibleTime is too small. invisibleTime={ms}, min={minimum}"
            )
        if ms > MAX_INVISIBLE_MS:
            raise ConsumeRefused(
                "ILLEGAL_INVISIBLE_TIME",
                f"the invisibleTime is too large. invisibleTime={ms}, max={MAX_INVISIBLE_MS}",
            )
        return ms

    async def _policy(self, client_id: str, group: str) -> GroupPolicy:
        settings = self.client_settings(client_id)
        if settings is not None and settings.WhichOneof("pub_sub") == "subscription":
            return GroupPolicy(settings.subscription.fifo, settings.backoff_policy.max_attempts)
        return await self.backend.group_policy(group)

    # ------------------------------------------------------------------ Telemetry, Heartbeat
    async def settings(self, peer: StreamPeer, client_id: str, client: Any, out: Any) -> None:
        """Complete a consumer's settings ``out`` as RocketMQ's proxy does (batch size, longest
        poll, FIFO and attempts from the group) and register it as a consumer of its group."""
        pb = self.pb
        group = client.subscription.group.name
        if not group or check_group_name(group):
            return
        policy = await self.backend.group_policy(group)
        sub = out.subscription
        sub.receive_batch_size = MAX_BATCH
        sub.long_polling_timeout.FromMilliseconds(MAX_POLLING_MS)
        sub.fifo = policy.fifo
        backoff = out.backoff_policy
        backoff.max_attempts = policy.max_attempts
        backoff.ClearField("customized_backoff")
        for seconds in RETRY_BACKOFF_S:
            backoff.customized_backoff.next.add().FromSeconds(seconds)
        subscriptions = []
        for entry in client.subscription.subscriptions:
            if not entry.topic.name:
                continue
            kind = "SQL92" if entry.expression.type == pb.SQL else "TAG"
            subscriptions.append(
                Subscribed(entry.topic.name, kind, entry.expression.expression.strip() or "*")
            )
        language = peer.agent.language if isinstance(peer, StreamPeer) else agent_of(client).language
        kind = CONSUME_ACTIVELY if client.client_type == pb.SIMPLE_CONSUMER else CONSUME_PASSIVELY
        if isinstance(peer, StreamPeer):  # what its running info (GET_CONSUMER_RUNNING_INFO) shows
            peer.consumer = ConsumerFacts(group, kind, subscriptions)
        consumer = _Consumer(peer, language, group, subscriptions, kind)
        self.consumers[client_id] = consumer
        peer.add_close_callback(lambda _p: self._forget(client_id, consumer))
        await self.backend.register_consumer(peer, client_id, language, group, subscriptions, kind)

    def _forget(self, client_id: str, consumer: _Consumer) -> None:
        if self.consumers.get(client_id) is consumer:  # gone, not replaced by a newer stream
            del self.consumers[client_id]
            self._background(self.renewals.clear(client_id))

    async def heartbeat(self, client_id: str) -> None:
        """Refresh the client's consumer registration (a v5 client heartbeats every 10 s)."""
        consumer = self.consumers.get(client_id)
        if consumer is not None and not consumer.peer.closed:
            await self.backend.register_consumer(
                consumer.peer,
                client_id,
                consumer.language,
                consumer.group,
                consumer.subscriptions,
                consumer.consume_type,
            )

    # ------------------------------------------------------------------ QueryAssignment
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        pb = self.pb
        topic, group = request.topic.name, request.group.name
        try:
            self._check_names(group, topic)
            assigned = await self.backend.query_assignment(topic, group, _client_id(context))
        except ConsumeRefused as exc:
            return pb.QueryAssignmentResponse(status=self.status(exc.code, exc.message))
        if not assigned:
            return pb.QueryAssignmentResponse(
                status=self.status(pb.FORBIDDEN, f"topic {topic} has no readable queue")
            )
        queues = []
        for a in assigned:
            queue = pb.MessageQueue(
                topic=pb.Resource(resource_namespace=request.topic.resource_namespace, name=topic),
                id=a.queue_id,
                permission=_permission(pb, a.perm),
                broker=pb.Broker(name=a.broker_name, id=0, endpoints=self.endpoints()),
                accept_message_types=[pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
            )
            queues.append(pb.Assignment(message_queue=queue))
        return pb.QueryAssignmentResponse(status=self.status(pb.OK), assignments=queues)

    # ------------------------------------------------------------------ ReceiveMessage
    def _poll_ms(self, request: Any, context: Any) -> int:
        """The proxy's polling time: the request's (or what the deadline leaves), within the limits
        and the deadline; ILLEGAL_POLLING_TIME when the deadline leaves less than the minimum."""
        remaining = context.time_remaining()
        left = int(remaining * 1000) - _RESERVE_MS if remaining is not None else MAX_POLLING_MS
        if request.HasField("long_polling_timeout"):
            poll = int(request.long_polling_timeout.ToMilliseconds())
        else:
            poll = left
        poll = min(max(poll, self.limits.min_polling_ms), MAX_POLLING_MS)
        if poll > left:
            if left < self.limits.min_polling_ms:
                raise ConsumeRefused(
                    "ILLEGAL_POLLING_TIME",
                    "The deadline time remaining is not enough for polling, please check network condition",
                )
            poll = left
        return poll

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        pb = self.pb
        group, topic = request.group.name, request.message_queue.topic.name
        delivered: list[Delivered] = []
        written = 0
        try:
            self._check_names(group, topic)
            if request.batch_size <= 0:
                raise ConsumeRefused("BAD_REQUEST", f"batch_size {request.batch_size} must be positive")
            batch = min(request.batch_size, MAX_BATCH)
            if request.auto_renew:  # kept invisible in slices until settled (renew.py)
                invisible = self.renewals.slice_ms
            elif not request.HasField("invisible_duration"):
                raise ConsumeRefused("ILLEGAL_INVISIBLE_TIME", "invisible_duration is required")
            else:
                invisible = self._invisible(request.invisible_duration, self.limits.min_invisible_ms)
            poll = self._poll_ms(request, context)
            expression = request.filter_expression
            kind = "SQL92" if expression.type == pb.SQL else "TAG"
            text = expression.expression.strip() or "*"
            policy = await self._policy(_client_id(context), group)
            delivered = await self.backend.receive(
                group, topic, batch, invisible, poll, kind, text, policy.fifo, context.cancelled
            )
            delivered = await self._screen(group, topic, kind, text, policy, delivered)
            if not delivered:
                yield pb.ReceiveMessageResponse(status=self.status(pb.MESSAGE_NOT_FOUND, "no new message"))
            else:
                yield pb.ReceiveMessageResponse(status=self.status(pb.OK))
                cid = _client_id(context)
                for d in delivered:
                    response = pb.ReceiveMessageResponse()
                    message = self._message(d, response.message)
                    yield response
                    written += 1
                    if request.auto_renew:
                        self.renewals.hold(
                            cid,
                            group,
                            topic,
                            message.system_properties.message_id,
                            d.receipt_handle,
                            invisible,
                        )
        except ConsumeRefused as exc:
            yield pb.ReceiveMessageResponse(status=self.status(exc.code, exc.message))
        finally:
            if written < len(delivered):  # the client went away: give the rest back soon
                self._nack(group, topic, delivered[written:])
        now = time.time_ns()
        yield pb.ReceiveMessageResponse(delivery_timestamp={"seconds": now // 10**9, "nanos": now % 10**9})

    async def _screen(
        self, group: str, topic: str, kind: str, text: str, policy: GroupPolicy, delivered: list[Delivered]
    ) -> list[Delivered]:
        """The proxy's PopMessageResultFilter: a message whose tag the subscription does not name
        exactly (the store filters by the tag's hash code) is acknowledged, one past the group's
        attempts is forwarded to the dead-letter queue; the rest are delivered."""
        tags = None if kind != "TAG" or text == "*" else {t.strip() for t in text.split("||") if t.strip()}
        keep = []
        for d in delivered:
            try:
                if tags is not None and (d.message.tags or "") not in tags:
                    await self.backend.ack(group, topic, d.receipt_handle)
                elif policy.max_attempts > 0 and d.delivery_attempt > policy.max_attempts:
                    message_id = d.message.uniq_key or d.message.msg_id
                    await self.backend.forward_to_dlq(
                        group, topic, d.receipt_handle, message_id, policy.max_attempts
                    )
                else:
                    keep.append(d)
            except ConsumeRefused as exc:  # it comes back after its invisible time
                log.warning("receive of %s/%s: a screened message was not settled: %s", group, topic, exc)
        return keep

    def _message(self, d: Delivered, out: Any) -> Any:
        """``d`` as the client sees it, filled into ``out`` (the response's message)."""
        fill_v5(self.pb, d.message, out)
        out.topic.name = d.topic  # a redelivery is read from the retry topic
        system = out.system_properties
        system.receipt_handle = d.receipt_handle
        system.delivery_attempt = d.delivery_attempt
        system.invisible_duration.FromMilliseconds(d.invisible_ms)
        return out

    def _nack(self, group: str, topic: str, undelivered: list[Delivered]) -> None:
        async def nack() -> None:
            for d in undelivered:
                try:
                    await self.backend.change_invisible(group, topic, d.receipt_handle, NACK_INVISIBLE_MS)
                except ConsumeRefused as exc:
                    log.debug("nack of an unwritten message failed: %s", exc)

        self._background(nack())

    def _background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.pending_tasks.add(task)
        task.add_done_callback(self.pending_tasks.discard)

    # ------------------------------------------------------------------ settle
    async def AckMessage(self, request: Any, context: Any) -> Any:
        pb = self.pb
        group, topic = request.group.name, request.topic.name
        try:
            self._check_names(group, topic)
        except ConsumeRefused as exc:
            return pb.AckMessageResponse(status=self.status(exc.code, exc.message))
        entries = request.entries
        if not entries:
            return pb.AckMessageResponse(status=self.status(pb.BAD_REQUEST, "no entry to acknowledge"))
        if len(entries) > MAX_ACK_ENTRIES:
            return pb.AckMessageResponse(
                status=self.status(
                    pb.BAD_REQUEST,
                    f"{len(entries)} entries; at most {MAX_ACK_ENTRIES} in one request",
                )
            )
        response = pb.AckMessageResponse()
        results = response.entries
        renewals = self.renewals
        # The client id only matters when auto_renew holds messages (reading the call's metadata
        # is one of the dearer steps of an ack).
        cid = _client_id(context) if renewals.held else ""
        ok = self.status(pb.OK)
        first: Any = None
        mixed = False
        for entry in entries:  # each result filled in place in the response (no copies)
            message_id, receipt = entry.message_id, entry.receipt_handle
            try:
                handle = await renewals.take(cid, group, message_id, receipt) if renewals.held else receipt
                self._handle(handle)
                await self.backend.ack(group, topic, handle)
                status = ok
            except ConsumeRefused as exc:
                status = self.status(exc.code, exc.message)
            result = results.add()
            result.message_id = message_id
            result.receipt_handle = receipt
            result.status.CopyFrom(status)
            if first is None:
                first = status
            elif status.code != first.code:
                mixed = True
        if mixed:
            first = self.status(pb.MULTIPLE_RESULTS, "the entries had different outcomes")
        response.status.CopyFrom(first)
        return response

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        pb = self.pb
        group, topic = request.group.name, request.topic.name
        try:
            self._check_names(group, topic)
            invisible = max(self._invisible(request.invisible_duration, 0), ENGINE_MIN_INVISIBLE_MS)
            handle = await self.renewals.take(
                _client_id(context), group, request.message_id, request.receipt_handle
            )
            self._handle(handle)
            handle = await self.backend.change_invisible(group, topic, handle, invisible)
        except ConsumeRefused as exc:
            return pb.ChangeInvisibleDurationResponse(status=self.status(exc.code, exc.message))
        return pb.ChangeInvisibleDurationResponse(status=self.status(pb.OK), receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        pb = self.pb
        group, topic = request.group.name, request.topic.name
        try:
            self._check_names(group, topic)
            handle = await self.renewals.take(
                _client_id(context), group, request.message_id, request.receipt_handle
            )
            self._handle(handle)
            await self.backend.forward_to_dlq(
                group, topic, handle, request.message_id, request.max_delivery_attempts
            )
        except ConsumeRefused as exc:
            return pb.ForwardMessageToDeadLetterQueueResponse(status=self.status(exc.code, exc.message))
        return pb.ForwardMessageToDeadLetterQueueResponse(status=self.status(pb.OK))

    # ------------------------------------------------------------------ RecallMessage
    async def RecallMessage(self, request: Any, context: Any) -> Any:
        pb = self.pb
        topic = request.topic.name
        problem = check_topic_name(topic)
        if problem:
            return pb.RecallMessageResponse(status=self.status(pb.ILLEGAL_TOPIC, problem))
        if not request.recall_handle.strip():
            return pb.RecallMessageResponse(status=self.status(pb.BAD_REQUEST, "recall handle is invalid"))
        if self.topic_type is not None:
            # Only a DELAY (or MIXED) topic's messages are recalled, as RocketMQ 5's proxy checks
            # (ProducerProcessor.recallMessage): else MESSAGE_PROPERTY_CONFLICT_WITH_TYPE.
            kind = await self.topic_type(topic)
            conflict = None if kind is None else type_conflict(kind, TopicMessageType.DELAY)
            if conflict is not None:
                return pb.RecallMessageResponse(
                    status=self.status(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, conflict)
                )
        try:
            message_id = await self.backend.recall(topic, request.recall_handle)
        except ConsumeRefused as exc:
            return pb.RecallMessageResponse(status=self.status(exc.code, exc.message))
        return pb.RecallMessageResponse(status=self.status(pb.OK), message_id=message_id)


def _client_id(context: Any) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


def _permission(pb: ModuleType, perm: int) -> int:
    readable, writable = bool(perm & 0x4), bool(perm & 0x2)
    if readable and writable:
        return int(pb.READ_WRITE)
    if readable:
        return int(pb.READ)
    return int(pb.WRITE if writable else pb.NONE)
