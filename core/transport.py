"""Transport contract (role ``transport``): servers and clients that move RemotingCommands.

The codec (:mod:`tidemq.remoting`) is sans-IO; a transport plugin owns the sockets.  Handlers
and commands are :class:`tidemq.remoting.RemotingCommand` objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tidemq.remoting.command import RemotingCommand


@runtime_checkable
class Connection(Protocol):
    """One peer's connection as a request handler sees it (the server side of a transport)."""

    #: ``host:port`` of the peer.
    remote_address: str
    #: Free slot for the application (the broker keeps a client's channel info here).
    context: dict[str, Any]

    @property
    def closed(self) -> bool: ...

    def add_close_callback(self, fn: Callable[[Any], Any]) -> None:
        """Call ``fn(connection)`` once when the connection closes (soon, if it already has)."""

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """A request to the peer (the broker asks its clients: consumer ids changed, check a transaction)."""

    async def invoke_oneway(self, request: RemotingCommand) -> None: ...

    def send_response(self, response: RemotingCommand) -> None:
        """Write a response outside the handler's return path."""


#: ``handler(connection, request) -> response | None`` (None for oneway requests).
#:
#: A handler object may also have ``handle_many(connection, requests)``: a transport that reads
#: several requests at once (pipelined frames in one read) may hand them over together and gets
#: one awaitable per request back, in order, which it awaits in turn (the broker coalesces sends of
#: one read into one store put this way).  Without it, or from a transport that does not batch,
#: each request goes to ``handler`` alone; the answers are the same either way.
RequestHandler = Callable[[Connection, "RemotingCommand"], Awaitable["RemotingCommand | None"]]


@runtime_checkable
class TransportServer(Protocol):
    async def start(self) -> None: ...

    @property
    def address(self) -> tuple[str, int]: ...

    async def stop(self, drain_timeout: float = 5.0) -> None: ...


@runtime_checkable
class TransportClient(Protocol):
    async def invoke(self, address: str, request: Any, timeout: float) -> Any: ...

    async def invoke_oneway(self, address: str, request: Any) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """What a transport factory returns."""

    def server(self, host: str, port: int, handler: RequestHandler, **options: Any) -> TransportServer: ...

    def client(self, **options: Any) -> TransportClient: ...
