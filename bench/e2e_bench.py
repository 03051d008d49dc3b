"""End-to-end throughput over loopback with the official client (PyPI ``rocketmq==0.4.4``).

Starts ``tidemq namesrv`` and ``tidemq broker`` as subprocesses on free ports, creates a topic,
then measures:

* produce: ``send_sync`` of ``--messages`` messages of ``--size`` bytes from ``--producers`` threads;
* produce_oneway: ``send_oneway`` of the same number (throughput as the broker stores them);
* consume: a PushConsumer (CLUSTERING, new group) reading every message back;
* then the same with tidemq's own asyncio client (skip with ``--no-tidemq-client``).

Prints one JSON object on stdout (progress on stderr); ratios compare the phases of this run.
Default run: 20000 messages of 256 bytes, well under a minute; ``--full`` runs 50000 x 1 KiB.

    python bench/e2e_bench.py [--messages N] [--size BYTES] [--producers N] [--store mmap|memory] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop


def log(msg: str) -> None:
    print(f"[e2e_bench] {msg}", file=sys.stderr, flush=True)


def rate(n: int, seconds: float, size: int) -> dict[str, float]:
    return {
        "messages": n,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(n / seconds, 1) if seconds > 0 else 0.0,
        "mb_per_s": round(n * size / seconds / 1e6, 3) if seconds > 0 else 0.0,
    }


def produce(
    namesrv: str, topic: str, n: int, size: int, threads: int, oneway: bool
) -> tuple[int, float, int]:
    from rocketmq.client import Message, Producer

    body = ("x" * size).encode()
    producer = Producer(f"BENCH_P_{'ONEWAY' if oneway else 'SYNC'}", timeout=10000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    warm = Message(topic)
    warm.set_body(b"warmup")
    producer.send_sync(warm)  # route lookup and connection set-up stay out of the measurement
    per_thread = n // threads
    failures: list[BaseException] = []  # sends that failed even after retries
    retried = [0]
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(per_thread):
            msg = Message(topic)
            msg.set_body(body)
            msg.set_tags("bench")
            for attempt in range(3):
                try:
                    if oneway:
                        producer.send_oneway(msg)
                    else:
                        producer.send_sync(msg)
                    break
                except Exception as exc:
                    # rocketmq-client-cpp fails a send when its threads contend for the connection
                    # lock ("get timed_mutex timeout"); count it and try again.
                    with lock:
                        if attempt == 2:
                            failures.append(exc)
                        else:
                            retried[0] += 1

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    if oneway:
        time.sleep(2.0)  # oneway sends still queued in the client are dropped by shutdown
    producer.shutdown()
    if retried[0] or failures:
        log(f"  client-side send retries: {retried[0]}, failures: {len(failures)} {failures[:1]!r}")
    return per_thread * threads - len(failures), elapsed, retried[0] + len(failures)


def consume(namesrv: str, topic: str, expected: int, timeout: float) -> tuple[int, float]:
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(f"BENCH_C_{os.getpid()}")
    consumer.set_namesrv_addr(namesrv)
    consumer.set_thread_count(4)
    count = [0]
    first = [0.0]
    lock = threading.Lock()
    done = threading.Event()

    def on_message(msg: Any) -> None:
        with lock:
            if count[0] == 0:
                first[0] = time.perf_counter()
            count[0] += 1
            if count[0] >= expected:
                done.set()

    consumer.subscribe(topic, on_message)
    t0 = time.perf_counter()
    consumer.start()
    done.wait(timeout)
    elapsed = time.perf_counter() - t0
    consumer.shutdown()
    return count[0], elapsed


async def stored_messages(namesrv: str, topic: str) -> tuple[int, int]:
    """Messages the broker holds in the topic (sum of the queues' max offsets), and the number of
    messages its send processor accepted since it started (GET_BROKER_RUNTIME_INFO)."""
    from tidemq.admin import AdminClient
    from tidemq.client.route import loads_lenient
    from tidemq.remoting.codes import RequestCode

    client = AdminClient(namesrv)
    try:
        route = await client.route(topic)
        total = accepted = 0
        for addr in route.addresses().values():
            for q in route.subscribe_queues():
                resp = await client.call(
                    addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q.queue_id}
                )
                total += int(resp.ext_fields["offset"])
            info = await client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
            accepted += int(loads_lenient(info.body or b"{}")["table"]["msgPutTotalTodayNow"])
        return total, accepted
    finally:
        await client.close()


async def tidemq_client_phase(
    namesrv: str, topic: str, n: int, size: int, concurrency: int
) -> dict[str, Any]:
    """The same produce/consume with tidemq's own asyncio client, on a fresh topic."""
    from tidemq.client import ConsumeFrom, Message, Producer, PushConsumer

    body = b"x" * size
    producer = Producer("BENCH_TIDEMQ_P", namesrv=namesrv)
    await producer.start()
    await producer.send(Message(topic, b"warmup"))
    per_task = n // concurrency

    async def sender() -> None:
        for _ in range(per_task):
            await producer.send(Message(topic, body, tags="bench"))

    t0 = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    t_send = time.perf_counter() - t0
    await producer.shutdown()
    sent = per_task * concurrency

    expected = sent + 1
    done = asyncio.Event()
    count = [0]

    def listener(msgs: list[Any]) -> None:
        count[0] += len(msgs)
        if count[0] >= expected:
            loop.call_soon_threadsafe(done.set)

    loop = asyncio.get_running_loop()
    consumer = PushConsumer("BENCH_TIDEMQ_C", namesrv=namesrv, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe(topic)
    consumer.register_listener(listener)
    t0 = time.perf_counter()
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), max(60.0, expected / 200))
    except TimeoutError:
        pass
    t_consume = time.perf_counter() - t0
    await consumer.shutdown()
    return {
        "produce_send": rate(sent, t_send, size),
        "consume_push": {
            **rate(count[0], t_consume, size),
            "complete": count[0] >= expected,
            "expected": expected,
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--store", default="mmap")
    p.add_argument("--flush", default="async")
    p.add_argument("--full", action="store_true", help="50000 messages of 1 KiB")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument("--no-tidemq-client", action="store_true", help="skip the phase with tidemq's own client")
    args = p.parse_args()
    if args.full:
        args.messages, args.size = 50_000, 1024

    work = Path(tempfile.mkdtemp(prefix="tidemq-e2e-"))
    os.environ["HOME"] = str(work)  # the C++ client writes ~/logs/rocketmq-cpp
    ns_port, broker_port = free_port(), free_port()
    namesrv = f"127.0.0.1:{ns_port}"
    (work / "broker.toml").write_text(
        f"""
[broker]
name = "bench-broker"
listen = "127.0.0.1:{broker_port}"
namesrv = ["{namesrv}"]
data_dir = "{work / "data"}"
[plugins]
store = "{args.store}"
flush = "{args.flush}"
"""
    )
    procs = []
    try:
        procs.append(start(["namesrv", "--listen", namesrv], work, "namesrv"))
        procs.append(start(["broker", "-c", str(work / "broker.toml")], work, "broker"))
        topic = "BenchTopic"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tidemq",
                "admin",
                "updateTopic",
                "-n",
                namesrv,
                "-t",
                topic,
                "-r",
                str(args.queues),
                "-w",
                str(args.queues),
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        log(f"produce {args.messages} x {args.size} B with send_sync from {args.producers} threads")
        n_sync, t_sync, err_sync = produce(
            namesrv, topic, args.messages, args.size, args.producers, oneway=False
        )
        log(f"  {n_sync / t_sync:.0f} msg/s")
        log("produce the same with send_oneway")
        n_ow, t_ow, err_ow = produce(namesrv, topic, args.messages, args.size, args.producers, oneway=True)
        log(f"  {n_ow / t_ow:.0f} msg/s (client side)")
        time.sleep(1.0)
        total, accepted = asyncio.run(stored_messages(namesrv, topic))
        log(
            f"  the broker accepted {accepted} and stored {total} of {n_sync + n_ow + 2} messages the client sent"
        )
        log(f"consume {total} with a PushConsumer")
        n_c, t_c = consume(namesrv, topic, total, timeout=max(60.0, total / 200))
        log(f"  {n_c} messages in {t_c:.2f} s")
        result = {
            "benchmark": "e2e_official_client",
            "client": "rocketmq==0.4.4 (rocketmq-client-cpp)",
            "store": args.store,
            "flush": args.flush,
            "size": args.size,
            "producers": args.producers,
            "queues": args.queues,
            "produce_sync": {**rate(n_sync, t_sync, args.size), "client_send_errors": err_sync},
            "produce_oneway": {**rate(n_ow, t_ow, args.size), "client_send_errors": err_ow},
            "stored": total,
            "broker_accepted": accepted,
            "sent": n_sync + n_ow + 2,  # two warm-up messages
            "consume_push": {**rate(n_c, t_c, args.size), "complete": n_c >= total, "expected": total},
        }
        if not args.no_tidemq_client:
            log(
                f"tidemq client: produce {args.messages} with {args.producers} concurrent senders, then consume"
            )
            try:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tidemq",
                        "admin",
                        "updateTopic",
                        "-n",
                        namesrv,
                        "-t",
                        "BenchTidemq",
                        "-r",
                        str(args.queues),
                        "-w",
                        str(args.queues),
                    ],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
                result["tidemq_client"] = asyncio.run(
                    tidemq_client_phase(namesrv, "BenchTidemq", args.messages, args.size, args.producers)
                )
            except Exception as exc:  # the official-client figures still count
                result["tidemq_client"] = {"error": f"{type(exc).__name__}: {exc}"}
        result["ratios"] = {
            "oneway_vs_sync": round(
                result["produce_oneway"]["msgs_per_s"] / max(result["produce_sync"]["msgs_per_s"], 1e-9), 2
            ),
            "consume_vs_sync_produce": round(
                result["consume_push"]["msgs_per_s"] / max(result["produce_sync"]["msgs_per_s"], 1e-9), 2
            ),
        }
        tc = result.get("tidemq_client", {})
        if "produce_send" in tc:
            result["ratios"]["tidemq_vs_official_sync_produce"] = round(
                tc["produce_send"]["msgs_per_s"] / max(result["produce_sync"]["msgs_per_s"], 1e-9), 2
            )
            result["ratios"]["tidemq_vs_official_consume"] = round(
                tc["consume_push"]["msgs_per_s"] / max(result["consume_push"]["msgs_per_s"], 1e-9), 2
            )
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
