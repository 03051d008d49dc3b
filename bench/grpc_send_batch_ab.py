"""A/B: latency and broker CPU of a gRPC SendMessage carrying N messages under sync flush.

    python bench/grpc_send_batch_ab.py --b-tree /work/wt/base_pkgs [--rounds 4] [--calls 200]

Per round a fresh ``tidemq broker`` subprocess per configuration (A: this tree; B: ``PYTHONPATH``
the old code), ``[plugins] flush = "sync"``, its data on the work disk, the gRPC endpoint
(native server); one grpcio client in this process sends ``--calls`` SendMessage requests of
``--batch`` 1 KiB messages one after another (each awaited), then as many of one message. The
order of A and B swaps every round. Prints JSON: per round and configuration the latency
median/p99 of each size, the broker's CPU seconds per call, and the median ratios B / A.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_IDS = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_broker(work: Path, b_tree: str | None) -> tuple[subprocess.Popen[bytes], str]:
    grpc_addr = f"127.0.0.1:{free_port()}"
    toml = (
        f'[broker]\nname = "bench"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = []\n'
        f'data_dir = "{work / "data"}"\nauto_create_topic = true\n'
        '[plugins]\nflush = "sync"\n'
        f'[transport.grpc]\nlisten = "{grpc_addr}"\n'
    )
    (work / "broker.toml").write_text(toml)
    env = dict(os.environ)
    if b_tree:
        env["PYTHONPATH"] = b_tree
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq", "--log-level", "WARNING", "broker", "-c", str(work / "broker.toml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    host, port = grpc_addr.rsplit(":", 1)
    for _ in range(300):
        try:
            socket.create_connection((host, int(port)), 0.5).close()
            return proc, grpc_addr
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the broker did not start")


async def drive(address: str, pid: int, batch: int, calls: int) -> dict[str, Any]:
    import grpc

    from tidemq_transport_grpc.proto import load

    pb = load()
    meta = (("x-mq-client-id", "bench@1"),)

    def message() -> Any:
        return pb.Message(
            topic=pb.Resource(name="BatchSync"),
            body=b"m" * 1024,
            system_properties=pb.SystemProperties(message_id=f"{next(_IDS):034X}"),
        )

    out: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        send = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.SendMessageResponse.FromString,
        )
        for _ in range(20):  # the topic made, the paths warm
            await send(pb.SendMessageRequest(messages=[message() for _ in range(batch)]), metadata=meta)
        for size in (batch, 1):
            requests = [
                pb.SendMessageRequest(messages=[message() for _ in range(size)]) for _ in range(calls)
            ]
            latencies = []
            cpu0 = cpu_seconds(pid)
            for request in requests:
                t0 = time.perf_counter()
                response = await send(request, metadata=meta)
                latencies.append(time.perf_counter() - t0)
                assert response.status.code == pb.OK, response.status
            cpu = cpu_seconds(pid) - cpu0
            latencies.sort()
            out[f"msgs{size}"] = {
                "p50_ms": round(statistics.median(latencies) * 1000, 3),
                "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
                "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
                "broker_cpu_ms_per_call": round(cpu / calls * 1000, 3),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--b-tree", required=True, help="PYTHONPATH of B's broker (the old code)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dir", default=None, help="where the brokers' data goes (default: a temp dir)")
    args = parser.parse_args()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = [("A", None), ("B", args.b_tree)]
        if r % 2:
            order.reverse()
        result: dict[str, Any] = {"round": r, "load": os.getloadavg()[0]}
        for name, tree in order:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                proc, address = start_broker(Path(tmp), tree)
                try:
                    result[name] = asyncio.run(drive(address, proc.pid, args.batch, args.calls))
                finally:
                    proc.terminate()
                    proc.wait(30)
        print(json.dumps(result), file=sys.stderr, flush=True)
        rounds.append(result)
    key = f"msgs{args.batch}"

    def ratio(size: str, field: str) -> float:
        return round(statistics.median(r["B"][size][field] / r["A"][size][field] for r in rounds), 3)

    summary = {
        f"{key}_p50_ms": {c: statistics.median(r[c][key]["p50_ms"] for r in rounds) for c in "AB"},
        f"{key}_p99_ms": {c: statistics.median(r[c][key]["p99_ms"] for r in rounds) for c in "AB"},
        "msgs1_p50_ms": {c: statistics.median(r[c]["msgs1"]["p50_ms"] for r in rounds) for c in "AB"},
        f"{key}_p50_B_over_A": ratio(key, "p50_ms"),
        f"{key}_cpu_B_over_A": ratio(key, "broker_cpu_ms_per_call"),
        "msgs1_p50_B_over_A": ratio("msgs1", "p50_ms"),
    }
    print(
        json.dumps(
            {"args": vars(args), "A": "this tree", "B": args.b_tree, "summary": summary, "rounds": rounds},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
