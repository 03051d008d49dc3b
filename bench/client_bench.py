"""tidemq's own client over loopback: produce (single, batched), consume, send latency.

Starts ``tidemq namesrv`` and ``tidemq broker`` (flush ``sync`` by default) as subprocesses on
free ports, then with :mod:`tidemq.client` (asyncio, this process) measures:

* latency: ``send`` one at a time, ``--latency-messages`` messages -> p50/p90/p99 in ms;
* produce_single: ``send`` of ``--messages`` messages of ``--size`` bytes, ``--inflight`` at once;
* produce_batch: ``send_batch`` of ``--batch`` messages per request, same total;
* consume_push: a PushConsumer (new group, from the first offset) reading everything back.

Prints one JSON object on stdout (progress on stderr); ratios compare phases of this run.
Default: 20000 x 1 KiB (about 15 s); ``--full`` runs 100000.

    python bench/client_bench.py [--messages N] [--size BYTES] [--inflight N] [--batch N] [--flush sync|async] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

from tidemq.client import Message, Producer, PushConsumer


def log(msg: str) -> None:
    print(f"[client_bench] {msg}", file=sys.stderr, flush=True)


def rate(n: int, seconds: float, size: int) -> dict[str, float]:
    return {
        "messages": n,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(n / seconds, 1) if seconds else 0.0,
        "mib_per_s": round(n * size / seconds / 2**20, 2) if seconds else 0.0,
    }


def pct(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 3)


async def run(args: argparse.Namespace, namesrv: str, topic: str) -> dict[str, Any]:
    body = (
        os.urandom(args.size // 2).hex().encode()[: args.size]
    )  # incompressible-ish text, no compression below 4 KiB
    async with Producer("bench-producer", namesrv, send_timeout=10.0) as p:
        await p.send(Message(topic, body))  # warm-up: route, connection, topic
        log(f"latency: {args.latency_messages} sequential sends")
        lat: list[float] = []
        for _ in range(args.latency_messages):
            t = time.perf_counter()
            await p.send(Message(topic, body))
            lat.append((time.perf_counter() - t) * 1000)
        log(f"produce_single: {args.messages} x {args.size} B, {args.inflight} in flight")
        sem = asyncio.Semaphore(args.inflight)

        async def one() -> None:
            async with sem:
                await p.send(Message(topic, body))

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(args.messages)))
        t_single = time.perf_counter() - t0
        log(f"  {args.messages / t_single:.0f} msg/s")
        log(f"produce_batch: {args.messages} in batches of {args.batch}")
        bsem = asyncio.Semaphore(max(1, args.inflight // 4))

        async def batch(n: int) -> None:
            async with bsem:
                await p.send_batch([Message(topic, body) for _ in range(n)])

        t0 = time.perf_counter()
        sizes = [args.batch] * (args.messages // args.batch) + (
            [args.messages % args.batch] if args.messages % args.batch else []
        )
        await asyncio.gather(*(batch(n) for n in sizes))
        t_batch = time.perf_counter() - t0
        log(f"  {args.messages / t_batch:.0f} msg/s")

    total = 1 + args.latency_messages + 2 * args.messages
    log(f"consume_push: {total} messages")
    count = 0
    done = asyncio.Event()

    async def listener(msgs: list[Any]) -> None:
        nonlocal count
        count += len(msgs)
        if count >= total:
            done.set()

    c = PushConsumer(
        "bench-consumer", namesrv, consume_from="first", consume_batch_size=32, pull_batch_size=32
    )
    c.subscribe(topic)
    c.register_listener(listener)
    t0 = time.perf_counter()
    await c.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=max(60.0, total / 100))
    except TimeoutError:
        log(f"  consume timed out at {count}/{total}")
    t_consume = time.perf_counter() - t0
    await c.shutdown()
    log(f"  {count / t_consume:.0f} msg/s")
    result: dict[str, Any] = {
        "latency_ms": {
            "sends": len(lat),
            "p50": pct(lat, 50),
            "p90": pct(lat, 90),
            "p99": pct(lat, 99),
            "max": round(max(lat), 3),
        },
        "produce_single": {**rate(args.messages, t_single, args.size), "inflight": args.inflight},
        "produce_batch": {**rate(args.messages, t_batch, args.size), "batch": args.batch},
        "consume_push": {**rate(count, t_consume, args.size), "expected": total, "complete": count >= total},
    }
    result["ratios"] = {
        "batch_vs_single": round(
            result["produce_batch"]["msgs_per_s"] / max(result["produce_single"]["msgs_per_s"], 1e-9), 2
        ),
        "consume_vs_single": round(
            result["consume_push"]["msgs_per_s"] / max(result["produce_single"]["msgs_per_s"], 1e-9), 2
        ),
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--latency-messages", type=int, default=2000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--inflight", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--store", default="mmap")
    p.add_argument("--flush", default="sync")
    p.add_argument("--full", action="store_true", help="100000 messages, 5000 latency samples")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    args = p.parse_args()
    if args.full:
        args.messages, args.latency_messages = 100_000, 5000

    work = Path(tempfile.mkdtemp(prefix="tidemq-client-bench-"))
    namesrv = f"127.0.0.1:{free_port()}"
    (work / "broker.toml").write_text(
        f'[broker]\nname = "bench-broker"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = ["{namesrv}"]\n'
        f'data_dir = "{work / "data"}"\ndefault_topic_queues = {args.queues}\n'
        f'[plugins]\nstore = "{args.store}"\nflush = "{args.flush}"\n'
    )
    procs = []
    try:
        procs.append(start(["namesrv", "--listen", namesrv], work))
        procs.append(start(["broker", "-c", str(work / "broker.toml")], work))
        result = {
            "benchmark": "e2e_tidemq_client",
            "client": "tidemq.client (asyncio, one process)",
            "store": args.store,
            "flush": args.flush,
            "size": args.size,
            **asyncio.run(run(args, namesrv, "ClientBenchTopic")),
        }
        print(json.dumps(result, indent=2))
    finally:
        for proc in reversed(procs):
            stop(proc)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"data kept in {work}")


if __name__ == "__main__":
    main()
