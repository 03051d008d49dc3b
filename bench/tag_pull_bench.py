"""Pull throughput of TAG-filtered subscriptions on the mmap store (issue 35, item 8).

Writes ``--messages`` messages to one queue of an mmap store, tags cycling over ``T0``..``T99``,
then consumes the queue from the start the way the pull processor does (``store.get_message``
with the compiled TAG filter, following ``next_begin_offset``) for:

* ``tag_1pct``: ``T7`` (1 % of the records match);
* ``tag_10pct``: ten tags joined by ``||`` (10 %);
* ``tag_all``: the hundred tags (every record matches: the common one-tag-per-topic case);
* ``tag_collision``: ``T7`` plus a tag whose Java hash equals ``T8``'s but is not ``T8`` (the
  broker must not serve ``T8``: 1 % match, 2 % reach the tag-string check);
* ``unfiltered``: no filter, for reference (the compiled walk).

Each case runs ``--repeats`` passes; the JSON gives the best, the median and the spread
((max - min) / median) of the passes, since the machine is shared.  Progress goes to stderr.

``--careful`` also runs each TAG case through the store's per-entry loop (the same filter
without ``selected_tags``: how every TAG pull ran before the walk took tags), its passes
interleaved with the walk's, so both see the same load; ``walk_speedup`` is the ratio of medians.
Run: ``.venv/bin/python bench/tag_pull_bench.py [--messages 100000] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidemq import _native
from tidemq.message import MessageInner, java_string_hash
from tidemq.testing.store_contract import build_store
from tidemq_filter_server.tag import TagFilterFactory

TOPIC = "TagPullBench"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def colliding_tag(tag: str) -> str:
    """Another string with ``tag``'s Java hash: shift one unit between two adjacent characters."""
    a, b = tag[-2], tag[-1]
    other = tag[:-2] + chr(ord(a) + 1) + chr(ord(b) - 31)
    assert other != tag and java_string_hash(other) == java_string_hash(tag)
    return other


def fill(store: Any, n: int, body_size: int) -> float:
    body = b"x" * body_size
    start = time.perf_counter()
    futures = []
    for i in range(n):
        props = {"TAGS": f"T{i % 100}", "KEYS": f"k{i}"}
        futures.append(store.put_message(MessageInner(topic=TOPIC, body=body, queue_id=0, properties=props)))
        if len(futures) >= 1024:
            for f in futures:
                f.result(30)
            futures.clear()
    for f in futures:
        f.result(30)
    return time.perf_counter() - start


def consume(store: Any, flt: Any, max_nums: int) -> tuple[float, int]:
    offset, matched = 0, 0
    end = store.get_max_offset_in_queue(TOPIC, 0)
    start = time.perf_counter()
    while offset < end:
        r = store.get_message("CG", TOPIC, 0, offset, max_nums, flt)
        matched += r.message_count
        if r.next_begin_offset <= offset:
            break
        offset = r.next_begin_offset
    return time.perf_counter() - start, matched


class CarefulOnly:
    """The same subscription, not a SelectsByTag: the store's per-entry loop decides."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def matches_tags_code(self, tags_code: int) -> bool:
        return bool(self.inner.matches_tags_code(tags_code))

    def matches_message(self, properties: Any) -> bool:
        return bool(self.inner.matches_message(properties))


def summary(times: list[float], expected: int, messages: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {
        "matched": expected,
        "best_s": round(min(times), 4),
        "median_s": round(med, 4),
        "spread": round((max(times) - min(times)) / med, 3),
        "scanned_per_s_best": round(messages / min(times)),
        "scanned_per_s_median": round(messages / med),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--max-nums", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--careful", action="store_true", help="also the per-entry loop, interleaved")
    args = ap.parse_args()
    factory = TagFilterFactory()
    cases: dict[str, tuple[Any, int]] = {
        "tag_1pct": (factory.compile("T7"), args.messages // 100),
        "tag_10pct": (factory.compile("||".join(f"T{k}" for k in range(10, 20))), args.messages // 10),
        "tag_all": (factory.compile("||".join(f"T{k}" for k in range(100))), args.messages),
        "tag_collision": (factory.compile(f"T7||{colliding_tag('T8')}"), args.messages // 100),
        "unfiltered": (None, args.messages),
    }
    out: dict[str, Any] = {
        "bench": "tag_pull_bench",
        "codec": _native.DESCRIPTION,
        "messages": args.messages,
        "body_size": args.body_size,
        "max_nums": args.max_nums,
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory(prefix="tidemq-tag-bench-") as tmp:
        store = build_store(
            "mmap", Path(tmp), flush="async", store_options={"commitlog_file_size": 256 * 1024 * 1024}
        )
        if not store.load():
            raise RuntimeError("store did not load")
        store.start()
        try:
            t = fill(store, args.messages, args.body_size)
            progress(f"filled: {args.messages / t:.0f} msg/s")
            results: dict[str, Any] = {}
            for name, (flt, expected) in cases.items():
                ways = {"": flt}
                if args.careful and flt is not None:
                    ways["_careful"] = CarefulOnly(flt)
                times: dict[str, list[float]] = {w: [] for w in ways}
                for _ in range(args.repeats):
                    for way, f in ways.items():
                        elapsed, matched = consume(store, f, args.max_nums)
                        if matched != expected:
                            raise SystemExit(f"{name}{way} matched {matched} messages, expected {expected}")
                        times[way].append(elapsed)
                for way in ways:
                    results[name + way] = summary(times[way], expected, args.messages)
                    progress(f"{name + way}: {results[name + way]}")
                if len(ways) > 1:
                    results[name]["walk_speedup"] = round(
                        results[name + "_careful"]["median_s"] / results[name]["median_s"], 2
                    )
        finally:
            store.shutdown()
    out["consume"] = results
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
