"""CPU of the mmap store's put of a batch, in process (no broker, no socket).

    python bench/store_put_bench.py [--batch 32] [--body 128] [--puts 20000] [--queues 4]
    python bench/store_put_bench.py --b-tree /work/wt/base_pkgs --rounds 8   # A = this tree, B = old

A store as the broker builds it (mmap store, async flush, the ``hash`` key index attached) takes
``--puts`` calls of ``put_messages`` of ``--batch`` messages of ``--body`` bytes, round robin over
``--queues`` queues of one topic, each message with a ``UNIQ_KEY`` (as clients send).  The
batches are made before the clock.  Reported: the calling thread's CPU per put, the process's
(the index's thread included) and wall time.  Prints JSON.

With ``--b-tree`` it runs itself ``--rounds`` times for A and B, alternating which goes first,
each in a fresh process (B with ``PYTHONPATH=--b-tree``), and prints every round, the medians and
the per-round ratios B / A (> 1: A costs less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def batches(args: argparse.Namespace) -> list[list[Any]]:
    from tidemq.message import MessageInner

    out = []
    body = b"x" * args.body
    for p in range(args.puts):
        q = p % args.queues
        out.append(
            [
                MessageInner(
                    topic="BenchTopic",
                    body=body,
                    queue_id=q,
                    properties={"UNIQ_KEY": f"7F00000100002A9F{p * args.batch + i:016X}", "WAIT": "true"},
                    born_host=("127.0.0.1", 40000),
                    born_timestamp=1_764_300_000_000 + p,
                )
                for i in range(args.batch)
            ]
        )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.cli import tune_gc
    from tidemq.plugins import get_plugin_manager
    from tidemq.testing.store_contract import build_store

    with tempfile.TemporaryDirectory(prefix="tidemq-putbench-", dir=args.dir) as tmp:
        pm = get_plugin_manager()
        index = pm.create("index", "hash", data_dir=tmp) if args.index else None
        store = build_store("mmap", tmp, flush=args.flush, index=index)
        assert store.load()
        store.start()
        warm = batches(argparse.Namespace(**{**vars(args), "puts": 200}))
        for b in warm:
            store.put_messages(b).result(10)
        work = batches(args)
        tune_gc()  # as `tidemq standalone` serves: start-up frozen, gen-0 threshold 50 000
        if args.ready_file:  # for `perf record -p`: the put loop starts a second after this
            Path(args.ready_file).write_text(str(os.getpid()))
            time.sleep(1.0)
        time.sleep(0.2)
        put = store.put_messages
        cpu0, th0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        if args.flush == "sync":
            futs = [put(b) for b in work]
            for f in futs:
                f.result(10)
        else:
            for b in work:
                put(b)
        th = time.thread_time() - th0
        wall = time.perf_counter() - wall0
        if index is not None:
            deadline = time.monotonic() + 30
            while index.pending()[0]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)
        cpu = time.process_time() - cpu0
        store.shutdown()
    n = args.puts
    return {
        "benchmark": "store_put",
        "args": vars(args),
        "thread_us_per_put": round(th / n * 1e6, 2),
        "process_us_per_put": round(cpu / n * 1e6, 2),
        "wall_us_per_put": round(wall / n * 1e6, 2),
    }


def run_once(argv: list[str], tree: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv], env=env, check=True, capture_output=True
    )
    return json.loads(out.stdout)


def ab(args: argparse.Namespace, single: list[str]) -> dict[str, Any]:
    rounds = []
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        got: dict[str, Any] = {}
        for side in order:
            got[side] = run_once(single, args.b_tree if side == "B" else None)
            del got[side]["args"]
        got["load_average"] = round(os.getloadavg()[0], 1)
        rounds.append(got)
        print(
            f"round {r + 1}: thread A {got['A']['thread_us_per_put']} B {got['B']['thread_us_per_put']}"
            f" process A {got['A']['process_us_per_put']} B {got['B']['process_us_per_put']}"
            f" load {got['load_average']}",
            file=sys.stderr,
        )
    keys = ("thread_us_per_put", "process_us_per_put", "wall_us_per_put")
    med = {s: {k: statistics.median(r[s][k] for r in rounds) for k in keys} for s in "AB"}
    ratios = {k: [round(r["B"][k] / r["A"][k], 3) for r in rounds] for k in keys}
    return {
        "benchmark": "store_put_ab",
        "args": vars(args),
        "a": "this tree",
        "b": args.b_tree,
        "median": med,
        "ratio_b_over_a": {k: {"median": statistics.median(v), "rounds": v} for k, v in ratios.items()},
        "load_average": [r["load_average"] for r in rounds],
        "rounds": rounds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--body", type=int, default=128)
    p.add_argument("--puts", type=int, default=20000)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--flush", default="async", choices=["async", "sync"])
    p.add_argument("--no-index", dest="index", action="store_false", help="no key index attached")
    p.add_argument("--dir", default=None, help="where the store's temporary directory goes")
    p.add_argument("--ready-file", default=None, help="written with the pid just before the timed puts")
    p.add_argument("--b-tree", default=None, help="A/B: PYTHONPATH of B (the old code)")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    if args.b_tree:
        single = [
            f"--batch={args.batch}",
            f"--body={args.body}",
            f"--puts={args.puts}",
            f"--queues={args.queues}",
            f"--flush={args.flush}",
        ]
        if not args.index:
            single.append("--no-index")
        if args.dir:
            single.append(f"--dir={args.dir}")
        print(json.dumps(ab(args, single), indent=2))
        return
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
