"""asyncio TCP transport: servers and pooled clients exchanging RemotingCommands.

:class:`TcpServer` listens and keeps the partial-frame budget of its connections; :class:`TcpClient`
pools one connection per address; :class:`TcpTransport` is what the plugin factory returns.  The
per-connection protocol lives in :mod:`tidemq_transport_tcp.connection`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import ssl
from typing import Any

from tidemq.address import format_address, split_address
from tidemq.errors import ConfigError
from tidemq.remoting import RemotingCommand, RemotingConnectError, RemotingSendError
from tidemq_transport_tcp.connection import _READ_SLACK, Connection, Handler
from tidemq_transport_tcp.options import TcpOptions

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """An address to connect to: ``(host, port)``; RemotingConnectError when it is not one."""
    try:
        host, port = split_address(address)
    except ValueError:
        host, port = "", 0
    if not host or not 0 < port < 65536:
        raise RemotingConnectError(f"bad address {address!r}; expected host:port")
    return host, port


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
        self._buffered = 0
        # Never below one frame of the largest allowed size, with the bytearray's growth (up to 1/8)
        # and a read past its end: a budget that one legitimate frame cannot fit would close every
        # peer that sends one.  max_frame_size may be a [broker]/[namesrv] override, so refusing the
        # combination would turn a broker config that used to start into a startup error.
        frame = options.max_frame_size
        self._budget = max(options.max_buffered_bytes, frame + frame // 8 + _READ_SLACK)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: Connection(self, self._handler, self._options, server_side=True),
                self._host,
                self._port,
                ssl=self._ssl,
                backlog=self._options.backlog,
                reuse_address=True,
            )
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # asyncio and uvloop word it differently; the address is what the operator needs.
            raise OSError(
                errno.EADDRINUSE,
                f"cannot listen on {format_address(self._host, self._port)}: address already in use",
            ) from exc
        sockname = self._server.sockets[0].getsockname()
        self._address = (sockname[0], sockname[1])
        log.info("tcp transport listening on %s:%s%s", *self._address, " (TLS)" if self._ssl else "")

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def connections(self) -> list[Connection]:
        return list(self._connections)

    @property
    def buffered_bytes(self) -> int:
        """Memory held in partial frames by all connections (what ``max_buffered_bytes`` bounds)."""
        return self._buffered

    def _buffer_changed(self, delta: int) -> None:
        self._buffered += delta
        if delta > 0 and self._buffered > self._budget:
            self._enforce_budget()

    def _enforce_budget(self) -> None:
        """Close connections holding partial frames until the total is within the budget.

        The victims are the connections that have gone longest without completing a frame: a peer
        that holds memory hostage must stop sending (a frame that keeps arriving completes, and a
        busy connection completes frames all the time), so it ages, while frames in progress stay
        fresh.  Closing the largest holder instead would close a legitimate large send whenever many
        small stalled partials fill the budget; closing the connection whose read crossed the line
        would let stalled peers that came first shut everyone else out.  Pausing reads instead could
        deadlock: if every connection holds part of a frame, none can finish and free its share.
        """
        holders = sorted(
            (c for c in self._connections if c._held), key=lambda c: (c._partial_since, -c._held)
        )
        total = self._buffered
        for conn in holders:
            if self._buffered <= self._budget:
                break
            conn._close_after_answers(
                f"partial frames of all connections hold {total} bytes, over max_buffered_bytes "
                f"{self._budget}; this connection's {conn._held} bytes are the oldest "
                f"({conn._loop.time() - conn._partial_since:.1f}s without completing a frame)"
            )

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``drain_timeout``), then close."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        conns = list(self._connections)
        for conn in conns:
            conn._begin_drain()
        tasks: list[asyncio.Future[Any]] = [t for conn in conns for t in conn._tasks]
        tasks += [f for f in (conn._answers_later() for conn in conns) if f is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            for conn in conns:
                conn._cancel_parked()  # the sends parked on a future, as their tasks would be
            if pending:
                log.warning(
                    "%d requests still running after %.1fs drain; cancelled", len(pending), drain_timeout
                )
        for conn in conns:
            conn.close()
        waits = [conn.lost for conn in conns if not conn.lost.done()]
        if waits:
            _closed, slow = await asyncio.wait(waits, timeout=1.0)
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

    def _buffer_changed(self, delta: int) -> None:
        pass  # a client reads the answers it asked for: only servers budget partial frames

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
        if not given:
            check_tls_files(opts)
        return TcpServer(host, port, handler, opts, ctx if given else opts.server_ssl())

    def client(self, handler: Handler | None = None, **options: Any) -> TcpClient:
        opts, ctx, given = self._resolve(dict(options), "transport.client()")
        if not given:
            check_tls_files(opts)
        return TcpClient(handler, opts, ctx if given else opts.client_ssl())


def check_tls_files(opts: TcpOptions) -> None:
    """With TLS on, every file named must exist and be readable: one line naming the key and path.

    ``ssl`` reports a missing file as a bare ``[Errno 2]`` without its name.
    """
    if not opts.tls:
        return
    for key, what in _TLS_FILES:
        path = getattr(opts, key)
        if not path:
            continue
        where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
        if not os.path.isfile(path):
            raise ConfigError(
                f"[transport.tcp] {key} = {path!r}: no such file{where}, the TLS {what}; "
                "fix the path (absolute paths are safest) or set tls = false"
            )
        if not os.access(path, os.R_OK):
            raise ConfigError(
                f"[transport.tcp] {key} = {path!r}: not readable by this user{where}, the TLS {what}; "
                "fix its permissions"
            )


_TLS_FILES = (
    ("tls_certfile", "certificate"),
    ("tls_keyfile", "private key"),
    ("tls_cafile", "CA certificate"),
)
