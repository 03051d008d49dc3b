"""The timer store's per-interval flush, in-process: the old whole-wheel msync against the dirty
pages' msync, and the old checkpoint rewrite against the kept file's touch, on real files.

Cycles alternate old / new (the machine is shared: drift hits both).  Per cycle:

* ``steady``: ``--puts`` slot writes at ticks within ``--spread`` ticks of a moving tick (1 000
  timer messages a second due within 60 s), then the wheel's flush: old ``msync`` of the whole
  mapping, new :meth:`TimerWheel.flush`;
* ``holding``: nothing written; old: the wheel's whole ``msync`` and the checkpoint rewritten (temp
  file, fsync, rename, directory fsync), as every interval while messages waited; new: the wheel's
  flush (no call) and :meth:`CheckpointWriter.touch`.

Reported per wheel size (``--max-delay-sec``, comma-separated): the median thread CPU and wall time
per cycle, and the block device's completed flush requests and written sectors over each side's
cycles (``/sys/block/DEV/stat``: the whole disk, other processes included).  JSON on stdout.

    python bench/timer_flush_stages.py [--cycles 60] [--max-delay-sec 259200,8640000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tidemq.broker.timer.checkpoint import CheckpointWriter, TimerCheckpoint
from tidemq.broker.timer.timer_wheel import TimerWheel


def disk_of(path: Path) -> Path | None:
    dev = os.stat(path).st_dev
    name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    stat = name / "stat"
    if not stat.exists() and (name.parent / "stat").exists():
        stat = name.parent / "stat"
    return stat if stat.exists() else None


def disk_counts(stat: Path | None) -> tuple[int, int]:
    """(sectors written, flush requests completed) of the disk."""
    if stat is None:
        return 0, 0
    f = stat.read_text().split()
    return int(f[6]), int(f[15]) if len(f) > 15 else 0


def one_size(args: argparse.Namespace, max_delay_sec: int, work: Path) -> dict[str, Any]:
    slots = 2 * max_delay_sec + 2
    wheel = TimerWheel(work / f"timerwheel-{max_delay_sec}", slots)
    writer = CheckpointWriter(work / "config" / "timercheck")
    (work / "config").mkdir(exist_ok=True)
    cp = TimerCheckpoint(1_000, 480, 10, 1000, slots, {"T": 10})
    writer.save(cp, 10)
    rng = random.Random(1)
    stat = disk_of(work)
    out: dict[str, Any] = {"slots": slots, "wheel_mib": round(slots * 32 / 2**20, 1)}
    tick = 1_000_000
    for phase in ("steady", "holding"):
        times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        disk: dict[str, list[int]] = {"old": [0, 0], "new": [0, 0]}
        for c in range(2 * args.cycles):
            side = "old" if (c // 2 + c) % 2 == 0 else "new"  # old new, new old, ...
            if phase == "steady":
                tick += 1
                for _ in range(args.puts):
                    wheel.put(tick + rng.randrange(args.spread), 0, 48, 1)
            s0, t0, c0 = disk_counts(stat), time.perf_counter(), time.thread_time()
            if side == "old":
                wheel._map.flush()  # what TimerWheel.flush did
                wheel.take_dirty()  # all written now: the new side starts from nothing
                if phase == "holding":
                    writer.save(cp, 10)
            else:
                wheel.flush()
                if phase == "holding":
                    writer.touch()
            c1, t1, s1 = time.thread_time(), time.perf_counter(), disk_counts(stat)
            times[side].append((c1 - c0, t1 - t0))
            disk[side][0] += s1[0] - s0[0]
            disk[side][1] += s1[1] - s0[1]
            time.sleep(args.pause_s)
        out[phase] = {
            side: {
                "cpu_us_median": round(statistics.median(c for c, _ in times[side]) * 1e6, 1),
                "wall_us_median": round(statistics.median(w for _, w in times[side]) * 1e6, 1),
                "disk_kib_written": disk[side][0] // 2,
                "disk_flushes": disk[side][1],
            }
            for side in ("old", "new")
        }
    wheel.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=60, help="cycles of each side per phase")
    ap.add_argument("--puts", type=int, default=1000, help="steady: slot writes per cycle")
    ap.add_argument("--spread", type=int, default=60, help="steady: ticks they fall in")
    ap.add_argument("--max-delay-sec", default="259200,8640000", help="wheel sizes (1 s precision)")
    ap.add_argument("--pause-s", type=float, default=0.05)
    ap.add_argument("--dir", default=None, help="where the files go (a real disk; default: TMPDIR)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="timer-flush-stages-", dir=args.dir) as d:
        result = {
            "args": vars(args),
            "loadavg_start": os.getloadavg(),
            "sizes": {s: one_size(args, int(s), Path(d)) for s in args.max_delay_sec.split(",")},
            "loadavg_end": os.getloadavg(),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
