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
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--max-nums", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="consume passes per case (best is kept)")
    args = ap.parse_args()
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
