"""Transport contract (role ``transport``): servers and clients that move RemotingCommands.

The codec (:mod:`tidemq.remoting`) is sans-IO; a transport plugin owns the sockets.  Handlers
and commands are :class:`tidemq.remoting.RemotingCommand` objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

#: ``handler(connection, request) -> response | None`` (None for oneway requests).
RequestHandler = Callable[[Any, Any], Awaitable[Any]]


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
