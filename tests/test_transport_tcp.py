"""The tcp transport over real loopback sockets."""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import subprocess
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from tidemq.errors import ConfigError
from tidemq.plugins import get_plugin_manager
from tidemq.remoting import (
    RemotingCommand,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
    ResponseCode,
    SerializeType,
)
from tidemq.remoting.codec import FrameDecoder, encode_bytes
from tidemq_transport_tcp import TcpTransport, new_event_loop, run

pytestmark = pytest.mark.timeout(60)


def arun(coro: Coroutine[Any, Any, Any], use_uvloop: bool = True) -> Any:
    if use_uvloop:
        return run(coro)
    with asyncio.Runner() as runner:
        return runner.run(coro)


def addr_of(server: Any) -> str:
    host, port = server.address
    return f"{host}:{port}"


async def echo(conn: Any, req: RemotingCommand) -> RemotingCommand:
    return req.reply(ext_fields={"echo": req.ext_fields.get("i", "")}, body=req.body)


def transport(**options: Any) -> TcpTransport:
    return get_plugin_manager().create("transport", "tcp", options=options)


def test_plugin_is_registered_and_options_are_checked() -> None:
    assert isinstance(transport(), TcpTransport)
    with pytest.raises(ConfigError, match="idle_timeout"):
        transport(idle_timeout=3)
    assert new_event_loop() is not None


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_request_response_and_correlation_under_concurrency(use_uvloop: bool) -> None:
    async def main() -> None:
        seen_peers = set()

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            seen_peers.add(conn.remote_address)
            i = int(req.ext_fields["i"])
            await asyncio.sleep((i % 7) * 0.002)  # answers come back out of order
            return await echo(conn, req)

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        assert server.address[1] != 0
        client = t.client()
        try:
            reqs = [RemotingCommand.request(10, {"i": i}, f"body-{i}".encode()) for i in range(300)]
            resps = await asyncio.gather(*(client.invoke(addr_of(server), r, 5) for r in reqs))
            for req, resp in zip(reqs, resps, strict=True):
                assert resp.is_response and resp.opaque == req.opaque
                assert resp.code == ResponseCode.SUCCESS
                assert resp.body == req.body and resp.ext_fields["echo"] == req.ext_fields["i"]
            assert len(seen_peers) == 1  # one pooled connection
        finally:
            await client.close()
            await server.stop()

    arun(main(), use_uvloop)


def test_slow_request_does_not_block_others_on_the_same_connection() -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            if req.code == 11:
                await release.wait()
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            slow = asyncio.ensure_future(client.invoke(addr_of(server), RemotingCommand.request(11), 5))
            for _ in range(20):
                fast = await client.invoke(addr_of(server), RemotingCommand.request(10), 2)
                assert fast.code == 0
            assert not slow.done()
            release.set()
            assert (await slow).code == 0
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_oneway_reaches_handler_without_response() -> None:
    async def main() -> None:
        got: asyncio.Queue[RemotingCommand] = asyncio.Queue()

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand | None:
            await got.put(req)
            return req.reply()  # dropped: the request is oneway

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            await client.invoke_oneway(addr_of(server), RemotingCommand.request(34, {"k": "v"}, b"hb"))
            req = await asyncio.wait_for(got.get(), 2)
            assert req.is_oneway and req.body == b"hb" and req.ext_fields == {"k": "v"}
            # the connection still correlates normal calls (no stray response was sent)
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_timeout_then_connection_still_works() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            if req.code == 11:
                await asyncio.sleep(0.5)
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            with pytest.raises(RemotingTimeoutError, match="request code 11"):
                await client.invoke(addr_of(server), RemotingCommand.request(11), 0.1)
            await asyncio.sleep(0.6)  # the late response arrives and is dropped
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_handler_exception_becomes_system_error_and_connection_is_kept() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            if req.code == 13:
                raise KeyError("boom")
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            bad = await client.invoke(addr_of(server), RemotingCommand.request(13), 2)
            assert bad.code == ResponseCode.SYSTEM_ERROR and "boom" in (bad.remark or "")
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
            assert len(server.connections) == 1
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_connect_errors_are_typed() -> None:
    async def main() -> None:
        client = transport(connect_timeout_s=1.0).client()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # bound but not listening: refused
            with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}"):
                await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(10), 1)
        with pytest.raises(RemotingConnectError, match="bad address"):
            await client.invoke("no-port", RemotingCommand.request(10), 1)
        await client.close()

    arun(main())


async def _raw_call(host: str, port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    try:
        return await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()


def test_garbage_closes_only_that_connection() -> None:
    async def main() -> None:
        t = transport()
        server = t.server("127.0.0.1", 0, echo)
        await server.start()
        client = t.client()
        try:
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
            host, port = server.address
            # an absurd frame length: the server closes that connection without answering
            assert await _raw_call(host, port, b"\xff" * 64) == b""
            assert await _raw_call(host, port, struct.pack(">II", 8, 9 << 24) + b"abcd") == b""
            # the well-behaved client's connection is untouched
            for i in range(5):
                resp = await client.invoke(addr_of(server), RemotingCommand.request(10, {"i": i}), 2)
                assert resp.ext_fields["echo"] == str(i)
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_bad_header_gets_error_response_and_connection_survives() -> None:
    async def main() -> None:
        t = transport()
        server = t.server("127.0.0.1", 0, echo)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            header = b'{"code":"not-a-number","opaque":77,"flag":0}'
            bad = struct.pack(">II", 4 + len(header), len(header)) + header
            good = RemotingCommand.request(10, {"i": "5"})
            writer.write(bad + encode_bytes(good))
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < 2:
                got += decoder.feed(await asyncio.wait_for(reader.read(65536), 3))
            by_opaque = {c.opaque: c for c in got}
            assert by_opaque[77].code == ResponseCode.SYSTEM_ERROR and "code" in (by_opaque[77].remark or "")
            assert by_opaque[good.opaque].code == 0 and by_opaque[good.opaque].ext_fields["echo"] == "5"
            writer.close()
        finally:
            await server.stop()

    arun(main())


def test_idle_connections_are_closed_and_client_reconnects() -> None:
    async def main() -> None:
        t = transport()
        server = t.server("127.0.0.1", 0, echo, idle_timeout_s=0.3)
        await server.start()
        client = t.client()
        try:
            closed = asyncio.Event()
            first_peer: list[str] = []

            async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
                first_peer.append(conn.remote_address)
                conn.add_close_callback(lambda c: closed.set())
                return req.reply()

            server._handler = handler  # the same server, now noting its connections
            await client.invoke(addr_of(server), RemotingCommand.request(10), 2)
            await asyncio.wait_for(closed.wait(), 3)
            assert server.connections == []
            await client.invoke(addr_of(server), RemotingCommand.request(10), 2)
            assert first_peer[0] != first_peer[1]  # a new connection was made on demand
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_busy_connection_is_not_idle() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(0.8)  # a held request (long polling) longer than the idle timeout
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler, idle_timeout_s=0.2)
        await server.start()
        client = t.client()
        try:
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 3)).code == 0
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_backpressure_stops_reading_from_a_peer_that_does_not_read() -> None:
    async def main() -> None:
        handled = 0
        big = b"r" * (512 * 1024)

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            nonlocal handled
            handled += 1
            return req.reply(body=big)

        t = transport()
        server = t.server(
            "127.0.0.1", 0, handler, write_high_water=64 * 1024, write_low_water=16 * 1024, max_in_flight=8
        )
        await server.start()
        try:
            n = 120
            reader, writer = await asyncio.open_connection(*server.address, limit=64 * 1024)
            reqs = [RemotingCommand.request(10, body=b"q" * 32 * 1024) for _ in range(n)]
            writer.write(b"".join(encode_bytes(r) for r in reqs))  # ~4 MiB of requests; we never read
            await asyncio.sleep(1.0)
            assert handled < n // 2  # the server stopped taking requests it cannot answer
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < n:
                chunk = await asyncio.wait_for(reader.read(1 << 20), 5)
                assert chunk
                got += decoder.feed(chunk)
            assert handled == n and all(c.body == big for c in got)
            assert sorted(c.opaque for c in got) == sorted(r.opaque for r in reqs)
            writer.close()
        finally:
            await server.stop()

    arun(main())


def test_graceful_stop_drains_in_flight_requests() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            started.set()
            await asyncio.sleep(0.4)
            return req.reply(body=b"done")

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        address = addr_of(server)
        client = t.client()
        try:
            calls = [
                asyncio.ensure_future(client.invoke(address, RemotingCommand.request(10), 5))
                for _ in range(5)
            ]
            await asyncio.wait_for(started.wait(), 2)
            await server.stop(drain_timeout=5.0)
            assert [(await c).body for c in calls] == [b"done"] * 5
            with pytest.raises((RemotingConnectError, RemotingSendError)):
                await client.invoke(address, RemotingCommand.request(10), 1)
        finally:
            await client.close()

    arun(main())


def test_stop_cancels_requests_beyond_drain_timeout() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(30)
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            call = asyncio.ensure_future(client.invoke(addr_of(server), RemotingCommand.request(10), 10))
            await asyncio.sleep(0.1)
            await server.stop(drain_timeout=0.2)
            with pytest.raises(RemotingSendError, match="closed"):
                await call
        finally:
            await client.close()

    arun(main())


def test_server_initiated_request_to_client_handler() -> None:
    async def main() -> None:
        answers: list[RemotingCommand] = []

        async def server_handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            # like NOTIFY_CONSUMER_IDS_CHANGED / CHECK_TRANSACTION_STATE: broker asks the client back
            answers.append(await conn.invoke(RemotingCommand.request(39, {"msgId": "m1"}), 2))
            await conn.invoke_oneway(RemotingCommand.request(40, {"consumerGroup": "g"}))
            return req.reply()

        notified = asyncio.Event()

        async def client_handler(conn: Any, req: RemotingCommand) -> RemotingCommand | None:
            if req.code == 40:
                assert req.is_oneway
                notified.set()
                return None
            return req.reply(ext_fields={"seen": req.ext_fields["msgId"]})

        t = transport()
        server = t.server("127.0.0.1", 0, server_handler)
        await server.start()
        client = t.client(handler=client_handler)
        try:
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 3)).code == 0
            assert answers[0].ext_fields == {"seen": "m1"}
            await asyncio.wait_for(notified.wait(), 2)
            # a client without a handler answers REQUEST_CODE_NOT_SUPPORTED
            plain = t.client()
            answers.clear()
            await plain.invoke(addr_of(server), RemotingCommand.request(10), 3)
            assert answers[0].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            await plain.close()
        finally:
            await client.close()
            await server.stop()

    arun(main())


def test_peer_closing_fails_pending_calls() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            conn.close()
            await asyncio.sleep(1)
            return req.reply()

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            with pytest.raises(RemotingSendError, match="closed"):
                await client.invoke(addr_of(server), RemotingCommand.request(10), 3)
        finally:
            await client.close()
            await server.stop()

    arun(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_round_trip(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )

    async def main() -> None:
        tls = transport(tls=True, tls_certfile=str(cert), tls_keyfile=str(key))
        server = tls.server("127.0.0.1", 0, echo)
        await server.start()
        client = transport(tls=True, tls_cafile=str(cert), tls_check_hostname=True).client()
        plain = transport().client()
        try:
            resp = await client.invoke(addr_of(server), RemotingCommand.request(10, {"i": 1}, b"secret"), 3)
            assert resp.body == b"secret"
            # a plaintext client cannot talk to the TLS server
            with pytest.raises((RemotingSendError, RemotingTimeoutError)):
                await plain.invoke(addr_of(server), RemotingCommand.request(10), 1)
        finally:
            await client.close()
            await plain.close()
            await server.stop()

    arun(main())


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_body_parts_from_a_shared_buffer_arrive_intact(use_uvloop: bool) -> None:
    store = bytearray(b"".join(bytes([i]) * 1000 for i in range(200)))  # like a mapped commit-log file

    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            view = memoryview(store)
            parts = tuple(view[i * 1000 : (i + 1) * 1000] for i in range(0, 200, 3))
            return req.reply(ext_fields={"n": len(parts)}, body_parts=parts)

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            resps = await asyncio.gather(
                *(client.invoke(addr_of(server), RemotingCommand.request(11), 3) for _ in range(5))
            )
            expected = b"".join(bytes([i]) * 1000 for i in range(0, 200, 3))
            assert all(r.body == expected for r in resps)
        finally:
            await client.close()
            await server.stop()

    arun(main(), use_uvloop)


# ---------------------------------------------------------------------------- hostile bytes (issue 20.8)


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body


async def read_until_closed(reader: asyncio.StreamReader, timeout: float = 5.0) -> tuple[list, bool]:
    """The commands the server sends, and whether it closed the connection within ``timeout``."""
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - loop.time()))
        except TimeoutError:
            return got, False
        except ConnectionError:
            return got, True
        if not chunk:
            return got, True
        got += decoder.feed(chunk)


async def slow_echo(conn: Any, req: RemotingCommand) -> RemotingCommand:
    if req.code == 12:
        await asyncio.sleep(0.2)  # still running when the bad frame behind it is read
    return await echo(conn, req)


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_deeply_nested_header_is_answered_and_the_connection_survives(use_uvloop: bool) -> None:
    async def main() -> None:
        server = transport().server("127.0.0.1", 0, echo)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            # The value's depth; with the header object and extFields around it, 1022 makes 1024.
            for depth in (255, 600, 1022):
                nested = b"[" * depth + b"]" * depth
                bad = raw_frame(b'{"code":10,"opaque":77,"flag":0,"extFields":{"k":' + nested + b"}}")
                good = RemotingCommand.request(10, {"i": depth})
                writer.write(bad + encode_bytes(good))
                decoder = FrameDecoder()
                got: list[RemotingCommand] = []
                while len(got) < 2:
                    chunk = await asyncio.wait_for(reader.read(65536), 3)
                    assert chunk, f"connection dropped at depth {depth}"
                    got += decoder.feed(chunk)
                by_opaque = {c.opaque: c for c in got}
                assert by_opaque[77].code == ResponseCode.SYSTEM_ERROR
                assert "nested" in (by_opaque[77].remark or "")
                assert by_opaque[good.opaque].ext_fields["echo"] == str(depth)
            writer.close()
        finally:
            await server.stop()

    arun(main(), use_uvloop)


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
@pytest.mark.parametrize(
    "bad",
    [
        b"\xff" * 8,  # oversize length
        struct.pack(">II", 8, 9 << 24) + b"abcd",  # unknown serialize type
        struct.pack(">I", 1) + b"\x00" * 4,  # length too small
    ],
    ids=["oversize", "stype", "tiny"],
)
def test_good_frames_before_a_broken_frame_are_answered_then_the_connection_closes(
    use_uvloop: bool, bad: bytes
) -> None:
    async def main() -> None:
        server = transport().server("127.0.0.1", 0, slow_echo)
        await server.start()
        client = transport().client()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            goods = [RemotingCommand.request(12 if i == 1 else 10, {"i": i}) for i in range(3)]
            writer.write(b"".join(encode_bytes(g) for g in goods) + bad)  # one write, one read
            got, closed = await read_until_closed(reader)
            assert sorted(c.opaque for c in got) == sorted(g.opaque for g in goods)
            assert all(c.code == ResponseCode.SUCCESS for c in got)
            assert closed
            writer.close()
            # other connections are untouched
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
        finally:
            await client.close()
            await server.stop()

    arun(main(), use_uvloop)


@pytest.mark.parametrize(
    "header",
    [b"{not json", b"[1,2]", b'{"code":10,"opaque":"99999999999999999999","flag":0}'],
    ids=["not-json", "array", "opaque-out-of-range"],
)
def test_undecodable_header_closes_the_connection_with_one_warning(
    header: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # RocketMQ's NettyDecoder closes the channel on any decode failure; a header whose opaque cannot be
    # read cannot be answered either, so the connection is closed (after the frames before it).
    async def main() -> None:
        server = transport().server("127.0.0.1", 0, echo)
        await server.start()
        client = transport().client()
        try:
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
            reader, writer = await asyncio.open_connection(*server.address)
            peer = "{}:{}".format(*writer.get_extra_info("sockname"))
            good = RemotingCommand.request(10, {"i": "1"})
            caplog.clear()
            writer.write(encode_bytes(good) + raw_frame(header) + encode_bytes(RemotingCommand.request(10)))
            got, closed = await read_until_closed(reader)
            assert [c.opaque for c in got] == [good.opaque]  # the frame before it answered, none after
            assert closed
            warnings = [r for r in caplog.records if r.levelname == "WARNING" and peer in r.getMessage()]
            assert len(warnings) == 1 and "header" in warnings[0].getMessage()
            assert not [r for r in caplog.records if r.levelno >= 40]  # no ERROR, no traceback
            writer.close()
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code == 0
        finally:
            await client.close()
            await server.stop()

    with caplog.at_level("INFO"):
        arun(main())


def test_response_that_cannot_be_encoded_is_replaced_and_the_connection_kept() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            # echoes a value the JSON encoder refuses (a lone surrogate), or an opaque no header holds
            if req.code == 11:
                return req.reply(ext_fields={"echo": "\ud800"})
            resp = req.reply()
            resp.serialize_type = SerializeType.ROCKETMQ
            resp.version = 2**40
            return resp

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            for code in (11, 12):
                resp = await client.invoke(addr_of(server), RemotingCommand.request(code), 2)
                assert resp.code == ResponseCode.SYSTEM_ERROR and "cannot encode" in (resp.remark or "")
            assert len(server.connections) == 1
        finally:
            await client.close()
            await server.stop()

    arun(main())


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_partial_frames_over_the_global_budget_close_the_oldest_stalled_holders(use_uvloop: bool) -> None:
    frame_limit = 1024 * 1024
    budget = 3 * frame_limit

    async def main() -> None:
        t = transport(max_frame_size=frame_limit, max_buffered_bytes=budget)
        server = t.server("127.0.0.1", 0, echo)
        await server.start()
        client = t.client()
        streams = []
        try:
            for i in range(10):  # 10 x ~900 KiB of frames that never complete: ~9 MiB against 3 MiB
                reader, writer = await asyncio.open_connection(*server.address)
                writer.write(struct.pack(">II", frame_limit - 8, 2) + b"{}" + bytes([i]) * (900 * 1024 + i))
                await writer.drain()
                streams.append((reader, writer))
            outcomes = await asyncio.gather(*(read_until_closed(r, 2.0) for r, _ in streams))
            closed = sum(1 for _, was_closed in outcomes if was_closed)
            assert closed >= 6, f"only {closed} of 10 connections closed"
            assert server.buffered_bytes <= budget
            held = sum(c._decoder.held for c in server.connections)
            assert held == server.buffered_bytes  # the account matches what the decoders hold
            # The server serves others, and a whole frame near the limit still goes through.
            big = RemotingCommand.request(10, {"i": "big"}, b"b" * (frame_limit - 4096))
            resp = await client.invoke(addr_of(server), big, 5)
            assert resp.body == big.body
            for _, writer in streams:
                writer.close()
            await asyncio.sleep(0.2)
            assert server.buffered_bytes == 0  # closed connections give their share back
        finally:
            await client.close()
            await server.stop()

    arun(main(), use_uvloop)


def test_buffer_budget_option_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_buffered_bytes"):
        transport(max_buffered_bytes=0)
    assert transport().options.max_buffered_bytes == 64 * 1024 * 1024


def test_late_response_that_cannot_be_encoded_becomes_system_error() -> None:
    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand | None:
            # a held request answered later (as a long-polling pull is), with a value JSON cannot carry
            asyncio.get_running_loop().call_soon(conn.send_response, req.reply(ext_fields={"x": "\ud800"}))
            return None

        t = transport()
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            resp = await client.invoke(addr_of(server), RemotingCommand.request(10), 2)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "cannot encode" in (resp.remark or "")
            assert (await client.invoke(addr_of(server), RemotingCommand.request(10), 2)).code
        finally:
            await client.close()
            await server.stop()

    arun(main())


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_a_pipelined_burst_does_not_make_other_connections_wait_for_all_of_it(use_uvloop: bool) -> None:
    """2 000 requests in one write are served in turns: another peer's request is served in between."""
    burst = 2000
    served = {"burst": 0, "other_after": -1}

    async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
        if req.code == 11:
            served["burst"] += 1
        else:
            served["other_after"] = served["burst"]
        return req.reply()

    async def main() -> None:
        server = transport().server("127.0.0.1", 0, handler)
        await server.start()
        client = transport().client()
        try:
            other = await client.connection(addr_of(server))  # connected before the burst
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(
                b"".join(encode_bytes(RemotingCommand.request(11, {"i": str(i)})) for i in range(burst))
            )
            await writer.drain()
            answer = await other.invoke(RemotingCommand.request(12), 10)
            assert answer.code == ResponseCode.SUCCESS
            decoder = FrameDecoder()
            got = 0
            while got < burst:
                got += len(decoder.feed(await asyncio.wait_for(reader.read(1 << 20), 10)))
            writer.close()
        finally:
            await client.close()
            await server.stop()

    arun(main(), use_uvloop)
    assert served["burst"] == burst
    assert 0 <= served["other_after"] < burst // 2, served


def test_bad_headers_are_all_answered_but_a_flood_is_not_a_flood_of_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        server = transport().server("127.0.0.1", 0, echo)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            header = b'{"code":"not-a-number","opaque":77,"flag":0}'
            bad = struct.pack(">II", 4 + len(header), len(header)) + header
            writer.write(bad * 200)
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < 200:
                got += decoder.feed(await asyncio.wait_for(reader.read(65536), 5))
            assert all(c.code == ResponseCode.SYSTEM_ERROR for c in got)
            writer.close()
        finally:
            await server.stop()

    caplog.set_level("WARNING", logger="tidemq_transport_tcp")
    arun(main())
    warnings = [r for r in caplog.records if "bad command header" in r.getMessage()]
    assert 1 <= len(warnings) <= 11, len(warnings)


class _ReadLane:
    """A handler with a read lane (``serve_read``, as the broker's send lane): it answers the whole
    code-10 frames a read starts with itself (remark "lane"); everything else is the handler's."""

    def __init__(self) -> None:
        self.taken = 0
        self.reads: list[int] = []

    async def __call__(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        return await echo(conn, req)

    def serve_read(self, conn: Any, data: bytes, max_frame: int) -> tuple[int, bytes] | None:
        self.reads.append(len(data))
        pos = 0
        out = []
        while len(data) - pos >= 4:
            end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
            if end > len(data):
                break
            (cmd,) = FrameDecoder().feed(data[pos:end])
            if cmd.code != 10:
                break
            out.append(encode_bytes(cmd.reply(ResponseCode.SUCCESS, remark="lane")))
            pos = end
        if not out:
            return None
        self.taken += len(out)
        return pos, b"".join(out)


@pytest.mark.parametrize("read_lane", [True, False])
def test_a_handlers_read_lane_gets_each_reads_bytes_and_frames_cut_across_reads(read_lane: bool) -> None:
    """The transport offers a read's bytes to the handler's lane before decoding, a frame begun in an
    earlier read included; what the lane leaves is decoded and served as usual, answers in order,
    and no partial frame stays counted against the budget ([transport.tcp] read_lane = false: never)."""

    async def main() -> None:
        lane = _ReadLane()
        server = transport(read_lane=read_lane).server("127.0.0.1", 0, lane)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            codes = [10, 10, 11, 10, 10, 12, 10]
            stream = b"".join(
                encode_bytes(RemotingCommand(code, opaque=i + 1, ext_fields={"i": str(i)}, body=b"p" * 40))
                for i, code in enumerate(codes)
            )
            for at in range(0, len(stream), 37):  # cut anywhere: headers, bodies, length fields
                writer.write(stream[at : at + 37])
                await writer.drain()
                await asyncio.sleep(0.002)
            decoder = FrameDecoder()
            answers: list[RemotingCommand] = []
            while len(answers) < len(codes):
                data = await asyncio.wait_for(reader.read(1 << 16), 5)
                assert data
                answers += decoder.feed(data)
            assert [a.opaque for a in answers] == list(range(1, len(codes) + 1))  # in order
            if read_lane:
                assert [a.remark == "lane" for a in answers] == [c == 10 for c in codes]
                assert lane.taken == codes.count(10)
            else:
                assert lane.reads == [] and all(a.remark != "lane" for a in answers)
            assert [a.ext_fields.get("echo") for a in answers if a.remark != "lane"] == [
                str(i) for i, c in enumerate(codes) if c != 10 or not read_lane
            ]
            assert server.buffered_bytes == 0
            writer.close()
        finally:
            await server.stop()

    arun(main())
