"""A commit-log-like round (small append + ``fdatasync``) beside an index flush: in one burst
(one ``fdatasync`` of ~5 000 dirty slot pages, the old way) or in windows (``writeback.write_back``
then ``fdatasync``, the new way), alternated in one process on the same file system (issue 38).

    python bench/sync_latency_writeback_ab.py [--cycles 6] [--rate 1000] [--keys 20000] [--dir DIR]

One thread runs rounds at ``--rate`` a second: a 2 KiB ``pwrite`` into a file whose blocks are
written (zeros, synced once) and an ``fdatasync``, as a sync-flush round of 1-2 sends.  Another
keeps a real hash-index file (:class:`tidemq_index_hash.indexfile.IndexFile`, default geometry):
each cycle puts ``--keys`` random keys (dirtying most slot pages), waits 0.5 s, flushes it with the
cycle's variant, waits 0.5 s.  Reported per variant: the rounds' ``fdatasync`` that overlapped the
index flush (and the 50 ms after it), and the flush's own time.  Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sync_latency_trace import summary  # noqa: E402


def rounds(path: Path, rate: float, stop: threading.Event, out: list[tuple[int, int]]) -> None:
    size = 64 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zero = bytes(1 << 20)
        for pos in range(0, size, len(zero)):
            os.pwrite(fd, zero, pos)
        os.fdatasync(fd)  # written blocks: the rounds overwrite, as the commit log's mostly do
        data = os.urandom(2048)
        pos = 0
        step = 1 / rate
        nxt = time.perf_counter()
        while not stop.is_set():
            os.pwrite(fd, data, pos)
            t0 = time.perf_counter_ns()
            os.fdatasync(fd)
            out.append((t0, time.perf_counter_ns()))
            pos = (pos + len(data)) % size
            nxt += step
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.perf_counter()
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=6, help="index flushes per variant")
    p.add_argument("--rate", type=float, default=1000.0, help="rounds a second")
    p.add_argument("--keys", type=int, default=20_000, help="keys put before each index flush")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    from tidemq_index_hash import writeback
    from tidemq_index_hash.indexfile import IndexFile

    work = Path(tempfile.mkdtemp(prefix="tidemq-wbab-", dir=args.dir))
    real = writeback._sync_file_range
    marks: list[tuple[str, int, int]] = []
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    t = threading.Thread(target=rounds, args=(work / "log", args.rate, stop, samples), daemon=True)
    t.start()
    rnd = random.Random(1)
    try:
        f = IndexFile.create(work / "index", 5_000_000, 20_000_000)
        try:
            time.sleep(1.0)
            n = 0
            for c in range(args.cycles * 2):
                variant = ("windows", "burst")[c % 2] if (c // 2) % 2 == 0 else ("burst", "windows")[c % 2]
                for _ in range(args.keys):
                    h = rnd.randrange(1 << 31)
                    f.reserve([h])
                    n += 1
                    f.put_key(h, n * 100, 1_000 + n)
                time.sleep(0.5)
                writeback._sync_file_range = real if variant == "windows" else None
                t0 = time.perf_counter_ns()
                f.sync_data()
                t1 = time.perf_counter_ns()
                marks.append((variant, t0, t1))
                time.sleep(0.5)
        finally:
            writeback._sync_file_range = real
            f.close()
    finally:
        stop.set()
        t.join()
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"rate": args.rate, "keys": args.keys, "load_avg": os.getloadavg()}
    quiet = [
        (b - a) / 1e3
        for a, b in samples
        if not any(m0 - 50_000_000 < b and a < m1 + 50_000_000 for _v, m0, m1 in marks)
    ]
    out["rounds_away_from_any_index_flush_us"] = {
        **summary(quiet),
        "count": len(quiet),
        "share_over_1ms": round(sum(x > 1000 for x in quiet) / max(1, len(quiet)), 4),
        "share_over_2ms": round(sum(x > 2000 for x in quiet) / max(1, len(quiet)), 4),
    }
    for variant in ("burst", "windows"):
        mine = [(m0, m1) for v, m0, m1 in marks if v == variant]
        during = [(b - a) / 1e3 for a, b in samples if any(m0 < b and a < m1 + 50_000_000 for m0, m1 in mine)]
        per_flush_max = [
            max(((b - a) / 1e3 for a, b in samples if m0 < b and a < m1 + 50_000_000), default=0.0)
            for m0, m1 in mine
        ]
        out[variant] = {
            "index_flush_ms": [round((m1 - m0) / 1e6, 1) for m0, m1 in mine],
            # Rounds that a send's p99 would see: how many went over 1 and 2 ms during the flushes.
            "rounds_during_over_1ms": sum(x > 1000 for x in during),
            "rounds_during_over_2ms": sum(x > 2000 for x in during),
            "rounds_during_flush_us": {**summary(during), "count": len(during)},
            "slowest_round_per_flush_us": [round(x) for x in per_flush_max],
            "median_slowest_round_us": round(statistics.median(per_flush_max)) if per_flush_max else 0,
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
