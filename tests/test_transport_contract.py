"""The transport contract (tidemq.testing.transport_contract) against the tcp transport, and against
broken stand-ins it must catch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.plugins import PluginManager
from tidemq.remoting import RemotingCommand, RemotingTimeoutError, RequestCode, ResponseCode
from tidemq.testing.transport_contract import TransportContract
from tidemq.transport import Connection, RequestHandler, Transport
from tidemq_transport_tcp import TcpTransport, run

pytestmark = pytest.mark.timeout(60)

FRAME = 64 * 1024


class TestTcpTransportContract(TransportContract):
    max_frame_size = FRAME

    @pytest.fixture
    def make_transport(self, tidemq_plugins: PluginManager) -> Callable[[], Transport]:
        return lambda: tidemq_plugins.create("transport", "tcp", options={"max_frame_size": FRAME})


class TestTcpTransportContractUvloop(TestTcpTransportContract):
    """The same on the loop the broker runs (uvloop when installed)."""

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return run(coro)


# ---------------------------------------------------------------------- the suite catches broken transports
class DeafConnection:
    """A server-side connection that never reports its closing."""

    def __init__(self, inner: Connection):
        self._inner = inner
        self.remote_address = inner.remote_address
        self.context = inner.context

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def add_close_callback(self, fn: Callable[[Any], Any]) -> None:
        return None

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        return await self._inner.invoke(request, timeout)

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        await self._inner.invoke_oneway(request)

    def send_response(self, response: RemotingCommand) -> None:
        self._inner.send_response(response)


class Wrapped(TcpTransport):
    """The tcp transport with its handler wrapped by ``wrap``."""

    def __init__(self, wrap: Callable[[RequestHandler], RequestHandler], **options: Any):
        super().__init__()
        self.options = self.options.with_overrides(options, "test")
        self.wrap = wrap

    def server(self, host: str, port: int, handler: RequestHandler, **options: Any) -> Any:
        return super().server(host, port, self.wrap(handler), **options)


def silent_on_errors(handler: RequestHandler) -> RequestHandler:
    async def wrapped(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        try:
            return await handler(conn, request)
        except Exception:
            return None  # the error is swallowed: the caller waits for nothing

    return wrapped


def deaf_connections(handler: RequestHandler) -> RequestHandler:
    async def wrapped(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        return await handler(DeafConnection(conn), request)

    return wrapped


def test_contract_catches_a_handler_error_left_unanswered() -> None:
    with pytest.raises(RemotingTimeoutError):
        TestTcpTransportContract().test_handler_error_is_answered_with_system_error(
            lambda: Wrapped(silent_on_errors)
        )


def test_contract_catches_close_callbacks_that_never_fire() -> None:
    with pytest.raises(AssertionError, match="close callback"):
        TestTcpTransportContract().test_close_callback_and_remote_address(lambda: Wrapped(deaf_connections))


def test_contract_catches_a_frame_budget_that_is_not_enforced() -> None:
    # Declares 64 KiB but accepts 16 MiB frames.
    with pytest.raises(AssertionError, match="was answered"):
        TestTcpTransportContract().test_oversized_frame_fails_clearly_and_the_server_keeps_serving(
            lambda: Wrapped(lambda h: h)
        )


def test_contract_catches_a_stop_that_drops_requests_in_flight() -> None:
    class Impatient(TcpTransport):
        def server(self, host: str, port: int, handler: RequestHandler, **options: Any) -> Any:
            real = super().server(host, port, handler, **options)
            stop = real.stop

            async def no_drain(drain_timeout: float = 5.0) -> None:
                await stop(drain_timeout=0.0)

            real.stop = no_drain  # type: ignore[method-assign]
            return real

    with pytest.raises(AssertionError, match="in flight"):
        TestTcpTransportContract().test_stop_answers_requests_in_flight_then_refuses(Impatient)


# ---------------------------------------------------------------------- the pytest plugin's broker factory
def test_make_broker_serves_on_loopback(
    tidemq_make_broker: Callable[..., contextlib.AbstractAsyncContextManager[Broker]],
    tidemq_plugins: PluginManager,
) -> None:
    async def main() -> None:
        async with tidemq_make_broker({"store": "memory"}, role="ASYNC_MASTER") as broker:
            host, _, port = broker.address.rpartition(":")
            assert broker.running and host == "127.0.0.1" and int(port) > 0
            client = tidemq_plugins.create("transport", "tcp").client()
            try:
                request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                answer = await client.invoke(broker.address, request, 5.0)
            finally:
                await client.close()
            assert answer.code == ResponseCode.SUCCESS
            table = orjson.loads(answer.body or b"{}")["table"]
            assert table["brokerAddr"] == broker.address and table["brokerRole"] == "ASYNC_MASTER"
        assert not broker.running

    asyncio.run(main())
