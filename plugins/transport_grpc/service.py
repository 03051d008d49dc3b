"""``apache.rocketmq.v2.MessagingService`` over a broker: each RPC decodes, calls the broker, encodes.

Statuses are ``apache.rocketmq.v2.Code`` values in the response, as RocketMQ's proxy sends them;
gRPC status errors are for what is not a RocketMQ answer (a malformed frame, an RPC that needs an
engine tidemq does not have yet).  Sends go through :mod:`.broker_calls`, the one module that
touches the broker.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import grpc

from tidemq.context import BrokerContext

from . import broker_calls
from .broker_calls import PERM_READ, PERM_WRITE, SendOutcome

log = logging.getLogger(__name__)

#: RPCs that need RocketMQ 5's POP engine (receive, invisibility, ack): answered UNIMPLEMENTED.
POP_RPCS = (
    "QueryAssignment",
    "ReceiveMessage",
    "AckMessage",
    "ChangeInvisibleDuration",
    "ForwardMessageToDeadLetterQueue",
)
_POP_MISSING = (
    "{rpc} needs the broker's POP consumption engine (pop, ack, change invisibility), "
    "which tidemq does not have yet; use a 4.x push or pull consumer meanwhile"
)
#: Producer retry policy handed to clients in Settings (RocketMQ's producer defaults).
_PRODUCER_ATTEMPTS = 3


def client_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


class MessagingService:
    """The RPC implementations; :func:`tidemq_transport_grpc.server.handlers` binds them by name."""

    def __init__(self, broker: BrokerContext, pb: ModuleType, host: str, port: int, max_body: int) -> None:
        self.broker = broker
        self.pb = pb
        self.host = host
        self.port = port
        self.max_body = max_body
        self.clients: dict[str, Any] = {}  # client id -> its latest Settings (telemetry)

    # ------------------------------------------------------------------ helpers
    def status(self, code: int, message: str = "") -> Any:
        return self.pb.Status(code=code, message=message or self.pb.Code.Name(code))

    def endpoints(self) -> Any:
        pb = self.pb
        scheme = (
            pb.IPv4
            if self.host.replace(".", "").isdigit()
            else (pb.IPv6 if ":" in self.host else pb.DOMAIN_NAME)
        )
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=self.host, port=self.port)])

    # ------------------------------------------------------------------ QueryRoute
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        pb = self.pb
        topic = request.topic.name
        cfg, problem = broker_calls.route_topic(self.broker, topic)
        if cfg is None:
            code = pb.TOPIC_NOT_FOUND if problem is None else pb.ILLEGAL_TOPIC
            return pb.QueryRouteResponse(status=self.status(code, problem or f"topic {topic} not found"))
        broker = pb.Broker(name=self.broker.settings.name, id=0, endpoints=self.endpoints())
        queues = []
        # Every type until topics carry RocketMQ 5's message.type attribute (a MIXED topic).
        accept = [pb.NORMAL, pb.FIFO, pb.DELAY]
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
        if not client_id(context):
            return pb.HeartbeatResponse(
                status=self.status(pb.CLIENT_ID_REQUIRED, "x-mq-client-id is required")
            )
        return pb.HeartbeatResponse(status=self.status(pb.OK))

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        self.clients.pop(client_id(context), None)
        return self.pb.NotifyClientTerminationResponse(status=self.status(self.pb.OK))

    async def Telemetry(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The client's settings in, the broker's settings out (clients wait 10 s for them);
        answers to VerifyMessage/PrintThreadStack commands are logged."""
        pb = self.pb
        cid = client_id(context)
        async for command in requests:
            if not hasattr(command, "WhichOneof"):  # a frame that did not parse (server.Malformed)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, command.details())
            kind = command.WhichOneof("command")
            if kind == "settings":
                settings = self.settings_for(command.settings)
                self.clients[cid] = settings
                yield pb.TelemetryCommand(status=self.status(pb.OK), settings=settings)
            elif kind in ("thread_stack_trace", "verify_message_result"):
                log.info("client %s answered %s", cid, kind)
            else:
                yield pb.TelemetryCommand(
                    status=self.status(pb.BAD_REQUEST, f"unexpected telemetry command {kind}")
                )
        self.clients.pop(cid, None)

    def settings_for(self, client: Any) -> Any:
        """The settings a client gets back: its own, completed with the broker's limits."""
        pb = self.pb
        out = pb.Settings()
        out.CopyFrom(client)
        out.access_point.CopyFrom(self.endpoints())
        kind = client.WhichOneof("pub_sub")
        if kind == "publishing" or client.client_type == pb.PRODUCER:
            out.publishing.max_body_size = self.max_body
            out.publishing.validate_message_type = True
            policy = out.backoff_policy
            policy.max_attempts = _PRODUCER_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromSeconds(1)
            policy.exponential_backoff.multiplier = 2.0
        elif kind == "subscription":
            out.backoff_policy.max_attempts = self.broker.settings.max_reconsume_times + 1
            out.backoff_policy.customized_backoff.next.add().FromSeconds(1)
            if not out.subscription.HasField("receive_batch_size"):
                out.subscription.receive_batch_size = 32
            if not out.subscription.HasField("long_polling_timeout"):
                out.subscription.long_polling_timeout.FromSeconds(20)
        out.metric.on = False
        return out

    # ------------------------------------------------------------------ send
    async def SendMessage(self, request: Any, context: Any) -> Any:
        pb = self.pb
        if not request.messages:
            return pb.SendMessageResponse(status=self.status(pb.BAD_REQUEST, "no message to send"))
        entries = []
        for message in request.messages:
            outcome = await self.send_one(message, context)
            entries.append(
                pb.SendResultEntry(
                    status=self.status(outcome.code, outcome.message),
                    message_id=message.system_properties.message_id,
                    offset=max(outcome.queue_offset, 0),
                )
            )
        first = entries[0].status
        if len(entries) > 1 and any(e.status.code != first.code for e in entries):
            first = self.status(pb.MULTIPLE_RESULTS, "the messages had different outcomes")
        return pb.SendMessageResponse(status=first, entries=entries)

    async def send_one(self, message: Any, context: Any) -> SendOutcome:
        pb = self.pb
        system = message.system_properties
        topic = message.topic.name
        if not message.body:
            return SendOutcome(pb.MESSAGE_BODY_EMPTY, "message body is empty")
        if len(message.body) > self.max_body:
            return SendOutcome(pb.MESSAGE_BODY_TOO_LARGE, f"message body is over {self.max_body} bytes")
        if system.message_type == pb.TRANSACTION:
            return SendOutcome(
                pb.UNSUPPORTED,
                "transactional messages over gRPC wait for EndTransaction, which needs the broker services "
                "layer (issue 35); use a 4.x transactional producer meanwhile",
            )
        if system.body_encoding == pb.GZIP:
            try:
                body = zlib.decompress(message.body, wbits=31)
            except zlib.error as exc:
                return SendOutcome(pb.MESSAGE_CORRUPTED, f"GZIP body does not decompress: {exc}")
        else:
            body = message.body
        properties = dict(message.user_properties)
        tag = system.tag if system.HasField("tag") else None
        group = system.message_group if system.HasField("message_group") else None
        delivery_ms = None
        if system.HasField("delivery_timestamp"):
            delivery_ms = system.delivery_timestamp.ToMilliseconds()
        return await broker_calls.send(
            self.broker,
            topic,
            body,
            properties,
            message_id=system.message_id,
            tag=tag,
            keys=list(system.keys),
            message_group=group,
            delivery_ms=delivery_ms,
            born_ms=system.born_timestamp.ToMilliseconds(),
            born_host=system.born_host or context.peer(),
            codes=pb,
        )

    # ------------------------------------------------------------------ not yet
    async def EndTransaction(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "EndTransaction needs the broker services layer's typed transaction service (issue 35), "
            "not on this broker yet",
        )

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "RecallMessage needs timer messages, which tidemq does not have yet",
        )


def pop_missing(rpc: str) -> Any:
    """A handler for an RPC over the POP engine: UNIMPLEMENTED naming what is missing."""

    async def missing(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _POP_MISSING.format(rpc=rpc))

    return missing
