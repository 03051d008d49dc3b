"""In-process benchmarks of two trees, alternating: this tree (A) against another's (B, e.g. main).

    python bench/inproc_ab.py --b-tree /work/wt/base --bench stages --workload single --rounds 6 --out x.json

Runs ``bench/send_path_bench.py`` (``--bench send_path``) or ``bench/batch_stages.py``
(``--bench stages``) of each tree with that tree's own ``.venv/bin/python`` (its compiled modules),
A then B, the order swapped every round so drift on a shared machine hits both.  Workloads:
``single`` (1 KiB single sends, 46 per read: what the compare clients give), ``single1`` (one per
read, send_path only), ``batch`` (4 requests of 32 x 128 B per read).  Writes JSON: each round's
figures, the ratio B / A of the process CPU per message, the load average per round.
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

HERE = Path(__file__).resolve().parent.parent

ARGS = {
    ("send_path", "single"): "--batch 1 --per-read 46 --requests 20000 --body 1024 --repeats 3",
    ("send_path", "single1"): "--batch 1 --per-read 1 --requests 10000 --body 1024 --repeats 3",
    (
        "send_path",
        "batch",
    ): "--batch 32 --body 128 --per-read 4 --batch-requests 3000 --requests 500 --repeats 3",
    ("stages", "single"): "--batch 1 --body 1024 --per-read 46 --requests 20000",
    ("stages", "batch"): "--batch 32 --body 128 --per-read 4 --requests 3000",
}
SCRIPT = {"send_path": "bench/send_path_bench.py", "stages": "bench/batch_stages.py"}


def one(tree: Path, bench: str, args: str) -> dict[str, Any]:
    cmd = [str(tree / ".venv/bin/python"), str(tree / SCRIPT[bench]), *args.split()]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/tmp")
    doc = json.loads(res.stdout)
    if bench == "send_path":
        r = doc["results"][0]
        return {"cpu_us_per_message": r["cpu_us_per_message"], "run": r}
    stages = doc["stages_us_per_request"]
    return {
        "cpu_us_per_message": doc["process_cpu_us_per_message"],
        "prepare_frames_us_per_request": stages["prepare_frames"]["us"],
        "run": doc,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b-tree", required=True, help="the other tree (built, with its own .venv)")
    ap.add_argument("--bench", choices=sorted(SCRIPT), default="stages")
    ap.add_argument("--workload", choices=["single", "single1", "batch"], default="single")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bench_args = ARGS[(args.bench, args.workload)]
    trees = {"a": HERE, "b": Path(args.b_tree)}
    rows: list[dict[str, Any]] = []
    loads = []
    for r in range(args.rounds):
        row = {side: one(trees[side], args.bench, bench_args) for side in ("ab" if r % 2 == 0 else "ba")}
        loads.append(round(os.getloadavg()[0], 2))
        rows.append(row)
        print(
            f"round {r + 1}: a {row['a']['cpu_us_per_message']} b {row['b']['cpu_us_per_message']}",
            file=sys.stderr,
        )
    ratio = [round(row["b"]["cpu_us_per_message"] / row["a"]["cpu_us_per_message"], 3) for row in rows]
    summary = {
        side: {
            "cpu_us_per_message": [row[side]["cpu_us_per_message"] for row in rows],
            "median_cpu_us_per_message": statistics.median(row[side]["cpu_us_per_message"] for row in rows),
        }
        for side in "ab"
    }
    if args.bench == "stages":
        for side in "ab":
            per = [row[side]["prepare_frames_us_per_request"] for row in rows]
            summary[side]["prepare_frames_us_per_request"] = per
            summary[side]["median_prepare_frames_us_per_request"] = statistics.median(per)

    def rev(tree: Path) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()

    doc = {
        "benchmark": f"{SCRIPT[args.bench]} in-process A/B",
        "command": f"{SCRIPT[args.bench]} {bench_args}",
        "a": f"{HERE} ({rev(HERE)})",
        "b": f"{args.b_tree} ({rev(trees['b'])})",
        "summary": summary,
        "b_over_a_cpu_per_message": ratio,
        "median_b_over_a": statistics.median(ratio),
        "load_average_per_round": loads,
        "rounds": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(
        json.dumps(
            {k: doc[k] for k in ("b_over_a_cpu_per_message", "median_b_over_a", "load_average_per_round")}
        )
    )


if __name__ == "__main__":
    main()
