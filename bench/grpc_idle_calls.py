"""What an idle long-polling ReceiveMessage call costs the broker: RSS and CPU per waiting call.

    python bench/grpc_idle_calls.py [--calls 1000] [--window 10] [--server native]

A broker in this process (mmap store, the gRPC endpoint), a client subprocess holding ``--calls``
ReceiveMessage calls on an empty topic (long polling 20 s, the most a v5 client asks; each call
made again as soon as it ends, over ``--calls / 100`` connections), and, measured on the broker:
RSS and CPU seconds over ``--window`` seconds with no call and with the calls waiting, and a census
of the objects the waiting calls hold (gc: count and shallow size by type; asyncio tasks).  Prints
JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

CLIENT = r"""
import asyncio, sys, grpc
from tidemq_transport_grpc.proto import load
pb = load()
address, calls = sys.argv[1], int(sys.argv[2])
SERVICE = "/apache.rocketmq.v2.MessagingService/"

async def main():
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(max(1, calls // 100))]
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name="G_IDLE"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="IdleT"), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=32, auto_renew=True)
    request.long_polling_timeout.FromSeconds(20)
    opened = [0]

    async def one(channel):
        receive = channel.unary_stream(SERVICE + "ReceiveMessage",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ReceiveMessageResponse.FromString)
        while True:
            opened[0] += 1
            async for _ in receive(request, metadata=(("x-mq-client-id", "idle@1"),), timeout=30):
                pass

    tasks = [asyncio.ensure_future(one(channels[i % len(channels)])) for i in range(calls)]
    while opened[0] < calls:
        await asyncio.sleep(0.1)
    print("open", flush=True)
    await asyncio.gather(*tasks)

asyncio.run(main())
"""


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def census() -> tuple[Counter[str], Counter[str]]:
    gc.collect()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        counts[name] += 1
        try:
            sizes[name] += sys.getsizeof(obj)
        except TypeError:
            pass
    return counts, sizes


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    from tidemq.testing.pytest_plugin import running_broker
    from tidemq_transport_grpc import plugin as grpc_plugin
    from tidemq_transport_grpc.proto import load

    pb = load()
    options = {
        "transport": {
            "grpc": {"listen": "127.0.0.1:0", "server": args.server, "max_concurrent_streams": 1000}
        }
    }
    with tempfile.TemporaryDirectory() as tmp:
        async with running_broker(Path(tmp), options=options, auto_create_topic=True) as broker:
            server = grpc_plugin.server_of(broker)
            assert server is not None
            async with grpc.aio.insecure_channel(server.address) as channel:  # the topic made
                route = channel.unary_unary(
                    "/apache.rocketmq.v2.MessagingService/QueryRoute",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=pb.QueryRouteResponse.FromString,
                )
                await route(pb.QueryRouteRequest(topic=pb.Resource(name="IdleT")))
            await asyncio.sleep(1)
            gc.collect()
            rss0, cpu0 = rss_kib(), cpu()
            await asyncio.sleep(args.window)
            idle_cpu = cpu() - cpu0
            counts0, sizes0 = census()
            tasks0 = len(asyncio.all_tasks())
            rss0 = rss_kib()
            client = subprocess.Popen(
                [sys.executable, "-c", CLIENT, server.address, str(args.calls)],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert client.stdout is not None
                began = time.monotonic()
                line = await asyncio.to_thread(client.stdout.readline)
                assert line.strip() == "open", line
                opened_s = time.monotonic() - began
                await asyncio.sleep(3)  # every call parked
                calls_open = server.figures.figures()["calls"]
                rss1, cpu1 = rss_kib(), cpu()
                await asyncio.sleep(args.window)
                waiting_cpu = cpu() - cpu1
                rss1 = max(rss1, rss_kib())
                tasks1 = len(asyncio.all_tasks())
                counts1, sizes1 = census()
            finally:
                client.kill()
                client.wait()
    n = args.calls
    grown = {
        name: {"count": counts1[name] - counts0[name], "bytes": sizes1[name] - sizes0[name]}
        for name in counts1
        if counts1[name] - counts0[name] >= n // 2
    }
    return {
        "args": vars(args),
        "load": os.getloadavg(),
        "opened_s": round(opened_s, 2),
        "calls_open_figure": calls_open,
        "rss_kib_before": rss0,
        "rss_kib_waiting": rss1,
        "rss_kib_per_call": round((rss1 - rss0) / n, 2),
        "cpu_s_idle_window": round(idle_cpu, 3),
        "cpu_s_waiting_window": round(waiting_cpu, 3),
        "cpu_us_per_call_second": round((waiting_cpu - idle_cpu) / n / args.window * 1e6, 2),
        "tasks_before": tasks0,
        "tasks_waiting": tasks1,
        "gc_objects_grown_per_call": {
            k: {"count": round(v["count"] / n, 2), "bytes": round(v["bytes"] / n, 1)}
            for k, v in sorted(grown.items(), key=lambda kv: -kv[1]["bytes"])
        },
        "gc_bytes_per_call": round(sum(v["bytes"] for v in grown.values()) / n, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--server", default="native", choices=["native", "grpcio"])
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
