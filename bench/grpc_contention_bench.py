"""Do grpcio's threads and the broker's event loop slow each other down?  One broker, remoting
load and gRPC load alone and together.

    .venv/bin/python bench/grpc_contention_bench.py [--seconds 8] [--repeats 3] [--body 1024] [--out FILE]

``tidemq namesrv`` and one ``tidemq broker`` with ``[transport.grpc]`` run as subprocesses.  Each
round runs for ``--seconds``, with

* ``remoting``: the official ``rocketmq==0.4.4`` (C++) producer, sync sends in a loop, alone;
* ``grpc``: a gRPC loader (tidemq's protobuf module over ``grpc.aio``, ``--grpc-concurrency``
  SendMessage calls in flight), alone;
* ``both``: the two at once, on the same broker;
* ``both_via_proxy``: the two at once, the gRPC load through a ``tidemq proxy`` process in front of
  the broker (RocketMQ 5's cluster mode: the broker sees remoting only);

the four alternating ``--repeats`` times.  The broker's CPU time (every thread, grpcio's poller
included) is read from /proc around each round.  From the rounds alone, the broker's CPU cost of
one remoting message and of one gRPC message; in ``both``, the CPU the broker spent beyond what
its messages cost alone (``interference``: 1.0 = none) and the remoting messages per broker
CPU-second once the gRPC messages' own cost is taken out.  The machine is shared: indicative only.
One JSON document on stdout (and in ``--out``), progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpc_bench import cpu_seconds, free_port, progress, start, wait_listening  # noqa: E402

TOPIC = "ContentionBench"

V4_LOADER = """
import json, sys, time
from rocketmq.client import Message, Producer
namesrv, topic, seconds, body = sys.argv[1], sys.argv[2], float(sys.argv[3]), b"x" * int(sys.argv[4])
producer = Producer("contention-bench", timeout=5000)
producer.set_namesrv_addr(namesrv)
producer.start()
msg = Message(topic); msg.set_body(body); producer.send_sync(msg)  # route known before go
print("ready", flush=True)
sys.stdin.readline()
sent = failed = 0
started = time.monotonic()
while time.monotonic() - started < seconds:
    msg = Message(topic); msg.set_body(body)
    try:
        if int(producer.send_sync(msg).status) == 0: sent += 1
        else: failed += 1
    except Exception:
        failed += 1
print(json.dumps({"sent": sent, "failed": failed, "seconds": time.monotonic() - started}), flush=True)
sys.stdin.readline()
producer.shutdown()
"""

GRPC_LOADER = """
import asyncio, json, sys, time, uuid
import grpc
from tidemq_transport_grpc.proto import load
pb = load()
address, topic, seconds, body, concurrency = sys.argv[1], sys.argv[2], float(sys.argv[3]), b"x" * int(sys.argv[4]), int(sys.argv[5])
META = (("x-mq-client-id", "contention-bench@1"),)
async def main():
    async with grpc.aio.insecure_channel(address) as channel:
        send = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=lambda m: m.SerializeToString(), response_deserializer=pb.SendMessageResponse.FromString)
        def request():
            msg = pb.Message(topic=pb.Resource(name=topic), body=body)
            msg.system_properties.message_id = uuid.uuid4().hex
            msg.system_properties.born_timestamp.GetCurrentTime()
            return pb.SendMessageRequest(messages=[msg])
        assert (await send(request(), metadata=META)).status.code == pb.OK
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        counts = {"sent": 0, "failed": 0}
        started = time.monotonic()
        async def worker():
            while time.monotonic() - started < seconds:
                try:
                    ok = (await send(request(), metadata=META)).status.code == pb.OK
                except grpc.aio.AioRpcError:
                    ok = False
                counts["sent" if ok else "failed"] += 1
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        print(json.dumps({**counts, "seconds": time.monotonic() - started}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
asyncio.run(main())
"""


def one_round(loaders: dict[str, list[str]], broker_pid: int, proxy_pid: int) -> dict[str, Any]:
    procs = {
        name: subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for name, cmd in loaders.items()
    }
    try:
        for name, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"{name} loader did not start: {line!r}")
        before, proxy_before = cpu_seconds(broker_pid), cpu_seconds(proxy_pid)
        began = time.monotonic()
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        result: dict[str, Any] = {}
        for name, proc in procs.items():
            assert proc.stdout is not None
            result[name] = json.loads(proc.stdout.readline())
        result["broker_cpu_s"] = round(cpu_seconds(broker_pid) - before, 3)
        result["proxy_cpu_s"] = round(cpu_seconds(proxy_pid) - proxy_before, 3)
        result["wall_s"] = round(time.monotonic() - began, 3)
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("done\n")
            proc.stdin.flush()
            proc.wait(60)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--grpc-concurrency", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="grpc-contention-") as tmp:
        work = Path(tmp)
        try:
            namesrv, namesrv_addr = start(["namesrv", "--listen", "127.0.0.1:0"], work)
            procs.append(namesrv)
            grpc_addr = f"127.0.0.1:{free_port()}"
            (work / "broker.toml").write_text(
                f'[broker]\nname = "contention"\nlisten = "127.0.0.1:{free_port()}"\n'
                f'namesrv = ["{namesrv_addr}"]\ndata_dir = "{work / "data"}"\n'
                f'[transport.grpc]\nlisten = "{grpc_addr}"\n'
            )
            broker, _ = start(["broker", "-c", str(work / "broker.toml")], work)
            procs.append(broker)
            wait_listening(grpc_addr)
            proxy, proxy_addr = start(["proxy", "--namesrv", namesrv_addr, "--listen", "127.0.0.1:0"], work)
            procs.append(proxy)
            subprocess.run(
                [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-t", TOPIC, "-n", namesrv_addr],
                check=True,
                capture_output=True,
                timeout=30,
            )
            seconds = str(args.seconds)
            v4 = [sys.executable, "-c", V4_LOADER, namesrv_addr, TOPIC, seconds, str(args.body)]
            v5 = [
                sys.executable,
                "-c",
                GRPC_LOADER,
                grpc_addr,
                TOPIC,
                seconds,
                str(args.body),
                str(args.grpc_concurrency),
            ]
            via_proxy = [*v5[:3], proxy_addr, *v5[4:]]
            kinds = {
                "remoting": {"remoting": v4},
                "grpc": {"grpc": v5},
                "both": {"remoting": v4, "grpc": v5},
                "both_via_proxy": {"remoting": v4, "grpc": via_proxy},
            }
            rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for r in range(args.repeats):
                for kind, loaders in kinds.items():
                    progress(f"round {r + 1}/{args.repeats}: {kind}, {args.seconds} s")
                    rounds[kind].append(one_round(loaders, broker.pid, proxy.pid))
                    progress(f"  {rounds[kind][-1]}")
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)

    def per_cpu(kind: str, loader: str) -> float:
        return statistics.median(x[loader]["sent"] / max(x["broker_cpu_s"], 1e-3) for x in rounds[kind])

    def rate(kind: str, loader: str) -> float:
        return statistics.median(x[loader]["sent"] / x[loader]["seconds"] for x in rounds[kind])

    remoting_cost = 1 / per_cpu("remoting", "remoting")  # broker CPU-seconds per remoting message
    grpc_cost = 1 / per_cpu("grpc", "grpc")
    interference = []
    remoting_per_cpu_beside_grpc = []
    for x in rounds["both"]:
        alone = x["remoting"]["sent"] * remoting_cost + x["grpc"]["sent"] * grpc_cost
        interference.append(x["broker_cpu_s"] / alone)
        left = max(x["broker_cpu_s"] - x["grpc"]["sent"] * grpc_cost, 1e-3)
        remoting_per_cpu_beside_grpc.append(x["remoting"]["sent"] / left)
    doc = {
        "what": "one broker: remoting (0.4.4 sync sends) and gRPC (SendMessage) load, alone and together",
        "seconds": args.seconds,
        "body": args.body,
        "grpc_concurrency": args.grpc_concurrency,
        "repeats": args.repeats,
        "remoting_msgs_per_broker_cpu_s": {
            "alone": round(1 / remoting_cost, 1),
            "beside_grpc_load": round(statistics.median(remoting_per_cpu_beside_grpc), 1),
        },
        "grpc_msgs_per_broker_cpu_s_alone": round(1 / grpc_cost, 1),
        "interference_cpu_ratio": round(statistics.median(interference), 3),
        "msgs_per_s": {
            "remoting_alone": round(rate("remoting", "remoting"), 1),
            "remoting_beside_grpc": round(rate("both", "remoting"), 1),
            "grpc_alone": round(rate("grpc", "grpc"), 1),
            "grpc_beside_remoting": round(rate("both", "grpc"), 1),
            "remoting_beside_grpc_via_proxy": round(rate("both_via_proxy", "remoting"), 1),
            "grpc_via_proxy_beside_remoting": round(rate("both_via_proxy", "grpc"), 1),
        },
        "remoting_msgs_per_broker_cpu_s_beside_grpc_via_proxy": round(
            statistics.median(
                x["remoting"]["sent"] / max(x["broker_cpu_s"], 1e-3) for x in rounds["both_via_proxy"]
            ),
            1,
        ),
        "rounds": rounds,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
