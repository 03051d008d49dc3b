"""Delayed delivery: lateness distribution and backlog drain throughput of the schedule service.

Starts ``tidemq namesrv`` and ``tidemq broker`` (delay levels ``--levels``, default ``1s 2s 3s``)
as subprocesses on free ports and, with tidemq's asyncio client:

* lateness: sends ``--messages`` messages at ``--level`` (plus the same number undelayed, for the
  send-rate ratio), reads them back from the real topic and reports how late each reached it:
  ``store timestamp in the real topic - (born timestamp + level delay)`` -- p50/p99/max in ms
  (includes the send latency between born and schedule-store time, so it is an upper bound);
* drain: sends ``--messages`` messages at the last level, stops the broker before they are due,
  restarts it once they all are, and measures how fast the service moves the backlog to the real
  topic (messages / span of their real-topic store timestamps).

Prints one JSON object on stdout (progress on stderr).  Default: 3000 messages, ~20 s.

    python bench/delay_bench.py [--messages N] [--size BYTES] [--level L] [--levels "1s 2s 3s"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

from tidemq.broker.schedule import parse_delay_levels
from tidemq.client import Message, MessageExt, Producer, PullConsumer, PullStatus


def log(msg: str) -> None:
    print(f"[delay_bench] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def send_all(producer: Producer, topic: str, n: int, size: int, level: int, window: int = 64) -> float:
    """Send ``n`` messages with at most ``window`` in flight; seconds taken."""
    body = b"x" * size
    sem = asyncio.Semaphore(window)

    async def one(i: int) -> None:
        async with sem:
            await producer.send(Message(topic, body, keys=str(i), delay_level=level))

    begin = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - begin


async def read_all(ns: str, group: str, topic: str, n: int, timeout: float) -> list[MessageExt]:
    """Pull every queue of ``topic`` from offset 0 until ``n`` messages were read."""
    out: list[MessageExt] = []
    async with PullConsumer(group, ns) as consumer:
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
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} of {n} messages reached {topic} in {timeout}s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--levels", default="1s 2s 3s")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    args = ap.parse_args()
    delays = parse_delay_levels(args.levels)
    if not 1 <= args.level <= len(delays):
        ap.error(f"--level must be within 1..{len(delays)}")
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-delay-bench-"))
    ns_port, broker_port = free_port(), free_port()
    ns_addr, broker_addr = f"127.0.0.1:{ns_port}", f"127.0.0.1:{broker_port}"
    cfg = tmp / "broker.toml"
    cfg.write_text(
        f'[broker]\nname = "bench-delay"\nregister_interval_s = 2.0\ndelay_levels = "{args.levels}"\n\n'
        "[store.mmap]\ncommitlog_file_size = 67108864\nconsumequeue_entries = 100000\n"
    )
    broker_args = [
        "broker",
        "-c",
        str(cfg),
        "--listen",
        broker_addr,
        "--namesrv",
        ns_addr,
        "--data-dir",
        str(tmp / "data"),
    ]
    ns = start(["namesrv", "--listen", ns_addr], tmp, "namesrv")
    broker = start(broker_args, tmp, "broker")
    n, level, delay_ms = args.messages, args.level, delays[args.level - 1]
    out: dict[str, Any] = {"messages": n, "size": args.size, "levels": args.levels}
    try:

        async def lateness_phase() -> None:
            async with Producer("bench-delay-pg", ns_addr) as producer:
                await producer.send(Message("BenchPlain", b"warm-up"))
                await send_all(producer, "BenchWarmUp", min(n, 1000), args.size, 0)
                plain_s = await send_all(producer, "BenchPlain", n, args.size, 0)
                log(f"plain sends: {n / plain_s:.0f}/s")
                delayed_s = await send_all(producer, "BenchDelay", n, args.size, level)
                log(f"delayed sends: {n / delayed_s:.0f}/s")
            msgs = await read_all(ns_addr, "bench-delay-cg", "BenchDelay", n, delay_ms / 1000 + 60)
            late = [m.store_timestamp - (m.born_timestamp + delay_ms) for m in msgs]
            stamps = [m.store_timestamp for m in msgs]
            out["lateness"] = {
                "level": level,
                "delay_ms": delay_ms,
                "plain_send_per_s": round(n / plain_s, 1),
                "delayed_send_per_s": round(n / delayed_s, 1),
                "delayed_vs_plain_send_ratio": round(plain_s / delayed_s, 3),
                "early": sum(1 for v in late if v < 0),
                "late_ms_p50": percentile(late, 0.50),
                "late_ms_p99": percentile(late, 0.99),
                "late_ms_max": max(late),
                "delivered_span_s": round((max(stamps) - min(stamps)) / 1000, 3),
            }

        asyncio.run(lateness_phase())
        log(f"lateness: {out['lateness']}")

        last_level, last_delay = len(delays), delays[-1]

        async def fill() -> float:
            async with Producer("bench-delay-pg2", ns_addr) as producer:
                await producer.send(Message("BenchDrain", b"warm-up"))
                return await send_all(producer, "BenchDrain", n, args.size, last_level)

        begin = time.time()
        fill_s = asyncio.run(fill())
        stop(broker)
        if fill_s * 1000 > last_delay:
            log(
                f"warning: filling took {fill_s:.1f}s, longer than the {last_delay} ms delay: part was delivered live"
            )
        time.sleep(max(0.0, begin + fill_s + last_delay / 1000 + 0.5 - time.time()))
        restart_at = time.time()
        broker = start(broker_args, tmp, "broker")
        ready_s = time.time() - restart_at

        async def drain() -> list[MessageExt]:
            return await read_all(ns_addr, "bench-delay-cg2", "BenchDrain", n + 1, 60)

        msgs = [m for m in asyncio.run(drain()) if m.store_timestamp >= restart_at * 1000]
        stamps = sorted(m.store_timestamp for m in msgs)
        span_s = (stamps[-1] - stamps[0]) / 1000 if len(stamps) > 1 else 0.0
        out["drain"] = {
            "level": last_level,
            "backlog": len(msgs),
            "broker_ready_s": round(ready_s, 3),
            "drain_span_s": round(span_s, 3),
            "drain_per_s": round(len(msgs) / span_s, 1) if span_s > 0 else None,
            "drain_vs_plain_send_ratio": round((len(msgs) / span_s) / out["lateness"]["plain_send_per_s"], 3)
            if span_s > 0
            else None,
        }
        log(f"drain: {out['drain']}")
    finally:
        stop(broker)
        stop(ns)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
