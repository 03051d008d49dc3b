"""Message trace: what switching it on costs a producer, measured against trace off in the same run.

Starts ``tidemq namesrv`` and ``tidemq broker`` (``trace_topic_enable = true``) as subprocesses on
free ports.  This process sends with two producers, one plain and one with ``enable_msg_trace``,
in alternating rounds (off, on, off, on: drift on a shared machine hits both alike):

* fixed rate: ``--rate`` sync sends a second for ``--seconds``; p50/p99 latency in ms;
* maximum rate: ``--window`` sends in flight for ``--seconds``; sends a second, and the CPU of
  this process (client) and of the broker per 1 000 sends (``/proc/<pid>/stat``), which with
  trace on includes the dispatcher's batching and the broker storing the trace messages.

Ratios are trace-on over trace-off.  The trace records are checked to arrive: the dispatcher's
``sent`` count after the run, and ``dropped`` (must be 0 at these rates with the default queue).
Prints one JSON object on stdout (progress on stderr).  Default: ~45 s.

    python bench/trace_bench.py [--rate N] [--seconds S] [--window W] [--size BYTES]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import start_namesrv_and_broker, stop
from reply_bench import create_topic, fixed_rate, max_rate, summary

from tidemq.client import Message, Producer

TOPIC = "ReplyBench"  # reply_bench.create_topic's topic: any topic of 4 queues will do
TICKS = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[trace_bench] {msg}", file=sys.stderr, flush=True)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure(args: argparse.Namespace, ns: str, broker: str, broker_pid: int) -> dict[str, Any]:
    body = b"x" * args.size
    plain = Producer("TraceBenchOffPG", ns)
    traced = Producer("TraceBenchOnPG", ns, enable_msg_trace=True)
    async with plain, traced:
        await create_topic(plain, broker)
        for p in (plain, traced):  # routes, connections, the trace topic's route
            for i in range(300):
                await p.send(Message(TOPIC, body, keys=f"warm-{i}"))
        rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for name, producer in (("off", plain), ("on", traced)):

                async def send(i: int, producer: Producer = producer) -> Any:
                    return await producer.send(Message(TOPIC, body, keys=f"k{i}"))

                log(f"round {r + 1}/{args.rounds}, trace {name}: {args.rate}/s for {args.seconds}s")
                lat, fail = await fixed_rate(send, args.rate, args.seconds)
                log(f"round {r + 1}/{args.rounds}, trace {name}: {args.window} in flight for {args.seconds}s")
                client0, broker0 = time.process_time(), proc_cpu_s(broker_pid)
                top = await max_rate(send, args.window, args.seconds)
                client_s, broker_s = time.process_time() - client0, proc_cpu_s(broker_pid) - broker0
                n = max(top["completed"], 1)
                rounds[name].append(
                    {
                        "fixed_rate": {**summary(lat), "failures": fail},
                        "max_rate": top,
                        "client_cpu_ms_per_1000": round(client_s * 1e6 / n, 1),
                        "broker_cpu_ms_per_1000": round(broker_s * 1e6 / n, 1),
                    }
                )
        await asyncio.sleep(0.5)  # let the dispatcher send its last batch before the counters are read
        assert traced.tracer is not None
        dispatcher = traced.tracer.dispatcher
        delivery = {"sent": dispatcher.sent, "dropped": dispatcher.dropped, "failed": dispatcher.failed}

    def mean(name: str, pick: Any) -> float:
        values = [pick(x) for x in rounds[name]]
        return sum(values) / len(values)

    def ratio(pick: Any) -> float:
        off = mean("off", pick)
        return round(mean("on", pick) / off, 3) if off else float("nan")

    return {
        "rounds": rounds,
        "ratio_on_over_off": {
            "fixed_rate_p50": ratio(lambda x: x["fixed_rate"]["p50_ms"]),
            "fixed_rate_p99": ratio(lambda x: x["fixed_rate"]["p99_ms"]),
            "max_rate_sends_per_s": ratio(lambda x: x["max_rate"]["per_s"]),
            "client_cpu_per_send": ratio(lambda x: x["client_cpu_ms_per_1000"]),
            "broker_cpu_per_send": ratio(lambda x: x["broker_cpu_ms_per_1000"]),
        },
        "trace_delivery": delivery,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="sends a second in the fixed-rate runs")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each run")
    parser.add_argument("--window", type=int, default=32, help="sends in flight in the maximum-rate runs")
    parser.add_argument("--size", type=int, default=128, help="body bytes")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="trace-bench-"))
    ns, broker, ns_addr, broker_addr = start_namesrv_and_broker(
        tmp, '[broker]\nname = "bench-trace"\nregister_interval_s = 2.0\ntrace_topic_enable = true\n'
    )
    try:
        log("cluster up")
        result = asyncio.run(measure(args, ns_addr, broker_addr, broker.pid))
    finally:
        stop(broker)
        stop(ns)
        shutil.rmtree(tmp, ignore_errors=True)
    result["settings"] = vars(args)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m_5m_15m": [round(x, 2) for x in os.getloadavg()],
    }
    result["processes"] = "namesrv, broker and this client (both producers): one process each"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
