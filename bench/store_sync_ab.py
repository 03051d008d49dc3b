"""``store_bench.py --only sync`` for this tree (A) and an old one (B), alternated, in one run.

    python bench/store_sync_ab.py --b-tree /tmp/base_pkgs [--rounds 3] [-- store_bench options]

``--b-tree``: a directory whose ``tidemq`` and ``tidemq_<plugin>`` entries import before this
tree's (see ``compare_ab.py``); the bench script itself is this tree's for both.  Every run measures
its own fsync-per-message baseline (same file system, just before and after its sync writers), so
each ratio is against the disk of its own moment.  Prints JSON: per run the sync figures and
ratios, and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent / "store_bench.py"

KEEP = (
    "fsync_per_message_baseline_msgs_s",
    "ideal_group_commit_before_latency",
    "ideal_group_commit_after_latency",
    "fsync_around_sync_writers",
    "sync_concurrent",
    "sync_concurrent_asyncio",
    "async_concurrent_asyncio",
    "fsync_before_latency",
    "fsync_4k_before_latency",
    "sync_latency",
    "ratios",
    "machine",
)


def run(tree: str, extra: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    else:
        env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--only", "sync", *extra], env=env, capture_output=True, timeout=900
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr.decode()[-3000:])
    out = json.loads(proc.stdout)
    return {k: out[k] for k in KEEP if k in out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b-tree", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("extra", nargs="*", help="store_bench.py options (after --)")
    args = p.parse_args()
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = [("a", ""), ("b", args.b_tree)]
        if i % 2:
            order.reverse()
        row: dict[str, Any] = {}
        for name, tree in order:
            row[name] = run(tree, args.extra)
            r = row[name]["ratios"]
            print(
                f"[store_sync_ab] round {i} {name}: 32 asyncio writers"
                f" {row[name]['sync_concurrent_asyncio']['msgs_s']} msgs/s"
                f" = {r['sync_32_asyncio_writers_vs_fsync_per_message']}x fsync/msg"
                f" (ceiling {r['no_flush_32_asyncio_writers_vs_fsync_per_message']}x,"
                f" zero-CPU rounds {r.get('zero_cpu_32_writers_vs_fsync_per_message')}x),"
                f" round {row[name]['sync_concurrent_asyncio']['round_us']} us"
                f" of which flush {row[name]['sync_concurrent_asyncio']['flush_us']} us,"
                f" cpu {row[name]['sync_concurrent_asyncio']['process_cpu_us_per_msg']} us/msg,"
                f" latency p99 {row[name]['sync_latency']['p99_us']} us",
                file=sys.stderr,
            )
        rounds.append(row)

    def med(name: str, get: Any) -> float:
        return round(statistics.median(get(r[name]) for r in rounds), 2)

    summary = {
        n: {
            "sync_32_asyncio_msgs_s": med(n, lambda x: x["sync_concurrent_asyncio"]["msgs_s"]),
            "sync_32_asyncio_cpu_us_per_msg": med(
                n, lambda x: x["sync_concurrent_asyncio"]["process_cpu_us_per_msg"]
            ),
            "sync_32_asyncio_round_us": med(n, lambda x: x["sync_concurrent_asyncio"]["round_us"]),
            "sync_32_asyncio_flush_us": med(n, lambda x: x["sync_concurrent_asyncio"]["flush_us"] or 0),
            "sync_32_threads_msgs_s": med(n, lambda x: x["sync_concurrent"]["msgs_s"]),
            "sync_32_asyncio_vs_fsync_per_message": med(
                n, lambda x: x["ratios"]["sync_32_asyncio_writers_vs_fsync_per_message"]
            ),
            "sync_32_threads_vs_fsync_per_message": med(
                n, lambda x: x["ratios"]["sync_32_writers_vs_fsync_per_message"]
            ),
            "no_flush_32_asyncio_vs_fsync_per_message": med(
                n, lambda x: x["ratios"]["no_flush_32_asyncio_writers_vs_fsync_per_message"]
            ),
            "zero_cpu_32_writers_vs_fsync_per_message": med(
                n, lambda x: x["ratios"].get("zero_cpu_32_writers_vs_fsync_per_message", 0)
            ),
            "sync_latency_p99_us": med(n, lambda x: x["sync_latency"]["p99_us"]),
            "sync_latency_p99_vs_fsync_p99": med(n, lambda x: x["ratios"]["sync_latency_p99_vs_fsync_p99"]),
            "sync_latency_p99_vs_ideal_group_commit_p99": med(
                n, lambda x: x["ratios"].get("sync_latency_p99_vs_ideal_group_commit_p99", 0)
            ),
        }
        for n in ("a", "b")
    }
    pairs = [
        r["a"]["sync_concurrent_asyncio"]["msgs_s"] / r["b"]["sync_concurrent_asyncio"]["msgs_s"]
        for r in rounds
    ]
    cpu = [
        r["b"]["sync_concurrent_asyncio"]["process_cpu_us_per_msg"]
        / r["a"]["sync_concurrent_asyncio"]["process_cpu_us_per_msg"]
        for r in rounds
    ]
    print(
        json.dumps(
            {
                "b_tree": args.b_tree,
                "rounds": rounds,
                "median": summary,
                "a_over_b_sync_32_asyncio_msgs_s": [round(x, 3) for x in pairs],
                "b_over_a_cpu_per_msg": [round(x, 3) for x in cpu],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
