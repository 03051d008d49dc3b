"""The broker's ACL over gRPC: every call of a RocketMQ 5 client is checked before it runs.

The v5 clients sign every call when credentials are configured: ``authorization: MQv2-HMAC-SHA1
Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex HmacSHA1(secretKey,
x-mq-date-time)>`` and ``x-mq-date-time`` in the metadata.  :class:`Gate` reads them and what
the request needs (the topics it writes or reads, the groups it consumes as: RocketMQ's
``PlainAccessResource.parse`` of a v5 request) into a :class:`tidemq.SignedCall` and hands it to
the broker's access validator (``validate_call``).  A refused call is answered with the RPC's
own response and a ``Status`` of UNAUTHORIZED (no, a malformed or a wrong signature, an unknown
key) or FORBIDDEN (no permission), as RocketMQ 5's proxy answers; the handler never runs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import grpc

from tidemq import AccessDenied, CallValidator, NotAuthenticated, SignedCall

from .figures import WrappedMethods, responses
from .peer import born_address

log = logging.getLogger(__name__)

#: RPCs whose request names a consumer group and a topic it reads (topic field path).
_CONSUME = {
    "QueryAssignment": "topic",
    "ReceiveMessage": "message_queue.topic",
    "AckMessage": "topic",
    "ChangeInvisibleDuration": "topic",
    "ForwardMessageToDeadLetterQueue": "topic",
    "PullMessage": "message_queue.topic",
    "UpdateOffset": "message_queue.topic",
    "GetOffset": "message_queue.topic",
}
_CONSUMER_TYPES = ("PUSH_CONSUMER", "SIMPLE_CONSUMER", "PULL_CONSUMER")


def _field(message: Any, path: str) -> Any:
    for name in path.split("."):
        message = getattr(message, name)
    return message


def needs(rpc: str, request: Any, pb: ModuleType) -> dict[str, tuple[str, ...]]:
    """What ``request`` of ``rpc`` needs: ``publish``/``subscribe``/``look_up`` topics, ``groups``."""
    if not hasattr(request, "DESCRIPTOR"):  # a frame that did not parse: the handler refuses it
        return {}
    if rpc == "SendMessage":
        return {"publish": tuple(dict.fromkeys(m.topic.name for m in request.messages))}
    if rpc in ("EndTransaction", "RecallMessage"):
        return {"publish": (request.topic.name,)}
    if rpc == "QueryRoute":
        return {"look_up": (request.topic.name,)}
    if rpc in _CONSUME:
        return {"groups": (request.group.name,), "subscribe": (_field(request, _CONSUME[rpc]).name,)}
    if rpc == "QueryOffset":
        return {"subscribe": (request.message_queue.topic.name,)}
    if rpc == "Heartbeat":
        consumer = pb.ClientType.Name(request.client_type) in _CONSUMER_TYPES
        return {"groups": (request.group.name,)} if consumer and request.group.name else {}
    if rpc == "NotifyClientTermination":
        return {"groups": (request.group.name,)} if request.group.name else {}
    if rpc == "Telemetry" and request.WhichOneof("command") == "settings":
        settings = request.settings
        out: dict[str, tuple[str, ...]] = {}
        if settings.HasField("publishing"):
            out["publish"] = tuple(t.name for t in settings.publishing.topics)
        if settings.HasField("subscription"):
            sub = settings.subscription
            out["groups"] = (sub.group.name,)
            out["subscribe"] = tuple(e.topic.name for e in sub.subscriptions)
        return out
    return {}


class Gate:
    """Checks calls with the broker's validator and answers the refused ones."""

    def __init__(self, validator: CallValidator, pb: ModuleType) -> None:
        self.validator = validator
        self.pb = pb
        self.refusals = 0
        methods = pb.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name
        self._responses = {name: getattr(pb, m.output_type.name) for name, m in methods.items()}

    def check(self, rpc: str, request: Any, context: Any) -> Any | None:
        """None when the call may run, else the response that refuses it."""
        pb = self.pb
        host, port = born_address(context.peer())
        call = SignedCall.of(rpc, context.invocation_metadata() or (), **needs(rpc, request, pb))
        try:
            self.validator.validate_call(call, f"{host}:{port}")
            return None
        except NotAuthenticated as exc:
            code, reason, key = pb.UNAUTHORIZED, exc.reason, exc.access_key
        except AccessDenied as exc:
            code, reason, key = pb.FORBIDDEN, exc.reason, exc.access_key
        except Exception as exc:  # a validator bug refuses (fails closed)
            log.exception("access validator failed on %s from %s", rpc, context.peer())
            code, reason, key = pb.FORBIDDEN, f"access check failed: {type(exc).__name__}: {exc}", None
        self.refusals += 1
        # Never the signature: the access key names the account.
        log.warning("refused gRPC %s from %s, access key %r: %s", rpc, context.peer(), key, reason)
        response = self._responses[rpc]
        return response(status=pb.Status(code=code, message=reason))

    def wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` with the check in front of its behaviour."""
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(rpc, handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(rpc, handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(rpc, handler.stream_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return handler  # no such method in this service

    def _unary(self, rpc: str, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        async def gated(request: Any, context: Any) -> Any:
            refused = self.check(rpc, request, context)
            if refused is not None:
                return refused
            return await behavior(request, context)

        return gated

    def _unary_stream(
        self, rpc: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def gated(request: Any, context: Any) -> AsyncIterator[Any]:
            refused = self.check(rpc, request, context)
            if refused is not None:
                yield refused
                return
            async for response in responses(behavior(request, context)):
                yield response

        return gated

    def _stream(
        self, rpc: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        """Telemetry: the signature before anything, then each command's needs (a client's
        settings name its topics and group); a refused command ends the stream with its status."""

        async def gated(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            refused = self.check(rpc, None, context)
            if refused is not None:
                # The client's first command (its Settings) is read before the refusal ends the
                # stream: a client writes it at once, and a write racing the stream's end fails
                # on the client as INTERNAL instead of reading the refusal (the native server
                # answers within one round trip).
                async for _ in requests:
                    break
                yield refused
                return
            stopped: list[Any] = []

            async def checked() -> AsyncIterator[Any]:
                async for request in requests:
                    refusal = self.check(rpc, request, context)
                    if refusal is not None:
                        stopped.append(refusal)
                        return
                    yield request

            async for response in responses(behavior(checked(), context)):
                yield response
            if stopped:
                yield stopped[0]

        return gated


class Guarded(WrappedMethods):
    """A generic handler whose every method is behind a :class:`Gate`."""

    def __init__(self, inner: grpc.GenericRpcHandler, gate: Gate) -> None:
        super().__init__(inner)
        self.gate = gate

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        return self.gate.wrap(method.rsplit("/", 1)[-1], handler)
