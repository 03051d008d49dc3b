"""The native gRPC server (``[transport.grpc] server = "native"``, tidemq_transport_grpc.h2_server).

Happy paths with grpcio's own client (unary, server streaming, bidi, statuses, deadlines); broken
HTTP/2 and gRPC as raw socket bytes: the connection gets GOAWAY or the stream RST_STREAM or a
gRPC status, the server keeps serving others, and a client that does not read holds the
server's writer at its flow-control window.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")

from tidemq_transport_grpc import h2_frames as f  # noqa: E402
from tidemq_transport_grpc.h2_server import H2GrpcServer  # noqa: E402

LIMIT = 64 * 1024


class Service:
    """bench.Echo: what the tests call, and what it saw."""

    def __init__(self) -> None:
        self.produced = 0
        self.seen_metadata: tuple[Any, ...] = ()
        self.seen_peer = ""

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.seen_metadata = tuple(context.invocation_metadata())
        self.seen_peer = context.peer()
        return request

    async def fail(self, request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no: é 100%")
        raise AssertionError("abort returned")

    async def crash(self, request: bytes, context: Any) -> bytes:
        raise ValueError("boom")

    async def slow(self, request: bytes, context: Any) -> bytes:
        assert context.time_remaining() is not None and context.time_remaining() < 1.0
        await asyncio.sleep(5)
        return request

    async def eager(self, request: bytes, context: Any) -> bytes:
        # Answered without a wait: run from the connection's callback, no Task made for it.
        return b"task" if asyncio.current_task() is not None else b"none"

    async def waits(self, request: bytes, context: Any) -> bytes:
        # Waits in each way a handler can, after its first step ran outside a Task.
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bytes] = loop.create_future()
        loop.call_later(0.01, done.set_result, b"later")
        answer = await done
        failing: asyncio.Future[bytes] = loop.create_future()
        loop.call_soon(failing.set_exception, KeyError("seen"))
        try:
            await failing
        except KeyError:
            answer += b"+caught"
        if request == b"raise":
            await failing
        return answer

    async def batch(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for _ in range(int(request or b"3")):
            yield request

    async def flood(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        while True:  # a client that reads nothing holds this at its window
            self.produced += 1
            yield b"z" * 1024

    async def chat(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.upper()

    def handler(self) -> Any:
        def bad(data: bytes) -> bytes:
            if data.startswith(b"bad"):
                raise ValueError("not a request")
            return data

        table = {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Strict": grpc.unary_unary_rpc_method_handler(self.echo, request_deserializer=bad),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "Crash": grpc.unary_unary_rpc_method_handler(self.crash),
            "Slow": grpc.unary_unary_rpc_method_handler(self.slow),
            "Eager": grpc.unary_unary_rpc_method_handler(self.eager),
            "Waits": grpc.unary_unary_rpc_method_handler(self.waits),
            "Batch": grpc.unary_stream_rpc_method_handler(self.batch),
            "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
            "Chat": grpc.stream_stream_rpc_method_handler(self.chat),
        }
        return grpc.method_handlers_generic_handler("bench.Echo", table)


async def serving(service: Service, **kwargs: Any) -> H2GrpcServer:
    server = H2GrpcServer(service.handler(), max_message_bytes=LIMIT, **kwargs)
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server


async def echo_works(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await channel.unary_unary("/bench.Echo/Echo")(b"still here", timeout=5) == b"still here"


def test_unary_streaming_and_bidi_calls_with_grpcio_s_client() -> None:
    async def main() -> None:
        service = Service()
        server = await serving(service)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            echo = channel.unary_unary("/bench.Echo/Echo")
            body = bytes(range(256)) * 40
            assert (
                await echo(body, metadata=(("x-mq-client-id", "c1"), ("trace-bin", b"\x00\x01")), timeout=5)
                == body
            )
            assert ("x-mq-client-id", "c1") in service.seen_metadata
            assert ("trace-bin", b"\x00\x01") in service.seen_metadata
            assert service.seen_peer.startswith("ipv4:127.0.0.1:")
            assert await echo(b"") == b""
            replies = [r async for r in channel.unary_stream("/bench.Echo/Batch")(b"40")]
            assert replies == [b"40"] * 40
            chat = channel.stream_stream("/bench.Echo/Chat")
            call = chat()
            for word in (b"a", b"bc", b"d" * 60_000):  # the last one is larger than a frame
                await call.write(word)
                assert await call.read() == word.upper()
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
            # many calls at once on one connection
            answers = await asyncio.gather(*(echo(str(i).encode()) for i in range(300)))
            assert answers == [str(i).encode() for i in range(300)]
        await server.stop(0)

    asyncio.run(main())


def test_statuses_reach_the_client() -> None:
    async def main() -> None:
        service = Service()
        server = await serving(service)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:

            async def status(method: str, body: bytes = b"x", timeout: float = 5) -> tuple[Any, str]:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(method)(body, timeout=timeout)
                return caught.value.code(), caught.value.details() or ""

            assert await status("/bench.Echo/Fail") == (grpc.StatusCode.FAILED_PRECONDITION, "no: é 100%")
            code, details = await status("/bench.Echo/Crash")
            assert code == grpc.StatusCode.UNKNOWN and "boom" in details
            assert (await status("/bench.Echo/Nope"))[0] == grpc.StatusCode.UNIMPLEMENTED
            assert (await status("/other.Service/Echo"))[0] == grpc.StatusCode.UNIMPLEMENTED
            assert (await status("/bench.Echo/Strict", b"bad"))[0] == grpc.StatusCode.INTERNAL
            code, details = await status("/bench.Echo/Echo", b"x" * (LIMIT + 1))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert (await status("/bench.Echo/Slow", timeout=0.3))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
            assert server.open_calls == 0
            await echo_works(server.port)
        await server.stop(0)

    asyncio.run(main())


def test_a_unary_handler_runs_at_once_and_one_that_waits_goes_on_as_a_task() -> None:
    async def main() -> None:
        server = await serving(Service())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            assert await channel.unary_unary("/bench.Echo/Eager")(b"", timeout=5) == b"none"
            waits = channel.unary_unary("/bench.Echo/Waits")
            assert await asyncio.gather(*(waits(b"") for _ in range(20))) == [b"later+caught"] * 20
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await waits(b"raise", timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNKNOWN and "seen" in (caught.value.details() or "")
            assert server.open_calls == 0
        await server.stop(0)

    asyncio.run(main())


# ---------------------------------------------------------------------------- raw HTTP/2 bytes
def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return f.frame(kind, flags, stream_id, payload)


def request_headers(encoder: Any, path: str = "/bench.Echo/Echo") -> bytes:
    return encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int, preface: bytes = f.PREFACE + frame(f.SETTINGS, 0, 0)) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(preface)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frames(self, timeout: float = 3.0) -> AsyncIterator[tuple[int, int, int, bytes]]:
        """Frames until the server closes (or ``timeout`` without one)."""
        while True:
            try:
                head = await asyncio.wait_for(self.reader.readexactly(9), timeout)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                return
            length = int.from_bytes(head[:3], "big")
            payload = await self.reader.readexactly(length)
            yield head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload

    async def goaway(self) -> int:
        """The GOAWAY's error code (the connection must end with one)."""
        async for kind, _flags, _stream, payload in self.frames():
            if kind == f.GOAWAY:
                code = int.from_bytes(payload[4:8], "big")
                assert await self.reader.read() == b""  # then closed
                return code
        raise AssertionError("no GOAWAY")

    async def status(self, stream_id: int) -> tuple[int | None, int | None]:
        """The stream's grpc-status (from its trailers) or its RST_STREAM code."""
        async for kind, flags, stream, payload in self.frames():
            if stream != stream_id:
                continue
            if kind == f.RST_STREAM:
                return None, int.from_bytes(payload, "big")
            if kind == f.HEADERS and flags & f.END_STREAM:
                fields = dict(self.decoder.decode(payload))
                return int(fields["grpc-status"]), None
            if kind == f.HEADERS:
                self.decoder.decode(payload)
        raise AssertionError(f"stream {stream_id} did not end")


@pytest.mark.parametrize(
    ("bytes_in", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),  # DATA on stream 0
        (f.PREFACE + (20000).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01", f.FRAME_SIZE_ERROR),
        (f.PREFACE + frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"), f.COMPRESSION_ERROR),
        (f.PREFACE + frame(f.HEADERS, f.END_HEADERS, 2, b"\x82"), f.PROTOCOL_ERROR),  # even stream
        (f.PREFACE + frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"), f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.SETTINGS, 0, 0, b"\x00\x04\xff\xff\xff\xff"), f.FLOW_CONTROL_ERROR),
        (f.PREFACE + frame(f.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01"), f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.SETTINGS, 0, 0, b"\x00\x01\x00"), f.FRAME_SIZE_ERROR),
        (f.PREFACE + frame(f.PING, 0, 0, b"1234"), f.FRAME_SIZE_ERROR),
        (f.PREFACE + frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02"), f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"), f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.HEADERS, 0, 1, b"\x82") + frame(f.DATA, 0, 1, b"x"), f.PROTOCOL_ERROR),
        (f.PREFACE + frame(f.RST_STREAM, 0, 7, b"\x00\x00\x00\x08"), f.PROTOCOL_ERROR),  # idle stream
    ],
    ids=[
        "http1",
        "data-on-0",
        "oversized-frame",
        "bad-hpack",
        "even-stream",
        "zero-window-update",
        "huge-initial-window",
        "small-max-frame",
        "settings-length",
        "short-ping",
        "push-promise",
        "stray-continuation",
        "interrupted-headers",
        "reset-idle",
    ],
)
def test_broken_http2_gets_goaway_and_others_are_served(bytes_in: bytes, code: int) -> None:
    async def main() -> None:
        server = await serving(Service())
        client = await RawClient.connect(server.port, bytes_in)
        assert await client.goaway() == code
        await echo_works(server.port)
        assert not server.connections or all(not c.calls for c in server.connections)
        await server.stop(0)

    asyncio.run(main())


def test_ping_is_answered_and_broken_grpc_messages_get_statuses() -> None:
    async def main() -> None:
        server = await serving(Service())
        client = await RawClient.connect(server.port)
        client.send(frame(f.PING, 0, 0, b"12345678"))
        async for kind, flags, _stream, payload in client.frames():
            if kind == f.PING:
                assert flags & f.ACK and payload == b"12345678"
                break
        else:
            raise AssertionError("no PING ACK")
        # a message cut short by END_STREAM: INTERNAL
        client.send(frame(f.HEADERS, f.END_HEADERS, 1, request_headers(client.encoder)))
        client.send(frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x10abc"))
        assert await client.status(1) == (grpc.StatusCode.INTERNAL.value[0], None)
        # a length over the limit: RESOURCE_EXHAUSTED at once, before the body arrives
        client.send(frame(f.HEADERS, f.END_HEADERS, 3, request_headers(client.encoder)))
        client.send(frame(f.DATA, 0, 3, b"\x00\x7f\xff\xff\xff"))
        assert (await client.status(3))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        # a compressed flag without grpc-encoding: INTERNAL
        client.send(frame(f.HEADERS, f.END_HEADERS, 5, request_headers(client.encoder)))
        client.send(frame(f.DATA, f.END_STREAM, 5, b"\x01\x00\x00\x00\x01a"))
        assert await client.status(5) == (grpc.StatusCode.INTERNAL.value[0], None)
        # two messages on a unary call
        client.send(frame(f.HEADERS, f.END_HEADERS, 7, request_headers(client.encoder)))
        client.send(frame(f.DATA, f.END_STREAM, 7, b"\x00\x00\x00\x00\x01a" * 2))
        assert (await client.status(7))[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]
        # no message at all on a unary call
        client.send(frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 9, request_headers(client.encoder)))
        assert (await client.status(9))[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]
        # an unknown method; an unknown frame type is ignored
        client.send(frame(0xEE, 0, 0, b"whatever"))
        client.send(
            frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 11, request_headers(client.encoder, "/x/y"))
        )
        assert (await client.status(11))[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]
        # the connection still serves
        client.send(frame(f.HEADERS, f.END_HEADERS, 13, request_headers(client.encoder)))
        client.send(frame(f.DATA, f.END_STREAM, 13, b"\x00\x00\x00\x00\x02ok"))
        assert await client.status(13) == (0, None)
        assert server.open_calls == 0
        client.writer.close()
        await server.stop(0)

    asyncio.run(main())


def test_streams_beyond_the_limit_are_refused() -> None:
    async def main() -> None:
        server = await serving(Service(), max_concurrent_streams=3)
        client = await RawClient.connect(server.port)
        for stream_id in (1, 3, 5, 7):  # headers only: all four stay open
            client.send(frame(f.HEADERS, f.END_HEADERS, stream_id, request_headers(client.encoder)))
        assert await client.status(7) == (None, f.REFUSED_STREAM)
        client.send(frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x01a"))
        assert await client.status(1) == (0, None)
        client.writer.close()
        await server.stop(0)

    asyncio.run(main())


def test_a_client_that_reads_nothing_holds_the_writer_at_its_window() -> None:
    async def main() -> None:
        service = Service()
        server = await serving(service)
        client = await RawClient.connect(server.port)  # the default 65 535-byte windows, never grown
        client.send(frame(f.HEADERS, f.END_HEADERS, 1, request_headers(client.encoder, "/bench.Echo/Flood")))
        client.send(frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
        received = 0
        async for kind, _flags, _stream, payload in client.frames(timeout=0.5):
            if kind == f.DATA:
                received += len(payload)
        assert received <= 65535
        produced = service.produced
        assert produced <= 65535 // 1029 + 2
        await asyncio.sleep(0.3)
        assert service.produced == produced  # held, not buffering
        # more window: more messages
        client.send(frame(f.WINDOW_UPDATE, 0, 1, struct.pack(">I", 10 * 1029)))
        client.send(frame(f.WINDOW_UPDATE, 0, 0, struct.pack(">I", 10 * 1029)))
        await asyncio.sleep(0.3)
        assert produced + 8 <= service.produced <= produced + 12
        client.send(frame(f.RST_STREAM, 0, 1, b"\x00\x00\x00\x08"))  # CANCEL
        await asyncio.sleep(0.1)
        assert server.open_calls == 0
        await echo_works(server.port)
        client.writer.close()
        await server.stop(0)

    asyncio.run(main())


def test_random_bytes_only_ever_end_the_connection_with_goaway() -> None:
    """The frame layer, sans-IO: whatever the bytes, ConnectionError_ (GOAWAY) or events."""
    rng = random.Random(40)
    encoder = hpack.Encoder()
    seeds = [
        frame(f.HEADERS, f.END_HEADERS, 1, request_headers(encoder)),
        frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x01a"),
        frame(f.SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00\x00"),
        frame(f.WINDOW_UPDATE, 0, 1, b"\x00\x00\x10\x00"),
        frame(f.PING, 0, 0, b"12345678"),
        frame(f.RST_STREAM, 0, 1, b"\x00\x00\x00\x08"),
        frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"),
    ]
    for _ in range(3000):
        conn = f.ServerConnection(max_concurrent_streams=4)
        data = bytearray(f.PREFACE + b"".join(rng.choice(seeds) for _ in range(rng.randint(1, 6))))
        for _ in range(rng.randint(0, 8)):
            data[rng.randrange(24, len(data))] = rng.randrange(256)
        try:
            for start in range(0, len(data), 7):
                conn.receive(bytes(data[start : start + 7]))
        except f.ConnectionError_:
            assert conn.goaway_sent
        assert len(conn.buffer) <= f.FRAME_SIZE + 9


def test_a_ping_flood_from_a_client_that_reads_nothing_stays_bounded() -> None:
    """6 MiB of PINGs from a client with a 4 KiB receive buffer that reads nothing: the server
    stops reading it while its answers are queued (without that, 3.8 MiB were queued here)."""

    async def main() -> None:
        server = await serving(Service())
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.setblocking(False)
        flood = f.PREFACE + frame(f.SETTINGS, 0, 0) + frame(f.PING, 0, 0, b"12345678") * 400_000
        sending = asyncio.get_running_loop().create_task(asyncio.get_running_loop().sock_sendall(sock, flood))
        await asyncio.sleep(2.5)
        (connection,) = server.connections
        assert connection.transport is not None
        assert connection.transport.get_write_buffer_size() < 1024 * 1024
        await echo_works(server.port)  # others are served meanwhile
        sending.cancel()
        sock.close()
        await server.stop(0)

    asyncio.run(main())


def test_the_compiled_hpack_decoder_answers_as_the_hpack_package() -> None:
    """tests/fuzz/fuzz_hpack.py, briefly: mutated blocks decode to hpack's fields or hpack's errors."""
    compiled = pytest.importorskip("tidemq_transport_grpc._hpack", reason="the compiled decoder is not built")
    assert f.HPACK_DECODER == "compiled"
    rng = random.Random(7)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    try:
        import fuzz_hpack
    finally:
        sys.path.pop(0)
    pool = fuzz_hpack.seeds(rng, 200)
    for _ in range(3000):
        ours = compiled.Decoder(16384, 4096)
        theirs = hpack.Decoder(max_header_list_size=16384)
        theirs.max_allowed_table_size = 4096
        for block in fuzz_hpack.blocks(rng, pool):
            mine = fuzz_hpack.decode(ours, block, raw=False)
            reference = fuzz_hpack.decode(theirs, block, raw=True)
            if isinstance(mine, list) or isinstance(reference, list):
                assert mine == reference, block.hex()
            else:  # both refused (with hpack's errors)
                break


def test_the_endpoint_s_server_option_picks_the_server_and_bad_values_are_named(
    tidemq_make_broker: Any,
) -> None:
    from tidemq.errors import ConfigError
    from tidemq_transport_grpc import plugin as grpc_plugin
    from tidemq_transport_grpc.proto import load

    pb = load()

    async def route(server: str | None) -> str:
        table = {"listen": "127.0.0.1:0"} | ({} if server is None else {"server": server})
        async with tidemq_make_broker(
            auto_create_topic=True, options={"transport": {"grpc": table}}
        ) as broker:
            endpoint = grpc_plugin.server_of(broker)
            assert endpoint is not None
            async with grpc.aio.insecure_channel(endpoint.address) as channel:
                query = channel.unary_unary(
                    "/apache.rocketmq.v2.MessagingService/QueryRoute",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=pb.QueryRouteResponse.FromString,
                )
                answer = await query(pb.QueryRouteRequest(topic=pb.Resource(name="T")), timeout=10)
                assert answer.status.code == pb.OK
            return type(endpoint.server).__name__

    assert asyncio.run(route(None)) == "H2GrpcServer"  # the default
    assert asyncio.run(route("native")) == "H2GrpcServer"
    assert asyncio.run(route("grpcio")) != "H2GrpcServer"
    with pytest.raises(ConfigError, match='takes "native" or "grpcio"'):
        asyncio.run(route("nginx"))

    async def busy() -> None:
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        try:
            table = {"listen": f"127.0.0.1:{taken.getsockname()[1]}", "server": "native"}
            async with tidemq_make_broker(options={"transport": {"grpc": table}}):
                pass
        finally:
            taken.close()

    with pytest.raises(ConfigError, match="cannot listen there"):
        asyncio.run(busy())


def test_without_the_hpack_package_the_endpoint_serves_with_grpcio_and_says_so() -> None:
    import subprocess
    import sys

    code = (
        "import sys, logging; sys.modules['hpack'] = None\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stdout)\n"
        "import grpc\n"
        "from tidemq_transport_grpc.h2_server import aio_like\n"
        "from tidemq_transport_grpc.options import grpc_options\n"
        "print(aio_like(grpc_options({})) is grpc.aio.server)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().endswith("True"), out.stderr
    assert "needs the hpack package" in out.stdout
