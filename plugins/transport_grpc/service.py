"""``apache.rocketmq.v2.MessagingService`` over brokers: each RPC decodes, calls its
:class:`~.backend.Backend`, encodes.

In a broker's process the backend is :class:`~.backend.LocalBackend`: sends go through
:class:`~tidemq.broker.services.SendService` (the one send path of the remoting transport too:
topic checks, the send hooks and trace, the put and replica wait, transactions' half messages),
ends of transactions through :class:`~tidemq.broker.services.TransactionService`, a Telemetry
stream's producers through :class:`~tidemq.broker.services.ClientService`.  ``tidemq proxy``
serves the same RPCs over remoting to a cluster's brokers.  Statuses are ``apache.rocketmq.v2.Code`` values
in the response, as RocketMQ's proxy sends them; gRPC status errors are for what is not a
RocketMQ answer (a malformed frame, an RPC that needs an engine tidemq does not have yet).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import grpc

from tidemq.broker.services import Outcome
from tidemq.message import TRANSACTION_PREPARED_TYPE, Prop, decode_message_id
from tidemq.names import check_topic_name
from tidemq.topic_attributes import TopicMessageType, topic_message_type

from .agent import agent_of
from .backend import DEFAULT_TOPIC, Backend, Outgoing, Stored
from .consume import ConsumeRpcs, ReceiveLimits
from .consume_types import ConsumeBackend
from .messages import (
    TIMER_DELIVER_MS,
    accepted_message_types,
    code_of,
    parse_transaction_id,
    producer_group,
    transaction_id,
)
from .peer import OUTBOX_LIMIT, CallPeer, StreamPeer

log = logging.getLogger(__name__)

#: RocketMQ's permission bits of a topic (PermName).
PERM_READ = 0x4
PERM_WRITE = 0x2
#: RocketMQ's transaction types of END_TRANSACTION (MessageSysFlag).
_COMMIT = 0x8
_ROLLBACK = 0xC
_UNKNOWN = 0x0

#: Producer retry policy handed to clients in Settings (RocketMQ's producer defaults).
_PRODUCER_ATTEMPTS = 3


def client_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


class MessagingService:
    """The RPC implementations; :func:`tidemq_transport_grpc.server.handlers` binds them by name."""

    def __init__(
        self,
        backend: Backend,
        pb: ModuleType,
        host: str,
        port: int,
        max_body: int,
        limits: ReceiveLimits | None,
        consume: ConsumeBackend,
    ) -> None:
        self.backend = backend
        self.pb = pb
        self.host = host
        self.port = port
        self.max_body = max_body
        self.clients: dict[str, Any] = {}  # client id -> its latest Settings (telemetry)
        self.streams: dict[str, StreamPeer] = {}  # client id -> its Telemetry stream
        self._plain: dict[int, Any] = {}  # code -> its Status without a message of its own
        #: RocketMQ 5 proxy's enableTopicMessageTypeCheck ([transport.grpc]).
        self.check_message_types = True
        #: The consumer RPCs (consume.py), over ``consume`` (the broker's POP engine, or remoting).
        self.consume = ConsumeRpcs(consume, pb, self.endpoints, self.clients.get, limits)
        self.consume.topic_type = self.topic_type  # RecallMessage checks the topic is DELAY

    # ------------------------------------------------------------------ helpers
    def status(self, code: int, message: str = "") -> Any:
        if not message:  # the common answers, made once (a message field copies its value)
            plain = self._plain.get(code)
            if plain is None:
                plain = self._plain[code] = self.pb.Status(code=code, message=self.pb.Code.Name(code))
            return plain
        return self.pb.Status(code=code, message=message)

    def endpoints(self) -> Any:
        pb = self.pb
        scheme = (
            pb.IPv4
            if self.host.replace(".", "").isdigit()
            else (pb.IPv6 if ":" in self.host else pb.DOMAIN_NAME)
        )
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=self.host, port=self.port)])

    def illegal_topic(self, topic: str) -> str | None:
        """Why ``topic`` is not a topic's name (checked here, as RocketMQ 5's proxy validates it,
        so a bad one is ILLEGAL_TOPIC), None when it is one."""
        problem = check_topic_name(topic)
        if problem:
            return problem
        if topic == DEFAULT_TOPIC:
            return f"the topic[{topic}] is conflict with system reserved words."
        return None

    async def topic_type(self, topic: str) -> TopicMessageType | None:
        """The ``message.type`` ``topic`` takes (its route's attributes); None when the topic is
        unknown or types are not checked (enable_topic_message_type_check off)."""
        if not self.check_message_types:
            return None
        layouts = await self.backend.route(topic)
        if isinstance(layouts, Outcome) or not layouts:
            return None
        return topic_message_type(layouts[0].attributes)

    def refusal(self, outcome: Outcome) -> Any:
        return self.status(code_of(self.pb, outcome.status, outcome.remark), outcome.remark or "")

    # ------------------------------------------------------------------ QueryRoute
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        pb = self.pb
        topic = request.topic.name
        problem = self.illegal_topic(topic)
        if problem:
            return pb.QueryRouteResponse(status=self.status(pb.ILLEGAL_TOPIC, problem))
        layouts = await self.backend.route(topic)
        if isinstance(layouts, Outcome):
            return pb.QueryRouteResponse(status=self.refusal(layouts))
        queues = []
        for cfg in layouts:
            accept = accepted_message_types(pb, cfg.attributes)  # the topic's message.type attribute
            # Each broker group's queues, all at this endpoint (a proxy in front of several).
            broker = pb.Broker(name=cfg.broker_name, id=0, endpoints=self.endpoints())
            for qid in range(max(cfg.read_queue_nums, cfg.write_queue_nums)):
                readable = qid < cfg.read_queue_nums and bool(cfg.perm & PERM_READ)
                writable = qid < cfg.write_queue_nums and bool(cfg.perm & PERM_WRITE)
                perm = (
                    pb.READ_WRITE
                    if readable and writable
                    else pb.READ
                    if readable
                    else pb.WRITE
                    if writable
                    else pb.NONE
                )
                queues.append(
                    pb.MessageQueue(
                        topic=pb.Resource(resource_namespace=request.topic.resource_namespace, name=topic),
                        id=qid,
                        permission=perm,
                        broker=broker,
                        accept_message_types=accept,
                    )
                )
        return pb.QueryRouteResponse(status=self.status(pb.OK), message_queues=queues)

    # ------------------------------------------------------------------ clients
    async def Heartbeat(self, request: Any, context: Any) -> Any:
        pb = self.pb
        cid = client_id(context)
        if not cid:
            return pb.HeartbeatResponse(
                status=self.status(pb.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
            )
        stream = self.streams.get(cid)
        if stream is not None and stream.producer_groups:  # refresh its producer registrations
            self.backend.register_producers(stream, cid, stream.producer_groups)
        await self.consume.heartbeat(cid)  # and its consumer registration
        return pb.HeartbeatResponse(status=self.status(pb.OK))

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        cid = client_id(context)
        self.clients.pop(cid, None)
        stream = self.streams.pop(cid, None)
        if stream is not None:
            self.backend.unregister_producers(stream, cid, stream.producer_groups)
            stream.close()
        return self.pb.NotifyClientTerminationResponse(status=self.status(self.pb.OK))

    async def Telemetry(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The client's settings in, the broker's settings out (clients wait 10 s for them), and
        what the broker asks the client (transaction checks, CONSUME_MESSAGE_DIRECTLY as
        VerifyMessageCommand, GET_CONSUMER_RUNNING_INFO's PrintThreadStackTraceCommand) out;
        VerifyMessageResults and ThreadStackTraces answer the latter two."""
        cid = client_id(context)
        peer = StreamPeer(context.peer(), cid, self.pb)
        metadata = tuple(context.invocation_metadata() or ())
        peer.agent = agent_of(None, metadata)
        self.streams[cid] = peer  # a client that reconnects: its newest stream
        reader = asyncio.get_running_loop().create_task(self._read_telemetry(requests, cid, peer, metadata))
        try:
            while True:
                command = await peer.outbox.get()
                if command is None:
                    break
                if not hasattr(command, "WhichOneof"):  # a frame that did not parse (server.Malformed)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, command.details())
                yield command
        finally:
            reader.cancel()
            if self.streams.get(cid) is peer:
                del self.streams[cid]
                self.clients.pop(cid, None)
            peer.close()  # drops its producer registrations

    async def _read_telemetry(
        self, requests: AsyncIterator[Any], cid: str, peer: StreamPeer, metadata: tuple[Any, ...] = ()
    ) -> None:
        pb = self.pb
        out = peer.outbox
        try:
            async for command in requests:
                if not hasattr(command, "WhichOneof"):
                    out.put_nowait(command)
                    return
                kind = command.WhichOneof("command")
                if kind == "settings":
                    peer.agent = agent_of(command.settings, metadata)
                    settings = self.settings_for(command.settings)
                    if command.settings.WhichOneof("pub_sub") == "subscription":
                        await self.consume.settings(peer, cid, command.settings, settings)
                    self.clients[cid] = settings
                    self._register_producer(peer, cid, command.settings)
                    await _room(out)
                    out.put_nowait(pb.TelemetryCommand(status=self.status(pb.OK), settings=settings))
                elif kind == "verify_message_result":  # the answer to a CONSUME_MESSAGE_DIRECTLY
                    nonce = command.verify_message_result.nonce
                    if not peer.verified(nonce, command.status.code, command.status.message):
                        log.info("client %s answered verify_message %r, which no one waits for", cid, nonce)
                elif kind == "thread_stack_trace":  # the answer to GET_CONSUMER_RUNNING_INFO's -s
                    trace = command.thread_stack_trace
                    if not peer.stack_traced(
                        trace.nonce, command.status.code, command.status.message, trace.thread_stack_trace
                    ):
                        log.info(
                            "client %s answered thread stack %r, which no one waits for", cid, trace.nonce
                        )
                else:
                    await _room(out)
                    out.put_nowait(
                        pb.TelemetryCommand(
                            status=self.status(pb.BAD_REQUEST, f"unexpected telemetry command {kind}")
                        )
                    )
        except Exception as exc:  # the stream broke: end the writer too
            log.debug("telemetry stream of %s ended: %s", cid, exc)
        finally:
            out.put_nowait(None)

    def _register_producer(self, peer: StreamPeer, cid: str, settings: Any) -> None:
        """A producer's stream is where the broker's transaction checks of its topics go: it is
        registered as a producer of each topic's group (RocketMQ 5's proxy routes them by topic)."""
        if settings.WhichOneof("pub_sub") != "publishing":
            return
        groups = [producer_group(topic.name) for topic in settings.publishing.topics if topic.name]
        if not groups:
            return
        peer.producer_groups = groups
        self.backend.register_producers(peer, cid, groups)

    def settings_for(self, client: Any) -> Any:
        """The settings a client gets back: its own, completed with the broker's limits."""
        pb = self.pb
        out = pb.Settings()
        out.CopyFrom(client)
        out.access_point.CopyFrom(self.endpoints())
        kind = client.WhichOneof("pub_sub")
        if kind == "publishing" or client.client_type == pb.PRODUCER:
            out.publishing.max_body_size = self.max_body
            out.publishing.validate_message_type = self.check_message_types
            policy = out.backoff_policy
            policy.max_attempts = _PRODUCER_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromSeconds(1)
            policy.exponential_backoff.multiplier = 2.0
        elif kind == "subscription":
            out.backoff_policy.max_attempts = self.backend.max_reconsume_times + 1
            out.backoff_policy.customized_backoff.next.add().FromSeconds(1)
            if not out.subscription.HasField("receive_batch_size"):
                out.subscription.receive_batch_size = 32
            if not out.subscription.HasField("long_polling_timeout"):
                out.subscription.long_polling_timeout.FromSeconds(20)
        out.metric.on = False
        return out

    # ------------------------------------------------------------------ send
    async def SendMessage(self, request: Any, context: Any) -> Any:
        """The request's messages, one answer each.  Several messages are prepared in order, put
        together and awaited together (one flush round under sync flush, as RocketMQ's proxy
        sends them as one batch); a message refused before the store is answered alone."""
        pb = self.pb
        messages = request.messages
        if not messages:
            return pb.SendMessageResponse(status=self.status(pb.BAD_REQUEST, "no message to send"))
        peer = CallPeer(context.peer(), messages[0].system_properties.born_host)
        try:
            if len(messages) == 1:
                answers = [await self.send_one(messages[0], peer)]
            else:
                answers = await self.send_many(messages, peer)
        finally:
            peer.close()
        entries = [
            pb.SendResultEntry(
                status=self.status(code, text),
                message_id=message.system_properties.message_id,
                offset=max(offset, 0),
                transaction_id=tx_id,
                recall_handle=recall,
            )
            for message, (code, text, offset, tx_id, recall) in zip(messages, answers, strict=True)
        ]
        first = entries[0].status
        if len(entries) > 1 and any(e.status.code != first.code for e in entries):
            first = self.status(pb.MULTIPLE_RESULTS, "the messages had different outcomes")
        return pb.SendMessageResponse(status=first, entries=entries)

    async def send_one(self, message: Any, peer: CallPeer) -> tuple[int, str, int, str, str]:
        """One message through the send service: ``(code, message, queue offset, transaction id,
        recall handle)`` (the last one for a timer message, else empty)."""
        outgoing = self.outgoing(message)
        if type(outgoing) is tuple:
            return outgoing
        return self.answer(message, await self.backend.send(peer, outgoing))  # type: ignore[arg-type]

    async def send_many(self, messages: Any, peer: CallPeer) -> list[tuple[int, str, int, str, str]]:
        """:meth:`send_one` of each message, the ones that reach the store stored together
        (:meth:`Backend.send_many`): the same answers, their durability awaited at once."""
        answers: list[Any] = [self.outgoing(message) for message in messages]
        todo = [i for i, answer in enumerate(answers) if type(answer) is not tuple]
        if todo:
            stored = await self.backend.send_many(peer, [answers[i] for i in todo])
            for i, one in zip(todo, stored, strict=True):
                answers[i] = self.answer(messages[i], one)
        return answers

    def outgoing(self, message: Any) -> Outgoing | tuple[int, str, int, str, str]:
        """``message`` as the backend stores it, or the answer that refuses it here."""
        pb = self.pb
        system = message.system_properties
        topic = message.topic.name
        if not message.body:
            return pb.MESSAGE_BODY_EMPTY, "message body is empty", -1, "", ""
        if len(message.body) > self.max_body:
            return pb.MESSAGE_BODY_TOO_LARGE, f"message body is over {self.max_body} bytes", -1, "", ""
        if system.body_encoding == pb.GZIP:
            try:
                body = zlib.decompress(message.body, wbits=31)
            except zlib.error as exc:
                return pb.MESSAGE_CORRUPTED, f"GZIP body does not decompress: {exc}", -1, "", ""
        else:
            body = message.body
        transactional = system.message_type == pb.TRANSACTION
        sys_flag = TRANSACTION_PREPARED_TYPE if transactional else 0
        problem = self.illegal_topic(topic)
        if problem:
            return pb.ILLEGAL_TOPIC, problem, -1, "", ""
        properties = dict(message.user_properties)
        message_group = None
        group = ""
        if system.HasField("message_group"):
            # FIFO: one message group, one queue (the backend picks it).
            message_group = system.message_group
            properties[Prop.SHARDING_KEY] = system.message_group
        if system.HasField("tag") and system.tag:
            properties[Prop.TAGS] = system.tag
        if system.keys:
            properties[Prop.KEYS] = " ".join(system.keys)
        if system.message_id:
            properties[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = (
                system.message_id
            )  # the client's id is the message's
        try:  # protobuf refuses a Timestamp out of its range (a time in ms given as seconds)
            born_ms = system.born_timestamp.ToMilliseconds()
            if system.HasField("delivery_timestamp"):
                properties[TIMER_DELIVER_MS] = str(system.delivery_timestamp.ToMilliseconds())
        except ValueError as exc:
            return pb.ILLEGAL_DELIVERY_TIME, f"bad timestamp: {exc}", -1, "", ""
        if transactional:
            group = producer_group(topic)
            properties[Prop.TRANSACTION_PREPARED] = "true"
            properties[Prop.PRODUCER_GROUP] = group
        return Outgoing(
            topic,
            body,
            properties,
            sys_flag,
            born_ms,
            group,
            message_group,
            check_type=self.check_message_types,
        )

    def answer(self, message: Any, stored: Stored) -> tuple[int, str, int, str, str]:
        """What became of ``message`` (:meth:`send_one`'s tuple) from the backend's answer."""
        pb = self.pb
        if stored.type_conflict:  # the topic's message.type, as RocketMQ 5's proxy checks it
            return pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, stored.outcome.remark or "", -1, "", ""
        outcome = stored.outcome
        code = code_of(pb, outcome.status, outcome.remark)
        tx_id = (
            transaction_id(stored.offset_msg_id, stored.queue_offset)
            if message.system_properties.message_type == pb.TRANSACTION and code == pb.OK
            else ""
        )
        recall = stored.recall_handle if code == pb.OK else ""
        return code, outcome.remark or "", stored.queue_offset, tx_id, recall

    # ------------------------------------------------------------------ transactions
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        """Commit or roll back a half message, named by the transaction id its send answered
        (or the check handed out)."""
        pb = self.pb
        resolution = {pb.COMMIT: _COMMIT, pb.ROLLBACK: _ROLLBACK}.get(request.resolution, _UNKNOWN)
        named = parse_transaction_id(request.transaction_id)
        if named is not None:
            try:
                decode_message_id(named[0])
            except ValueError:
                named = None
        if named is None:
            return pb.EndTransactionResponse(
                status=self.status(pb.INVALID_TRANSACTION_ID, f"no transaction {request.transaction_id!r}")
            )
        outcome = await self.backend.end_transaction(
            CallPeer(context.peer()).remote_address,
            producer_group(request.topic.name),
            named[0],
            named[1],
            resolution,
            request.source == pb.SOURCE_SERVER_CHECK,
            request.message_id,
        )
        if not outcome.ok:
            return pb.EndTransactionResponse(status=self.refusal(outcome))
        return pb.EndTransactionResponse(status=self.status(pb.OK))


async def _room(outbox: asyncio.Queue[Any]) -> None:
    """Wait while a Telemetry stream's outbox is full: a client that stops reading its answers
    stops being read (HTTP/2 flow control then holds its writes), so its stream's memory stays
    bounded by :data:`~.peer.OUTBOX_LIMIT` answers."""
    while outbox.qsize() >= OUTBOX_LIMIT:
        await asyncio.sleep(0.05)
