"""Python calls per message on the broker's event loop, sync against async flush (issue 38).

    python bench/sync_call_counts.py [--workload produce_1k_single] [--flush sync] [--messages 40000]

Starts ``tidemq standalone`` as ``compare.py`` does with a ``sitecustomize`` (on ``PYTHONPATH``)
that counts, with ``sys.setprofile`` on the loop's thread only, every Python function call and
every call of a builtin or compiled function by name.  Before and after the measured run the
broker dumps its counts (``SIGUSR1``); prints JSON: calls per message and per flush round of each
function, largest first, and the totals.  The hook slows the loop several times over, so rounds
grow: compare counts, not times, and read the per-round figures with that in mind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402
from sync_round_stats import metrics  # noqa: E402

_SITE = """
import collections, json, os, signal, sys, threading
_counts = collections.Counter()
_dumps = [0]
def _prof(frame, event, arg):
    if event == "call":
        c = frame.f_code
        _counts[c.co_filename.rsplit("/", 2)[-2:][-1] + ":" + c.co_qualname] += 1
    elif event == "c_call":
        _counts["C:" + getattr(arg, "__qualname__", getattr(arg, "__name__", "?"))] += 1
def _dump(signum, frame):
    _dumps[0] += 1
    path = os.environ["TIDEMQ_CALLS_OUT"] + f".{_dumps[0]}"
    with open(path + ".tmp", "w") as f:
        json.dump(dict(_counts), f)
    os.replace(path + ".tmp", path)
if os.environ.get("TIDEMQ_CALLS_OUT") and "standalone" in " ".join(sys.argv + sys.orig_argv):
    signal.signal(signal.SIGUSR1, _dump)
    sys.setprofile(_prof)
"""


def _snapshot(pid: int, out: Path, n: int) -> dict[str, int]:
    os.kill(pid, signal.SIGUSR1)
    path = Path(f"{out}.{n}")
    deadline = time.monotonic() + 30
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the broker did not dump its call counts")
        time.sleep(0.05)
    data: dict[str, int] = json.loads(path.read_text())
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="produce_1k_single")
    p.add_argument("--flush", default="sync", choices=["async", "sync"])
    p.add_argument("--messages", type=int, default=40_000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--extra", default="", help="TOML appended to the broker's config")
    p.add_argument("--top", type=int, default=60)
    args = p.parse_args()
    size = 128 if "128" in args.workload else 1024
    batch = 32 if "batch" in args.workload else 1
    port = systems.free_port()
    extra = f'metrics = "prometheus"\n{args.extra}\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
    work = Path(tempfile.mkdtemp(prefix="tidemq-calls-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITE)
    out = work / "calls"
    os.environ["PYTHONPATH"] = str(site)
    os.environ["TIDEMQ_CALLS_OUT"] = str(out)
    server = systems.start_tidemq(work / "tidemq", args.flush, extra)
    os.environ.pop("PYTHONPATH", None)
    os.environ.pop("TIDEMQ_CALLS_OUT", None)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        bench = Bench(argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0), server)
        bench.setup()
        bench.produce(size, batch, args.messages // 8)  # warm up
        m0, c0 = metrics(url), _snapshot(server.pid, out, 1)
        run = bench.produce(size, batch, args.messages)
        m1, c1 = metrics(url), _snapshot(server.pid, out, 2)
    finally:
        server.stop()
    sent = run.get("messages", args.messages)
    dm = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    rounds = next((v for k, v in dm.items() if k.startswith("tidemq_flush_rounds")), 0.0)
    diff = {k: v - c0.get(k, 0) for k, v in c1.items() if v - c0.get(k, 0) > 0}
    py = sum(v for k, v in diff.items() if not k.startswith("C:"))
    cc = sum(v for k, v in diff.items() if k.startswith("C:"))
    top = sorted(diff.items(), key=lambda kv: -kv[1])[: args.top]
    result: dict[str, Any] = {
        "workload": args.workload,
        "flush": args.flush,
        "extra": args.extra,
        "messages": sent,
        "rounds": rounds,
        "messages_per_round": round(sent / rounds, 1) if rounds else None,
        "python_calls_per_msg": round(py / sent, 2),
        "builtin_calls_per_msg": round(cc / sent, 2),
        "top_per_msg": {k: round(v / sent, 3) for k, v in top},
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
