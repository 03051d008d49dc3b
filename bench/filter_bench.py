"""Consume throughput of a 1 %-selective SQL92 subscription with and without the bloom pre-check.

Writes ``--messages`` messages to one queue of an mmap store, each with a property ``k`` cycling
over 0..99 and a tag, then consumes the queue from the start the way the broker's pull processor
does (``store.get_message`` with the compiled filter, following ``next_begin_offset``) for:

* ``sql92_precheck``: the SQL92 filter ``k = 7 AND region = 'eu'`` registered with the dispatch-time
  bit map before the messages were written, so non-matching entries are skipped from the bits;
* ``sql92_no_precheck``: the same expression with the pre-check disabled: every record is read
  and its properties decoded;
* ``tag``: a 1 %-selective TAG subscription, for reference (tag codes sit in the ConsumeQueue).

It also reports what the pre-check costs at write time (put throughput with one registered
filter vs none).  Prints one JSON object; progress goes to stderr.  Run:
``/tmp/venv/bin/python bench/filter_bench.py [--messages 200000]``.

``--latency`` measures instead what many distinct SQL92 subscriptions cost every producer (issue
20, item 7): a ``tidemq standalone`` subprocess, one client sending 1-by-1 and timing each send
(p50 / p99), before and after ``--subscriptions`` distinct SQL92 expressions were pulled on the
topic (each pull registers its expression with the dispatch-time pre-check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidemq.message import MessageInner
from tidemq.testing.store_contract import build_store
from tidemq_filter_server.bitmap import FilterBitMap
from tidemq_filter_server.sql92 import Sql92FilterFactory
from tidemq_filter_server.tag import TagFilterFactory

TOPIC = "FilterBench"
EXPRESSION = "k = 7 AND region = 'eu'"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def open_store(directory: Path, precheck: FilterBitMap | None) -> Any:
    store = build_store(
        "mmap", directory, flush="async", store_options={"commitlog_file_size": 256 * 1024 * 1024}
    )
    if precheck is not None:
        store.add_dispatcher(precheck)
    if not store.load():
        raise RuntimeError("store did not load")
    store.start()
    return store


def fill(store: Any, n: int, body_size: int) -> float:
    body = b"x" * body_size
    start = time.perf_counter()
    futures = []
    for i in range(n):
        k = i % 100
        props = {"k": str(k), "region": "eu" if k == 7 else ("us", "ap")[i % 2], "TAGS": f"T{k}"}
        futures.append(store.put_message(MessageInner(topic=TOPIC, body=body, queue_id=0, properties=props)))
        if len(futures) >= 1024:
            for f in futures:
                f.result(30)
            futures.clear()
    for f in futures:
        f.result(30)
    return time.perf_counter() - start


def consume(store: Any, flt: Any, max_nums: int) -> dict[str, Any]:
    offset, matched, pulls = 0, 0, 0
    end = store.get_max_offset_in_queue(TOPIC, 0)
    start = time.perf_counter()
    while offset < end:
        r = store.get_message("CG", TOPIC, 0, offset, max_nums, flt)
        pulls += 1
        matched += r.message_count
        if r.next_begin_offset <= offset:
            break
        offset = r.next_begin_offset
    elapsed = time.perf_counter() - start
    return {
        "matched": matched,
        "pulls": pulls,
        "seconds": round(elapsed, 4),
        "scanned_per_s": round(end / elapsed),
        "matched_per_s": round(matched / elapsed),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _send_latencies(client: Any, addr: str, n: int) -> list[float]:
    from tidemq.message import properties_to_string
    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    out = []
    for i in range(n):
        fields = {
            "producerGroup": "PG",
            "topic": TOPIC,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": str(i % 4),
            "sysFlag": "0",
            "bornTimestamp": str(int(time.time() * 1000)),
            "flag": "0",
            "properties": properties_to_string({"k": str(i % 100), "region": "eu", "TAGS": "T"}),
            "reconsumeTimes": "0",
            "unitMode": "false",
        }
        start = time.perf_counter()
        resp = await client.invoke(
            addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"x" * 256), 10.0
        )
        out.append(time.perf_counter() - start)
        if resp.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"send failed: {resp.code} {resp.remark}")
    return out


async def _register(client: Any, addr: str, count: int) -> float:
    from tidemq.remoting.codes import RequestCode
    from tidemq.remoting.command import RemotingCommand

    start = time.perf_counter()
    for i in range(count):
        fields = {
            "consumerGroup": f"CG{i}",
            "topic": TOPIC,
            "queueId": str(i % 4),
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "4",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subscription": f"(k = {i % 100} AND region = 'eu') OR uid = 'user-{i}'",
            "subVersion": "0",
            "expressionType": "SQL92",
        }
        await client.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, fields), 10.0)
    return time.perf_counter() - start


def _summary(lat: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in lat)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
        "max_ms": round(ms[-1], 3),
    }


def latency_main(args: argparse.Namespace) -> None:
    from tidemq.plugins import get_plugin_manager

    with tempfile.TemporaryDirectory(prefix="tidemq-filter-latency-") as tmp:
        ns_port, broker_port = _free_port(), _free_port()
        log = open(Path(tmp) / "broker.log", "wb")
        config = Path(tmp) / "tidemq.toml"
        table = f"max_registrations_per_topic = {args.per_topic}\n" if args.per_topic else ""
        config.write_text(f"[filter.SQL92]\n{table}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "standalone", "-c", str(config), "--data-dir", f"{tmp}/data"]
            + ["--namesrv-listen", f"127.0.0.1:{ns_port}", "--broker-listen", f"127.0.0.1:{broker_port}"],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if b"broker listening on" in line:
                    break
            addr = f"127.0.0.1:{broker_port}"

            async def run() -> dict[str, Any]:
                client = get_plugin_manager().create("transport", "tcp").client()
                try:
                    await _send_latencies(client, addr, 200)  # warm-up, creates the topic
                    before = _summary(await _send_latencies(client, addr, args.sends))
                    progress(f"before: {before}")
                    reg_s = await _register(client, addr, args.subscriptions)
                    progress(f"{args.subscriptions} subscriptions pulled in {reg_s:.2f} s")
                    after = _summary(await _send_latencies(client, addr, args.sends))
                    progress(f"after: {after}")
                    return {
                        "sends": args.sends,
                        "subscriptions": args.subscriptions,
                        "max_registrations_per_topic": args.per_topic or "default",
                        "subscribe_pulls_s": round(reg_s, 3),
                        "send_latency_before": before,
                        "send_latency_with_subscriptions": after,
                    }
                finally:
                    await client.close()

            print(json.dumps(asyncio.run(run()), indent=2))
        finally:
            proc.terminate()
            proc.wait(20)
            log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", action="store_true", help="send latency with many SQL92 subscriptions")
    ap.add_argument("--subscriptions", type=int, default=1000)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument(
        "--per-topic", type=int, default=0, help="[filter.SQL92] max_registrations_per_topic (0: default)"
    )
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--max-nums", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="consume passes per case (best is kept)")
    args = ap.parse_args()
    if args.latency:
        latency_main(args)
        return
    out: dict[str, Any] = {
        "messages": args.messages,
        "body_size": args.body_size,
        "selectivity": 0.01,
        "expression": EXPRESSION,
    }
    with tempfile.TemporaryDirectory(prefix="tidemq-filter-bench-") as tmp:
        # Write once without any registered filter (put baseline) ...
        plain = open_store(Path(tmp) / "plain", None)
        t_plain = fill(plain, args.messages, args.body_size)
        progress(f"filled plain store: {args.messages / t_plain:.0f} msg/s")
        # ... and once with the SQL92 filter registered so dispatch computes the bloom words.
        bitmap = FilterBitMap()
        with_pre = Sql92FilterFactory(bitmap).compile(EXPRESSION)
        with_pre.matches_queue_entry(TOPIC, 0, 0)  # registers it, as the first pull does
        store = open_store(Path(tmp) / "bits", bitmap)
        t_bits = fill(store, args.messages, args.body_size)
        t_drain = time.perf_counter()
        bitmap.drain(600.0)  # the words are computed by the bit map's worker, off the store's lock
        progress(f"pre-check words computed {time.perf_counter() - t_drain:.2f} s after the last put")
        progress(f"filled store with pre-check: {args.messages / t_bits:.0f} msg/s")
        out["put_per_s_without_registered_filter"] = round(args.messages / t_plain)
        out["put_per_s_with_registered_filter"] = round(args.messages / t_bits)
        without_pre = Sql92FilterFactory(None).compile(EXPRESSION)
        tag = TagFilterFactory().compile("T7")
        cases = {"sql92_precheck": with_pre, "sql92_no_precheck": without_pre, "tag": tag}
        results: dict[str, Any] = {}
        for name, flt in cases.items():
            best = None
            for _ in range(args.repeats):
                r = consume(store, flt, args.max_nums)
                if best is None or r["seconds"] < best["seconds"]:
                    best = r
            results[name] = best
            progress(f"{name}: {best}")
        plain.shutdown()
        store.shutdown()
        bitmap.close()
    expected = args.messages // 100
    for name, r in results.items():
        if r["matched"] != expected:
            raise SystemExit(f"{name} matched {r['matched']} messages, expected {expected}")
    out["consume"] = results
    out["precheck_speedup"] = round(
        results["sql92_no_precheck"]["seconds"] / results["sql92_precheck"]["seconds"], 2
    )
    out["precheck_entries_skipped"] = bitmap.skipped
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
