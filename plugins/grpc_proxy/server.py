"""The proxy's process: a ``grpc.aio`` server with the transport_grpc plugin's RPCs over a
:class:`~.cluster.ClusterBackend`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from tidemq import CallValidator
from tidemq.address import split_address
from tidemq.client import ClientError
from tidemq.errors import ConfigError
from tidemq.message import local_ip
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.errors import RemotingError
from tidemq_transport_grpc.api import (
    BackendUnavailable,
    Gate,
    Guarded,
    MessagingService,
    PullRpcs,
    ReceiveLimits,
    aio_server,
    handlers,
)

from .cluster import ClusterBackend
from .consume import RemotingConsumeBackend
from .options import ProxyOptions, server_credentials

log = logging.getLogger(__name__)

#: Room for the properties and envelope above the largest message body.
_FRAME_OVERHEAD = 64 * 1024
#: How long the start-up probe of the NameServers may take, seconds.
_PROBE_S = 3.0


async def _unavailable(context: Any, exc: BackendUnavailable) -> None:
    log.info("UNAVAILABLE: %s", exc)
    await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


class Unavailable(grpc.aio.ServerInterceptor):
    """A backend that cannot reach the cluster answers gRPC UNAVAILABLE (the clients retry it)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: Any) -> Any:
                try:
                    return await inner(request, context)
                except BackendUnavailable as exc:
                    await _unavailable(context, exc)

            return handler._replace(unary_unary=unary)
        if handler.unary_stream is not None:
            streamed = handler.unary_stream

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    async for response in streamed(request, context):
                        yield response
                except BackendUnavailable as exc:
                    await _unavailable(context, exc)

            return handler._replace(unary_stream=stream)
        return handler


def _gate(acl_file: str, pb: ModuleType) -> Gate | None:
    """The ACL check of the clients' calls: the ``plain`` validator over ``acl_file``."""
    if not acl_file:
        return None
    path = Path(acl_file).expanduser().resolve()
    validator = get_plugin_manager().create("acl", "plain", options={"file": str(path)}, data_dir=path.parent)
    if not isinstance(validator, CallValidator):
        raise ConfigError(f"--acl-file {acl_file}: the plain ACL does not check RocketMQ 5 calls")
    log.info("clients' calls are checked against the ACL in %s", path)
    return Gate(validator, pb)


class ProxyServer:
    """``tidemq proxy``: bound when made (a busy port fails the start), served from :meth:`start`."""

    def __init__(
        self, options: ProxyOptions, pb: ModuleType, account: tuple[str, str | None] | None = None
    ) -> None:
        self.options = options
        self.server, host, bound = aio_server(
            options.listen,
            label=f"--listen {options.listen}",
            max_frame_bytes=options.max_message_size + _FRAME_OVERHEAD,
            max_concurrent_streams=options.max_concurrent_streams,
            max_concurrent_calls=options.max_concurrent_calls,
            credentials=server_credentials(options),
            interceptors=[Unavailable()],
        )
        if options.advertise:
            host, bound_port = split_address(options.advertise)
        else:
            bound_port = bound
            if host in ("0.0.0.0", "::", ""):  # a wildcard: route clients to this machine's address
                host = local_ip()
        self.host, self.port = host, bound_port
        self.backend = ClusterBackend(
            [a for a in options.namesrv.replace(",", ";").split(";") if a.strip()],
            timeout=options.request_timeout,
            route_refresh_s=options.route_refresh_s,
            heartbeat_s=options.heartbeat_s,
            max_reconsume_times=options.max_reconsume_times,
            credentials=account,  # signs requests to brokers with an ACL
        )
        limits = ReceiveLimits(options.receive_min_invisible_ms, options.receive_min_polling_ms)
        self.service = MessagingService(
            self.backend,
            pb,
            host,
            bound_port,
            options.max_message_size,
            limits,
            RemotingConsumeBackend(self.backend),
        )
        self.service.check_message_types = options.enable_topic_message_type_check
        # The clients' user agents (language, version) for their registrations with the brokers.
        self.backend.instance.clients.settings_of = self.service.clients.get
        served = handlers(self.service, PullRpcs(self.backend, pb), pb)
        #: The check of every client's signature and permissions (None without --acl-file).
        self.gate = _gate(options.acl_file, pb)
        if self.gate is not None:
            served = Guarded(served, self.gate)
        self.server.add_generic_rpc_handlers((served,))
        self.bound = bound

    @property
    def address(self) -> str:
        """Where clients connect (what QueryRoute hands out for every queue)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def start(self) -> None:
        await self.backend.start()
        await self.server.start()
        log.info("gRPC proxy serving on %s, NameServers %s", self.address, self.options.namesrv)
        await self._probe()

    async def _probe(self) -> None:
        """Say at start-up when the NameServers do not answer (the proxy serves anyway: clients
        get UNAVAILABLE until they do)."""
        try:
            await self.backend.api.get_route("TBW102", timeout=_PROBE_S)
        except (ClientError, RemotingError) as exc:
            log.warning("the NameServers %s do not answer yet: %s", self.options.namesrv, exc)

    async def stop(self) -> None:
        await self.server.stop(self.options.stop_grace)
        await self.backend.stop()
