"""Sync-flush send latency at a fixed rate, this tree (A) against an old one (B), with the disk's fsync
measured beside every run (issue 38: send p99 at 2 000 msg/s <= 2x one fsync's p99).

    python bench/sync_latency_ab.py --b-tree /tmp/base_pkgs [--rounds 3] [--rate 2000] [--seconds 10]

Each round measures one 4 KiB append + fdatasync (``compare_limits.fsync_latency``, 500 samples, in
the brokers' work directory: the same file system), then runs compare.py's ``latency_fixed``
workload on a fresh sync-flush broker of A and of B (order swapped every round), then the fsync
again; a run's ratio divides its send p99 by the p99 of the fsync samples taken around it.
``--b-tree``: see ``compare_ab.py``.  Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sync_latency_trace  # noqa: E402
from compare_ab import one  # noqa: E402
from compare_limits import fsync_latency  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default="", help="TOML appended to A's config")
    p.add_argument("--b", default="", help="TOML appended to B's config")
    p.add_argument("--b-tree", default="", help="PYTHONPATH for B's broker: the old code")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    p.add_argument(
        "--probe-ms",
        type=float,
        default=20.0,
        help="a 4 KiB append + fdatasync every this many ms during each run (0: off): one fsync's "
        "p50/p99 over the same seconds as the sends",
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-synclat-", dir=args.dir))
    ns = argparse.Namespace(
        workload="latency_fixed",
        latency_rate=args.rate,
        latency_seconds=args.seconds,
        procs=2,
        inflight=64,
        messages=20_000,
    )
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            order = [("a", args.a, ""), ("b", args.b, args.b_tree)]
            if i % 2:
                order.reverse()
            row: dict[str, Any] = {}
            for name, toml, tree in order:
                before = fsync_latency(work, 500)
                probes: list[tuple[int, int]] = []
                stop = threading.Event()
                prober = threading.Thread(
                    target=sync_latency_trace.probe,
                    args=(work, args.probe_ms / 1e3, stop, probes),
                    daemon=True,
                )
                if args.probe_ms > 0:
                    prober.start()
                r = one(work / f"{name}{i}", "sync", toml, ns, tree)
                stop.set()
                if args.probe_ms > 0:
                    prober.join()
                after = fsync_latency(work, 500)
                during = sync_latency_trace.summary([(b - a) / 1e3 for a, b in probes])
                fsync_p99 = max(before["p99_us"], after["p99_us"])
                fsync_p50 = statistics.fmean([before["p50_us"], after["p50_us"]])
                row[name] = {
                    "msgs_per_s": r["msgs_per_s"],
                    "p50_us": r["p50_us"],
                    "p99_us": r["p99_us"],
                    "msgs_per_server_cpu_s": r.get("msgs_per_server_cpu_s"),
                    "server_cpu_per_s": r.get("server_cpu_per_s"),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    "errors": r.get("errors"),
                    "fsync_4k_before": before,
                    "fsync_4k_after": after,
                    # The larger of the two p99s: the run's disk at its worse moment (conservative).
                    "p99_vs_one_fsync_p99": round(r["p99_us"] / fsync_p99, 2),
                    "p99_vs_one_fsync_p50": round(r["p99_us"] / fsync_p50, 2),
                    # The fsyncs taken during the run itself (the whole run, setup included).
                    "fsync_4k_during": {**during, "count": len(probes)},
                    "p99_vs_fsync_p99_during": round(r["p99_us"] / during["p99"], 2)
                    if during["p99"]
                    else None,
                    "p50_vs_fsync_p99_during": round(r["p50_us"] / during["p99"], 2)
                    if during["p99"]
                    else None,
                }
                print(
                    f"[sync_latency_ab] round {i} {name}: p50 {r['p50_us']} p99 {r['p99_us']} us,"
                    f" fsync p99 {before['p99_us']}/{after['p99_us']} us -> {row[name]['p99_vs_one_fsync_p99']},"
                    f" during p50/p99 {during['p50']}/{during['p99']} us -> {row[name]['p99_vs_fsync_p99_during']}",
                    file=sys.stderr,
                )
            rounds.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    print(
        json.dumps(
            {
                "workload": "latency_fixed",
                "flush": "sync",
                "rate": args.rate,
                "seconds": args.seconds,
                "a": args.a,
                "b": args.b,
                "b_tree": args.b_tree,
                "rounds": rounds,
                "median": {
                    n: {
                        k: med(n, k)
                        for k in (
                            "p50_us",
                            "p99_us",
                            "p99_vs_one_fsync_p99",
                            "p99_vs_one_fsync_p50",
                            "p99_vs_fsync_p99_during",
                            "p50_vs_fsync_p99_during",
                            "server_cpu_per_s",
                        )
                    }
                    for n in ("a", "b")
                },
                "median_fsync_4k_us": {
                    k: statistics.median(
                        r[n][f"fsync_4k_{w}"][k]
                        for r in rounds
                        for n in ("a", "b")
                        for w in ("before", "after")
                    )
                    for k in ("p50_us", "p99_us")
                },
                "a_over_b_per_cpu": [
                    round(r["a"]["msgs_per_server_cpu_s"] / r["b"]["msgs_per_server_cpu_s"], 3)
                    for r in rounds
                    if r["a"].get("msgs_per_server_cpu_s") and r["b"].get("msgs_per_server_cpu_s")
                ],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
