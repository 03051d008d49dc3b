"""Does this disk take a second ``fdatasync`` while one runs?  (docs/flush.md, "Overlapping rounds")

    python bench/sync_latency_overlap_pair.py [--dir DIR] [--pairs 200]

On one preallocated file: a 1 KiB ``pwrite`` + ``fdatasync`` alone, ``--pairs`` times (its p50 is
F); then pairs: thread A appends 1 KiB and ``fdatasync``s on one open file description, and after
0.1, 0.3 or 0.6 F the main thread appends 1 KiB and ``fdatasync``s on a second description of the
same file (a second ``open()``, as the compiled rounds' slots).  Reports how long B took and how much
earlier it finished than it would have started after A and taken F (one round at a time).  Prints
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * p))], 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None)
    p.add_argument("--pairs", type=int, default=200)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="tidemq-overlap-pair-", dir=args.dir)
    path = os.path.join(work, "f.bin")
    fd1 = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd1, 0, 64 << 20)
    os.fdatasync(fd1)
    fd2 = os.open(f"/proc/self/fd/{fd1}", os.O_RDWR)
    block = os.urandom(1024)
    off = [0]

    def append() -> None:
        os.pwrite(fd1, block, off[0])
        off[0] += 1024

    solo: list[float] = []
    for _ in range(args.pairs):
        append()
        t = time.perf_counter_ns()
        os.fdatasync(fd1)
        solo.append((time.perf_counter_ns() - t) / 1e3)
        time.sleep(0.002)
    f_us = statistics.median(solo)

    def first(out: list[tuple[int, int]]) -> None:
        t = time.perf_counter_ns()
        os.fdatasync(fd1)
        out.append((t, time.perf_counter_ns()))

    pairs: dict[str, dict[str, float]] = {}
    for frac in (0.1, 0.3, 0.6):
        took: list[float] = []
        earlier: list[float] = []
        for _ in range(args.pairs):
            append()
            out: list[tuple[int, int]] = []
            th = threading.Thread(target=first, args=(out,))
            th.start()
            time.sleep(f_us * frac / 1e6)
            append()
            t1 = time.perf_counter_ns()
            os.fdatasync(fd2)
            t2 = time.perf_counter_ns()
            th.join()
            a_end = out[0][1]
            took.append((t2 - t1) / 1e3)
            earlier.append((a_end + f_us * 1e3 - t2) / 1e3)
            time.sleep(0.002)
        pairs[f"second_started_{frac}F_after_the_first"] = {
            "second_took_p50_us": q(took, 0.5),
            "second_took_p99_us": q(took, 0.99),
            "finished_earlier_than_one_at_a_time_p50_us": q(earlier, 0.5),
            "finished_earlier_p10_us": q(earlier, 0.1),
        }
    os.close(fd1)
    os.close(fd2)
    os.unlink(path)
    os.rmdir(work)
    print(
        json.dumps(
            {
                "load_avg": os.getloadavg(),
                "solo_fdatasync_us": {"p50": q(solo, 0.5), "p99": q(solo, 0.99)},
                **pairs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
