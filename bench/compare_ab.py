"""A/B two tidemq configurations under one compare.py workload, alternating, in one run.

    python bench/compare_ab.py --b '[transport.tcp]
    coalesce_writes = false' [--a TOML] [--workload produce_1k_single] [--rounds 3] [--flush async]
    python bench/compare_ab.py --b-tree /tmp/base_pkgs --workload consume_1k   # code before/after

``--b-tree DIR`` runs B's broker with ``PYTHONPATH=DIR``: a directory whose ``tidemq`` and
``tidemq_<plugin>`` entries (symlinks into a ``git worktree`` of the old commit, with its compiled
modules built or copied in) import before this tree's, so B is the old code, A this one.

``--acl both`` runs both brokers with the plain ACL (every request of the load clients signed,
topics made by an admin account); ``--acl a`` only A (B without: what the ACL costs).

Each round starts a fresh broker per configuration (A then B, order swapped every round so drift
on a shared machine hits both) and drives it with the compare.py generators.  Prints JSON: each
round's msgs/s, p50/p99 and CPU for A and B, and the median ratio A / B.  Use it for before/after
figures: put the old behaviour in B.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402

#: ``--acl``: the plain ACL on both brokers; the load clients sign as ``bench-ak`` (PUB|SUB on the
#: bench topics), topics are made by ``bench-admin`` (tidemq admin reads $TIDEMQ_ACCESS_KEY).
ACL = """\
accounts:
  - accessKey: bench-ak
    secretKey: bench-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Bench1k=PUB|SUB
      - Bench128=PUB|SUB
  - accessKey: bench-admin
    secretKey: bench-admin-secret
    admin: true
"""
ACL_ENV = {
    "TIDEMQ_BENCH_ACL": "bench-ak:bench-secret",
    "TIDEMQ_ACCESS_KEY": "bench-admin",
    "TIDEMQ_SECRET_KEY": "bench-admin-secret",
}


def with_acl(work: Path, toml: str) -> str:
    """``toml`` with the plain ACL turned on (its lines go into start_tidemq's ``[plugins]`` table)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "plain_acl.yml").write_text(ACL)
    return f'acl = "plain"\n[acl.plain]\nfile = "{work / "plain_acl.yml"}"\n{toml}'


def one(
    work: Path, flush: str, toml: str, args: argparse.Namespace, tree: str = "", acl: bool = False
) -> dict[str, Any]:
    if acl:
        toml = with_acl(work, toml)
    saved = os.environ.get("PYTHONPATH")
    if tree:
        os.environ["PYTHONPATH"] = tree  # the broker child imports the old packages first
    try:
        server = systems.start_tidemq(work, flush, toml)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        bench = Bench(
            argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=args.messages), server
        )
        bench.setup()
        if args.workload == "consume_1k":
            bench.produce(1024, 32, args.messages * 2)
            r = bench.consume()
        elif args.workload == "latency_fixed":  # compare.py's: 1 KiB sends at --latency-rate, open loop
            r = bench.rate(args.latency_rate, args.latency_seconds, args.latency_seconds)
        else:
            size = 1024 if "1k" in args.workload else 128
            batch = 32 if args.workload.endswith("batch") else 1
            r = bench.produce(size, batch, args.messages * (2 if batch > 1 else 1))
        r.pop("_hists", None)
        r.pop("_rss", None)
        return r
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default="", help="TOML appended to A's config (default: none)")
    p.add_argument("--b", default="", help="TOML appended to B's config")
    p.add_argument("--b-tree", default="", help="PYTHONPATH for B's broker: the old code (see above)")
    p.add_argument(
        "--workload",
        default="produce_1k_single",
        help="produce_1k_single|produce_1k_batch|produce_128_single|produce_128_batch|consume_1k|latency_fixed",
    )
    p.add_argument("--flush", default="async", choices=["async", "sync"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=40_000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--latency-rate", type=float, default=2000.0, help="msgs/s of --workload latency_fixed")
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument(
        "--acl",
        choices=["none", "both", "a"],
        default="none",
        help="the plain ACL on A and B (both) or on A only (a, B without: its cost); every request signed",
    )
    args = p.parse_args()
    if args.acl != "none":
        os.environ.update(ACL_ENV)  # the load clients and tidemq admin are child processes
    work = Path(tempfile.mkdtemp(prefix="tidemq-ab-"))
    rounds = []
    try:
        for i in range(args.rounds):
            order = [("a", args.a, ""), ("b", args.b, args.b_tree)]
            if i % 2:
                order.reverse()
            row: dict[str, Any] = {}
            for name, toml, tree in order:
                acl = args.acl == "both" or (args.acl == "a" and name == "a")
                row[name] = one(work / f"{name}{i}", args.flush, toml, args, tree, acl)
                print(
                    f"[compare_ab] round {i} {name}: {row[name]['msgs_per_s']:.0f} msg/s,"
                    f" p99 {row[name].get('p99_us')} us",
                    file=sys.stderr,
                )
            rounds.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [r["a"]["msgs_per_s"] / r["b"]["msgs_per_s"] for r in rounds if r["b"].get("msgs_per_s")]
    eff = [
        r["a"]["msgs_per_server_cpu_s"] / r["b"]["msgs_per_server_cpu_s"]
        for r in rounds
        if r["a"].get("msgs_per_server_cpu_s") and r["b"].get("msgs_per_server_cpu_s")
    ]
    print(
        json.dumps(
            {
                "workload": args.workload,
                "flush": args.flush,
                "acl": args.acl,
                "a": args.a,
                "b": args.b,
                "b_tree": args.b_tree,
                "rounds": rounds,
                "a_over_b_msgs_per_s": [round(x, 3) for x in ratios],
                "median_a_over_b": round(statistics.median(ratios), 3) if ratios else None,
                # msgs per server CPU-second: what a shared, oversubscribed machine cannot blur
                "a_over_b_msgs_per_server_cpu_s": [round(x, 3) for x in eff],
                "median_a_over_b_per_cpu": round(statistics.median(eff), 3) if eff else None,
                "median_p99_us": {
                    n: statistics.median(r[n]["p99_us"] for r in rounds)
                    for n in ("a", "b")
                    if all(r[n].get("p99_us") is not None for r in rounds)
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
