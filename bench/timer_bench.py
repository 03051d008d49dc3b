"""Timer messages (issue 36): lateness, memory with many scheduled, and cost against a plain send.

Starts ``tidemq namesrv`` and ``tidemq broker`` as subprocesses on free ports and, with tidemq's
asyncio client, measures three things (one JSON object on stdout, progress on stderr):

* cost: ``--messages`` plain sends, then as many timer sends (``TIMER_DELIVER_MS`` far ahead), each
  with ``--window`` in flight; the broker's CPU seconds (``/proc/PID/stat`` utime + stime) per
  phase, the timer phase counted until the broker has them all in its wheel (timerOffsetBehind 0).
  Reported as messages per server CPU-second and their ratio (the issue's target: timer costs at
  most 1.5x a plain send);
* memory: the broker's anonymous RSS (``RssAnon``) with ``--few`` messages scheduled, then with
  ``--many`` (sent in batches), all due after the run;
* lateness: ``--burst`` messages due within the same second, read back from their real topic;
  lateness = store timestamp there - TIMER_OUT_MS (p50 / p99 / max, and how many were early).

Default scale (a reduced run on a shared 2-core machine): 10 000 / 10 000 / 200 000 / 10 000.
The issue's full target is 1 M scheduled over 10 minutes: ``--many 1000000``.

    python bench/timer_bench.py [--messages N] [--few N] [--many N] [--burst N] [--precision-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from benchutil import start_namesrv_and_broker, stop

from tidemq.client import Message, MessageExt, Producer, PullConsumer, PullStatus
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand


def log(msg: str) -> None:
    print(f"[timer_bench] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


async def runtime(broker: str) -> dict[str, str]:
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        resp = await client.invoke(broker, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)
    finally:
        await client.close()
    return dict(orjson.loads(resp.body)["table"])


async def wait_enqueued(broker: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await runtime(broker)).get("timerOffsetBehind") == "0":
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the broker did not enqueue its timer messages in time")


async def send_singles(producer: Producer, topic: str, n: int, window: int, props: dict[str, str]) -> float:
    body = b"x" * 128
    sem = asyncio.Semaphore(window)

    async def one() -> None:
        async with sem:
            await producer.send(Message(topic, body, properties=props))

    begin = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - begin


async def send_batches(
    producer: Producer, topic: str, n: int, props: dict[str, str], batch: int = 128
) -> None:
    body = b"x" * 128
    sem = asyncio.Semaphore(8)

    async def one(count: int) -> None:
        async with sem:
            await producer.send_batch([Message(topic, body, properties=props) for _ in range(count)])

    tasks = [one(min(batch, n - i)) for i in range(0, n, batch)]
    for i in range(0, len(tasks), 256):
        await asyncio.gather(*tasks[i : i + 256])
        log(f"  {topic}: {min(n, (i + 256) * batch)} of {n} sent")


async def read_all(ns: str, topic: str, n: int, timeout: float) -> list[MessageExt]:
    out: list[MessageExt] = []
    async with PullConsumer("bench-timer-cg", ns) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        offsets = {mq: 0 for mq in queues}
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            progressed = False
            for mq in queues:
                result = await consumer.pull(mq, "*", offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    out.extend(result.messages)
                    progressed = True
                offsets[mq] = result.next_begin_offset
            if not progressed:
                await asyncio.sleep(0.1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000, help="cost phase: sends of each kind")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--few", type=int, default=10_000)
    ap.add_argument("--many", type=int, default=200_000)
    ap.add_argument("--burst", type=int, default=10_000, help="lateness: messages due in one second")
    ap.add_argument("--precision-ms", type=int, default=1000)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-timer-bench-"))
    toml = (
        f'[broker]\nname = "bench-timer"\nregister_interval_s = 2.0\ntimer_precision_ms = {args.precision_ms}\n\n'
        "[store.mmap]\ncommitlog_file_size = 268435456\nconsumequeue_entries = 300000\n"
    )
    ns, broker, ns_addr, broker_addr = start_namesrv_and_broker(work, toml)
    out: dict[str, Any] = {"scale": vars(args)}
    far = {"TIMER_DELIVER_MS": str(int(time.time() * 1000) + 3_600_000)}

    async def phases() -> None:
        async with Producer("bench-timer-pg", ns_addr, send_timeout=30) as producer:
            await producer.send(Message("BenchTimerPlain", b"warm-up"))
            await producer.send(Message("BenchTimerFar", b"warm-up"))
            await send_singles(producer, "BenchWarm", 2000, args.window, {})
            # cost
            c0 = cpu_s(broker.pid)
            plain_s = await send_singles(producer, "BenchTimerPlain", args.messages, args.window, {})
            c1 = cpu_s(broker.pid)
            timer_s = await send_singles(producer, "BenchTimerFar", args.messages, args.window, far)
            await wait_enqueued(broker_addr)
            c2 = cpu_s(broker.pid)
            plain_per_cpu = args.messages / max(c1 - c0, 1e-9)
            timer_per_cpu = args.messages / max(c2 - c1, 1e-9)
            out["cost"] = {
                "plain_send_per_s": round(args.messages / plain_s),
                "timer_send_per_s": round(args.messages / timer_s),
                "plain_per_server_cpu_s": round(plain_per_cpu),
                "timer_per_server_cpu_s": round(timer_per_cpu),
                "timer_cost_vs_plain": round(plain_per_cpu / timer_per_cpu, 3),
            }
            log(f"cost: {out['cost']}")
            # memory
            few = args.few - args.messages
            if few > 0:
                await send_batches(producer, "BenchTimerFar", few, far)
            await wait_enqueued(broker_addr)
            await asyncio.sleep(1.0)
            rss_few = rss_anon_kib(broker.pid)
            await send_batches(producer, "BenchTimerFar", args.many - max(args.few, args.messages), far)
            await wait_enqueued(broker_addr)
            await asyncio.sleep(1.0)
            rss_many = rss_anon_kib(broker.pid)
            info = await runtime(broker_addr)
            out["memory"] = {
                "scheduled_few": max(args.few, args.messages),
                "scheduled_many": args.many,
                "timerCongestNum": int(info["timerCongestNum"]),
                "rss_anon_kib_few": rss_few,
                "rss_anon_kib_many": rss_many,
                "ratio": round(rss_many / rss_few, 3),
                "timer_files_bytes": sum(
                    f.stat().st_size for f in (work / "data").glob("timer*/**/*") if f.is_file()
                )
                + (work / "data" / "timerwheel").stat().st_size,
            }
            log(f"memory: {out['memory']}")
            # lateness: the burst is due within one second, 15 s from now
            due_base = int(time.time() * 1000) + 15_000
            c3 = cpu_s(broker.pid)
            sem = asyncio.Semaphore(8)

            async def burst(i0: int, count: int) -> None:
                async with sem:
                    await producer.send_batch(
                        [
                            Message(
                                "BenchTimerBurst",
                                b"b",
                                properties={"TIMER_DELIVER_MS": str(due_base + (i * 1000) // args.burst)},
                            )
                            for i in range(i0, i0 + count)
                        ]
                    )

            await asyncio.gather(*(burst(i, min(100, args.burst - i)) for i in range(0, args.burst, 100)))
            log(f"burst of {args.burst} sent; due in {(due_base - time.time() * 1000) / 1000:.1f} s")
        msgs = await read_all(ns_addr, "BenchTimerBurst", args.burst, 120)
        c4 = cpu_s(broker.pid)
        late = [m.store_timestamp - int(m.properties["TIMER_OUT_MS"]) for m in msgs]
        stamps = [m.store_timestamp for m in msgs]
        out["lateness"] = {
            "messages": len(msgs),
            "due_within_ms": 1000,
            "early": sum(1 for v in late if v < 0),
            "late_ms_p50": percentile(late, 0.5),
            "late_ms_p99": percentile(late, 0.99),
            "late_ms_max": max(late) if late else None,
            "delivered_span_s": round((max(stamps) - min(stamps)) / 1000, 3) if stamps else None,
            "server_cpu_s_schedule_and_deliver": round(c4 - c3, 2),
        }
        log(f"lateness: {out['lateness']}")

    try:
        asyncio.run(phases())
    finally:
        stop(broker)
        stop(ns)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
