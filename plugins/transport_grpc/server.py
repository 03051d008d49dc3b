"""The ``grpc.aio`` server on the broker's event loop, and the method table it serves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from types import ModuleType
from typing import Any

import grpc

from tidemq import CallValidator
from tidemq.address import split_address
from tidemq.broker.services import BrokerServices
from tidemq.context import BrokerContext
from tidemq.errors import ConfigError

from .auth import Gate, Guarded
from .backend import LocalBackend
from .consume import CONSUME_UNARY, ReceiveLimits
from .consume_backend import BrokerConsumeBackend
from .figures import CallFigures, Counted
from .h2_server import aio_like
from .options import GrpcOptions, server_credentials
from .pull import PullRpcs
from .service import MessagingService

log = logging.getLogger(__name__)

SERVICE = "apache.rocketmq.v2.MessagingService"
_UNARY = (
    "QueryRoute",
    "Heartbeat",
    "SendMessage",
    "EndTransaction",
    "NotifyClientTermination",
)
_PULL_UNARY = ("UpdateOffset", "GetOffset", "QueryOffset")
#: Room for the properties and envelope above the broker's largest message body.
_FRAME_OVERHEAD = 64 * 1024
#: Calls grpc's backlog may hold beyond the server's cap before it cancels them at random.
_BACKLOG_HEADROOM = 1000


class Malformed:
    """A request that did not parse: the handler answers INVALID_ARGUMENT (grpcio would log the
    parser's traceback and answer UNKNOWN)."""

    __slots__ = ("error", "kind")

    def __init__(self, kind: str, error: Exception) -> None:
        self.kind = kind
        self.error = error

    def details(self) -> str:
        return f"malformed {self.kind}: {self.error}"


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as exc:  # DecodeError, and whatever a hostile frame makes the parser raise
            return Malformed(cls.DESCRIPTOR.full_name, exc)

    return parse


def _checked(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    async def unary(request: Any, context: Any) -> Any:
        if type(request) is Malformed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details())
        return await behavior(request, context)

    return unary


def _checked_stream(
    behavior: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
        if type(request) is Malformed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details())
        async for response in behavior(request, context):
            yield response

    return stream


async def _refuse(request: Malformed, context: Any) -> Any:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details())


async def _refuse_stream(request: Malformed, context: Any) -> AsyncIterator[Any]:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details())
    yield None  # not reached: abort raises


# For a caller that runs the handlers inside coroutine functions of its own (Counted): the
# handler's own coroutine or async generator when the request parsed, so a call pays no wrapper
# coroutine and a streamed message no extra generator layer.  (grpcio itself needs coroutine
# functions: the plain ones above.)
def _checked_flat(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def unary(request: Any, context: Any) -> Any:
        if type(request) is Malformed:
            return _refuse(request, context)
        return behavior(request, context)

    return unary


def _checked_stream_flat(
    behavior: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    def stream(request: Any, context: Any) -> AsyncIterator[Any]:
        if type(request) is Malformed:
            return _refuse_stream(request, context)
        return behavior(request, context)

    return stream


def handlers(
    service: MessagingService, pulls: PullRpcs, pb: ModuleType, flat: bool = False
) -> grpc.GenericRpcHandler:
    """The service's methods by name, each with its protobuf request and response types.  With
    ``flat``, methods are plain functions returning the handler's coroutine (or async generator):
    only for a caller wrapping each in a coroutine function of its own (:class:`Counted`)."""
    checked, checked_stream = (_checked_flat, _checked_stream_flat) if flat else (_checked, _checked_stream)

    def kinds(rpc: str) -> tuple[Any, Any]:
        method = pb.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name[rpc]
        return (
            _parser(getattr(pb, method.input_type.name)),
            getattr(pb, method.output_type.name).SerializeToString,
        )

    table: dict[str, grpc.RpcMethodHandler] = {}
    for rpc in _UNARY:
        table[rpc] = grpc.unary_unary_rpc_method_handler(checked(getattr(service, rpc)), *kinds(rpc))
    for rpc in _PULL_UNARY:
        table[rpc] = grpc.unary_unary_rpc_method_handler(checked(getattr(pulls, rpc)), *kinds(rpc))
    table["PullMessage"] = grpc.unary_stream_rpc_method_handler(
        checked_stream(pulls.PullMessage), *kinds("PullMessage")
    )
    consume = service.consume
    for rpc in CONSUME_UNARY:
        table[rpc] = grpc.unary_unary_rpc_method_handler(checked(getattr(consume, rpc)), *kinds(rpc))
    table["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(
        checked_stream(consume.ReceiveMessage), *kinds("ReceiveMessage")
    )
    table["Telemetry"] = grpc.stream_stream_rpc_method_handler(service.Telemetry, *kinds("Telemetry"))
    return grpc.method_handlers_generic_handler(SERVICE, table)


def aio_server(
    listen: str,
    *,
    label: str,
    max_frame_bytes: int,
    max_concurrent_streams: int,
    max_concurrent_calls: int,
    credentials: Any = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    make: Callable[..., Any] = grpc.aio.server,
) -> tuple[grpc.aio.Server, str, int]:
    """A ``grpc.aio`` server bound to ``listen`` (``host:port``, port 0 picks one): ``(server, host,
    bound port)``; the broker's endpoint and ``tidemq proxy`` both build theirs here.

    ``max_concurrent_streams`` caps one connection's calls (HTTP/2: a client queues the rest),
    ``max_concurrent_calls`` the whole server's (beyond it: RESOURCE_EXHAUSTED at once).  A burst
    of calls faster than the event loop takes them waits in grpc's backlog of calls not yet
    taken; grpc bounds that backlog itself (1 000 soft, 3 000 hard by default: past them it
    cancels calls at random, which a client whose first write meets it reports as its own
    INTERNAL "Internal error from Core"), so the backlog is allowed as many calls as the server
    serves: the burst is taken, and what is beyond ``max_concurrent_calls`` is refused
    RESOURCE_EXHAUSTED.  ``credentials`` (grpc's server credentials) serve TLS.  ``make`` builds
    the server from ``grpc.aio.server``'s arguments (the native server's maker takes them too).  A port that
    cannot be bound is a :class:`~tidemq.errors.ConfigError` naming ``label`` (the setting)."""
    host, port = split_address(listen)
    extra: dict[str, Any] = {"interceptors": list(interceptors)} if interceptors else {}
    server = make(
        **extra,
        maximum_concurrent_rpcs=max_concurrent_calls,
        options=[
            ("grpc.max_receive_message_length", max_frame_bytes),
            ("grpc.max_send_message_length", max_frame_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", max_concurrent_streams),
            ("grpc.server.max_pending_requests", max_concurrent_calls),
            ("grpc.server.max_pending_requests_hard_limit", max_concurrent_calls + _BACKLOG_HEADROOM),
        ],
    )
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(bind)
        else:
            bound = server.add_secure_port(bind, credentials)
    except RuntimeError as exc:
        raise ConfigError(f"{label}: cannot listen there: {exc}") from exc
    if not bound:
        raise ConfigError(f"{label}: cannot listen there (in use?)")
    return server, host, bound


class GrpcServer:
    """One broker's gRPC endpoint: bound when made (a busy port fails the broker's start), served
    from :meth:`start` until :meth:`stop`."""

    def __init__(self, broker: BrokerContext, options: GrpcOptions, pb: ModuleType) -> None:
        self.options = options
        frame = options.max_frame_bytes or broker.settings.max_message_size + _FRAME_OVERHEAD
        self.server, host, bound = aio_server(
            options.listen,
            label=f"[transport.grpc] listen = {options.listen!r}",
            max_frame_bytes=frame,
            max_concurrent_streams=options.max_concurrent_streams,
            max_concurrent_calls=options.max_concurrent_calls,
            credentials=server_credentials(options),
            make=grpc.aio.server if options.server == "grpcio" else aio_like(options),  # h2_server.py
        )
        self.broker = broker
        self._starting: asyncio.Task[None] | None = None
        self.host = host
        self.port = bound
        # Announced in the CLI's start-up lines ("tidemq grpc listening on ...").
        broker.endpoints["grpc"] = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        # The broker's services, as the remoting processors have them (their own instance: the
        # services keep only caches, the state is the broker's).
        services = BrokerServices(broker)
        backend = LocalBackend(services)
        limits = ReceiveLimits(options.receive_min_invisible_ms, options.receive_min_polling_ms)
        self.service = MessagingService(
            backend, pb, host, bound, broker.settings.max_message_size, limits, BrokerConsumeBackend(services)
        )
        self.service.check_message_types = options.enable_topic_message_type_check
        # flat: Counted (below) runs every method in a coroutine function of its own.
        served = handlers(self.service, PullRpcs(backend, pb), pb, flat=True)
        #: The ACL check of every call (None without ACL): tidemq_transport_grpc.auth.
        self.gate = Gate(broker.acl, pb) if isinstance(broker.acl, CallValidator) else None
        if self.gate is not None:
            served = Guarded(served, self.gate)
        #: What the endpoint serves, counted (the broker's metrics and runtime info read it).
        self.figures = CallFigures()
        if self.gate is not None:
            gate = self.gate
            self.figures.refusals = lambda: gate.refusals
        broker.endpoint_figures["grpc"] = self.figures.figures
        self.server.add_generic_rpc_handlers((Counted(served, self.figures),))

    @property
    def address(self) -> str:
        """Where clients connect (what QueryRoute hands out)."""
        return f"{self.host}:{self.port}"

    def begin(self) -> None:
        """Start serving (from the broker's started hook, on its loop).

        The start runs in a task of its own, not one the broker cancels when it stops: a grpc.aio
        server cancelled half-way through its start and then stopped crashes the process."""
        self._starting = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        if self.host in ("0.0.0.0", "::", ""):  # a wildcard: route clients to the broker's own host
            self.host = self.service.host = split_address(self.broker.address)[0]
        await self.server.start()
        log.info("gRPC (RocketMQ 5 clients) serving on %s", self.address)

    async def stop(self) -> None:
        """Stop serving; waits for a start still under way first."""
        if self._starting is not None:
            try:
                await asyncio.shield(self._starting)
            except Exception:
                log.exception("the gRPC endpoint did not start")
        await self.server.stop(self.options.stop_grace)
        self.service.consume.close()
