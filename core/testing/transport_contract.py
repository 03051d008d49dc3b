"""The transport contract (role ``transport``) as a reusable pytest suite.

Subclass :class:`TransportContract` and provide a ``make_transport`` fixture returning a factory
``() -> Transport``; set ``max_frame_size`` to the frame budget those transports enforce::

    import pytest
    from tidemq.testing.transport_contract import TransportContract

    @pytest.fixture
    def make_transport(tidemq_plugins):
        return lambda: tidemq_plugins.create("transport", "quic", options={"max_frame_size": 65536})

    class TestQuicTransport(TransportContract):
        max_frame_size = 65536

Every test runs a real server on 127.0.0.1 port 0 and real clients, in one event loop per test
(override :meth:`TransportContract.run` to pick the loop).  What the contract asks (see
:mod:`tidemq.transport`): responses match their requests under concurrency; a oneway request
reaches the handler without anyone waiting for it; a handler that raises is answered with
SYSTEM_ERROR and the connection kept; a connection's close callbacks fire once; ``remote_address``
is the peer's ``host:port``; ``stop()`` answers requests in flight, then refuses new ones; a frame
over the budget fails its call with a :class:`~tidemq.remoting.RemotingError` (not a timeout) and
the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from tidemq.address import split_address
from tidemq.remoting import RemotingCommand, RemotingError, RemotingTimeoutError, ResponseCode
from tidemq.transport import Connection, RequestHandler, Transport, TransportClient, TransportServer

MakeTransport = Callable[[], Transport]
#: Request codes the suite's handler understands.
ECHO, SLOW, FAIL, ONEWAY_HOLD = 101, 102, 103, 104
TIMEOUT_S = 5.0


def address_of(server: TransportServer) -> str:
    host, port = server.address[:2]
    return f"{host}:{port}"


class Recorder:
    """The suite's request handler: echoes, sleeps, fails or holds, and remembers what it saw."""

    def __init__(self) -> None:
        self.connections: list[Connection] = []
        self.requests: list[RemotingCommand] = []
        self.release = asyncio.Event()

    async def __call__(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        self.connections.append(conn)
        self.requests.append(request)
        if request.code == SLOW:
            await asyncio.sleep(float(request.ext_fields.get("sleep", "0.3")))
        elif request.code == FAIL:
            raise ValueError(f"handler failed on purpose ({request.ext_fields.get('tag', '')})")
        elif request.code == ONEWAY_HOLD:
            await self.release.wait()
            return None
        return request.reply(ext_fields={"echo": request.ext_fields.get("i", "")}, body=request.body)


class TransportContract:
    """What every :class:`tidemq.transport.Transport` must do; needs a ``make_transport`` fixture."""

    #: The frame budget of the transports ``make_transport`` builds (None: skip the oversize test).
    max_frame_size: int | None = None
    host = "127.0.0.1"

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one test's coroutine; the default is a fresh asyncio loop."""
        return asyncio.run(coro)

    @contextlib.asynccontextmanager
    async def serving(
        self, transport: Transport, handler: RequestHandler
    ) -> AsyncIterator[tuple[TransportServer, TransportClient, str]]:
        server = transport.server(self.host, 0, handler)
        await server.start()
        client = transport.client()
        try:
            yield server, client, address_of(server)
        finally:
            await client.close()
            await server.stop(drain_timeout=1.0)

    # ------------------------------------------------------------------ shape
    def test_fits_the_transport_role(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            transport = make_transport()
            assert isinstance(transport, Transport)
            async with self.serving(transport, Recorder()) as (server, client, address):
                assert isinstance(server, TransportServer) and isinstance(client, TransportClient)
                host, port = server.address[:2]
                assert host == self.host and 0 < port < 65536, f"server.address is {server.address}"

        self.run(main())

    # ------------------------------------------------------------------ requests
    def test_invoke_round_trip_matches_concurrent_requests(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            handler = Recorder()
            async with self.serving(make_transport(), handler) as (_server, client, address):
                requests = [
                    RemotingCommand.request(
                        SLOW, {"i": i, "sleep": (30 - i) / 1000}, bytes([i]) * (i * 97) + bytes(range(256))
                    )
                    for i in range(30)
                ]
                answers = await asyncio.gather(*(client.invoke(address, r, TIMEOUT_S) for r in requests))
                for request, answer in zip(requests, answers, strict=True):
                    assert answer.code == ResponseCode.SUCCESS
                    assert answer.opaque == request.opaque, "a response went to the wrong request"
                    assert answer.ext_fields.get("echo") == request.ext_fields["i"]
                    assert answer.body == request.body
                got = handler.requests[0]
                assert got.code == SLOW and got.ext_fields["sleep"] and got.body
                assert all(isinstance(c, Connection) for c in handler.connections)

        self.run(main())

    def test_oneway_reaches_the_handler_without_waiting_for_it(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            handler = Recorder()
            async with self.serving(make_transport(), handler) as (_server, client, address):
                request = RemotingCommand.request(ONEWAY_HOLD, {"k": "v"}, b"heartbeat")
                # The handler holds until released: a oneway call that waited for it would hang.
                await asyncio.wait_for(client.invoke_oneway(address, request), TIMEOUT_S)
                deadline = time.monotonic() + TIMEOUT_S
                while not handler.requests and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert handler.requests, "the oneway request never reached the handler"
                got = handler.requests[0]
                assert (got.code, got.body, got.ext_fields.get("k")) == (ONEWAY_HOLD, b"heartbeat", "v")
                handler.release.set()
                answer = await client.invoke(address, RemotingCommand.request(ECHO, {"i": 7}), TIMEOUT_S)
                assert answer.code == ResponseCode.SUCCESS and answer.ext_fields.get("echo") == "7"

        self.run(main())

    def test_handler_error_is_answered_with_system_error(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            async with self.serving(make_transport(), Recorder()) as (_server, client, address):
                request = RemotingCommand.request(FAIL, {"tag": "xyzzy"})
                answer = await client.invoke(address, request, 2.0)
                assert answer.code == ResponseCode.SYSTEM_ERROR and answer.opaque == request.opaque
                assert "xyzzy" in (answer.remark or ""), "the remark must carry the handler's error"
                # The connection survives a failed handler.
                again = await client.invoke(address, RemotingCommand.request(ECHO, {"i": 1}), TIMEOUT_S)
                assert again.code == ResponseCode.SUCCESS

        self.run(main())

    # ------------------------------------------------------------------ connections
    def test_close_callback_and_remote_address(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            transport = make_transport()
            handler = Recorder()
            async with self.serving(transport, handler) as (server, client, address):
                other = transport.client()
                try:
                    await client.invoke(address, RemotingCommand.request(ECHO), TIMEOUT_S)
                    await other.invoke(address, RemotingCommand.request(ECHO), TIMEOUT_S)
                finally:
                    await other.close()
                first, second = handler.connections[0], handler.connections[1]
                for conn in (first, second):
                    host, port = split_address(conn.remote_address)
                    assert host in (self.host, f"::ffff:{self.host}"), conn.remote_address
                    assert 0 < port < 65536 and port != server.address[1]
                assert first.remote_address != second.remote_address
                closed: list[Any] = []
                first.add_close_callback(closed.append)
                assert not first.closed
                await client.close()
                deadline = time.monotonic() + 2.0  # loopback: the server sees the close at once
                while not closed and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert closed == [first], "the close callback did not fire once with the connection"
                assert first.closed
                late: list[Any] = []
                first.add_close_callback(late.append)  # already closed: called soon
                await asyncio.sleep(0.2)
                assert late == [first] and closed == [first]

        self.run(main())

    def test_stop_answers_requests_in_flight_then_refuses(self, make_transport: MakeTransport) -> None:
        async def main() -> None:
            transport = make_transport()
            server = transport.server(self.host, 0, Recorder())
            await server.start()
            address = address_of(server)
            client = transport.client()
            try:
                slow = asyncio.ensure_future(
                    client.invoke(address, RemotingCommand.request(SLOW, {"sleep": 0.3}), TIMEOUT_S)
                )
                await asyncio.sleep(0.1)
                await asyncio.wait_for(server.stop(drain_timeout=TIMEOUT_S), TIMEOUT_S + 5)
                try:
                    answer = await slow
                except RemotingError as exc:
                    raise AssertionError(f"stop() dropped a request in flight: {exc}") from None
                assert answer.code == ResponseCode.SUCCESS, "a request in flight was not answered by stop()"
                await asyncio.wait_for(server.stop(), TIMEOUT_S)  # a second stop() is harmless
                fresh = transport.client()
                try:
                    with pytest.raises(RemotingError):
                        await asyncio.wait_for(
                            fresh.invoke(address, RemotingCommand.request(ECHO), 2.0), TIMEOUT_S
                        )
                finally:
                    await fresh.close()
            finally:
                await client.close()
                await server.stop()

        self.run(main())

    def test_oversized_frame_fails_clearly_and_the_server_keeps_serving(
        self, make_transport: MakeTransport
    ) -> None:
        limit = self.max_frame_size
        if limit is None:
            pytest.skip("max_frame_size not declared")

        async def main() -> None:
            async with self.serving(make_transport(), Recorder()) as (_server, client, address):
                big = RemotingCommand.request(ECHO, {"i": "big"}, bytes(limit + 1))
                begin = time.monotonic()
                try:
                    answer = await client.invoke(address, big, TIMEOUT_S)
                except RemotingTimeoutError:
                    raise AssertionError("an oversized frame was met with silence (a timeout)") from None
                except RemotingError:
                    pass
                else:
                    raise AssertionError(f"a frame over max_frame_size {limit} was answered: {answer}")
                assert time.monotonic() - begin < TIMEOUT_S
                small = RemotingCommand.request(ECHO, {"i": 2}, b"small")
                answer = await client.invoke(address, small, TIMEOUT_S)
                assert answer.code == ResponseCode.SUCCESS and answer.body == b"small"

        self.run(main())
