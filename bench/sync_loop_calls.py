"""Python calls per request on the broker's event-loop thread, by function (issue 38, syncbatch).

    python bench/sync_loop_calls.py [--workload produce_1k_batch] [--flush sync] [--messages 160000]
                                     [--top 40] [--extra TOML] [--out FILE]

Starts ``tidemq standalone`` as ``compare.py`` does, with a ``sitecustomize`` on its path that
turns ``cProfile`` on for the main thread (the event loop) on SIGUSR1 and dumps it on SIGUSR2;
drives it with the compare.py generators (a warm-up first, unprofiled), and prints JSON: the
send requests served, the calls per request in all and by function (exact counts; cProfile's
times are inflated by its own cost, so they are only shares), the lane counters, and reads
and writes per request from ``/proc/<pid>/io``.  Run it under ``--flush sync`` and ``async``
and diff the two: what a send costs more under sync flush in *work*, not in time.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402

SITE = """\
import cProfile, os, signal
_prof = cProfile.Profile()
def _on(signum, frame):
    _prof.enable()
def _off(signum, frame):
    _prof.disable()
    _prof.dump_stats(os.environ["TIDEMQ_CALLS_OUT"])
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
"""


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        m = re.match(r"(tidemq_(?:flush|read_lane|send_lane)\w*)(\{[^}]*\})? ([\d.e+-]+)", line)
        if m and "bucket" not in m.group(1):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="produce_1k_batch")
    p.add_argument("--flush", default="sync", choices=["async", "sync"])
    p.add_argument("--messages", type=int, default=160_000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--extra", default="")
    p.add_argument("--out", default="")
    args = p.parse_args()
    size = 128 if "128" in args.workload else 1024
    batch = 32 if "batch" in args.workload else 1
    work = Path(tempfile.mkdtemp(prefix="tidemq-calls-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    stats_file = work / "loop.prof"
    os.environ["PYTHONPATH"] = str(site)
    os.environ["TIDEMQ_CALLS_OUT"] = str(stats_file)
    port = systems.free_port()
    extra = f'metrics = "prometheus"\n{args.extra}\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
    server = systems.start_tidemq(work / "tidemq", args.flush, extra)
    os.environ.pop("PYTHONPATH", None)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        bench = Bench(argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0), server)
        bench.setup()
        bench.produce(size, batch, args.messages // 8)  # warm up, unprofiled
        m0 = metrics(url)
        io0 = Path(f"/proc/{server.pid}/io").read_text()
        os.kill(server.pid, signal.SIGUSR1)
        time.sleep(0.2)
        run = bench.produce(size, batch, args.messages)
        os.kill(server.pid, signal.SIGUSR2)
        io1 = Path(f"/proc/{server.pid}/io").read_text()
        m1 = metrics(url)
        for _ in range(100):
            if stats_file.exists() and stats_file.stat().st_size:
                break
            time.sleep(0.1)
        time.sleep(0.3)
    finally:
        server.stop()
        shutil.rmtree(work / "tidemq", ignore_errors=True)  # the broker's data: hundreds of MB a run
    sent = run.get("messages", args.messages)
    requests = sent / batch
    dm = {k: v - m0.get(k, 0.0) for k, v in m1.items() if v - m0.get(k, 0.0)}

    def io(text: str) -> dict[str, int]:
        return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}

    i0, i1 = io(io0), io(io1)
    st = pstats.Stats(str(stats_file))
    rows: list[dict[str, Any]] = []
    total_calls = 0
    total_tt = 0.0
    for (file, line, name), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total_calls += nc
        total_tt += tt
        short = f"{Path(file).name}:{line}:{name}" if file != "~" else name
        rows.append({"fn": short, "calls_per_req": nc / requests, "tottime_share": tt})
    for r in rows:
        r["tottime_share"] = round(r["tottime_share"] / total_tt, 4) if total_tt else 0
        r["calls_per_req"] = round(r["calls_per_req"], 3)
    rows.sort(key=lambda r: -r["calls_per_req"])
    result = {
        "workload": args.workload,
        "flush": args.flush,
        "extra": args.extra,
        "messages": sent,
        "requests": requests,
        "msgs_per_s": run.get("msgs_per_s"),
        "loadavg": os.getloadavg(),
        "calls_per_request": round(total_calls / requests, 2),
        "syscr_per_request": round((i1["syscr"] - i0["syscr"]) / requests, 3),
        "syscw_per_request": round((i1["syscw"] - i0["syscw"]) / requests, 3),
        "metrics_per_request": {k: round(v / requests, 4) for k, v in dm.items()},
        "functions": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    rows_top = rows[: args.top]
    print(json.dumps({k: v for k, v in result.items() if k != "functions"} | {"top": rows_top}, indent=1))


if __name__ == "__main__":
    main()
