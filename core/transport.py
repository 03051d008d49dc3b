"""Transport contract (role ``transport``): servers and clients that move RemotingCommands.

The codec (:mod:`tidemq.remoting`) is sans-IO; a transport plugin owns the sockets.  Handlers
and commands are :class:`tidemq.remoting.RemotingCommand` objects.

Batching is declared here, on both sides of the broker: a transport that reads several requests
at once hands them to a :class:`BatchedRequestHandler` (``handle_many``), and the broker hands
consecutive requests for one code to a :class:`BatchedProcessor` (``many``: the send processor
stores a read's sends with one append).  Both are optional; the answers are the same either way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import attrs

if TYPE_CHECKING:
    from tidemq.remoting.command import RemotingCommand


@attrs.define(slots=True)
class ConnectionState:
    """What the broker keeps per connection (:attr:`Connection.context`), one per connection.

    A transport makes one, empty, with each server-side connection and never reads it; the broker
    fills it as the peer's requests arrive.
    """

    #: The peer's ``host:port`` parsed as a message's BORNHOST, on its first send (parsed once:
    #: it is the same for every send of the connection).
    born_host: tuple[str, int] | None = None
    #: The broker drops the peer's producer and consumer registrations when the connection closes
    #: (set with the close callback, on its first heartbeat: the callback is added once).
    watched: bool = False


@runtime_checkable
class Connection(Protocol):
    """One peer's connection as a request handler sees it (the server side of a transport)."""

    #: ``host:port`` of the peer.
    remote_address: str
    #: The broker's per-connection state (born host, watched), made empty by the transport.
    context: ConnectionState

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
RequestHandler = Callable[[Connection, "RemotingCommand"], Awaitable["RemotingCommand | None"]]


@runtime_checkable
class BatchedRequestHandler(Protocol):
    """A request handler that also takes the requests of one read together (the broker's).

    A transport that reads several requests at once (pipelined frames in one read) may call
    :meth:`handle_many` and gets one awaitable per request back, in order, which it awaits in turn;
    nothing runs before the first is awaited.  Without it, or from a transport that does not batch,
    each request goes to the handler alone; the answers are the same either way.  A transport
    checks for it once, when it is handed the handler, not per read.
    """

    def __call__(self, conn: Connection, request: RemotingCommand) -> Awaitable[RemotingCommand | None]: ...

    def handle_many(
        self, conn: Connection, requests: list[RemotingCommand]
    ) -> list[Awaitable[RemotingCommand | None]]: ...


#: What :meth:`ReadLaneHandler.serve_read` gives for the frames it took: all their response frames
#: as one bytes object, or per request (in order) the command and its response or an awaitable of it,
#: or an ``int``: that many requests the handler answers later, with one call of
#: :meth:`Connection.answer_later` (the transport counts them in flight until then).
ReadAnswer: TypeAlias = (
    "bytes | list[tuple[RemotingCommand, RemotingCommand | Awaitable[RemotingCommand | None]]] | int"
)


@runtime_checkable
class ReadLaneHandler(Protocol):
    """A request handler that may serve a read's leading frames from the bytes (issue 38: the
    broker's send lane), before the transport decodes them.

    Optional, checked once per connection.  ``serve_read(conn, data, max_frame)`` answers None
    when it takes nothing (the transport decodes ``data`` as usual), else ``(end, answer)``: it
    took the whole frames of ``data[:end]`` and ``answer`` answers them (:data:`ReadAnswer`); the
    transport writes that before serving ``data[end:]`` as usual.  A transport offers it only
    bytes that start a frame (nothing buffered) and only while it serves requests in the order
    read (not draining, no backlog): the answers are those the requests would get decoded.
    """

    def serve_read(self, conn: Connection, data: bytes, max_frame: int) -> tuple[int, ReadAnswer] | None: ...


@runtime_checkable
class AnswersLater(Protocol):
    """The connection a transport hands :meth:`ReadLaneHandler.serve_read`: it takes an ``int``
    answer (requests answered later) and then this one call for them."""

    def answer_later(self, answer: ReadAnswer, count: int) -> None:
        """On the loop: the answer to ``count`` requests a read lane took and answered with
        ``count`` (:data:`ReadAnswer`, not an ``int``): written (or served, per request) as a
        read's answer is; dropped when the connection has closed."""


#: ``failed(request, exc)``: the broker's answer to a request whose handling raised ``exc`` (its
#: one error mapping, the same as for a request served alone).
Failed = Callable[["RemotingCommand", Exception], "RemotingCommand"]


@runtime_checkable
class BatchedProcessor(Protocol):
    """A request processor that also serves consecutive requests of one read together (``many``).

    Registered like any handler (``ProcessorRegister.add``); the broker hands :meth:`many` the
    run of consecutive requests of one read for its codes, each already past the access check,
    and gets per request, in order, its response or an awaitable of it.  ``failed(request, exc)``
    answers a request whose handling raised.  A code that a plugin wraps is served one request at
    a time (through ``__call__``).
    """

    def __call__(self, conn: Connection, request: RemotingCommand) -> Awaitable[RemotingCommand | None]: ...

    def many(
        self, conn: Connection, requests: list[RemotingCommand], failed: Failed
    ) -> list[RemotingCommand | Awaitable[RemotingCommand | None]]: ...


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
