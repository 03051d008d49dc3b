"""Insert and query rates of the ``hash`` key index, with unique and collision-heavy key sets.

Workloads (each on a fresh index directory):

* ``unique``: every message has its own key, default file layout (5 M slots, 20 M entries).
* ``tiny_slots``: the same unique keys squeezed into ``--tiny-slots`` slots, so every lookup walks
  a long chain of other keys' entries (hash collisions in the slot table).
* ``hot_keys``: ``--hot`` distinct keys shared by all messages, so each key has a long chain of
  its own entries and a query is capped by ``max_num``.

Each message carries one KEYS entry and a UNIQ_KEY (two index entries, as a producer sends them).
Prints one JSON document to stdout; progress goes to stderr.  Compare the ratios within a run.

    python bench/index_bench.py                  # 200 000 keys
    python bench/index_bench.py --keys 1000000   # the full-size run
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tidemq.store import DispatchRequest
from tidemq_index_hash.service import HashIndex, HashIndexOptions

T0 = 1_767_225_600_000
TOPIC = "BenchTopic"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def requests(n: int, key_of: list[str]) -> list[DispatchRequest]:
    # One message every 0.1 ms of store time: 1 M messages span 100 s.
    return [
        DispatchRequest(
            topic=TOPIC,
            queue_id=i % 8,
            commit_log_offset=i * 256,
            msg_size=256,
            tags_code=0,
            store_timestamp=T0 + i // 10,
            queue_offset=i // 8,
            keys=key_of[i],
            uniq_key=f"7F00000100002A9F{i:016X}",
        )
        for i in range(n)
    ]


def run(
    name: str, root: Path, n: int, key_of: list[str], options: HashIndexOptions, queries: int, max_num: int
) -> dict:
    progress(f"[{name}] building {n} messages")
    reqs = requests(n, key_of)
    index = HashIndex(root / name / "index", options)
    index.load(True, 0)
    t = time.perf_counter()
    for req in reqs:
        index.dispatch(req)
    insert_s = time.perf_counter() - t
    t = time.perf_counter()
    index.flush()
    flush_s = time.perf_counter() - t
    progress(f"[{name}] inserted in {insert_s:.2f}s, flushed in {flush_s:.2f}s")

    rng = random.Random(7)
    probes = [rng.randrange(n) for _ in range(queries)]
    t = time.perf_counter()
    hits = 0
    for i in probes:
        hits += len(index.query(TOPIC, key_of[i], max_num, 0, 2**62).phy_offsets)
    key_s = time.perf_counter() - t
    t = time.perf_counter()
    for i in probes:
        index.query(TOPIC, f"7F00000100002A9F{i:016X}", 1, 0, 2**62)
    uniq_s = time.perf_counter() - t
    t = time.perf_counter()
    for i in probes:
        index.query(TOPIC, f"missing-{i}", max_num, 0, 2**62)
    miss_s = time.perf_counter() - t
    stats = index.stats()
    index.shutdown()
    progress(f"[{name}] {queries} queries of each kind in {key_s + uniq_s + miss_s:.2f}s")
    return {
        "messages": n,
        "entries": stats["entries"],
        "files": stats["files"],
        "slots": options.max_hash_slot_num,
        "insert_msgs_per_s": round(n / insert_s),
        "insert_keys_per_s": round(stats["entries"] / insert_s),
        "flush_s": round(flush_s, 3),
        "query_key_per_s": round(queries / key_s),
        "query_key_avg_hits": round(hits / queries, 2),
        "query_uniq_per_s": round(queries / uniq_s),
        "query_missing_per_s": round(queries / miss_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=200_000, help="messages (and distinct keys for 'unique')")
    ap.add_argument("--queries", type=int, default=20_000, help="queries of each kind per workload")
    ap.add_argument("--max-num", type=int, default=32, help="max_num of each key query")
    ap.add_argument("--tiny-slots", type=int, default=1024, help="slot count of the tiny_slots workload")
    ap.add_argument("--hot", type=int, default=1000, help="distinct keys of the hot_keys workload")
    ap.add_argument("--dir", type=Path, default=None, help="where to put index files (default: a temp dir)")
    args = ap.parse_args()

    n = args.keys
    unique = [f"order-{i}" for i in range(n)]
    hot = [f"user-{i % args.hot}" for i in range(n)]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        results = {
            "unique": run("unique", root, n, unique, HashIndexOptions(), args.queries, args.max_num),
            "tiny_slots": run(
                "tiny_slots",
                root,
                n,
                unique,
                HashIndexOptions(max_hash_slot_num=args.tiny_slots),
                args.queries,
                args.max_num,
            ),
            "hot_keys": run("hot_keys", root, n, hot, HashIndexOptions(), args.queries, args.max_num),
        }
    base = results["unique"]
    ratios = {
        name: {
            "insert_vs_unique": round(r["insert_keys_per_s"] / base["insert_keys_per_s"], 3),
            "query_key_vs_unique": round(r["query_key_per_s"] / base["query_key_per_s"], 3),
            "query_missing_vs_unique": round(r["query_missing_per_s"] / base["query_missing_per_s"], 3),
        }
        for name, r in results.items()
        if name != "unique"
    }
    print(json.dumps({"bench": "index_hash", "keys": n, "results": results, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
