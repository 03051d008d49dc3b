"""A gRPC server on the broker's own event loop: HTTP/2 from a sans-IO frame layer of its own.

``[transport.grpc] server = "native"`` serves the same generic handler (``grpc.GenericRpcHandler``:
the service's methods, behind the ACL gate and the call counter) as grpcio's ``grpc.aio`` server,
without grpcio's core: each connection is an :class:`asyncio.Protocol` feeding a
:class:`~.h2_frames.ServerConnection`; each call runs its handler (at once when its request is whole, as a
task of the loop from its first wait on) with a
:class:`~.h2_context.CallContext` (the ``grpc.aio.ServicerContext`` methods the handlers use).

The wire protocol (gRPC over HTTP/2): a request is HEADERS (``:path /<service>/<method>``,
``content-type application/grpc``, ``grpc-timeout``, metadata) then DATA carrying messages, each
prefixed by a compressed flag and a 4-byte big-endian length; the response is HEADERS
(``:status 200``), the messages, and trailers (``grpc-status``, ``grpc-message``), or trailers
only when the call fails before its first message.

The modules: this one (the server: binding, method lookup, start and stop, TLS, the maker the
endpoint calls), :mod:`.h2_connection` (one client connection, its bounds), :mod:`.h2_call` (one
call's state), :mod:`.h2_context` (what a handler sees of its call), :mod:`.h2_frames` (HTTP/2
frames, sans-IO).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tidemq.errors import ConfigError

from .h2_connection import Http2Protocol
from .h2_context import CallContext, CallDetails
from .h2_frames import hpack
from .options import GrpcOptions, server_credentials

log = logging.getLogger(__name__)


class H2GrpcServer:
    """A gRPC server of generic handlers, on the running loop; the calls of ``grpc.aio.Server``
    the endpoint makes (``add_generic_rpc_handlers``, ``start``, ``stop``).

    Bound when made (``bind`` raises OSError for an address in use); served from :meth:`start`."""

    def __init__(
        self,
        handler: grpc.GenericRpcHandler | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        max_concurrent_streams: int = 100,
        max_concurrent_calls: int = 10_000,
        max_header_list_size: int = 16 * 1024,
    ) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = [] if handler is None else [handler]
        self.ssl_context = ssl_context
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_streams = max_concurrent_streams
        self.max_concurrent_calls = max_concurrent_calls
        self.max_header_list_size = max_header_list_size
        self.open_calls = 0
        self.connections: set[Http2Protocol] = set()
        self._methods: dict[str, Any] = {}
        self.socket: socket.socket | None = None
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]

    def add_insecure_port(self, address: str) -> int:
        """Bind ``host:port`` (``[v6]:port``; port 0 picks one): the port bound.  RuntimeError
        when it cannot be bound, as grpcio's."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen(1024)
        except (OSError, ValueError) as exc:
            sock.close()
            raise RuntimeError(f"cannot bind {address}: {exc}") from exc
        sock.setblocking(False)
        self.socket = sock
        self.port = sock.getsockname()[1]
        return self.port

    def add_secure_port(self, address: str, credentials: Any = None) -> int:
        """As :meth:`add_insecure_port`, served with TLS (the server's ``ssl_context``)."""
        if self.ssl_context is None:
            raise RuntimeError("a TLS port needs the server's ssl_context")
        return self.add_insecure_port(address)

    def lookup(self, method: str, context: CallContext) -> Any:
        """The method's handler (grpc.RpcMethodHandler), None when the service has no such method."""
        found = self._methods.get(method)
        if found is None:
            details = CallDetails(method, context.invocation_metadata())
            for handler in self.handlers:
                found = handler.service(details)
                if found is not None:
                    break
            if found is not None and len(self._methods) < 64:
                self._methods[method] = found
        return found

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.handlers.extend(handlers)
        self._methods.clear()

    async def start(self) -> None:
        if self.socket is None:
            raise RuntimeError("the server has no port (add_insecure_port)")
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: Http2Protocol(self), sock=self.socket, ssl=self.ssl_context
        )

    async def stop(self, grace: float | None) -> None:
        """Stop taking connections, GOAWAY to every client, let calls run ``grace`` seconds, then
        cancel what is left and close."""
        if self._server is not None:
            self._server.close()
        elif self.socket is not None:
            self.socket.close()
        for connection in list(self.connections):
            connection.goaway()
        end = time.monotonic() + (grace or 0.0)
        while time.monotonic() < end and any(c.calls for c in self.connections):
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection._close()
        if self._server is not None:
            await self._server.wait_closed()


def tls_context(certfile: str, keyfile: str, cafile: str = "") -> ssl.SSLContext:
    """A server TLS context offering HTTP/2 (ALPN ``h2``); with ``cafile`` clients must show a
    certificate it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    if cafile:
        context.load_verify_locations(cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    return context


def aio_like(options: GrpcOptions) -> Callable[..., Any]:
    """A maker of the native server taking ``grpc.aio.server``'s arguments (the endpoint's
    ``[transport.grpc] server = "native"``); TLS from ``options``' files.  Without the hpack
    package (the grpc extra installs it) grpcio's server, with a warning."""
    if hpack is None:
        log.warning(
            '[transport.grpc] server = "native" needs the hpack package (pip install "tidemq[grpc]"): '
            "serving with grpcio's server"
        )
        return grpc.aio.server
    context = None
    if options.tls_certfile:
        server_credentials(options)  # each file readable, or the ConfigError naming it
        try:
            context = tls_context(options.tls_certfile, options.tls_keyfile, options.tls_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[transport.grpc] TLS files: {exc}") from exc

    def make(
        *, maximum_concurrent_rpcs: int | None = None, options: Sequence[tuple[str, Any]] = ()
    ) -> H2GrpcServer:
        channel = dict(options)
        return H2GrpcServer(
            ssl_context=context,
            max_message_bytes=int(channel.get("grpc.max_receive_message_length", 4 * 1024 * 1024)),
            max_concurrent_streams=int(channel.get("grpc.max_concurrent_streams", 100)),
            max_concurrent_calls=maximum_concurrent_rpcs or 10_000,
        )

    return make
