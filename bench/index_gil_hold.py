"""How late the put thread gets the GIL back while the key index's thread indexes (issue 38, looptail).

    python bench/index_gil_hold.py [--rate 2000] [--seconds 4] [--rounds 6] [--out FILE]

One ``HashIndex`` (default options: puts index inline from ``inline_keys`` queued keys on, the
index thread takes what is queued every 50 ms) fed as the broker's event loop feeds it at a fixed
rate of single sends: one ``dispatch_batch`` of one keyed message per send.  Between sends this
thread sleeps (``time.sleep``: the GIL released, as the loop in ``epoll_wait``) until the next
send is due; how late it wakes past that moment (the OS timer's slack, plus any wait for the GIL)
is recorded per send.  The phases alternate in one process: ``thread_releases`` (this tree: the
index thread's compiled calls release the GIL) and ``thread_keeps`` (``_release_gil`` patched to
do nothing: the setting before, the GIL held through the index thread's chunks).  Prints JSON:
per phase, the wake-up lateness p50/p99/p99.9/max (µs), how many sends woke over 100 / 300 µs
late, and the index thread's rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * p))], 1) if s else 0.0


def run_delay_ns(fd: int) -> int:
    """This thread's time spent runnable but not running (``schedstat``'s second field)."""
    import os

    return int(os.pread(fd, 64, 0).split()[1])


def phase(
    index: Any, rate: float, seconds: float, seq: list[int], fd: int
) -> tuple[list[float], list[float]]:
    from tidemq.message import Prop

    late: list[float] = []
    off_runqueue: list[float] = []  # the lateness less the time waiting for a CPU: the GIL wait
    period = 1.0 / rate
    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        due = t0 + i * period
        now = time.perf_counter()
        if due > now:
            r0 = run_delay_ns(fd)
            time.sleep(due - now)
            woke = time.perf_counter()
            late.append((woke - due) * 1e6)
            off_runqueue.append((woke - due) * 1e6 - (run_delay_ns(fd) - r0) / 1e3)
        seq[0] += 1
        k = seq[0]
        index.dispatch_batch(
            "BenchTopic",
            0,
            [{Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"7F00000100002A9F{k:016X}"}],
            [k * 1100],
            [1100],
            [0],
            1_767_225_600_000 + k,
            k,
            [0],
        )
    return late, off_runqueue


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default="")
    args = p.parse_args()
    import gc

    from tidemq_index_hash import native, service

    root = Path(tempfile.mkdtemp(prefix="index-gil-"))
    index = service.HashIndex(root / "index")
    index.load(True, 0)
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)  # as a serving broker (tidemq.cli.tune_gc)
    keeps = service.HashIndex._release_gil
    seq = [0]
    import os

    fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    phase(index, args.rate, 1.0, seq, fd)  # warm-up: the first slot pages faulted in
    res: dict[str, Any] = {
        "rate": args.rate,
        "seconds": args.seconds,
        "native": native.DESCRIPTION,
        "rounds": [],
    }
    for r in range(args.rounds):
        for name in (
            ("thread_releases", "thread_keeps") if r % 2 == 0 else ("thread_keeps", "thread_releases")
        ):
            if name == "thread_keeps":
                service.HashIndex._release_gil = lambda self: None  # type: ignore[method-assign]
            else:
                service.HashIndex._release_gil = keeps  # type: ignore[method-assign]
            drains0 = index._inline_drains
            late, gil = phase(index, args.rate, args.seconds, seq, fd)
            res["rounds"].append(
                {
                    "round": r,
                    "phase": name,
                    "late_us": {
                        "p50": q(late, 0.5),
                        "p99": q(late, 0.99),
                        "p999": q(late, 0.999),
                        "max": q(late, 1.0),
                    },
                    # the lateness less the time runnable but not running (another process had
                    # the CPU): the timer's slack and the wait for the GIL
                    "late_not_runqueue_us": {
                        "p50": q(gil, 0.5),
                        "p99": q(gil, 0.99),
                        "p999": q(gil, 0.999),
                        "max": q(gil, 1.0),
                    },
                    "not_runqueue_over_100us": sum(x > 100 for x in gil),
                    "not_runqueue_over_300us": sum(x > 300 for x in gil),
                    "over_100us": sum(x > 100 for x in late),
                    "over_300us": sum(x > 300 for x in late),
                    "inline_drains": index._inline_drains - drains0,
                }
            )
            print(json.dumps(res["rounds"][-1]), file=sys.stderr)
    service.HashIndex._release_gil = keeps  # type: ignore[method-assign]
    index.shutdown()
    summary = {}
    for name in ("thread_releases", "thread_keeps"):
        rows = [x for x in res["rounds"] if x["phase"] == name]
        summary[name] = {
            "late_p99_us_median": statistics.median(x["late_us"]["p99"] for x in rows),
            "late_p999_us_median": statistics.median(x["late_us"]["p999"] for x in rows),
            "over_100us_median": statistics.median(x["over_100us"] for x in rows),
            "over_300us_median": statistics.median(x["over_300us"] for x in rows),
            "not_runqueue_p99_us_median": statistics.median(x["late_not_runqueue_us"]["p99"] for x in rows),
            "not_runqueue_p999_us_median": statistics.median(x["late_not_runqueue_us"]["p999"] for x in rows),
            "not_runqueue_over_100us_median": statistics.median(x["not_runqueue_over_100us"] for x in rows),
            "not_runqueue_over_300us_median": statistics.median(x["not_runqueue_over_300us"] for x in rows),
        }
    res["summary"] = summary
    res["load_avg"] = os.getloadavg()
    text = json.dumps(res, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    import shutil

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
