"""Profile the tidemq broker under one compare.py workload with py-spy (sampling, no restart).

    python bench/compare_profile.py [--workload produce_1k_single|produce_128_single|produce_1k_batch|produce_128_batch|consume_1k]
                                    [--flush async|sync] [--seconds 15] [--out DIR]

Starts ``tidemq standalone``, drives it with the compare.py load generators, samples the server
with ``py-spy record --format raw`` (collapsed stacks, ``--nonblocking``) and prints JSON: the
functions with the largest self and inclusive share of busy samples (py-spy leaves idle
threads out),
and the throughput reached while sampling.  Needs ``pip install py-spy``.

py-spy samples wall-clock time: a thread preempted while it holds the GIL (the broker woken client
runs on its core right after the broker's socket write) is counted as busy.  ``--perf`` samples
on-CPU time instead, with ``perf record -g`` and ``perf stat`` over the broker (needs ``perf`` and
permission to trace it): the CPU shares by object (interpreter, kernel, compiled modules), by
thread, by kernel entry point (socket reads and writes, store ``pwrite``, page faults, futexes,
the scheduler), the top symbols, and syscalls and context switches per message.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Kernel entry points whose inclusive CPU share --perf reports (what the broker spends there).
_KERNEL_PATHS = {
    "socket read": "ksys_read",
    "socket write": "ksys_write",
    "store pwrite": "__x64_sys_pwrite64",
    "fdatasync": "__x64_sys_fdatasync",
    "epoll": "__x64_sys_epoll_pwait",
    "futex": "__x64_sys_futex",
    "page faults": "asm_exc_page_fault",
    "scheduler": "schedule",
    "softirq": "handle_softirqs",
}
_STAT_EVENTS = (
    "task-clock,context-switches,syscalls:sys_enter_read,syscalls:sys_enter_write,"
    "syscalls:sys_enter_writev,syscalls:sys_enter_pwrite64,syscalls:sys_enter_epoll_pwait,"
    "syscalls:sys_enter_futex"
)


def _perf_report(data: Path, *args: str) -> list[tuple[float, str]]:
    text = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "-g", "none", *args],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or line.startswith("#") or not parts[0].endswith("%"):
            continue
        rows.append((float(parts[0][:-1]), line))
    return rows


def perf_summary(data: Path, stat: Path, messages: int, top: int) -> dict[str, Any]:
    """What ``perf record``/``perf stat`` saw of the broker, as shares of its on-CPU samples."""
    by_dso = {
        line.split()[-1]: pct
        for pct, line in _perf_report(data, "--no-children", "--sort", "dso")
        if pct >= 0.1
    }
    symbols = [
        {"share": round(pct / 100, 4), "symbol": " ".join(line.split()[1:])}
        for pct, line in _perf_report(data, "--no-children", "--sort", "dso,sym")[:top]
    ]
    children: dict[str, float] = {}
    for _pct, line in _perf_report(data, "--children", "--sort", "sym"):
        parts = line.split()
        if len(parts) >= 4:
            children.setdefault(parts[-1], float(parts[0][:-1]))
    kernel = {name: round(children.get(sym, 0.0) / 100, 4) for name, sym in _KERNEL_PATHS.items()}
    tids = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "tid"], capture_output=True, text=True, check=False
    ).stdout.split()
    counts = collections.Counter(tids)
    total = sum(counts.values()) or 1
    threads = [round(c / total, 3) for _, c in counts.most_common(6)]
    stats: dict[str, float] = {}
    for line in stat.read_text().splitlines() if stat.exists() else []:
        parts = line.split(",")
        if len(parts) > 2 and parts[0].replace(".", "", 1).isdigit():
            stats[parts[2].replace("syscalls:sys_enter_", "")] = float(parts[0])
    per_message = {k: round(v / messages, 4) for k, v in stats.items() if messages and k != "task-clock"}
    if messages and "task-clock" in stats:
        per_message["cpu_us"] = round(stats["task-clock"] * 1000 / messages, 2)
    return {
        "samples": total,
        "by_object": {k: round(v / 100, 4) for k, v in by_dso.items()},
        "by_thread": threads,
        "kernel_inclusive": kernel,
        "top_symbols": symbols,
        "messages": messages,
        "per_message": per_message,
    }


sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_systems as systems  # noqa: E402
from compare import Bench  # noqa: E402


def top_functions(collapsed: Path, n: int) -> dict[str, Any]:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        total += c
        self_c[leaf] += c
        for f in set(frames):
            incl[f] += c
    busy = total or 1
    return {
        "samples_busy": total,
        "self": [{"function": f, "share": round(c / busy, 3)} for f, c in self_c.most_common(n)],
        "inclusive": [{"function": f, "share": round(c / busy, 3)} for f, c in incl.most_common(n)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--workload",
        default="produce_1k_single",
        choices=[
            "produce_1k_single",
            "produce_128_single",
            "produce_1k_batch",
            "produce_128_batch",
            "consume_1k",
        ],
    )
    p.add_argument("--flush", default="async", choices=["async", "sync"])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--lines", action="store_true", help="aggregate by line instead of by function")
    p.add_argument("--out", help="keep the collapsed stacks here")
    p.add_argument(
        "--gil", action="store_true", help="sample only the thread holding the GIL (Python CPU, not waits)"
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="py-spy: compiled (Cython, C) frames too; py-spy then stops the broker at each sample "
        "(no --nonblocking), which slows it",
    )
    p.add_argument("--perf", action="store_true", help="on-CPU samples with perf instead of py-spy")
    args = p.parse_args()
    if args.perf:
        if shutil.which("perf") is None:
            raise SystemExit("perf not found")
    elif shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy") if not args.perf else ""
    work = Path(tempfile.mkdtemp(prefix="tidemq-profile-"))
    server = systems.start_tidemq(work / "tidemq", args.flush)
    try:
        ns = argparse.Namespace(procs=args.procs, inflight=args.inflight, messages=0)
        bench = Bench(ns, server)
        bench.setup()
        batch = 32 if args.workload in ("produce_1k_batch", "produce_128_batch") else 1
        body = 128 if args.workload in ("produce_128_batch", "produce_128_single") else 1024
        if args.workload == "consume_1k":
            bench.produce(1024, 32, 400_000)  # the backlog to read
        out = Path(args.out) if args.out else work
        out.mkdir(parents=True, exist_ok=True)
        collapsed = out / f"{args.workload}-{args.flush}.txt"
        if args.perf:
            data, stat = (
                out / f"{args.workload}-{args.flush}.perf.data",
                out / f"{args.workload}-{args.flush}.stat",
            )
            # Both watch until the runs end (SIGINT): the messages counted are those they saw.
            rec = subprocess.Popen(
                ["perf", "record", "-F", "499", "-g", "-p", str(server.pid), "-o", str(data)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            statp = subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", _STAT_EVENTS, "-p", str(server.pid), "-o", str(stat)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            rec = subprocess.Popen(
                [spy, "record", "--pid", str(server.pid), "--format", "raw", "--rate", "250"]
                + ([] if args.lines else ["--function"])
                + (["--gil"] if args.gil else [])
                + (["--native"] if args.native else [])
                + ["--duration", str(int(args.seconds))]
                + ([] if args.native else ["--nonblocking"])
                + ["--output", str(collapsed)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        time.sleep(0.5)
        deadline = time.monotonic() + args.seconds
        runs = []
        while time.monotonic() < deadline:
            if args.workload == "consume_1k":
                runs.append(bench.consume())
                break
            runs.append(bench.produce(body, batch, 60_000 * batch // 4))
        if args.perf:
            for proc in (rec, statp):
                proc.send_signal(signal.SIGINT)
            rec.wait(60)
            statp.wait(60)
            profile = perf_summary(data, stat, sum(r.get("messages", 0) for r in runs), args.top)
        else:
            rec.wait(args.seconds + 60)
            profile = (
                top_functions(collapsed, args.top)
                if collapsed.exists()
                else {"error": rec.stderr.read().decode() if rec.stderr else ""}
            )
        result = {
            "workload": args.workload,
            "flush": args.flush,
            "msgs_per_s": [r["msgs_per_s"] for r in runs],
            "server_cpu_per_s": [r["server_cpu_per_s"] for r in runs],
            "generator_cpu_per_s": [r["generator_cpu_per_s"] for r in runs],
            "sampler": "perf (on-CPU)"
            if args.perf
            else f"py-spy ({'GIL holder' if args.gil else 'wall clock'})",
            "profile": profile,
        }
        print(json.dumps(result, indent=2))
    finally:
        server.stop()
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
