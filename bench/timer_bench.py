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

The issue's full target, ``--many 1000000 --spread-s 600``: the ``--many`` messages are due over
``--spread-s`` seconds (``--burst`` of them within one second in the middle, the others spread evenly
over the other seconds), starting once they are all sent (the lead is estimated from a calibration
send); memory is read with all of them scheduled, then every one of them is read back from its
topic for the lateness (overall, and of the burst second).

    python bench/timer_bench.py [--messages N] [--few N] [--many N] [--burst N] [--precision-ms MS]
                                [--spread-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc/PID/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


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


async def read_due(ns: str, topic: str, n: int, timeout: float) -> list[tuple[int, int]]:
    """(store timestamp in the real topic, TIMER_OUT_MS) of up to ``n`` messages of ``topic``."""
    out: list[tuple[int, int]] = []
    async with PullConsumer("bench-timer-spread-cg", ns) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        offsets = {mq: 0 for mq in queues}
        deadline = time.monotonic() + timeout
        next_log = len(out) + 100_000
        while len(out) < n and time.monotonic() < deadline:
            progressed = False
            for mq in queues:
                result = await consumer.pull(mq, "*", offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    out.extend(
                        (m.store_timestamp, int(m.properties["TIMER_OUT_MS"])) for m in result.messages
                    )
                    progressed = True
                offsets[mq] = result.next_begin_offset
            if len(out) >= next_log:
                log(f"  {topic}: {len(out)} of {n} read back")
                next_log += 100_000
            if not progressed:
                await asyncio.sleep(0.2)
    return out


def spread_due(i: int, base_ms: int, many: int, burst: int, spread_s: int) -> int:
    """Due time of message ``i`` of the spread run: the first ``burst`` within the middle second, the
    others evenly over the other ``spread_s - 1`` seconds."""
    mid_s = spread_s // 2
    if i < burst:
        return base_ms + mid_s * 1000 + (i * 1000) // burst
    j = i - burst
    at = (j * (spread_s - 1) * 1000) // max(1, many - burst)
    return base_ms + (at if at < mid_s * 1000 else at + 1000)


def lateness_of(pairs: list[tuple[int, int]]) -> dict[str, Any]:
    late = [stored - due for stored, due in pairs]
    return {
        "messages": len(pairs),
        "early": sum(1 for v in late if v < 0),
        "late_ms_min": min(late) if late else None,
        "late_ms_p50": percentile(late, 0.5),
        "late_ms_p99": percentile(late, 0.99),
        "late_ms_p999": percentile(late, 0.999),
        "late_ms_max": max(late) if late else None,
    }


def by_minute(pairs: list[tuple[int, int]], base_ms: int) -> list[dict[str, Any]]:
    """Lateness per minute of due time: where the late ones are."""
    buckets: dict[int, list[int]] = collections.defaultdict(list)
    for stored, due in pairs:
        buckets[(due - base_ms) // 60_000].append(stored - due)
    return [
        {
            "minute": m,
            "messages": len(v),
            "late_ms_p99": percentile(v, 0.99),
            "late_ms_max": max(v),
            "over_1200_ms": sum(1 for x in v if x > 1200),
        }
        for m, v in sorted(buckets.items())
    ]


def worst_seconds(pairs: list[tuple[int, int]], base_ms: int, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` seconds of due time with the latest deliveries (when the broker stalled)."""
    worst: dict[int, int] = {}
    for stored, due in pairs:
        sec = (due - base_ms) // 1000
        worst[sec] = max(worst.get(sec, 0), stored - due)
    top = sorted(worst.items(), key=lambda kv: -kv[1])[:n]
    return [{"second": sec, "late_ms_max": late} for sec, late in sorted(top)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000, help="cost phase: sends of each kind")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--few", type=int, default=10_000)
    ap.add_argument("--many", type=int, default=200_000)
    ap.add_argument("--burst", type=int, default=10_000, help="lateness: messages due in one second")
    ap.add_argument("--precision-ms", type=int, default=1000)
    ap.add_argument(
        "--spread-s",
        type=int,
        default=0,
        help="the --many messages are due over this many seconds (0: after the run)",
    )
    ap.add_argument(
        "--broker-nice",
        type=int,
        default=None,
        help="the broker's niceness (default: the bench's, inherited)",
    )
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-timer-bench-"))
    toml = (
        f'[broker]\nname = "bench-timer"\nregister_interval_s = 2.0\ntimer_precision_ms = {args.precision_ms}\n\n'
        "[store.mmap]\ncommitlog_file_size = 268435456\nconsumequeue_entries = 300000\n"
    )
    ns, broker, ns_addr, broker_addr = start_namesrv_and_broker(work, toml)
    if args.broker_nice is not None:
        os.setpriority(os.PRIO_PROCESS, broker.pid, args.broker_nice)
    out: dict[str, Any] = {"scale": vars(args), "loadavg_start": os.getloadavg(), "bench_nice": os.nice(0)}
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
            if args.spread_s > 0:
                spread_base_ms = await send_spread(producer)
                out["spread_base_ms"] = spread_base_ms
            else:
                await send_batches(producer, "BenchTimerFar", args.many - max(args.few, args.messages), far)
            await wait_enqueued(broker_addr)
            await asyncio.sleep(1.0)
            rss_many = rss_anon_kib(broker.pid)
            info = await runtime(broker_addr)
            if args.spread_s > 0 and time.time() * 1000 >= out["spread_base_ms"]:
                out["memory_note"] = "the first spread messages were due before memory was read"
            out["memory"] = {
                "scheduled_few": max(args.few, args.messages),
                "scheduled_many": int(info["timerCongestNum"]),
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
            if args.spread_s > 0:
                return
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

    async def send_spread(producer: Producer) -> int:
        """Calibrate the batch send rate, then send the --many spread messages; returns their base."""
        t0 = time.perf_counter()
        await send_batches(producer, "BenchTimerFar", 10_000, far)
        rate = 10_000 / (time.perf_counter() - t0)
        lead_s = 1.6 * args.many / rate + 30
        base_ms = int(time.time() * 1000 + lead_s * 1000) // 1000 * 1000
        log(f"spread: {rate:.0f} timer msg/s in batches; the {args.many} are due from {lead_s:.0f} s on")
        body = b"s" * 128
        sem = asyncio.Semaphore(8)

        async def one(i0: int, count: int) -> None:
            async with sem:
                await producer.send_batch(
                    [
                        Message(
                            "BenchTimerSpread",
                            body,
                            properties={
                                "TIMER_DELIVER_MS": str(
                                    spread_due(i, base_ms, args.many, args.burst, args.spread_s)
                                )
                            },
                        )
                        for i in range(i0, i0 + count)
                    ]
                )

        step = 128
        starts = list(range(0, args.many, step))
        for k in range(0, len(starts), 256):
            await asyncio.gather(*(one(i, min(step, args.many - i)) for i in starts[k : k + 256]))
            if (k // 256) % 10 == 0:
                log(f"  BenchTimerSpread: {min(args.many, (k + 256) * step)} of {args.many} sent")
        left = (base_ms - time.time() * 1000) / 1000
        log(f"spread: all sent, {left:.0f} s before the first is due")
        out["spread_sent_s_before_due"] = round(left, 1)
        return base_ms

    async def spread_lateness() -> None:
        base_ms = out["spread_base_ms"]
        end_ms = base_ms + args.spread_s * 1000
        c0, w0 = cpu_s(broker.pid), runqueue_wait_s(broker.pid)
        samples: list[dict[str, Any]] = []
        while time.time() * 1000 < end_ms + 3 * args.precision_ms:
            info = await runtime(broker_addr)
            sample = {
                "t_s": round(time.time() - base_ms / 1000, 1),
                "loadavg_1m": os.getloadavg()[0],
                "broker_cpu_s": round(cpu_s(broker.pid) - c0, 2),
                "broker_runqueue_wait_s": round(runqueue_wait_s(broker.pid) - w0, 2),
                "timerCongestNum": int(info.get("timerCongestNum", -1)),
                "timerReadBehind_s": int(info.get("timerReadBehind", -1)),
            }
            samples.append(sample)
            log(
                f"  waiting for the spread to be due: {(end_ms - time.time() * 1000) / 1000:.0f} s left, {sample}"
            )
            await asyncio.sleep(min(30.0, max(0.1, (end_ms - time.time() * 1000) / 1000 + 3)))
        c1, w1 = cpu_s(broker.pid), runqueue_wait_s(broker.pid)
        pairs = await read_due(ns_addr, "BenchTimerSpread", args.many, 1800)
        mid_ms = base_ms + (args.spread_s // 2) * 1000
        per_s = collections.Counter((due - base_ms) // 1000 for _, due in pairs)
        out["spread"] = {
            "due_over_s": args.spread_s,
            "max_due_in_one_second": max(per_s.values()) if per_s else 0,
            "server_cpu_s_while_due": round(c1 - c0, 2),
            "server_runqueue_wait_s_while_due": round(w1 - w0, 2),
            "all": lateness_of(pairs),
            "burst_second": lateness_of([p for p in pairs if mid_ms <= p[1] < mid_ms + 1000]),
            "by_minute_of_due": by_minute(pairs, base_ms),
            "worst_seconds_of_due": worst_seconds(pairs, base_ms),
            "samples": samples,
        }
        log(f"spread: {out['spread']}")

    async def run() -> None:
        await phases()
        if args.spread_s > 0:
            await spread_lateness()
        out["loadavg_end"] = os.getloadavg()

    try:
        asyncio.run(run())
    finally:
        stop(broker)
        stop(ns)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
