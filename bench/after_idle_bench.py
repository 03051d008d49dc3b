"""CPU of the same piece of Python work right after a gap, against back to back (issue 38, syncbatch).

    python bench/after_idle_bench.py [--n 3000] [--repeat 3] [--gaps 0,50,200,1000] [--pieces 1,4,16]
                                     [--out FILE]

A thread runs one fixed piece of Python work (~25 us: objects made, a dict filled, struct
packing, a join: the kind of work a request is) ``n`` times, each time after a gap of ``gap``
microseconds, and reads its own CPU time around the work only (``time.thread_time_ns``).  The
gap is a sleep (the thread idles: what the broker's event loop does between a flush round's
reads under sync flush) or a spin (the thread stays on the CPU).  Prints JSON: CPU microseconds
per piece of work by gap, and the host's load average.  If the work costs more after a gap, what
ran meanwhile (other threads and processes, the vCPU halted) left the caches cold: the broker
pays that on each wake-up, so its CPU per message grows with its wake-ups per message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import time
from pathlib import Path


class _Obj:
    __slots__ = ("a", "b", "c")

    def __init__(self, a: int, b: bytes, c: int) -> None:
        self.a, self.b, self.c = a, b, c


_DATA = [os.urandom(64) for _ in range(64)]


def work() -> int:
    index: dict[bytes, _Obj] = {}
    out = []
    for i, b in enumerate(_DATA):
        o = _Obj(i, b, len(b))
        index[b[:8]] = o
        out.append(struct.pack(">iq", o.a, o.c) + b[:16])
    total = 0
    for k, v in index.items():
        total += v.a + len(k)
    return len(b"".join(out)) + total


def run(gap_us: int, n: int, spin: bool, pieces: int = 1) -> float:
    """Median CPU microseconds of ``pieces`` pieces of work after a gap of ``gap_us``."""
    took = []
    gap = gap_us / 1e6
    for _ in range(n):
        if gap:
            if spin:
                end = time.perf_counter() + gap
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(gap)
        t = time.thread_time_ns()
        for _ in range(pieces):
            work()
        took.append(time.thread_time_ns() - t)
    return statistics.median(took) / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--gaps", default="0,50,200,1000")
    p.add_argument("--pieces", default="1,4,16", help="pieces of work after each gap (sleep only)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    gaps = [int(g) for g in args.gaps.split(",")]
    rows = []
    for _ in range(args.repeat):
        for spin in (False, True):
            rows.append(
                {"gap": "spin" if spin else "sleep"} | {str(g): round(run(g, args.n, spin), 2) for g in gaps}
            )
    by_size = []
    for pieces in [int(k) for k in args.pieces.split(",")]:
        n = max(100, args.n // pieces)
        by_size.append({"pieces": pieces} | {str(g): round(run(g, n, False, pieces), 2) for g in gaps})
    result = {
        "what": "median CPU us of one piece of Python work after a gap of N us (sleep or spin)",
        "loadavg_before_after": os.getloadavg(),
        "cpuidle_driver": _read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "guest_halt_poll_ns": _read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        "rows": rows,
        "after_sleep_by_work_size": by_size,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


if __name__ == "__main__":
    main()
