"""CPU of the send lane's prepare step alone (``prepare_frames``), in process, per message.

    python bench/prepare_bench.py [--rounds 5] [--b-python /work/wt/base/.venv/bin/python]

Frames are built as ``bench/send_path_bench.py`` builds them (the official client's V2 header),
split by the compiled ``take_frames`` before the clock, then handed to ``prepare_frames`` again
and again; the sends it returns are dropped before the next call, so their deallocation (and the
collector, tuned as ``tidemq standalone`` tunes it) is counted too.  Two workloads: single sends,
46 frames of 1 KiB per read (what the compare clients give), and batches, 4 requests of 32 x 128 B
per read.  With ``--b-python`` the same script runs under that interpreter too (another tree's
venv: main's code), A and B alternating per round, and the ratio B / A per round is reported.
Prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = {"single_1k_x46": (1, 46, 1024), "batch_128_4x32": (32, 4, 128)}


def measure(seconds: float) -> dict[str, Any]:
    from send_path_bench import build_frames

    from tidemq._native import _frame_lane, _send_lane
    from tidemq.cli import tune_gc

    born, store = ("127.0.0.1", 40000), ("127.0.0.1", 10911)
    out: dict[str, Any] = {"lane": _send_lane.__file__}
    tune_gc()
    for name, (batch, per_read, body) in WORKLOADS.items():
        data = b"".join(build_frames(batch, per_read, body, 1))
        frames, end = _frame_lane.take_frames(data, 16 * 1024 * 1024)
        assert end == len(data) and len(frames) == per_read

        def queues(topic: str) -> int:
            return 4

        prepare = _send_lane.prepare_frames
        assert prepare(frames, queues, "DefaultCluster", 1000, born, store) is not None
        msgs = batch * per_read
        loops = 0
        cpu0 = time.process_time()
        deadline = cpu0 + seconds
        while True:
            for _ in range(200):
                sends = prepare(frames, queues, "DefaultCluster", 1000, born, store)
                del sends
            loops += 200
            now = time.process_time()
            if now >= deadline:
                break
        out[name] = round((now - cpu0) / (loops * msgs) * 1e9, 1)
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per workload per run")
    ap.add_argument("--b-python", help="interpreter of tree B (alternating A/B)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.seconds)))
        return
    pythons = {"a": sys.executable}
    if args.b_python:
        pythons["b"] = args.b_python
    rounds = []
    for r in range(args.rounds):
        order = list(pythons) if r % 2 == 0 else list(reversed(pythons))
        row: dict[str, Any] = {}
        for side in order:
            res = subprocess.run(
                [pythons[side], __file__, "--child", "--seconds", str(args.seconds)],
                check=True,
                capture_output=True,
                text=True,
            )
            row[side] = json.loads(res.stdout)
        rounds.append(row)
        print(f"round {r + 1}: {row}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for name in WORKLOADS:
        s: dict[str, Any] = {"a_ns_per_message": [row["a"][name] for row in rounds]}
        s["a_median"] = statistics.median(s["a_ns_per_message"])
        if "b" in pythons:
            s["b_ns_per_message"] = [row["b"][name] for row in rounds]
            s["b_median"] = statistics.median(s["b_ns_per_message"])
            s["b_over_a"] = [round(row["b"][name] / row["a"][name], 3) for row in rounds]
            s["median_b_over_a"] = statistics.median(s["b_over_a"])
        summary[name] = s
    print(
        json.dumps(
            {
                "benchmark": "prepare_bench",
                "a": pythons["a"],
                "b": pythons.get("b"),
                "a_lane": rounds[0]["a"]["lane"],
                "b_lane": rounds[0]["b"]["lane"] if "b" in pythons else None,
                "seconds_per_workload": args.seconds,
                "load_average": os.getloadavg(),
                "summary": summary,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
