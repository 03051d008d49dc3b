"""grpcio's own cost per call, server side, for the ways the broker's endpoint could be built.

    .venv/bin/python bench/grpc_floor_bench.py [--count 2000] [--repeats 5] [--out FILE]

No broker: each variant is a bare server subprocess echoing 1 KiB bodies; a sync client in this
process makes ``--count`` unary calls one at a time and the server's CPU time (every thread) is
read from /proc around them.  The variants alternate ``--repeats`` times (the machine is shared:
compare the figures of one run); the figure is server CPU microseconds per call, median.

* ``aio``: ``grpc.aio.server()`` on asyncio's default loop; ``aio_uvloop``: on uvloop, as the
  broker runs it (the baseline of the rest);
* ``aio_options``: with ``grpc.enable_channelz`` 0, ``grpc.http2.bdp_probe`` 0,
  ``grpc.max_concurrent_streams`` 100, ``grpc.so_reuseport`` 0;
* ``aio_poll`` / ``aio_no_fork``: ``GRPC_POLL_STRATEGY=poll``, ``GRPC_ENABLE_FORK_SUPPORT=0``;
* ``aio_v5_metadata``: the client sends the seven ``x-mq-*`` headers and a deadline, as the v5
  clients do; ``aio_v5_client``: the same from a ``grpc.aio`` client channel with the v5 Python
  client's channel options (the official client calls so);
* ``sync``: ``grpc.server`` with a 4-thread pool, the handler in the pool thread;
  ``sync_to_loop``: the same, each call handed to an asyncio (uvloop) loop in another thread
  with ``run_coroutine_threadsafe``, as the broker's services would need;
* ``aio_stream34``: one server-streaming call of 34 writes (a ReceiveMessage of 32 messages),
  reported per write;
* ``h2lib*``: a bare echo on uvloop over the sans-IO ``h2`` library (pure Python: its frame
  objects, header validation and HPACK cost about as much as grpcio's core);
* ``native*``: the endpoint's ``server = "native"`` (``tidemq_transport_grpc.h2_server``: its own
  HTTP/2 frame layer, HPACK decoded by ``hpack``, on uvloop), with the plain, v5-metadata, v5 aio
  client and 34-write stream clients as above.

One JSON document on stdout (and in ``--out``), progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

AIO = """
import asyncio, grpc
async def echo(request, context):
    return request
async def batch(request, context):
    for _ in range(34):
        yield request
async def main():
    server = grpc.aio.server(options=OPTIONS)
    table = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Batch": grpc.unary_stream_rpc_method_handler(batch),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", table),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()
RUN
"""

SYNC = """
import asyncio, threading, grpc, uvloop
from concurrent import futures
loop = uvloop.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
async def handle(request):
    return request
def echo(request, context):
    if HOP:
        return asyncio.run_coroutine_threadsafe(handle(request), loop).result()
    return request
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
table = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", table),))
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
server.wait_for_termination()
"""

UVLOOP = "import uvloop; uvloop.run(main())"

#: The sans-IO ``h2`` library on uvloop: a bare echo (no flow-control waits: 1 KiB bodies fit the
#: windows), the cheapest a server built on it could be.
H2LIB = """
import asyncio, uvloop
import h2.config, h2.connection, h2.events
HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
TRAILERS = ((b"grpc-status", b"0"),)
class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        config = h2.config.H2Configuration(client_side=False, header_encoding=None,
            validate_outbound_headers=False, normalize_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.initiate_connection()
        self.bodies, self.paths = {}, {}
        transport.write(self.conn.data_to_send())
    def data_received(self, data):
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.paths[event.stream_id] = dict(event.headers)[b":path"]
                self.bodies[event.stream_id] = b""
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                asyncio.get_running_loop().create_task(self.answer(event.stream_id))
        self.transport.write(self.conn.data_to_send())
    async def answer(self, sid):
        body, path = self.bodies.pop(sid), self.paths.pop(sid)
        self.conn.send_headers(sid, HEADERS)
        for _ in range(34 if path.endswith(b"Batch") else 1):
            self.conn.send_data(sid, body)
        self.conn.send_headers(sid, TRAILERS, end_stream=True)
        self.transport.write(self.conn.data_to_send())
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""

#: The native server (tidemq_transport_grpc.h2_server: HTTP/2 from the h2 library on the loop).
H2 = """
import asyncio, grpc, uvloop
from tidemq_transport_grpc.h2_server import H2GrpcServer
async def echo(request, context):
    return request
async def batch(request, context):
    for _ in range(34):
        yield request
async def main():
    table = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Batch": grpc.unary_stream_rpc_method_handler(batch),
    }
    server = H2GrpcServer(grpc.method_handlers_generic_handler("bench.Echo", table))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await asyncio.Event().wait()
uvloop.run(main())
"""
OPTIONS = (
    '[("grpc.enable_channelz", 0), ("grpc.http2.bdp_probe", 0), '
    '("grpc.max_concurrent_streams", 100), ("grpc.so_reuseport", 0)]'
)

#: name -> (server source, environment, client style)
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    "aio": (AIO.replace("OPTIONS", "[]").replace("RUN", "asyncio.run(main())"), {}, "plain"),
    "aio_uvloop": (AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP), {}, "plain"),
    "aio_options": (AIO.replace("OPTIONS", OPTIONS).replace("RUN", UVLOOP), {}, "plain"),
    "aio_poll": (
        AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP),
        {"GRPC_POLL_STRATEGY": "poll"},
        "plain",
    ),
    "aio_no_fork": (
        AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP),
        {"GRPC_ENABLE_FORK_SUPPORT": "0"},
        "plain",
    ),
    "aio_v5_metadata": (AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP), {}, "v5"),
    "aio_v5_client": (AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP), {}, "v5_aio"),
    "sync": (SYNC.replace("HOP", "False"), {}, "plain"),
    "sync_to_loop": (SYNC.replace("HOP", "True"), {}, "plain"),
    "aio_stream34": (AIO.replace("OPTIONS", "[]").replace("RUN", UVLOOP), {}, "stream"),
    "h2lib": (H2LIB, {}, "plain"),
    "h2lib_v5_metadata": (H2LIB, {}, "v5"),
    "h2lib_stream34": (H2LIB, {}, "stream"),
    "native": (H2, {}, "plain"),
    "native_v5_metadata": (H2, {}, "v5"),
    "native_v5_client": (H2, {}, "v5_aio"),
    "native_stream34": (H2, {}, "stream"),
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def v5_metadata() -> tuple[tuple[str, str], ...]:
    return (
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "v2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-date-time", datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", "bench@1@0@0000000000"),
        ("x-mq-namespace", ""),
    )


async def _aio_client(pid: int, port: int, count: int) -> float:
    import grpc

    options = [("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        echo = channel.unary_unary("/bench.Echo/Echo")
        body = b"x" * 1024
        for _ in range(50):
            await echo(body, metadata=v5_metadata(), timeout=3.0)
        before = cpu_seconds(pid)
        for _ in range(count):
            await echo(body, metadata=v5_metadata(), timeout=3.0)
        return (cpu_seconds(pid) - before) / count * 1e6


def one(name: str, count: int) -> float:
    """Server CPU microseconds per call (per write for the stream variant)."""
    import grpc

    source, env, style = VARIANTS[name]
    server = subprocess.Popen(
        [sys.executable, "-c", source], stdout=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())
        if style == "v5_aio":
            return asyncio.run(_aio_client(server.pid, port, count))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/bench.Echo/Echo")
            stream = channel.unary_stream("/bench.Echo/Batch")
            body = b"x" * 1024
            if style == "stream":
                calls, units = max(count // 34, 1), 34

                def call() -> None:
                    list(stream(body))
            else:
                calls, units = count, 1

                def call() -> None:
                    if style == "v5":
                        echo(body, metadata=v5_metadata(), timeout=3.0)
                    else:
                        echo(body)

            for _ in range(50):
                call()
            before = cpu_seconds(server.pid)
            for _ in range(calls):
                call()
            cpu = cpu_seconds(server.pid) - before
    finally:
        server.kill()
        server.wait()
    return cpu / (calls * units) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args()
    rounds: dict[str, list[float]] = {v: [] for v in args.variants}
    for r in range(args.repeats):
        for name in args.variants:
            rounds[name].append(round(one(name, args.count), 1))
            print(f"round {r + 1}/{args.repeats} {name}: {rounds[name][-1]} us", file=sys.stderr, flush=True)
    median = {v: statistics.median(xs) for v, xs in rounds.items()}
    doc: dict[str, Any] = {
        "what": "server CPU microseconds per unary call (aio_stream34: per streamed write), bare servers "
        "echoing 1 KiB, median of the rounds",
        "count": args.count,
        "repeats": args.repeats,
        "median_us_per_call": median,
        "calls_per_server_cpu_s": {v: round(1e6 / us, 1) for v, us in median.items() if us > 0},
        "rounds": rounds,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
