"""In-process A/B of the sync flush's inline rounds (``[flush.sync] inline_max_us``), alternated.

    python bench/sync_inline_ab.py [--rounds 4] [--dir /tmp] [--latency-seconds 5] [--writers-seconds 3]

No broker, no client process, no socket: an mmap store with sync flush (and the hash index, as
store_bench's latency case), driven from one asyncio loop as the broker puts its sends.  Per round
and mode (A: inline rounds on, ``--a-inline-us``, 1000 by default; B: ``inline_max_us = 0``, every round on the
flush thread; the order swapped every round):

* ``sync_latency``: single 1 KiB puts at ``--rate`` per second (open loop), each awaited as the
  broker awaits a send; p50/p99 from the put to the task's resumption, with one 4 KiB append +
  ``fdatasync`` measured just before and after (compare.py's "one fsync");
* ``writers``: store_bench's 32 asyncio writers (closed loop), their rate against one 1 KiB
  append + ``fdatasync`` per message measured beside it, and the process CPU per message.

Prints JSON: every round, and per mode the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bench import (  # noqa: E402
    WRITERS,
    fsync_per_message,
    sync_concurrent_asyncio,
    sync_latency,
)

from tidemq.plugins import get_plugin_manager  # noqa: E402
from tidemq.testing.store_contract import build_store  # noqa: E402


def open_sync_store(directory: Path, inline_max_us: int | None, index: bool) -> Any:
    key_index = get_plugin_manager().create("index", "hash", data_dir=directory) if index else None
    flush_options = {} if inline_max_us is None else {"inline_max_us": inline_max_us}
    store = build_store(
        "mmap",
        directory,
        flush="sync",
        index=key_index,
        flush_options=flush_options,
        store_options={"commitlog_file_size": 256 << 20, "cq_flush_interval_ms": 1000},
    )
    if not store.load():
        raise RuntimeError("store did not load")
    store.start()
    return store


def one(base: Path, inline_max_us: int | None, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"load_average": list(os.getloadavg())}
    fsync_4k_before = fsync_per_message(base, 1.0, 4096)
    store = open_sync_store(base / "lat", inline_max_us, index=True)
    try:
        lat = sync_latency(store, args.rate, args.latency_seconds)
        policy = store.flush_policy
        lat["inline_rounds"] = getattr(policy, "inline_rounds", 0)
        lat["flush_rounds"] = policy.flush_rounds
    finally:
        store.shutdown()
        shutil.rmtree(base / "lat", ignore_errors=True)
    fsync_4k_after = fsync_per_message(base, 1.0, 4096)
    fsync_p99 = max(fsync_4k_before["p99_us"], fsync_4k_after["p99_us"])
    lat["fsync_4k_p99_us"] = [fsync_4k_before["p99_us"], fsync_4k_after["p99_us"]]
    lat["fsync_4k_p50_us"] = [fsync_4k_before["p50_us"], fsync_4k_after["p50_us"]]
    lat["p99_vs_one_fsync_p99"] = round(lat["p99_us"] / fsync_p99, 2)
    out["latency"] = lat
    if args.writers_seconds > 0:
        f1 = fsync_per_message(base, 1.0)
        store = open_sync_store(base / "w", inline_max_us, index=False)
        try:
            w = sync_concurrent_asyncio(store, args.writers_seconds, WRITERS)
            w["inline_rounds"] = getattr(store.flush_policy, "inline_rounds", 0)
        finally:
            store.shutdown()
            shutil.rmtree(base / "w", ignore_errors=True)
        f2 = fsync_per_message(base, 1.0)
        per_msg = statistics.fmean([f1["msgs_s"], f2["msgs_s"]])
        w["fsync_1k_msgs_s"] = [f1["msgs_s"], f2["msgs_s"]]
        w["vs_fsync_per_message"] = round(w["msgs_s"] / per_msg, 2)
        out["writers"] = w
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir): the disk measured")
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--latency-seconds", type=float, default=5.0)
    p.add_argument("--writers-seconds", type=float, default=3.0, help="0: no 32-writer case")
    p.add_argument("--a-inline-us", type=int, default=1000, help="A's inline_max_us")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidemq-inline-ab-", dir=args.dir))
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            order: list[tuple[str, int | None]] = [("a", args.a_inline_us), ("b", 0)]
            if i % 2:
                order.reverse()
            row: dict[str, Any] = {}
            for name, inline in order:
                t0 = time.perf_counter()
                row[name] = one(base, inline, args)
                lat = row[name]["latency"]
                w = row[name].get("writers", {})
                print(
                    f"[sync_inline_ab] round {i} {name}: p50 {lat['p50_us']} p99 {lat['p99_us']} us"
                    f" (fsync 4k p99 {lat['fsync_4k_p99_us']}) -> {lat['p99_vs_one_fsync_p99']};"
                    f" 32 writers {w.get('vs_fsync_per_message')}x one fsync,"
                    f" {w.get('process_cpu_us_per_msg')} us CPU/msg ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                )
            rounds.append(row)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(name: str, part: str, key: str) -> float | None:
        vals = [r[name][part][key] for r in rounds if part in r[name] and r[name][part].get(key) is not None]
        return statistics.median(vals) if vals else None

    keys = {
        "latency": ("p50_us", "p99_us", "p99_vs_one_fsync_p99"),
        "writers": ("msgs_s", "vs_fsync_per_message", "process_cpu_us_per_msg", "round_us", "flush_us"),
    }
    print(
        json.dumps(
            {
                "dir": str(base),
                "rate": args.rate,
                "rounds": rounds,
                "median": {
                    n: {f"{part}.{k}": med(n, part, k) for part, ks in keys.items() for k in ks}
                    for n in ("a", "b")
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
