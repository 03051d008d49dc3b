"""What the timer store's background flush costs a broker: steady timer traffic and holding idle.

For each round and each tree (A: this tree; B: ``--b-tree DIR`` on the broker's PYTHONPATH, the old
code, as ``compare_ab.py``), alternating A/B and swapping the order every round, a fresh NameServer
and broker (``timer_max_delay_sec`` = ``--max-delay-sec``: the wheel's size) are driven through:

* holding: ``--hold`` timer messages due far after the run, then nothing for ``--window-s``: the
  broker holds them and no new one comes (the wheel, the log and the checkpoint do not change);
* steady: ``--rate`` timer messages a second with delays of 1..``--max-due-s`` s, for ``--steady-s``
  s; the last ``--window-s`` measured (deliveries running by then).

Each measured window reports the broker's CPU seconds per second (``/proc/PID/stat``), its bytes
written per second (``/proc/PID/io`` ``write_bytes``: what reached the block layer for it), and,
in a second window of ``--strace-s`` under ``strace -c -f``, the msync / fsync / fdatasync / rename
calls (and the ``utimensat`` of a kept checkpoint) per second (strace slows the process: its window is not the CPU window).  JSON on stdout.

    python bench/timer_flush_bench.py --b-tree /work/wt/base_pkgs [--rounds 3] [--max-delay-sec 259200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import start_namesrv_and_broker, stop
from timer_bench import cpu_s, wait_enqueued

from tidemq.client import Message, Producer

SYSCALLS = ("msync", "fsync", "fdatasync", "rename", "utimensat")


def log(msg: str) -> None:
    print(f"[timer_flush_bench] {msg}", file=sys.stderr, flush=True)


def write_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return -1


def measure(pid: int, seconds: float) -> dict[str, float]:
    c0, w0, a0, t0 = cpu_s(pid), write_bytes(pid), ACKED[0], time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    cpu, acked = cpu_s(pid) - c0, ACKED[0] - a0
    return {
        "cpu_s_per_s": round(cpu / dt, 4),
        "write_kib_per_s": round((write_bytes(pid) - w0) / 1024 / dt, 1),
        "sends_per_s": round(acked / dt, 1),
        "cpu_ms_per_1000_sends": round(cpu * 1e6 / acked, 1) if acked else 0.0,
    }


def strace_counts(pid: int, seconds: float) -> dict[str, float]:
    """Calls per second of SYSCALLS by every thread of ``pid`` (strace -c -f attached)."""
    out = Path(tempfile.mkstemp(prefix="strace-")[1])
    proc = subprocess.Popen(
        ["strace", "-c", "-f", "-q", "-e", "trace=" + ",".join(SYSCALLS), "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(seconds)
    proc.send_signal(2)
    proc.wait(30)
    counts = {name: 0.0 for name in SYSCALLS}
    for line in out.read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in counts:
            counts[parts[-1]] = round(int(parts[3]) / seconds, 2)
    out.unlink()
    return counts


#: Sends acknowledged so far (read by the measuring thread).
ACKED = [0]


async def send_timers(ns: str, n: int, delay_of: Any, rate: float) -> None:
    """``n`` timer messages at ``rate`` a second (0: as fast as a window of 64 allows)."""
    body = b"x" * 128
    async with Producer("bench-timerflush-pg", ns, send_timeout=30) as producer:
        sem = asyncio.Semaphore(64)

        async def one() -> None:
            async with sem:
                delay_ms = delay_of()
                await producer.send(
                    Message("BenchTimerFlush", body, properties={"TIMER_DELAY_MS": str(delay_ms)})
                )
                ACKED[0] += 1

        begin = time.monotonic()
        tasks = []
        for i in range(n):
            if rate:
                ahead = begin + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)


def one_round(args: argparse.Namespace, tree: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tidemq-timerflush-", dir=args.tmp))
    toml = (
        f'[broker]\nname = "bench-timerflush"\nregister_interval_s = 2.0\n'
        f"timer_max_delay_sec = {args.max_delay_sec}\n\n"
        "[store.mmap]\ncommitlog_file_size = 268435456\nconsumequeue_entries = 300000\n"
    )
    old = os.environ.get("PYTHONPATH")
    if tree:
        os.environ["PYTHONPATH"] = tree
    try:
        ns, broker, ns_addr, broker_addr = start_namesrv_and_broker(work, toml)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    out: dict[str, Any] = {"loadavg": os.getloadavg()}
    try:
        far_ms = 3_600_000
        asyncio.run(send_timers(ns_addr, args.hold, lambda: far_ms, 0))
        asyncio.run(wait_enqueued(broker_addr))
        time.sleep(2 * args.flush_settle_s)  # the checkpoint of the holding state written
        out["holding"] = measure(broker.pid, args.window_s)
        out["holding"].update(strace_counts(broker.pid, args.strace_s))
        log(f"holding: {out['holding']}")

        async def steady() -> None:
            rng = random.Random(7)
            n = int(args.rate * args.steady_s)
            await send_timers(ns_addr, n, lambda: rng.randint(1000, args.max_due_s * 1000), args.rate)

        def run_steady() -> None:
            asyncio.run(steady())

        import threading

        sender = threading.Thread(target=run_steady)
        sender.start()
        time.sleep(args.steady_s - args.window_s - args.strace_s)
        out["steady"] = measure(broker.pid, args.window_s)
        out["steady"].update(strace_counts(broker.pid, args.strace_s))
        sender.join()
        log(f"steady: {out['steady']}")
    finally:
        stop(broker)
        stop(ns)
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b-tree", default="", help="PYTHONPATH for B's broker (the old code); empty: A only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-delay-sec", type=int, default=259_200, help="the wheel's size (3 days: 16 MiB)")
    ap.add_argument("--hold", type=int, default=2000, help="messages held, due after the run")
    ap.add_argument("--rate", type=float, default=1000, help="steady: timer messages a second")
    ap.add_argument("--max-due-s", type=int, default=60, help="steady: delays of 1..this s")
    ap.add_argument("--steady-s", type=float, default=22)
    ap.add_argument("--window-s", type=float, default=8)
    ap.add_argument("--strace-s", type=float, default=4)
    ap.add_argument("--flush-settle-s", type=float, default=1.0)
    ap.add_argument("--tmp", default=None, help="where the brokers' data go (a real disk; default: TMPDIR)")
    args = ap.parse_args()
    trees = [("a", "")] + ([("b", args.b_tree)] if args.b_tree else [])
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        result: dict[str, Any] = {}
        for name, tree in order:
            log(f"round {r + 1}: {name}")
            result[name] = one_round(args, tree)
        rounds.append(result)
    summary: dict[str, Any] = {}
    for phase in ("holding", "steady"):
        for name, _ in trees:
            for key in ("cpu_s_per_s", "write_kib_per_s", "sends_per_s", "cpu_ms_per_1000_sends", *SYSCALLS):
                summary.setdefault(phase, {}).setdefault(name, {})[key] = statistics.median(
                    rd[name][phase][key] for rd in rounds
                )
    print(json.dumps({"args": vars(args), "median": summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
