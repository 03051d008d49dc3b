"""In-process A/B of what a sync flush round writes back: the commit log's zeros ahead and where
single records are written (through the mapping or with ``pwrite``).

    python bench/flush_zero_ab.py [--rounds 4] [--dir /tmp] [--seconds 3] [--workloads single,batch1k,batch128]
        [--a ''] [--b zeros=256k,inplace=64k]

No broker, no socket: an mmap store with sync flush, driven from one asyncio loop as the broker
puts its sends (store_bench's writers).  A variant is empty (the tree's own choice under sync
flush, ``CommitLog.use_flush_rounds``) or sets ``zeros=<bytes>`` (``CommitLog.zero_ahead``, 0:
none) and ``inplace=<bytes>`` (``CommitLog.in_place_max``: the largest single record packed
through the mapping, 0: every record written with ``pwrite``); B's default is main's behaviour.
Per round, workload and variant (the order swapped every round):

* ``single``: 32 asyncio writers, single 1 KiB puts (one record each);
* ``batch1k`` / ``batch128``: 8 asyncio writers, each a batch of 32 x 1 KiB / 32 x 128 B a put
  (one ``pwrite`` a batch);

and reports the writers' rate, the process CPU per message (user and system), the flush rounds,
and the bytes the disk wrote per round (``/sys/block/<dev>/stat``: the whole device, so other
jobs' writes are in it) and the process's ``write_bytes`` (``/proc/self/io``: the folios it
dirtied, whole folios even where only some of their blocks are written back).  What the process's
own writes put on the disk: ``perf record -e block:block_rq_issue -- python bench/flush_zero_ab.py``.
Prints JSON: every round, and per variant and workload the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_bench import make_message  # noqa: E402

from tidemq.futures import resolved  # noqa: E402
from tidemq.testing.store_contract import build_store  # noqa: E402

WORKLOADS = {"single": (32, 1, 1024), "batch1k": (8, 32, 1024), "batch128": (8, 32, 128)}


def device_of(path: Path) -> str | None:
    dev = os.stat(path).st_dev
    name = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        return Path(os.path.realpath(name)).name
    except OSError:
        return None


def disk_written(dev: str | None) -> int:
    if dev is None:
        return 0
    try:
        return int(Path(f"/sys/block/{dev}/stat").read_text().split()[6]) * 512
    except (OSError, IndexError, ValueError):
        return 0


def proc_write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def apply_variant(store: Any, variant: dict[str, str]) -> None:
    cl = store.commitlog
    zeros = variant.get("zeros")
    if zeros is not None:
        cl.zero_ahead = 0 if zeros in ("0", "none") else _size(zeros)
    inplace = variant.get("inplace")
    if inplace is not None:  # the largest single record packed through the mapping (0: none)
        cl.in_place_max = _size(inplace)


def _size(text: str) -> int:
    text = text.lower()
    if text.endswith("k"):
        return int(text[:-1]) * 1024
    return int(text)


def parse_variant(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip()
    return out


def run_case(directory: Path, variant: dict[str, str], workload: str, seconds: float) -> dict[str, Any]:
    writers, batch, size = WORKLOADS[workload]
    store = build_store(
        "mmap",
        directory,
        flush="sync",
        store_options={"commitlog_file_size": 256 << 20, "cq_flush_interval_ms": 1000},
    )
    if not store.load():
        raise RuntimeError("store did not load")
    store.start()
    apply_variant(store, variant)
    counts = [0] * writers
    failures: list[str] = []

    async def writer(w: int, stop_at: float) -> None:
        msg = make_message(store, "BenchZeroAhead", size)
        msg.queue_id = w % 8
        msgs = [msg] * batch
        while time.perf_counter() < stop_at:
            fut = store.put_message(msg) if batch == 1 else store.put_messages(msgs)
            res = await resolved(fut)
            if not res.ok:
                failures.append(str(res.status))
                return
            counts[w] += res.message_count

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w, t0 + seconds) for w in range(writers)))
        return time.perf_counter() - t0

    dev = device_of(directory)
    try:
        fsyncs0 = store.commitlog.queue.flush_calls()
        disk0, wb0, t0 = disk_written(dev), proc_write_bytes(), os.times()
        elapsed = asyncio.run(run())
        t1, disk1, wb1 = os.times(), disk_written(dev), proc_write_bytes()
        fsyncs = store.commitlog.queue.flush_calls() - fsyncs0
    finally:
        store.shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    total = max(sum(counts), 1)
    rounds = max(fsyncs, 1)
    return {
        "messages": sum(counts),
        "msgs_s": round(total / elapsed, 1),
        "cpu_us_per_msg": round((t1.user - t0.user + t1.system - t0.system) / total * 1e6, 2),
        "sys_us_per_msg": round((t1.system - t0.system) / total * 1e6, 2),
        "rounds": fsyncs,
        "messages_per_round": round(total / rounds, 1),
        "round_us": round(elapsed / rounds * 1e6, 1),
        "disk_kib_per_round": round((disk1 - disk0) / rounds / 1024, 1),
        "dirtied_kib_per_round": round((wb1 - wb0) / rounds / 1024, 1),
        "data_kib_per_round": round(total * size / rounds / 1024, 1),
        "failures": failures[:3],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir): the disk measured")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--workloads", default="single,batch1k,batch128")
    p.add_argument(
        "--a",
        default="",
        help="A's variant: zeros=<bytes|256k|0>[,inplace=<bytes|64k|0>] (empty: the tree's)",
    )
    p.add_argument(
        "--b", default="zeros=256k,inplace=64k", help="B's variant (default: 256 KiB in one write)"
    )
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidemq-zero-ab-", dir=args.dir))
    variants = {"a": parse_variant(args.a), "b": parse_variant(args.b)}
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            row: dict[str, Any] = {"load_average": list(os.getloadavg())}
            for wl in args.workloads.split(","):
                order = ["a", "b"] if i % 2 == 0 else ["b", "a"]
                row[wl] = {}
                for name in order:
                    r = run_case(base / f"{wl}-{name}", variants[name], wl, args.seconds)
                    row[wl][name] = r
                    print(
                        f"[flush_zero_ab] round {i} {wl} {name}: {r['msgs_s']} msg/s,"
                        f" {r['cpu_us_per_msg']} us CPU/msg (sys {r['sys_us_per_msg']}),"
                        f" {r['messages_per_round']} msgs/round, round {r['round_us']} us,"
                        f" disk {r['disk_kib_per_round']} KiB/round (data {r['data_kib_per_round']})",
                        file=sys.stderr,
                    )
            rounds.append(row)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    keys = (
        "msgs_s",
        "cpu_us_per_msg",
        "sys_us_per_msg",
        "round_us",
        "disk_kib_per_round",
        "dirtied_kib_per_round",
    )
    median: dict[str, Any] = {}
    for wl in args.workloads.split(","):
        median[wl] = {}
        for name in ("a", "b"):
            median[wl][name] = {k: statistics.median(r[wl][name][k] for r in rounds) for k in keys}
        median[wl]["b_over_a_cpu_per_msg"] = [
            round(r[wl]["b"]["cpu_us_per_msg"] / r[wl]["a"]["cpu_us_per_msg"], 3) for r in rounds
        ]
    print(json.dumps({"variants": variants, "rounds": rounds, "median": median}, indent=2))


if __name__ == "__main__":
    main()
