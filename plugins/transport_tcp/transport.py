"""asyncio TCP transport: servers and pooled clients exchanging RemotingCommands.

Built on :class:`asyncio.Protocol` (no streams) for speed.  Each connection decodes frames with
the sans-IO :class:`~tidemq.remoting.FrameDecoder`, matches responses to requests by opaque, and
runs every incoming request as its own task so a slow handler (a held long-polling pull) never
blocks the others on the same connection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from tidemq.remoting import (
    FrameDecoder,
    FrameError,
    HeaderError,
    ProtocolError,
    RemotingCommand,
    RemotingConnectError,
    RemotingError,
    RemotingSendError,
    RemotingTimeoutError,
    ResponseCode,
    SerializeType,
    encode,
)
from tidemq.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE
from tidemq.remoting.command import next_opaque
from tidemq_transport_tcp.options import TcpOptions

log = logging.getLogger(__name__)

Handler = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]


class Connection(asyncio.Protocol):
    """One TCP connection, server or client side; both sides may send requests."""

    def __init__(
        self, owner: TcpServer | TcpClient, handler: Handler | None, options: TcpOptions, server_side: bool
    ):
        self._owner = owner
        self._handler = handler
        self._options = options
        self.server_side = server_side
        self._decoder = FrameDecoder(options.max_frame_size)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._close_callbacks: list[Callable[[Connection], Any]] = []
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._reading_paused_by_us = False
        self._draining = False
        self._last_activity = self._loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._out: list[bytes | memoryview] | None = None  # frames waiting for the end of this loop turn
        self._out_bytes = 0
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self.remote_address = ""
        self.local_address = ""
        #: Free slot for the application (the broker keeps its client-channel info here).
        self.context: dict[str, Any] = {}

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.remote_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.local_address = f"{sock[0]}:{sock[1]}" if sock else "?"
        transport.set_write_buffer_limits(
            high=self._options.write_high_water, low=self._options.write_low_water
        )
        self._owner._connection_made(self)
        idle = self._options.idle_timeout_s
        if self.server_side and idle > 0:
            self._idle_handle = self._loop.call_later(idle, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_activity = self._loop.time()
        decoder = self._decoder
        while True:
            try:
                commands = decoder.feed(data)
            except HeaderError as exc:
                self._on_header_error(exc)
                data = b""
                continue
            except FrameError as exc:
                log.warning("closing connection %s: %s", self.remote_address, exc)
                self.abort()
                return
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    fut = self._pending.pop(cmd.opaque, None)
                    if fut is None:
                        log.debug(
                            "response %r from %s matches no request (timed out?)", cmd, self.remote_address
                        )
                    elif not fut.done():
                        fut.set_result(cmd)
                else:
                    self._on_request(cmd)
            if not decoder.error_pending:
                return
            data = b""

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def pause_writing(self) -> None:
        self._write_paused = True
        # The peer is not reading what we send: stop reading what it sends (server side only:
        # a client must keep reading the responses it waits for).
        if self.server_side:
            self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._maybe_resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _pause_reading(self) -> None:
        if not self._reading_paused_by_us and self._transport is not None and not self._closed:
            self._reading_paused_by_us = True
            try:
                self._transport.pause_reading()
            except RuntimeError:  # already closing
                pass

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused_by_us
            and not self._write_paused
            and not self._draining
            and not self._closed
            and len(self._tasks) <= self._options.max_in_flight // 2
            and self._transport is not None
        ):
            self._reading_paused_by_us = False
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        reason = f": {exc}" if exc else ""
        for opaque, fut in self._pending.items():
            if not fut.done():
                fut.set_exception(
                    RemotingSendError(
                        f"connection {self.remote_address} closed before response {opaque}{reason}"
                    )
                )
        self._pending.clear()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(RemotingSendError(f"connection {self.remote_address} closed{reason}"))
        self._owner._connection_lost(self)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("close callback %r failed for %s", cb, self.remote_address)
        if not self.lost.done():
            self.lost.set_result(None)

    # ------------------------------------------------------------------ public API
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests received on this connection whose handler has not finished."""
        return len(self._tasks)

    def add_close_callback(self, fn: Callable[[Connection], Any]) -> None:
        """Call ``fn(conn)`` once when the connection closes (soon, if it already has)."""
        if self._closed:
            self._loop.call_soon(fn, self)
        else:
            self._close_callbacks.append(fn)

    def close(self) -> None:
        """Close after flushing what is already written."""
        if self._transport is not None and not self._transport.is_closing():
            self._flush_out()
            self._transport.close()

    def abort(self) -> None:
        """Close now, dropping unsent data."""
        if self._transport is not None:
            self._transport.abort()

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``request`` and wait up to ``timeout`` seconds for its response."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        if self._write_paused:
            await self._wait_drain()
        opaque = request.opaque
        if opaque in self._pending:  # the same command object sent twice: give it a new id
            request.opaque = opaque = next_opaque()
        fut: asyncio.Future[RemotingCommand] = self._loop.create_future()
        self._pending[opaque] = fut
        try:
            self._write(request)
        except RemotingSendError:
            self._pending.pop(opaque, None)
            raise
        except ProtocolError as exc:
            self._pending.pop(opaque, None)
            raise RemotingSendError(f"cannot encode request {request.code}: {exc}") from exc
        handle = self._loop.call_later(timeout, _expire, fut, request.code, self.remote_address, timeout)
        try:
            return await fut
        finally:
            handle.cancel()
            self._pending.pop(opaque, None)

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send ``request`` marked oneway; no response is expected."""
        if self._closed or self._transport is None or self._transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        request.flag |= FLAG_ONEWAY
        if self._write_paused:
            await self._wait_drain()
        try:
            self._write(request)
        except ProtocolError as exc:
            raise RemotingSendError(f"cannot encode request {request.code}: {exc}") from exc

    def send_response(self, response: RemotingCommand) -> None:
        """Write a response outside the handler's return path (a held pull answered later)."""
        response.flag |= FLAG_RESPONSE
        if not self._closed:
            try:
                self._write(response)
            except RemotingSendError:
                log.debug("late response dropped: %s closed", self.remote_address)

    # ------------------------------------------------------------------ internals
    def _write(self, cmd: RemotingCommand) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise RemotingSendError(f"connection {self.remote_address} is closed")
        chunks = encode(cmd)
        if self._options.coalesce_writes:
            # Frames written in one loop iteration leave in one writev at its end: with many
            # requests in flight a send() per response was the broker's largest single cost.
            pending = self._out
            if pending is None:
                self._out = chunks
                self._loop.call_soon(self._flush_out)
            else:
                pending += chunks
            self._out_bytes += sum(len(c) if type(c) is bytes else _nbytes(c) for c in chunks)
            if self._out_bytes >= self._options.write_high_water:
                self._flush_out()  # a big backlog goes now, so the transport can push back at once
        elif len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)
        self._last_activity = self._loop.time()

    def _flush_out(self) -> None:
        chunks, self._out = self._out, None
        self._out_bytes = 0
        transport = self._transport
        if not chunks or transport is None or transport.is_closing():
            return
        if len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)

    async def _wait_drain(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(fut)
        await fut

    def _on_request(self, cmd: RemotingCommand) -> None:
        if self._draining:
            if not cmd.flag & FLAG_ONEWAY and not self._closed:
                self._write(cmd.reply(ResponseCode.SYSTEM_BUSY, remark="server is shutting down"))
            return
        coro = self._serve(cmd)
        # Eager only while the peer reads what we write: otherwise a Task, which max_in_flight counts.
        if self._options.eager_requests and not self._write_paused:
            # Run the handler right here up to its first real wait: most requests (a send with
            # async flush, a pull that finds messages) finish without one, and skip a Task.
            try:
                yielded = coro.send(None)
            except StopIteration:
                return
            except BaseException:  # _serve answers handler errors itself; this is a bug in it
                log.exception("request %s from %s failed", cmd.code, self.remote_address)
                return
            task = self._loop.create_task(_resume(coro, yielded))
        else:
            task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if self.server_side and len(self._tasks) >= self._options.max_in_flight:
            self._pause_reading()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._reading_paused_by_us:
            self._maybe_resume_reading()

    async def _serve(self, cmd: RemotingCommand) -> None:
        handler = self._handler
        response: RemotingCommand | None
        if handler is None:
            response = cmd.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=f"request code {cmd.code} not supported"
            )
        else:
            try:
                result = handler(self, cmd)
                response = await result if inspect.isawaitable(result) else result  # sync handlers work too
            except Exception as exc:
                log.exception("handler failed on request code %s from %s", cmd.code, self.remote_address)
                response = cmd.reply(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if response is None or cmd.flag & FLAG_ONEWAY or self._closed:
            return
        try:
            response.opaque = cmd.opaque
            response.flag |= FLAG_RESPONSE
            self._write(response)
        except RemotingSendError:
            log.debug("response to request code %s dropped: %s closed", cmd.code, self.remote_address)
        except Exception as exc:  # a bad response object must not kill the connection
            log.error("cannot send response to request code %s: %s", cmd.code, exc)
            try:
                self._write(cmd.reply(ResponseCode.SYSTEM_ERROR, remark=f"cannot encode response: {exc}"))
            except RemotingSendError:
                pass

    def _on_header_error(self, exc: HeaderError) -> None:
        log.warning("undecodable command header from %s: %s", self.remote_address, exc)
        if exc.opaque is None:
            return
        flag = exc.flag or 0
        if flag & FLAG_RESPONSE:
            fut = self._pending.pop(exc.opaque, None)
            if fut is not None and not fut.done():
                fut.set_exception(RemotingError(f"undecodable response from {self.remote_address}: {exc}"))
            return
        if flag & FLAG_ONEWAY:
            return
        reply = RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR,
            opaque=exc.opaque,
            flag=FLAG_RESPONSE,
            remark=f"bad request header: {exc}",
            serialize_type=SerializeType(exc.serialize_type),
        )
        if not self._closed:
            self._write(reply)

    def _check_idle(self) -> None:
        self._idle_handle = None
        if self._closed:
            return
        idle = self._options.idle_timeout_s
        elapsed = self._loop.time() - self._last_activity
        if elapsed >= idle and not self._tasks and not self._pending:
            log.info("closing connection %s: idle for %.1fs", self.remote_address, elapsed)
            self.close()
            return
        self._idle_handle = self._loop.call_later(max(idle - elapsed, idle / 10), self._check_idle)

    def _begin_drain(self) -> None:
        self._draining = True
        self._pause_reading()

    def __repr__(self) -> str:
        side = "server" if self.server_side else "client"
        return f"<Connection {side} {self.local_address}<->{self.remote_address}{' closed' if self._closed else ''}>"


async def _resume(coro: Any, yielded: Any) -> None:
    """Finish a coroutine started outside a Task: wait for what it yielded, step it, repeat.

    ``await fut`` in the coroutine yields ``fut`` and, once resumed, reads ``fut.result()``
    itself, so a failed future reaches it as its own exception.
    """
    while True:
        throw: BaseException | None = None
        if yielded is None:  # a bare yield (asyncio.sleep(0))
            await asyncio.sleep(0)
        else:
            # As a Task does: the yield marked the future "blocking"; awaiting it again needs it unmarked.
            yielded._asyncio_future_blocking = False
            try:
                await yielded
            except asyncio.CancelledError:
                if not yielded.cancelled():  # this task was cancelled, not the awaited future
                    throw = asyncio.CancelledError()
            except BaseException:
                pass  # the coroutine sees the future's exception when it reads the result
        try:
            yielded = coro.send(None) if throw is None else coro.throw(throw)
        except StopIteration:
            return


def _nbytes(chunk: bytes | memoryview) -> int:
    return chunk.nbytes if type(chunk) is memoryview else len(chunk)


def _expire(fut: asyncio.Future[RemotingCommand], code: int, address: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(
            RemotingTimeoutError(f"no response to request code {code} from {address} within {timeout}s")
        )


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RemotingConnectError(f"bad address {address!r}; expected host:port")
    return host.strip("[]"), int(port)


class TcpServer:
    """A listening socket; ``handler(conn, request)`` answers every request."""

    def __init__(
        self, host: str, port: int, handler: Handler, options: TcpOptions, ssl_context: ssl.SSLContext | None
    ):
        self._host = host
        self._port = port
        self._handler = handler
        self._options = options
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] = (host, port)
        self._connections: set[Connection] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self, self._handler, self._options, server_side=True),
            self._host,
            self._port,
            ssl=self._ssl,
            backlog=self._options.backlog,
            reuse_address=True,
        )
        sockname = self._server.sockets[0].getsockname()
        self._address = (sockname[0], sockname[1])
        log.info("tcp transport listening on %s:%s%s", *self._address, " (TLS)" if self._ssl else "")

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def connections(self) -> list[Connection]:
        return list(self._connections)

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``drain_timeout``), then close."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        conns = list(self._connections)
        for conn in conns:
            conn._begin_drain()
        tasks = [t for conn in conns for t in conn._tasks]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            if pending:
                log.warning(
                    "%d requests still running after %.1fs drain; cancelled", len(pending), drain_timeout
                )
        for conn in conns:
            conn.close()
        waits = [conn.lost for conn in conns if not conn.lost.done()]
        if waits:
            _done, slow = await asyncio.wait(waits, timeout=1.0)
            if slow:
                for conn in conns:
                    if not conn.closed:
                        conn.abort()
                await asyncio.wait(slow, timeout=1.0)
        try:
            await asyncio.wait_for(server.wait_closed(), timeout=1.0)
        except TimeoutError:
            pass

    def _connection_made(self, conn: Connection) -> None:
        self._connections.add(conn)
        log.debug("accepted %r", conn)

    def _connection_lost(self, conn: Connection) -> None:
        self._connections.discard(conn)
        log.debug("lost %r", conn)


class TcpClient:
    """Pooled client: one connection per ``host:port``, reconnected on demand."""

    def __init__(self, handler: Handler | None, options: TcpOptions, ssl_context: ssl.SSLContext | None):
        self._handler = handler
        self._options = options
        self._ssl = ssl_context
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Task[Connection]] = {}
        self._closed = False

    async def connection(self, address: str) -> Connection:
        """The pooled connection to ``address``, connecting if needed."""
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise RemotingSendError("client is closed")
        task = self._connecting.get(address)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect(address))
            self._connecting[address] = task

            def done(t: asyncio.Task[Connection], address: str = address) -> None:
                if self._connecting.get(address) is t:
                    del self._connecting[address]
                if not t.cancelled():
                    t.exception()  # mark retrieved: callers get it through shield

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _connect(self, address: str) -> Connection:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        try:
            _transport, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self, self._handler, self._options, server_side=False),
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=host if self._ssl is not None else None,
                ),
                timeout=self._options.connect_timeout_s,
            )
        except TimeoutError:
            raise RemotingConnectError(
                f"cannot connect to {address}: no answer within {self._options.connect_timeout_s}s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise RemotingConnectError(f"cannot connect to {address}: {exc}") from exc
        if self._closed:
            conn.close()
            raise RemotingSendError("client is closed")
        self._conns[address] = conn
        return conn

    async def invoke(self, address: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        conn = await self.connection(address)
        return await conn.invoke(request, timeout)

    async def invoke_oneway(self, address: str, request: RemotingCommand) -> None:
        conn = await self.connection(address)
        await conn.invoke_oneway(request)

    def close_connection(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close()
        waits = [c.lost for c in conns if not c.lost.done()]
        if waits:
            await asyncio.wait(waits, timeout=1.0)

    def _connection_made(self, conn: Connection) -> None:
        log.debug("connected %r", conn)

    def _connection_lost(self, conn: Connection) -> None:
        for address, pooled in list(self._conns.items()):
            if pooled is conn:
                del self._conns[address]


class TcpTransport:
    """The ``tcp`` transport: what the plugin factory returns."""

    name = "tcp"

    def __init__(self, options: TcpOptions | None = None):
        self.options = options or TcpOptions()

    def _resolve(self, options: dict[str, Any], where: str) -> tuple[TcpOptions, ssl.SSLContext | None, bool]:
        ctx = options.pop("ssl", None)
        opts = self.options.with_overrides(options, where)
        return opts, ctx, ctx is not None

    def server(self, host: str, port: int, handler: Handler, **options: Any) -> TcpServer:
        opts, ctx, given = self._resolve(dict(options), "transport.server()")
        return TcpServer(host, port, handler, opts, ctx if given else opts.server_ssl())

    def client(self, handler: Handler | None = None, **options: Any) -> TcpClient:
        opts, ctx, given = self._resolve(dict(options), "transport.client()")
        return TcpClient(handler, opts, ctx if given else opts.client_ssl())
