"""Request-reply: round-trip latency at a fixed rate and the maximum request rate, beside plain sends.

Starts ``tidemq namesrv`` and ``tidemq broker`` as subprocesses on free ports, and a responder
process (this script with ``--responder``: a push consumer of the request topic answering every
request with ``create_reply`` + ``Producer.send_reply``).  This process is the requester:

* fixed rate: ``--rate`` sends a second for ``--seconds`` (open loop: each is started on its
  schedule whether the previous ones finished), first plain ``Producer.send`` calls, then
  ``Producer.request`` calls; p50/p99/max of each call's latency in ms and their ratio;
* maximum rate: ``--window`` calls in flight for ``--seconds``, plain sends then requests;
  calls per second and the ratio.

A request's round trip is a send, the responder's pull, its reply send and the broker's push:
several hops more than a send, so the ratios say what request-reply costs over a send here.
Prints one JSON object on stdout (progress on stderr).  Default: ~30 s.

    python bench/reply_bench.py [--rate N] [--seconds S] [--window W] [--size BYTES]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchutil import start_namesrv_and_broker, stop

from tidemq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer, create_reply
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

TOPIC = "ReplyBench"


def log(msg: str) -> None:
    print(f"[reply_bench] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(latencies_ms: list[float]) -> dict[str, float]:
    return {
        "count": len(latencies_ms),
        "p50_ms": round(percentile(latencies_ms, 0.50), 3),
        "p99_ms": round(percentile(latencies_ms, 0.99), 3),
        "max_ms": round(max(latencies_ms, default=float("nan")), 3),
    }


# ---------------------------------------------------------------------------- responder process
async def responder(ns: str) -> None:
    producer = Producer("ReplyBenchResponderPG", ns)
    consumer = PushConsumer("ReplyBenchResponder", ns, consume_from="first", suspend_s=1.0)
    pending: set[asyncio.Task[Any]] = set()

    async def answer(msg: MessageExt) -> None:
        try:
            await producer.send_reply(create_reply(msg, msg.body))
        except Exception as exc:  # a requester gone: counted by the broker, nothing to do here
            log(f"reply failed: {exc}")

    async def on_messages(msgs: list[MessageExt]) -> ConsumeStatus:
        for msg in msgs:
            task = asyncio.get_running_loop().create_task(answer(msg))
            pending.add(task)
            task.add_done_callback(pending.discard)
        return ConsumeStatus.SUCCESS

    consumer.subscribe(TOPIC)
    consumer.register_listener(on_messages)
    await producer.start()
    await consumer.start()
    print("responder ready", flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    finally:
        await consumer.shutdown()
        await producer.shutdown()


# ---------------------------------------------------------------------------- requester
async def create_topic(producer: Producer, broker: str) -> None:
    fields = {
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "readQueueNums": "4",
        "writeQueueNums": "4",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    req = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
    resp = await producer.instance.require_api().invoke(broker, req, 5.0)
    if resp.code != ResponseCode.SUCCESS:
        raise SystemExit(f"cannot create {TOPIC}: {resp.remark}")


async def fixed_rate(
    call: Callable[[int], Awaitable[Any]], rate: float, seconds: float
) -> tuple[list[float], int]:
    """Start a call every 1/rate s for ``seconds``; (latencies in ms, failures)."""
    latencies: list[float] = []
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        begin = time.perf_counter()
        try:
            await call(i)
        except Exception:
            failures += 1
            return
        latencies.append((time.perf_counter() - begin) * 1000)

    tasks = []
    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.get_running_loop().create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies, failures


async def max_rate(call: Callable[[int], Awaitable[Any]], window: int, seconds: float) -> dict[str, float]:
    """``window`` callers in a loop for ``seconds``: completed calls a second."""
    done = 0
    failures = 0
    stop_at = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done, failures
        i = w
        while time.perf_counter() < stop_at:
            try:
                await call(i)
                done += 1
            except Exception:
                failures += 1
            i += window

    begin = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(window)))
    took = time.perf_counter() - begin
    return {
        "per_s": round(done / took, 1),
        "completed": done,
        "failures": failures,
        "seconds": round(took, 2),
    }


async def requester(args: argparse.Namespace, ns: str, broker: str) -> dict[str, Any]:
    body = b"x" * args.size
    async with Producer("ReplyBenchRequesterPG", ns) as producer:
        await create_topic(producer, broker)

        async def send(i: int) -> Any:
            return await producer.send(Message(TOPIC, body, keys=str(i)))

        async def request(i: int) -> Any:
            return await producer.request(Message(TOPIC, body), args.timeout)

        # Warm up both paths (routes, connections, heartbeats, the responder's rebalance).
        deadline = time.monotonic() + 60
        while True:
            try:
                await request(0)
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the responder never answered: {exc}") from None
                await asyncio.sleep(0.5)
        for i in range(200):
            await send(i)
            await request(i)

        log(f"fixed rate {args.rate}/s for {args.seconds}s: sends")
        send_lat, send_fail = await fixed_rate(send, args.rate, args.seconds)
        log(f"fixed rate {args.rate}/s for {args.seconds}s: requests")
        req_lat, req_fail = await fixed_rate(request, args.rate, args.seconds)
        log(f"max rate, {args.window} in flight for {args.seconds}s: sends")
        send_max = await max_rate(send, args.window, args.seconds)
        log(f"max rate, {args.window} in flight for {args.seconds}s: requests")
        req_max = await max_rate(request, args.window, args.seconds)

    s, r = summary(send_lat), summary(req_lat)
    return {
        "fixed_rate": {
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "send": {**s, "failures": send_fail},
            "request": {**r, "failures": req_fail},
            "ratio_p50": round(r["p50_ms"] / s["p50_ms"], 2) if s["p50_ms"] else None,
            "ratio_p99": round(r["p99_ms"] / s["p99_ms"], 2) if s["p99_ms"] else None,
        },
        "max_rate": {
            "window": args.window,
            "send": send_max,
            "request": req_max,
            "ratio": round(req_max["per_s"] / send_max["per_s"], 3) if send_max["per_s"] else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="calls a second in the fixed-rate runs")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each of the four runs")
    parser.add_argument("--window", type=int, default=64, help="calls in flight in the maximum-rate runs")
    parser.add_argument("--size", type=int, default=128, help="request body bytes")
    parser.add_argument("--timeout", type=float, default=10.0, help="request timeout, seconds")
    parser.add_argument("--responder", metavar="NAMESRV", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.responder:
        asyncio.run(responder(args.responder))
        return

    tmp = Path(tempfile.mkdtemp(prefix="reply-bench-"))
    ns, broker, ns_addr, broker_addr = start_namesrv_and_broker(
        tmp, '[broker]\nname = "bench-reply"\nregister_interval_s = 2.0\n'
    )
    resp_proc: subprocess.Popen[bytes] | None = None
    try:
        resp_proc = subprocess.Popen(
            [sys.executable, __file__, "--responder", ns_addr],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(tmp / "responder.log", "ab"),
        )
        assert resp_proc.stdout is not None
        if b"responder ready" not in resp_proc.stdout.readline():
            raise SystemExit(f"the responder did not start; see {tmp / 'responder.log'}")
        log("cluster and responder up")
        result = asyncio.run(requester(args, ns_addr, broker_addr))
    finally:
        if resp_proc is not None:
            assert resp_proc.stdin is not None
            resp_proc.stdin.close()
            try:
                resp_proc.wait(15)
            except subprocess.TimeoutExpired:
                resp_proc.kill()
        stop(broker)
        stop(ns)
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m_5m_15m": [round(x, 2) for x in os.getloadavg()],
        "note": "2-core machine shared with other jobs while measured: figures are noisy",
    }
    result["processes"] = "namesrv, broker, responder and requester: one process each"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
