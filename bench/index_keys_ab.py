"""The hash index's key hashing of a put, this tree against another (A/B, in child processes).

    python bench/index_keys_ab.py --b-tree /work/wt/base_pkgs [--rounds 7] [--puts 4000] [--batch 32]

Each child builds puts of ``--batch`` messages as the official client sends them (a UNIQ_KEY of
32 hex digits; ``--with-keys``: also one KEYS entry), then times ``hash_chunk`` over chunks of
256 messages (what the inline drain hashes at once) and ``hash_batch`` put by put, on the
thread's CPU clock; A (this tree) and B (``PYTHONPATH=--b-tree``) alternate, and the medians and
B / A per round are printed as JSON.  Compiled index only (``tidemq_index_hash._native``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

CHILD = r"""
import json, sys, time
from tidemq_index_hash import _native as C
puts, with_keys, size, per_chunk = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
def props(p, i):
    d = {"UNIQ_KEY": "7F00000100002A9F0000%012X" % (p * size + i), "WAIT": "true", "TAGS": "TagA"}
    if with_keys:
        d["KEYS"] = "order-%d" % (p * size + i)
    return d
batches = [("BenchTopic", [props(p, i) for i in range(size)], [0] * size, 0) for p in range(puts)]
chunks = [batches[i : i + per_chunk] for i in range(0, puts, per_chunk)]
best = {}
for _ in range(3):
    t = time.thread_time_ns()
    for chunk in chunks:
        C.hash_chunk(chunk)
    best["hash_chunk_us_per_put"] = min(best.get("hash_chunk_us_per_put", 1e9), (time.thread_time_ns() - t) / puts / 1e3)
    t = time.thread_time_ns()
    for b in batches:
        C.hash_batch(*b)
    best["hash_batch_us_per_put"] = min(best.get("hash_batch_us_per_put", 1e9), (time.thread_time_ns() - t) / puts / 1e3)
best["source"] = C.HASH_SOURCE
print(json.dumps(best))
"""


def run(tree: str | None, puts: int, with_keys: bool, size: int) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(puts),
            "1" if with_keys else "0",
            str(size),
            str(max(1, 256 // size)),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b-tree", required=True, help="PYTHONPATH of B (the old code)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--puts", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=32, help="messages a put (1: single sends)")
    ap.add_argument("--with-keys", action="store_true", help="a KEYS entry per message too")
    args = ap.parse_args()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        pair: dict[str, Any] = {}
        for name, tree in (
            (("a", None), ("b", args.b_tree)) if r % 2 == 0 else (("b", args.b_tree), ("a", None))
        ):
            pair[name] = run(tree, args.puts, args.with_keys, args.batch)
        pair["load_average"] = os.getloadavg()[0]
        rounds.append(pair)
        print(f"round {r}: {json.dumps(pair)}", file=sys.stderr)
    keys = ["hash_chunk_us_per_put", "hash_batch_us_per_put"]
    out = {
        "benchmark": "index_keys_ab",
        "args": vars(args),
        "source": {"a": rounds[0]["a"]["source"], "b": rounds[0]["b"]["source"]},
        "median": {
            side: {k: round(statistics.median(r[side][k] for r in rounds), 3) for k in keys}
            for side in ("a", "b")
        },
        "b_over_a": {
            k: {
                "median": round(statistics.median(r["b"][k] / r["a"][k] for r in rounds), 3),
                "rounds": [round(r["b"][k] / r["a"][k], 3) for r in rounds],
            }
            for k in keys
        },
        "load_average": [round(r["load_average"], 1) for r in rounds],
        "rounds": rounds,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
