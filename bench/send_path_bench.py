"""Broker CPU per send request, in process: frames fed to a server connection, no socket.

    .venv/bin/python bench/send_path_bench.py [--batch 1 32] [--requests 20000] [--per-read 1 16]
        [--batch-requests 2000] [--repeats 5] [--body 1024] [--flush async] [--profile tottime]

A real broker (default plugins, ``mmap`` store, data in a temporary directory) serves
SEND_MESSAGE_V2 requests (``--batch 1``) or SEND_BATCH_MESSAGE requests of ``--batch`` messages,
built as the official client builds them.  They are fed to a server-side
:class:`tidemq_transport_tcp.connection.Connection` whose transport only counts what is written,
``--per-read`` frames per ``data_received`` (1: one request per read, as a client awaiting each
send; 16: a pipelining client).  Each configuration is run ``--repeats`` times, the
configurations alternating (the machine is shared: compare figures of one run), and the median
CPU time (``time.process_time``) per request and per message is reported with every run's figure.

Prints one JSON document on stdout, progress on stderr.  Every response is decoded after the
timed section and counted by code: a benchmark that measured error answers says so
(``responses``).  ``--profile KEY`` runs cProfile over one extra run of each configuration and
prints the top functions sorted by KEY on stderr.  Runs on the pure-Python path too
(``TIDEMQ_NO_EXTENSIONS=1``); ``codec`` in the output says which ran.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tidemq import _native
from tidemq.message import BatchItem, Prop, encode_batch
from tidemq.remoting import FrameDecoder, RemotingCommand, ResponseCode
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode
from tidemq.testing.pytest_plugin import running_broker

TOPIC = "BenchTopic"
QUEUES = 4  # the queues an auto-created topic gets (defaultTopicQueueNums below)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class CountingTransport:
    """What a Connection needs of a transport; keeps what is written for the check afterwards."""

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []
        self.writes = 0

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | memoryview) -> None:
        self.chunks.append(data)
        self.writes += 1

    def writelines(self, chunks: list[bytes | memoryview]) -> None:
        self.chunks.extend(chunks)
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def build_frames(batch: int, count: int, body_size: int, first_opaque: int) -> list[bytes]:
    """``count`` send requests as the official client encodes them (V2 header, round-robin queues)."""
    body = b"x" * body_size
    now = str(int(time.time() * 1000))
    # Keys never sent before: a broker's duplicate window (issue 37) answers a repeated key unstored.
    salt = f"{time.monotonic_ns() & 0xFFFFFFFFFF:010X}"
    frames = []
    for s in range(count):
        fields = {
            "a": "BENCH_P",
            "b": TOPIC,
            "c": "TBW102",
            "d": str(QUEUES),
            "e": str(s % QUEUES),
            "f": "0",
            "g": now,
            "h": "0",
            "j": "0",
            "k": "false",
            "m": "true" if batch > 1 else "false",
        }
        if batch > 1:
            fields["i"] = "WAIT\x01true\x02"
            items = [
                BatchItem(body, 0, {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"{salt}{s:010X}{i:04X}"})
                for i in range(batch)
            ]
            payload, code = encode_batch(items), RequestCode.SEND_BATCH_MESSAGE
        else:
            fields["i"] = f"WAIT\x01true\x02UNIQ_KEY\x01{salt}{s:022X}\x02"
            payload, code = body, RequestCode.SEND_MESSAGE_V2
        frames.append(
            encode_bytes(RemotingCommand(code, opaque=first_opaque + s, ext_fields=fields, body=payload))
        )
    return frames


def response_codes(chunks: list[bytes | memoryview]) -> Counter[str]:
    decoder = FrameDecoder()
    codes: Counter[str] = Counter()
    for cmd in decoder.feed(b"".join(chunks)):
        try:
            codes[ResponseCode(cmd.code).name] += 1
        except ValueError:
            codes[str(cmd.code)] += 1
    return codes


async def one_run(
    broker: Any, batch: int, requests: int, per_read: int, body_size: int, profile: str | None
) -> dict[str, Any]:
    from tidemq_transport_tcp.connection import Connection

    server = broker._server
    conn = Connection(server, server._handler, server._options, server_side=True)
    transport = CountingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    frames = build_frames(batch, requests, body_size, 1)
    reads = [b"".join(frames[i : i + per_read]) for i in range(0, requests, per_read)]
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for data in reads:
        conn.data_received(data)
        await asyncio.sleep(0)  # the loop turn that flushes the coalesced writes
    await asyncio.sleep(0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if profiler is not None:
        profiler.disable()
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats(profile).print_stats(30)
    for _ in range(100):  # sync flush: wait for the last answers
        if conn.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    conn.connection_lost(None)
    codes = response_codes(transport.chunks)
    return {
        "cpu_us_per_request": cpu / requests * 1e6,
        "cpu_us_per_message": cpu / (requests * batch) * 1e6,
        "wall_us_per_request": wall / requests * 1e6,
        "writes": transport.writes,
        "responses": dict(codes),
    }


def requests_for(args: argparse.Namespace, batch: int) -> int:
    return int(args.requests if batch == 1 else args.batch_requests)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = [(b, p) for b in args.batch for p in args.per_read]
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="tidemq-send-bench-") as tmp:
        async with running_broker(
            Path(tmp), {"flush": args.flush}, auto_create_topic=True, max_message_size=8 * 1024 * 1024
        ) as broker:
            # Warm-up: creates the topic and every code path once.
            for batch, per_read in configs:
                await one_run(broker, batch, min(args.requests, 500), per_read, args.body, None)
            for r in range(args.repeats):
                for batch, per_read in configs:
                    res = await one_run(broker, batch, requests_for(args, batch), per_read, args.body, None)
                    runs[(batch, per_read)].append(res)
                    progress(
                        f"run {r + 1}/{args.repeats} batch={batch} per_read={per_read}: "
                        f"{res['cpu_us_per_request']:.1f} us CPU/request, "
                        f"{res['cpu_us_per_message']:.2f} us CPU/message, writes={res['writes']}, "
                        f"responses={res['responses']}"
                    )
            if args.profile:
                for batch, per_read in configs:
                    progress(f"profile batch={batch} per_read={per_read}:")
                    await one_run(broker, batch, requests_for(args, batch), per_read, args.body, args.profile)
    results = []
    for (batch, per_read), rs in runs.items():
        per_request = [r["cpu_us_per_request"] for r in rs]
        codes: Counter[str] = Counter()
        for r in rs:
            codes.update(r["responses"])
        results.append(
            {
                "batch": batch,
                "per_read": per_read,
                "requests": requests_for(args, batch),
                "cpu_us_per_request": round(statistics.median(per_request), 2),
                "cpu_us_per_message": round(statistics.median(r["cpu_us_per_message"] for r in rs), 3),
                "messages_per_cpu_s": round(1e6 / statistics.median(r["cpu_us_per_message"] for r in rs)),
                "wall_us_per_request": round(statistics.median(r["wall_us_per_request"] for r in rs), 2),
                "runs_cpu_us_per_request": [round(x, 2) for x in per_request],
                "writes_per_run": rs[0]["writes"] if rs else 0,
                "responses": dict(codes),
            }
        )
    return {
        "benchmark": "send_path",
        "python": platform.python_version(),
        "codec": _native.DESCRIPTION,
        "flush": args.flush,
        "body_bytes": args.body,
        "repeats": args.repeats,
        "results": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--batch", type=int, nargs="+", default=[1, 32], help="messages per request (1: V2 single)"
    )
    ap.add_argument("--requests", type=int, default=20_000, help="requests per run (single sends)")
    ap.add_argument(
        "--batch-requests",
        type=int,
        default=2_000,
        help="requests per run when --batch > 1 (bounds the data written)",
    )
    ap.add_argument("--per-read", type=int, nargs="+", default=[1, 16], help="frames per data_received")
    ap.add_argument("--repeats", type=int, default=5, help="runs per configuration (median reported)")
    ap.add_argument("--body", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--flush", default="async", choices=["async", "sync"])
    ap.add_argument("--profile", metavar="SORT_KEY", help="cProfile one more run per configuration")
    args = ap.parse_args()
    if min(args.batch) < 1 or args.requests < 1 or args.batch_requests < 1 or min(args.per_read) < 1:
        ap.error("--batch, --requests, --batch-requests and --per-read must be positive")
    try:
        import uvloop
    except ImportError:  # the broker's own choice: uvloop when installed
        result = asyncio.run(run(args))
    else:
        result = uvloop.run(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
