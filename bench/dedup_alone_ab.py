"""``dedup_window_alone.py`` of two trees, alternated in pairs (issue 37): the window's own
ns a batch, A (this tree) against B (``--b-tree``, a PYTHONPATH of the older code's packages).

    .venv/bin/python bench/dedup_alone_ab.py --b-tree /work/wt/base_pkgs --pairs 6 -- --hot

Arguments after ``--`` go to ``dedup_window_alone.py`` (``--max-entries`` one value or more).
Prints JSON: every pair's figures, the medians, the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_ALONE = Path(__file__).with_name("dedup_window_alone.py")


def _run(pythonpath: str, extra: list[str]) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, str(_ALONE), *extra], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out[out.index("{") :])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b-tree", required=True)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("extra", nargs="*")
    args = p.parse_args()
    pairs = []
    for i in range(args.pairs):
        order = [("a", ""), ("b", args.b_tree)]
        if i % 2:
            order.reverse()
        pair: dict[str, object] = {}
        for name, tree in order:
            load = os.getloadavg()[0]
            got = _run(tree, args.extra)
            pair[name] = {
                "load": round(load, 2),
                "window_ns_per_batch": {
                    str(r["max_entries"]): r["window_ns_per_batch"]  # type: ignore[index]
                    for r in got["results"]  # type: ignore[attr-defined]
                },
            }
        pairs.append(pair)
    sizes = list(pairs[0]["a"]["window_ns_per_batch"])  # type: ignore[index]
    medians = {
        size: {
            side: statistics.median(p[side]["window_ns_per_batch"][size] for p in pairs)  # type: ignore[index]
            for side in ("a", "b")
        }
        for size in sizes
    }
    print(
        json.dumps(
            {
                "benchmark": "dedup_alone_ab",
                "b_tree": args.b_tree,
                "extra": args.extra,
                "pairs": pairs,
                "medians": medians,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
