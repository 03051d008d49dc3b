"""Sync puts at a fixed rate in process, overlapping rounds on and off alternated (docs/flush.md,
"Overlapping rounds").

    python bench/sync_latency_overlap_inproc.py [--rate 2000] [--seconds 8] [--pairs 4] [--dir DIR]

One mmap store (sync flush, compiled rounds) per run, an event loop putting a 1 KiB message every
1/rate s (open loop: each put's latency is from its scheduled time to its future's result, no
socket), ``[flush.sync] overlap_rounds`` 2 (unbounded gate: ``overlap_max_load`` 1e9) and 1
alternated, the order swapped every pair.  Beside each run a 4 KiB append + ``fdatasync`` every
20 ms on the same file system (one fsync over the same seconds).  Reports per run the put latency
p50/p99, the rounds, the rounds that overlapped another, and the process CPU per put.  Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sync_latency_trace  # noqa: E402

from tidemq.testing.store_contract import build_store, message  # noqa: E402


def run(work: Path, slots: int, rate: float, seconds: float) -> dict[str, Any]:
    store = build_store(
        "mmap",
        work,
        flush="sync",
        store_options={},
        flush_options={"overlap_rounds": slots, "overlap_max_load": 1e9},
    )
    assert store.load()
    store.start()
    native = store.flush_policy._native
    assert native is not None
    lat: list[float] = []
    probes: list[tuple[int, int]] = []
    stop = threading.Event()
    prober = threading.Thread(target=sync_latency_trace.probe, args=(work, 0.02, stop, probes), daemon=True)
    prober.start()
    body = os.urandom(1024)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[Any]] = []
        step = 1 / rate
        start = loop.time()
        n = int(seconds * rate)
        for i in range(n):
            due = start + i * step
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.perf_counter_ns() - int(max(0.0, -delay) * 1e9)  # from its scheduled time
            fut = store.put_message(message(topic="T", body=body, queue_id=i % 4))

            def done(f: Any, t0: int = t0) -> None:
                lat.append((time.perf_counter_ns() - t0) / 1e3)

            wrapped = asyncio.wrap_future(fut)
            wrapped.add_done_callback(done)
            pending.append(wrapped)
        await asyncio.gather(*pending)
        return n

    cpu0 = time.process_time()
    n = asyncio.run(main())
    cpu = time.process_time() - cpu0
    stop.set()
    prober.join()
    rounds, overlapped = native.rounds, native.worker.overlapped
    store.shutdown()
    warm = len(lat) // 10
    body_lat = lat[warm:]
    fs = [(b - a) / 1e3 for a, b in probes]
    return {
        "overlap_rounds": slots,
        "puts": n,
        "latency_us": sync_latency_trace.summary(body_lat),
        "fsync_4k_during_us": sync_latency_trace.summary(fs),
        "p99_vs_fsync_p99_during": round(
            sync_latency_trace.q(body_lat, 0.99) / max(1.0, sync_latency_trace.q(fs, 0.99)), 2
        ),
        "rounds": rounds,
        "overlapped_rounds": overlapped,
        "cpu_us_per_put": round(cpu / n * 1e6, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-overlap-inproc-", dir=args.dir))
    out: list[dict[str, Any]] = []
    try:
        for i in range(args.pairs):
            order = (2, 1) if i % 2 == 0 else (1, 2)
            row = {}
            for slots in order:
                d = work / f"{i}-{slots}"
                row[f"slots_{slots}"] = r = run(d, slots, args.rate, args.seconds)
                shutil.rmtree(d, ignore_errors=True)
                print(f"[overlap_inproc] pair {i} slots {slots}: {r}", file=sys.stderr)
            out.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"rate": args.rate, "seconds": args.seconds, "pairs": out}, indent=2))


if __name__ == "__main__":
    main()
