"""Profile the tidemq broker under one compare.py workload with py-spy (sampling, no restart).

    python bench/compare_profile.py [--workload produce_1k_single|produce_1k_batch|consume_1k]
                                    [--flush async|sync] [--seconds 15] [--out DIR]

Starts ``tidemq standalone``, drives it with the compare.py load generators, samples the server
with ``py-spy record --format raw`` (collapsed stacks, ``--nonblocking``) and prints JSON: the
functions with the largest self and inclusive share of busy samples (py-spy leaves idle
threads out),
and the throughput reached while sampling.  Needs ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402


def top_functions(collapsed: Path, n: int) -> dict[str, Any]:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        total += c
        self_c[leaf] += c
        for f in set(frames):
            incl[f] += c
    busy = total or 1
    return {
        "samples_busy": total,
        "self": [{"function": f, "share": round(c / busy, 3)} for f, c in self_c.most_common(n)],
        "inclusive": [{"function": f, "share": round(c / busy, 3)} for f, c in incl.most_common(n)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--workload",
        default="produce_1k_single",
        choices=["produce_1k_single", "produce_1k_batch", "consume_1k"],
    )
    p.add_argument("--flush", default="async", choices=["async", "sync"])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--lines", action="store_true", help="aggregate by line instead of by function")
    p.add_argument("--out", help="keep the collapsed stacks here")
    p.add_argument(
        "--gil", action="store_true", help="sample only the thread holding the GIL (Python CPU, not waits)"
    )
    args = p.parse_args()
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    work = Path(tempfile.mkdtemp(prefix="tidemq-profile-"))
    server = systems.start_tidemq(work / "tidemq", args.flush)
    try:
        ns = argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0)
        bench = Bench(ns, server)
        bench.setup()
        batch = 32 if args.workload == "produce_1k_batch" else 1
        if args.workload == "consume_1k":
            bench.produce(1024, 32, 400_000)  # the backlog to read
        out = Path(args.out) if args.out else work
        out.mkdir(parents=True, exist_ok=True)
        collapsed = out / f"{args.workload}-{args.flush}.txt"
        rec = subprocess.Popen(
            [spy, "record", "--pid", str(server.pid), "--format", "raw", "--rate", "250"]
            + ([] if args.lines else ["--function"])
            + (["--gil"] if args.gil else [])
            + ["--duration", str(int(args.seconds)), "--nonblocking", "--output", str(collapsed)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        deadline = time.monotonic() + args.seconds
        runs = []
        while time.monotonic() < deadline:
            if args.workload == "consume_1k":
                runs.append(bench.consume())
                break
            runs.append(bench.produce(1024, batch, 60_000 * batch // 4))
        rec.wait(args.seconds + 60)
        result = {
            "workload": args.workload,
            "flush": args.flush,
            "msgs_per_s": [r["msgs_per_s"] for r in runs],
            "server_cpu_per_s": [r["server_cpu_per_s"] for r in runs],
            "generator_cpu_per_s": [r["generator_cpu_per_s"] for r in runs],
            "profile": top_functions(collapsed, args.top)
            if collapsed.exists()
            else {"error": rec.stderr.read().decode() if rec.stderr else ""},
        }
        print(json.dumps(result, indent=2))
    finally:
        server.stop()
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
